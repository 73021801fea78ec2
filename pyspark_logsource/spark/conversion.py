"""The source's schema (Spark's Kafka source columns) and the columnar conversion of stored batches to it.

An untyped topic's schema is fixed. A typed topic's (PROTOCOL.md 11.8) keeps Kafka's metadata columns
but its ``value`` is a struct of the value schema's fields (:func:`typed_spark_schema`), or, with
``flattenValue``, those fields follow the metadata columns at top level.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pyspark_logsource.spark.option_schema import option_error
from pyspark_logsource.spark.options import SourceOptions
from segment_format.errors import InvalidConfigError

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


def spark_arrow_schema(include_headers: bool = False) -> pa.Schema:
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
    metadata = _metadata_columns(batch, topic, partition, timestamp_type, include_headers)
    return pa.RecordBatch.from_arrays(
        [metadata[0], batch.column(3), *metadata[1:]], schema=_ARROW_SCHEMAS[include_headers]
    )


def _metadata_columns(
    batch: pa.RecordBatch, topic: str, partition: int, timestamp_type: int, include_headers: bool
) -> list[pa.Array]:
    """Kafka's columns other than ``value``, in the source's order: key, topic, partition, offset,
    timestamp, timestampType, and headers with ``includeHeaders``."""
    n = batch.num_rows
    columns = [
        batch.column(2),
        _constant("string", topic, n),
        _constant("int32", partition, n),
        batch.column(0),
        batch.column(1).cast(_ARROW_TIMESTAMP),
        _constant("int32", timestamp_type, n),
    ]
    if include_headers:
        columns.append(batch.column(4).cast(_ARROW_HEADERS))
    return columns


def check_source_schema(schema: StructType, opts: SourceOptions) -> None:
    """Refuse a user-specified schema other than the (untyped) source's fixed one."""
    expected = spark_schema(opts.include_headers)
    if schema != expected:
        raise option_error(
            "schema",
            f"the plog source has a fixed schema ({expected.simpleString()}) and "
            f"cannot be read with a custom one ({schema.simpleString()})",
        )


# ---------------------------------------------------------------------------- typed topics (PROTOCOL.md 11.8)

_PRIMITIVES: list[tuple[pa.DataType, DataType]] = [
    (pa.bool_(), BooleanType()),
    (pa.int8(), ByteType()),
    (pa.int16(), ShortType()),
    (pa.int32(), IntegerType()),
    (pa.int64(), LongType()),
    (pa.float32(), FloatType()),
    (pa.float64(), DoubleType()),
    (pa.utf8(), StringType()),
    (pa.binary(), BinaryType()),
    (pa.date32(), DateType()),
    (_ARROW_TIMESTAMP, TimestampType()),
]


def spark_type(kind: pa.DataType, name: str = "value") -> DataType:
    """The Spark type of a value schema type (PROTOCOL.md 11.8, *Types*); nested nullability is kept.

    ``name`` is the field's path, for the error on a type typed topics do not store.
    """
    for arrow, spark in _PRIMITIVES:
        if kind.equals(arrow):
            return spark
    if pa.types.is_decimal128(kind):
        return DecimalType(kind.precision, kind.scale)
    if pa.types.is_list(kind):
        return ArrayType(spark_type(kind.value_type, f"{name}[]"), kind.value_field.nullable)
    if pa.types.is_map(kind):
        key, item = spark_type(kind.key_type, f"{name} key"), spark_type(kind.item_type, f"{name} value")
        return MapType(key, item, kind.item_field.nullable)
    if pa.types.is_struct(kind):
        return StructType(
            [
                StructField(f.name, spark_type(f.type, f"{name}.{f.name}"), f.nullable)
                for f in (kind.field(i) for i in range(kind.num_fields))
            ]
        )
    raise InvalidConfigError(f"value field {name!r} has type {kind}, which the Spark source cannot read")


#: The metadata columns of a typed read, in order, before the value's fields when they are flattened.
METADATA_COLUMNS = ("key", "topic", "partition", "offset", "timestamp", "timestampType", "headers")


def flattened_collisions(value_type: pa.StructType, include_headers: bool) -> list[str]:
    """Value fields whose names collide with a metadata column (Spark compares names case-insensitively)."""
    taken = {c.lower() for c in METADATA_COLUMNS if c != "headers" or include_headers}
    return [value_type.field(i).name for i in range(value_type.num_fields) if value_type.field(i).name.lower() in taken]


def typed_spark_schema(value_type: pa.StructType, include_headers: bool = False, flatten: bool = False) -> StructType:
    """A typed read's schema: Kafka's columns with ``value`` a struct of ``value_type``'s fields, or with
    ``flatten`` the metadata columns followed by the fields themselves (all nullable: a tombstone's are null).
    """
    value = spark_type(value_type)
    assert isinstance(value, StructType)
    if not flatten:
        fields = [*_SPARK_FIELDS]
        fields[1] = StructField("value", value)
        return StructType([*fields, _HEADERS_FIELD] if include_headers else fields)
    collisions = flattened_collisions(value_type, include_headers)
    if collisions:
        raise option_error(
            "flattenValue",
            f"value field(s) {collisions} have the name of a metadata column ({', '.join(METADATA_COLUMNS)}); "
            "read the value as a struct (flattenValue=false) or leave them out with valueFields",
        )
    metadata = [f for f in _SPARK_FIELDS if f.name != "value"]
    return StructType(
        [*metadata, *([_HEADERS_FIELD] if include_headers else []), *(StructField(f.name, f.dataType) for f in value)]
    )


@lru_cache(maxsize=64)
def typed_arrow_schema(value_type: pa.StructType, include_headers: bool, flatten: bool) -> pa.Schema:
    """The Arrow schema Spark expects from ``read()`` for :func:`typed_spark_schema` (Spark compares them)."""
    return to_arrow_schema(typed_spark_schema(value_type, include_headers, flatten), timezone="UTC")


def to_spark_typed_batch(
    batch: pa.RecordBatch, topic: str, partition: int, timestamp_type: int, include_headers: bool, flatten: bool
) -> pa.RecordBatch:
    """A typed topic's logical batch (``value`` a struct, read as the query's projection) as the source's
    Arrow schema, with pyarrow only: the struct, or its fields, cast to the Arrow form Spark expects
    (list and map children are named as Spark names them; the buffers are reused)."""
    value = batch.column(3)
    schema = typed_arrow_schema(value.type, include_headers, flatten)
    metadata = _metadata_columns(batch, topic, partition, timestamp_type, include_headers)
    if not flatten:
        columns = [metadata[0], value.cast(schema.field(1).type), *metadata[1:]]
    else:
        # ``flatten`` propagates the struct's nulls to its fields: a tombstone's fields are null.
        first = len(metadata)
        columns = [*metadata, *(child.cast(schema.field(first + i).type) for i, child in enumerate(value.flatten()))]
    return pa.RecordBatch.from_arrays(columns, schema=schema)
