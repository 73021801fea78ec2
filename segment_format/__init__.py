"""plog's storage layer: the protocol of PROTOCOL.md, as bytes on storage.

What lives here, lowest layer first (``tests/test_layering.py`` checks that no layer imports a higher one):

* ``errors``, ``parallel``: the exception hierarchy and the shared thread pool;
* ``stores/`` (the ``Store`` interface in ``stores.base`` and its backends), ``config`` (the one
  config-schema mechanism), ``documents`` (typed JSON documents), ``layout`` (key names), ``records``;
* ``numbered`` (numbered objects), ``notice`` (change notices), ``typed/`` (value schemas and typed layouts);
* ``segment/`` (segment objects: format, index, writer, reader), ``protocol`` (the root's protocol object);
* ``topic`` (topic metadata), ``encoding`` (records to stored batches);
* ``log/``: the partition log, one module per concept behind ``log.partition_log.PartitionLog``;
* ``root`` (``LogRoot``, a root's topics and partitions);
* ``inspect/``: data-only listings of a root and the verifier.

This package's ``__init__`` imports nothing, so that importing one module loads only what it needs.

May import: the standard library, pyarrow, numpy, pandas, fsspec, lz4 and
google-crc32c. Never ``coordinator`` or ``pyspark_logsource`` (checked by
``tests/test_layering.py``): this layer knows nothing of leases, groups or Spark.
"""
