"""plog's storage layer: the protocol of PROTOCOL.md, as bytes on storage.

What lives here: the ``Store`` interface and its backends (``stores/``), key names
(``layout``), records, segment objects and their indexes (``segment``), topic
metadata, typed JSON documents, numbered objects, the root's protocol object
(``protocol``) and the one config-schema mechanism (``config``); the partition
log, one module per concept behind the ``log.PartitionLog`` facade: ``chain``
(resolution), ``index_cache``, ``encoding``, ``producer_state``, ``appender``,
``reader`` and ``maintenance``; plus data-only listings of a root and the verifier.

May import: the standard library, pyarrow, numpy, pandas, fsspec, lz4 and
google-crc32c. Never ``coordinator`` or ``pyspark_logsource`` (checked by
``tests/test_layering.py``): this layer knows nothing of leases, groups or Spark.
"""
