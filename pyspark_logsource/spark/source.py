"""The Spark source: ``spark.readStream.format("plog")`` and ``spark.read.format("plog")``.

:class:`DefaultSource` is a PySpark Python data source. Spark (4.0 and later)
registers installed ``pyspark_*`` packages that expose a ``DefaultSource``, so
after ``pip install`` nothing needs ``spark.dataSource.register``. What each
PySpark version lacks (filter pushdown before 4.1, read limits and
``Trigger.AvailableNow`` of its own before 4.2) is detected, and worked around,
in :mod:`pyspark_logsource.spark.compat`::

    df = (spark.readStream.format("plog")
          .option("subscribe", "events")
          .option("startingOffsets", "earliest")
          .load("s3://bucket/plog"))

The options and the schema are those of Spark's Kafka source (see
:mod:`pyspark_logsource.spark.options`). The streaming offset is a JSON object
``{"topic": {"partition": next_offset}}`` kept in Spark's checkpoint, so a
restarted query re-reads exactly the ranges of a batch that did not commit.
Tasks read with :meth:`PartitionLog.read` and hand Spark Arrow record batches
converted with pyarrow compute: no Python object is made per record.

``isolationLevel=read_committed`` (the default) ends every batch at the last
stable offset (the first transaction not yet decided) and skips aborted
transactions; since decisions never change, a re-run batch reads the same
records. ``read_uncommitted`` reads every record up to the log end.

Batch reads push filters on ``topic``, ``partition``, ``offset`` and
``timestamp`` down to the offset and time indexes when Spark's
``spark.sql.python.filterPushdown.enabled`` is true (without it Spark filters
every row itself). Spark 4.3 keeps the read plan of a pushed-down query on the
DataFrame's source and reuses it for a later action of *the same DataFrame*
that pushes no filter at all (fixed upstream by scoping it to the scan), so on
4.3 call ``load()`` again rather than reuse a filtered DataFrame's parent.

A typed topic (PROTOCOL.md 11.8) keeps Kafka's metadata columns, but its ``value`` is a struct of
the value schema's fields; ``flattenValue=true`` puts the fields at top level after the metadata
columns instead, and ``valueFields=a,b`` reads (and decodes) only those fields, in the schema's
order (Spark 4.3's Python data sources get no column pruning, so the option stands in for it). The
value schema is the topics' current one when the query is defined: a streaming query keeps it for
its whole run, and a restart from its checkpoint reads with the schema current then.

Spark only runs the source on the driver and in Python workers, so a
``memory://`` root (one process) is refused; local directories must be
reachable at the same path from every executor.
"""

from __future__ import annotations

from pyspark.sql.types import StructType

from pyspark_logsource.spark import compat
from pyspark_logsource.spark.batch_reader import PlogBatchReader
from pyspark_logsource.spark.compat import (  # the classes differ by PySpark version
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark_logsource.spark.conversion import arrow_schema, spark_schema, to_spark_batch
from pyspark_logsource.spark.options import SourceOptions, parse_options
from pyspark_logsource.spark.partition_reader import PlogInputPartition, read_partition
from pyspark_logsource.spark.planning import DataLossError
from pyspark_logsource.spark.stream_reader import FailedStreamReader, PlogStreamReader
from pyspark_logsource.spark.typed import ReaderSchema, current_reader_schema, reader_schema_for
from segment_format.errors import PlogError
from segment_format.root import LogRoot

if not compat.HAS_DATA_SOURCES:
    # PySpark 3.x: Spark never looks for format("plog") in Python, so nothing skips this import; it is the
    # user's own (``from pyspark_logsource import DefaultSource``) and says which PySpark is needed.
    compat.require_supported()

__all__ = [
    "DataLossError",
    "DefaultSource",
    "PlogBatchReader",
    "PlogInputPartition",
    "PlogStreamReader",
    "arrow_schema",
    "read_partition",
    "spark_schema",
    "to_spark_batch",
]


class DefaultSource(DataSource):
    """The ``plog`` data source; Spark finds it in the ``pyspark_logsource`` package by its name."""

    def __init__(self, options: dict[str, str]) -> None:
        # A PySpark that lacks part of the API still registers the source (an import error would make Spark
        # skip the package and say only DATA_SOURCE_NOT_FOUND); the query fails here, naming the version.
        compat.require_supported()
        super().__init__(options)

    @classmethod
    def name(cls) -> str:
        """The format name: ``spark.read.format("plog")``."""
        return "plog"

    def schema(self) -> StructType:
        """Kafka's schema, with a typed topic's current value schema; checks the options first, so a bad
        one fails when the query is defined.

        The value schema chosen here is kept on this instance, which Spark pickles after this call and
        hands to :meth:`reader` / :meth:`streamReader`: the query reads the version Spark planned with.
        """
        opts = parse_options(self.options, streaming=None)
        root = LogRoot(opts.url, opts.storage_options)
        try:
            self._reading = current_reader_schema(root, opts)
        finally:
            root.close()
        return self._reading.spark_schema(opts)

    def _reader_schema(self, opts: SourceOptions, schema: StructType) -> ReaderSchema:
        """The value schema that gives ``schema``: the one :meth:`schema` chose, else found in the topics'
        histories (a schema given with ``.schema(...)``, or one this instance was not asked for)."""
        chosen: ReaderSchema | None = getattr(self, "_reading", None)
        if chosen is not None and chosen.spark_schema(opts) == schema:
            return chosen
        root = LogRoot(opts.url, opts.storage_options)
        try:
            return reader_schema_for(root, opts, schema)
        finally:
            root.close()

    def reader(self, schema: StructType) -> DataSourceReader:
        """A batch reader (``spark.read``)."""
        opts = parse_options(self.options, streaming=False)
        return PlogBatchReader(opts, self._reader_schema(opts, schema))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """A batch writer (``df.write``): one Spark job is one transaction."""
        from pyspark_logsource.spark.sink import PlogBatchWriter

        return PlogBatchWriter(dict(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """The exactly-once streaming sink (``df.writeStream``): one micro-batch is one transaction."""
        from pyspark_logsource.spark.sink import PlogStreamWriter

        return PlogStreamWriter(dict(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """A streaming reader (``spark.readStream``); bad options fail the query when it starts."""
        try:
            opts = parse_options(self.options, streaming=True)
            compat.check_stream_options(opts)
            reading = self._reader_schema(opts, schema)
        except PlogError as exc:
            # Raised from here, PySpark 4.3's stream runner hides it behind an UnboundLocalError of its
            # own; raised from the first call of the query instead, it is the query's error as is.
            return FailedStreamReader(exc)
        return PlogStreamReader(opts, reading)
