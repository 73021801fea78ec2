"""The sink's option and column checks: which columns it writes and their Spark types, a typed topic's value
fields, the errors that name the culprit option or column. Executed on the driver at start (``check_sink_columns``)
and by the task writer on every batch (``typed_value``).
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from pyspark_logsource.spark.option_schema import sink_option_error
from segment_format.errors import (
    InvalidRecordError,
)
from segment_format.topic import TopicMetadata
from segment_format.typed.layout import TypedLayout, entry_layout

#: The columns the sink writes, and the Spark types each may have.
_COLUMN_TYPES: dict[str, tuple[type, ...]] = {
    "value": (BinaryType, StringType),
    "key": (BinaryType, StringType),
    "topic": (StringType,),
    "partition": (IntegerType, LongType, ShortType, ByteType),
    "headers": (ArrayType,),
    "timestamp": (TimestampType, TimestampNTZType, LongType),
}
#: Columns of the plog (and Kafka) source schema that carry nothing to write; ignored, as Kafka's sink does.
IGNORED_COLUMNS = {"offset", "timestamptype"}


def column_error(name: str, message: str) -> InvalidRecordError:
    """An ``InvalidRecordError`` whose message names the input column first."""
    return InvalidRecordError(f"plog sink column '{name}': {message}")


#: Every column name the sink knows (lower case): its own and the ignored ones.
SINK_COLUMNS = set(_COLUMN_TYPES) | IGNORED_COLUMNS
#: Input columns that are not a typed topic's value fields: the sink's own and the ignored ones (lower case).
_NOT_FIELDS = (set(_COLUMN_TYPES) - {"value"}) | IGNORED_COLUMNS


def check_sink_columns(schema: StructType, has_topic_option: bool, meta: TopicMetadata | None = None) -> None:
    """Validate the input columns like Spark's Kafka sink, naming the culprit.

    ``meta``: the ``topic`` option's topic. For a typed one (PROTOCOL.md 11.8) the value is a struct
    column ``value`` or one column per field, checked against its current value schema now, so that
    a mismatch fails the query when it starts. Without the option, input that looks typed (a struct
    ``value``, or field columns and no binary or string ``value``) is checked per topic when written.
    """
    fields = {f.name.lower(): f for f in schema.fields}
    if meta is not None and meta.schema_history is not None:
        _check_column_types(fields, typed=True)
        _check_typed_value(schema, meta)
        return
    value = fields.get("value")
    value_type = value.dataType if value is not None else None
    if (
        meta is None
        and not has_topic_option
        and not isinstance(value_type, _TEXT)
        and (isinstance(value_type, StructType) or any(name not in SINK_COLUMNS for name in fields))
    ):
        # A struct value, or field columns: values of typed topics, checked per topic (the topic column's)
        # when written. Input with a binary or string value is an untyped topic's, checked as always.
        _check_column_types(fields, typed=True)
        if "topic" not in fields:
            raise sink_option_error("topic", "missing: set the 'topic' option or give the data a 'topic' column")
        return
    if "value" not in fields:
        raise column_error(
            "value", f"missing: the plog sink needs a 'value' column (binary or string); the input has {sorted(fields)}"
        )
    _check_column_types(fields, typed=False)
    unknown = sorted(set(fields) - set(_COLUMN_TYPES) - IGNORED_COLUMNS)
    if unknown:
        raise column_error(
            unknown[0], f"is not a column the sink writes (it writes {sorted(_COLUMN_TYPES)}; select only those)"
        )
    if "topic" not in fields and not has_topic_option:
        raise sink_option_error("topic", "missing: set the 'topic' option or give the data a 'topic' column")


#: The Spark types of an untyped topic's values.
_TEXT = (BinaryType, StringType)


def _check_column_types(fields: dict[str, StructField], typed: bool) -> None:
    """The sink's own columns have types it writes (``value`` too, unless the topic may be typed)."""
    for name, types in _COLUMN_TYPES.items():
        if typed and name == "value":
            continue
        if name in fields and not isinstance(fields[name].dataType, types):
            raise column_error(
                name,
                f"has type {fields[name].dataType.simpleString()}; expected {' or '.join(t.typeName() for t in types)}",  # type: ignore[attr-defined]
            )
    headers = fields.get("headers")
    if headers is not None and isinstance(headers.dataType, ArrayType):
        element = headers.dataType.elementType
        names = {f.name.lower(): f.dataType for f in element.fields} if isinstance(element, StructType) else {}
        if not (
            set(names) == {"key", "value"}
            and isinstance(names["key"], StringType)
            and isinstance(names["value"], (BinaryType, StringType))
        ):
            raise column_error(
                "headers",
                f"has type {headers.dataType.simpleString()}; expected array<struct<key:string,value:binary>>",
            )


