"""The Python client: ``LogStore`` (topics), ``Producer``, ``Consumer`` and their record types.

Kafka's client API (kafka-python's names) over the storage protocol. May import
``segment_format`` and ``coordinator``; never the Spark connector, the CLI or the views.
One concept per module:

* ``admin``: ``LogStore``, topic administration;
* ``types``: ``TopicPartition``, ``RecordMetadata``, ``ConsumerRecord``, ``OffsetAndTimestamp``;
* ``partitioner``: Kafka's murmur2 key partitioner, bit-for-bit and vectorised;
* ``routing``: ``Router``, where a record goes (explicit partition, key, sticky null keys),
  for the producer and the Spark sink alike;
* ``producer``: the ``Producer`` facade over ``accumulator`` (``RecordAccumulator``, the
  buffers ``send`` fills), ``sender`` (the thread writing sealed buffers), ``transactions``
  (``TransactionManager``: producer id, sequences, transactions) and ``futures``
  (``FutureRecordMetadata``, ``BatchSendResult``);
* ``table_reader``: ``read_topic``, a topic's committed records as a ``pyarrow.RecordBatchReader``
  for other engines (DuckDB, Polars, pandas);
* ``consumer``: the ``Consumer`` facade over ``fetcher`` (positions, reads, ``poll``'s and
  ``poll_arrow``'s answers) and ``consumer_group`` (membership, rebalances, offset commits).
"""
