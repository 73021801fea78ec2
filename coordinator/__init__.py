"""plog's coordination without a broker: producer ids, transactions and epochs, leases, consumer groups.

Everything here is built from ``segment_format``'s one atomic primitive,
put-if-absent, on numbered objects under ``_coordinator/`` and ``groups/``
(PROTOCOL.md 11).

May import: the standard library and ``segment_format``. Never
``pyspark_logsource`` (checked by ``tests/test_layering.py``): no Spark here.
"""
