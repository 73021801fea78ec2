"""The Spark connector: ``format("plog")`` as a Python Data Source (source, sink, options, planning).

May import ``segment_format``, ``coordinator`` and ``pyspark_logsource.client``; never the CLI or the views.
``DefaultSource`` is re-exported from ``pyspark_logsource`` for Spark's discovery of ``pyspark_*`` packages.
"""
