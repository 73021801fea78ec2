"""Typed topics' values (PROTOCOL.md 11.8) as JSON and their schemas as DDL, for the ``plog`` command.

A typed topic's value is a row of its value schema: a dict of fields. JSON has no timestamps, dates,
bytes or exact decimals, so both directions follow the field's Arrow type:

* ``timestamp[us, UTC]``: printed as ISO 8601 in UTC (``2024-05-01T12:00:00.250Z``); read from an
  ISO 8601 string, UTC when it names no zone (as every time ``plog`` takes). A JSON number is refused:
  seconds, milliseconds or microseconds would be a guess.
* ``date32``: ``2024-05-01`` both ways.
* ``binary``: standard base64 (RFC 4648, padded) both ways. Plain text is not accepted: many texts are
  also valid base64, so accepting both would make a value's bytes depend on a guess.
* ``decimal128(p, s)``: printed as a string, exact (``"12.50"``); read from a string or a JSON number,
  both exact (JSON is parsed with ``parse_float=Decimal``, never through a float).
* ``map<string, V>``: a JSON object both ways (a list of ``[key, value]`` pairs is also read);
  a map with other keys: a list of ``[key, value]`` pairs.
* everything else (booleans, integers, floats, strings, lists, structs): the plain JSON value.

So what ``plog consume --format json`` prints as a value, ``plog produce --json`` takes back unchanged.
Reading only converts; whether the result fits the schema is the producer's check
(:meth:`~segment_format.typed.layout.TypedLayout.check_python_value` and ``values_from_python``).
"""

from __future__ import annotations

import base64
import binascii
from datetime import date, datetime, timezone
from decimal import Decimal, InvalidOperation
from typing import Any

import pyarrow as pa

from segment_format.errors import InvalidRecordError
from segment_format.typed.layout import python_types

# --------------------------------------------------------------------------- values to JSON


def value_to_json(value: Any, kind: pa.DataType) -> Any:
    """``value`` (as ``pyarrow``'s ``to_pylist`` gives it for Arrow type ``kind``) as a JSON-able object."""
    if value is None:
        return None
    if pa.types.is_struct(kind):
        return {
            kind.field(i).name: value_to_json(value.get(kind.field(i).name), kind.field(i).type)
            for i in range(kind.num_fields)
        }
    if pa.types.is_map(kind):
        # to_pylist gives a map as (key, value) pairs; only string keys can be JSON object keys.
        pairs = [(value_to_json(k, kind.key_type), value_to_json(v, kind.item_type)) for k, v in value]
        if pa.types.is_string(kind.key_type):
            return dict(pairs)
        return [list(pair) for pair in pairs]
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return [value_to_json(item, kind.value_type) for item in value]
    if isinstance(value, datetime):
        stamp = value.astimezone(timezone.utc) if value.tzinfo is not None else value
        return stamp.replace(tzinfo=None).isoformat() + "Z"
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, Decimal):
        return str(value)  # a JSON number would go through float and lose digits
    return value


