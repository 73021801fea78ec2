"""The ``plog`` command line: topics, produce, consume, inspect, maintain, groups and the demo.

May import everything below it: ``segment_format``, ``coordinator``, the client, the Spark connector
(for the demo) and the views. Nothing imports the CLI.
"""

from pyspark_logsource.cli.app import main

__all__ = ["main"]
