"""The source's fixed schema (Spark's Kafka source columns) and the columnar conversion of stored batches to it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pyspark_logsource.spark.options import (
    SourceOptions,
    option_error,
)

_HEADER_STRUCT = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
_SPARK_FIELDS = [
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
]
_HEADERS_FIELD = StructField("headers", ArrayType(_HEADER_STRUCT))

_ARROW_TIMESTAMP = pa.timestamp("us", tz="UTC")
_ARROW_HEADERS = pa.list_(
    pa.field("element", pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
)
_ARROW_FIELDS = [
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", _ARROW_TIMESTAMP),
    pa.field("timestampType", pa.int32()),
]
_ARROW_SCHEMAS = {
    False: pa.schema(_ARROW_FIELDS),
    True: pa.schema([*_ARROW_FIELDS, pa.field("headers", _ARROW_HEADERS)]),
}


def spark_schema(include_headers: bool = False) -> StructType:
    """The schema of Spark's Kafka source; ``headers`` only with ``includeHeaders``."""
    return StructType([*_SPARK_FIELDS, _HEADERS_FIELD] if include_headers else list(_SPARK_FIELDS))


def arrow_schema(include_headers: bool = False) -> pa.Schema:
    """The Arrow schema Spark expects from ``read()`` for :func:`spark_schema`."""
    return _ARROW_SCHEMAS[include_headers]


_CONSTANTS: dict[tuple[str, object], pa.Array] = {}


def _constant(kind: str, value: str | int, n: int) -> pa.Array:
    """``n`` copies of ``value``: a zero-copy slice of a cached array, grown as needed (no per-batch fill)."""
    key = (kind, value)
    cached = _CONSTANTS.get(key)
    if cached is None or len(cached) < n:
        size = max(n, 2 * len(cached) if cached is not None else 65536)
        if len(_CONSTANTS) > 256:
            _CONSTANTS.clear()
        if kind == "int32":
            cached = pa.array(np.full(size, value, np.int32))
        else:
            data = str(value).encode()
            if not data or size * len(data) >= 2**31 - 1:
                return pa.array([value] * n, pa.string())
            offsets = np.arange(0, (size + 1) * len(data), len(data), dtype=np.int32)
            cached = pa.Array.from_buffers(pa.string(), size, [None, pa.py_buffer(offsets), pa.py_buffer(data * size)])
        _CONSTANTS[key] = cached
    return cached.slice(0, n)


def to_spark_batch(
    batch: pa.RecordBatch, topic: str, partition: int, timestamp_type: int, include_headers: bool
) -> pa.RecordBatch:
    """A stored batch (``RECORD_SCHEMA``) as the source's Arrow schema, with pyarrow only."""
    n = batch.num_rows
    columns = [
        batch.column(2),
        batch.column(3),
        _constant("string", topic, n),
        _constant("int32", partition, n),
        batch.column(0),
        batch.column(1).cast(_ARROW_TIMESTAMP),
        _constant("int32", timestamp_type, n),
    ]
    if include_headers:
        columns.append(batch.column(4).cast(_ARROW_HEADERS))
    return pa.RecordBatch.from_arrays(columns, schema=_ARROW_SCHEMAS[include_headers])


def check_schema(schema: StructType, opts: SourceOptions) -> None:
    expected = spark_schema(opts.include_headers)
    if schema != expected:
        raise option_error(
            "schema",
            f"the plog source has a fixed schema ({expected.simpleString()}) and "
            f"cannot be read with a custom one ({schema.simpleString()})",
        )