def values_to_json(column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """The JSON-able values of a struct ``value`` column (None for a tombstone)."""
    kind = column.type
    return [value_to_json(v, kind) for v in column.to_pylist()]


# --------------------------------------------------------------------------- JSON to values


def _refuse(path: str, given: Any, what: str) -> InvalidRecordError:
    return InvalidRecordError(f"field {path!r} holds {given!r}, which is not {what}")


def _timestamp(text: str, path: str) -> datetime:
    # Python 3.10's fromisoformat takes no "Z"; a time without a zone is UTC, as everywhere in plog.
    iso = text[:-1] + "+00:00" if text[-1:] in ("Z", "z") else text
    try:
        stamp = datetime.fromisoformat(iso)
    except ValueError:
        raise _refuse(path, text, "an ISO 8601 timestamp (e.g. 2024-05-01T12:00:00.250Z)") from None
    return stamp.replace(tzinfo=timezone.utc) if stamp.tzinfo is None else stamp


def _from_json(value: Any, kind: pa.DataType, path: str, nested: bool) -> Any:
    """``value``, parsed from JSON with ``parse_float=Decimal``, converted for Arrow type ``kind``.

    Refused here, naming the field: a timestamp or date that is not an ISO 8601 string, a string that
    is not the base64 or decimal its type asks for, and (``nested``) a value of another Python type
    than the field's. A top-level field of another type is left as it is, for the producer's check
    to refuse with the topic and schema version; nested values need the check here because Arrow
    would take some silently (1.5 for an int32 is 1, true for a double is 1.0).
    """
    if value is None:
        return None
    if pa.types.is_timestamp(kind):
        if not isinstance(value, str):  # Arrow would take a number as microseconds: a silent guess
            raise _refuse(path, _plain(value), "an ISO 8601 timestamp string (e.g. 2024-05-01T12:00:00.250Z)")
        return _timestamp(value, path)
    if pa.types.is_date(kind):
        if not isinstance(value, str):  # Arrow would take a number as days since 1970
            raise _refuse(path, _plain(value), "an ISO 8601 date string (e.g. 2024-05-01)")
        try:
            return date.fromisoformat(value)
        except ValueError:
            raise _refuse(path, value, "an ISO 8601 date (e.g. 2024-05-01)") from None
    if pa.types.is_binary(kind) and isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise _refuse(path, value, "base64 (binary fields are given as standard base64)") from None
    if pa.types.is_decimal(kind) and isinstance(value, str):
        try:
            return Decimal(value)
        except InvalidOperation:
            raise _refuse(path, value, f"a decimal number ({kind})") from None
    if pa.types.is_list(kind) and isinstance(value, list):
        return [_from_json(item, kind.value_type, f"{path}[]", True) for item in value]
    if pa.types.is_struct(kind) and isinstance(value, dict):
        names = [kind.field(i).name for i in range(kind.num_fields)]
        unknown = sorted(set(value) - set(names))
        if unknown:  # pyarrow would silently drop them; the top level refuses unknown fields, so does this
            raise InvalidRecordError(f"field {path!r} has unknown field(s) {unknown}; it has {names}")
        return {name: _from_json(value[name], kind.field(name).type, f"{path}.{name}", True) for name in value}
    if pa.types.is_map(kind) and (
        isinstance(value, dict) or (isinstance(value, list) and all(isinstance(p, list) and len(p) == 2 for p in value))
    ):
        pairs = value.items() if isinstance(value, dict) else value
        return [
            (_from_json(k, kind.key_type, f"{path} key", True), _from_json(v, kind.item_type, f"{path}{{}}", True))
            for k, v in pairs
        ]
    if pa.types.is_floating(kind) and isinstance(value, Decimal):
        value = float(value)
    plain = value if pa.types.is_decimal(kind) else _plain(value)  # a Decimal is exact: keep it
    if nested:
        types = python_types(kind)
        if not isinstance(plain, types) or (isinstance(plain, bool) and bool not in types):
            raise _refuse(path, plain, str(kind))
    return plain


def _plain(value: Any) -> Any:
    """A value as plain JSON would give it: JSON numbers with a fraction are floats, not Decimals."""
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def value_from_json(obj: dict[str, Any], value_type: pa.StructType) -> dict[str, Any]:
    """A typed value from a JSON object (parsed with ``parse_float=Decimal``, so decimals stay exact).

    Known fields are converted as the module's table says; unknown top-level fields are kept, for
    the producer's check to refuse with the schema's field list. Raises
    :class:`~segment_format.errors.InvalidRecordError` naming the field of a string that claims a
    timestamp, date, base64 or decimal it is not, or of an unknown nested field.
    """
    out = {}
    for name, item in obj.items():
        index = value_type.get_field_index(name)
        out[name] = _plain(item) if index < 0 else _from_json(item, value_type.field(index).type, name, False)
    return out


# --------------------------------------------------------------------------- schemas as DDL


def _quote(name: str) -> str:
    # The DDL parser takes bare identifiers or `backquoted` names.
    return name if name.isidentifier() and name.isascii() else f"`{name}`"


def type_ddl(kind: pa.DataType) -> str:
    """Arrow type ``kind`` in the Spark DDL that ``--value-schema`` takes (``BIGINT``, ``ARRAY<STRING>``...)."""
    simple = {
        pa.bool_(): "BOOLEAN",
        pa.int8(): "TINYINT",
        pa.int16(): "SMALLINT",
        pa.int32(): "INT",
        pa.int64(): "BIGINT",
        pa.float32(): "FLOAT",
        pa.float64(): "DOUBLE",
        pa.utf8(): "STRING",
        pa.binary(): "BINARY",
        pa.date32(): "DATE",
        pa.timestamp("us", tz="UTC"): "TIMESTAMP",
    }
    for arrow, ddl in simple.items():
        if kind.equals(arrow):
            return ddl
    if pa.types.is_decimal(kind):
        return f"DECIMAL({kind.precision},{kind.scale})"
    if pa.types.is_list(kind):
        return f"ARRAY<{type_ddl(kind.value_type)}>"
    if pa.types.is_map(kind):
        return f"MAP<{type_ddl(kind.key_type)},{type_ddl(kind.item_type)}>"
    if pa.types.is_struct(kind):
        return "STRUCT<" + ", ".join(field_ddl(kind.field(i)) for i in range(kind.num_fields)) + ">"
    return str(kind)  # not a value schema type (check_schema refuses it): shown as Arrow names it


def field_ddl(field: pa.Field) -> str:
    """``name TYPE`` with ``NOT NULL`` for a non-nullable field."""
    return f"{_quote(field.name)} {type_ddl(field.type)}" + ("" if field.nullable else " NOT NULL")


def schema_ddl(schema: pa.Schema) -> str:
    """A value schema as a DDL string that ``--value-schema`` reads back to the same schema.

    (DDL cannot say that list items or map values are not null; a schema imported from Avro or JSON
    Schema with such items reads back with nullable ones.)
    """
    return ", ".join(field_ddl(field) for field in schema)


__all__ = [
    "field_ddl",
    "schema_ddl",
    "type_ddl",
    "value_from_json",
    "value_to_json",
    "values_to_json",
]
