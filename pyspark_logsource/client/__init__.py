"""The Python client: ``LogStore`` (topics), ``Producer``, ``Consumer`` and their record types.

Kafka's client API (kafka-python's names) over the storage protocol. May import
``segment_format`` and ``coordinator``; never the Spark connector, the CLI or the views.
"""
