"""The Spark source: ``spark.readStream.format("plog")`` and ``spark.read.format("plog")``.

:class:`DefaultSource` is a PySpark Python data source. Spark (4.2 and later)
registers installed ``pyspark_*`` packages that expose a ``DefaultSource``, so
after ``pip install`` nothing needs ``spark.dataSource.register``::

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

Spark only runs the source on the driver and in Python workers, so a
``memory://`` root (one process) is refused; local directories must be
reachable at the same path from every executor.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from pyspark_logsource.spark.batch_reader import PlogBatchReader
from pyspark_logsource.spark.conversion import arrow_schema, check_schema, spark_schema, to_spark_batch
from pyspark_logsource.spark.options import parse_options
from pyspark_logsource.spark.partition_reader import PlogInputPartition, read_partition
from pyspark_logsource.spark.planning import DataLossError
from pyspark_logsource.spark.stream_reader import FailedStreamReader, PlogStreamReader
from segment_format.errors import PlogError

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

    @classmethod
    def name(cls) -> str:
        """The format name: ``spark.read.format("plog")``."""
        return "plog"

    def schema(self) -> StructType:
        """Kafka's schema; checks the options first, so a bad one fails when the query is defined."""
        opts = parse_options(self.options, streaming=None)
        return spark_schema(opts.include_headers)

    def reader(self, schema: StructType) -> DataSourceReader:
        """A batch reader (``spark.read``)."""
        opts = parse_options(self.options, streaming=False)
        check_schema(schema, opts)
        return PlogBatchReader(opts)

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
            check_schema(schema, opts)
        except PlogError as exc:
            # Raised from here, PySpark 4.3's stream runner hides it behind an UnboundLocalError of its
            # own; raised from the first call of the query instead, it is the query's error as is.
            return FailedStreamReader(exc)
        return PlogStreamReader(opts)