def _value_columns(names: list[str], value_is_struct: bool) -> list[str] | None:
    """A typed topic's value in the input: None for a struct column ``value`` (the only non-sink column),
    else the columns that are its fields: every column but the sink's own (``key``, ``topic``,
    ``partition``, ``headers``, ``timestamp``) and the ignored ``offset`` and ``timestampType``."""
    fields = [n for n in names if n.lower() not in _NOT_FIELDS]
    if len(fields) == 1 and fields[0].lower() == "value" and value_is_struct:
        return None
    return fields


def _typed_problem(exc: InvalidRecordError) -> InvalidRecordError:
    """A typed value's refusal (which names the field, its type and the version) as the sink's error."""
    return InvalidRecordError(
        f"plog sink: {exc} (a typed topic's value is a struct column 'value', or one column per field)"
    )


def _check_typed_value(schema: StructType, meta: TopicMetadata) -> None:
    """Check the input's value columns against the topic's current value schema, before any row is read:
    Spark's types as the Arrow ones it will send, conformed as an empty batch (names, types, missing fields)."""
    assert meta.schema_history is not None
    layout = entry_layout(meta.schema_history.current)
    value = next((f for f in schema.fields if f.name.lower() == "value"), None)
    columns = _value_columns(schema.fieldNames(), value is not None and isinstance(value.dataType, StructType))
    if columns is None:
        assert value is not None
        spark_value = value.dataType
    else:
        if not columns:
            raise column_error(
                "value",
                f"missing: topic {meta.name!r} is typed; give its value as a struct column 'value' or as columns "
                f"of its fields {list(layout.names)}; the input has {schema.fieldNames()}",
            )
        by_name = {f.name: f for f in schema.fields}
        spark_value = StructType([by_name[n] for n in columns])
    arrow = to_arrow_schema(StructType([StructField("value", spark_value)]), timezone="UTC").field(0).type
    empty = pa.array([], type=arrow)
    try:
        layout.conform(_renamed_fields(empty, layout.names), meta.name)
    except InvalidRecordError as exc:
        raise _typed_problem(exc) from None


def _field_name(name: str, names: tuple[str, ...]) -> str:
    """``name`` as the value schema spells it when only its case differs (Spark's names are case-insensitive)."""
    if name in names:
        return name
    matches = [n for n in names if n.lower() == name.lower()]
    return matches[0] if len(matches) == 1 else name


def _renamed_fields(value: pa.StructArray, names: tuple[str, ...]) -> pa.StructArray:
    """``value`` with its fields named as the value schema spells them (same children, same nulls)."""
    given = [value.type.field(i).name for i in range(value.type.num_fields)]
    wanted = [_field_name(n, names) for n in given]
    if wanted == given:
        return value
    children = [value.field(i) for i in range(len(given))]
    mask = value.is_null() if value.null_count else None
    return pa.StructArray.from_arrays(children, names=wanted, mask=mask)


def typed_value(table: pa.Table, layout: TypedLayout, topic: str) -> pa.Array:
    """The value column of a typed topic's payload from the input rows, conformed to ``layout``
    (``InvalidRecordError`` naming the field, before anything is appended: PROTOCOL.md 11.8)."""
    names = table.column_names
    columns = _value_columns(names, "value" in names and pa.types.is_struct(table.column("value").type))
    if columns is None:
        value = table.column("value")
        value = value.combine_chunks() if isinstance(value, pa.ChunkedArray) else value
    elif not columns:
        raise column_error("value", f"missing: topic {topic!r} is typed; give its value as a struct or its fields")
    else:
        # The top-level form cannot express a null value (a tombstone): every row is a record of fields.
        children = [table.column(n).combine_chunks() for n in columns]
        value = pa.StructArray.from_arrays(children, names=columns)
    try:
        return layout.conform(_renamed_fields(value, layout.names), topic)
    except InvalidRecordError as exc:
        raise _typed_problem(exc) from None
