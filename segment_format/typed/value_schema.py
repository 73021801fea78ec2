"""Value schemas of typed topics (PROTOCOL.md 11.8): the allowed types, DDL strings, the stored form,
and the evolution check.

A value schema is a :class:`pyarrow.Schema`; the topic metadata keeps every version as the
base64 of its IPC schema message (:func:`encode_schema`), and a change is accepted only when
:func:`evolution_problems` finds nothing under the topic's compatibility mode.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from functools import lru_cache

import pyarrow as pa

from ..errors import InvalidConfigError

#: Confluent's compatibility modes (PROTOCOL.md 11.8); BACKWARD is the default.
COMPATIBILITY_MODES = (
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
    "NONE",
)

#: Prefix no value field may use: plog's own stored columns (``__plog_tombstone``) start with it.
RESERVED_PREFIX = "__plog"

_DDL_TYPES: dict[str, pa.DataType] = {
    "BOOLEAN": pa.bool_(),
    "TINYINT": pa.int8(),
    "BYTE": pa.int8(),
    "SMALLINT": pa.int16(),
    "SHORT": pa.int16(),
    "INT": pa.int32(),
    "INTEGER": pa.int32(),
    "BIGINT": pa.int64(),
    "LONG": pa.int64(),
    "FLOAT": pa.float32(),
    "REAL": pa.float32(),
    "DOUBLE": pa.float64(),
    "STRING": pa.utf8(),
    "BINARY": pa.binary(),
    "DATE": pa.date32(),
    "TIMESTAMP": pa.timestamp("us", tz="UTC"),
}

#: Each type's widenings (PROTOCOL.md 11.8, *Reading*): a reader of the key's type reads values of these.
_WIDER = {
    pa.int8(): (pa.int16(), pa.int32(), pa.int64()),
    pa.int16(): (pa.int32(), pa.int64()),
    pa.int32(): (pa.int64(),),
    pa.float32(): (pa.float64(),),
    pa.date32(): (pa.timestamp("us", tz="UTC"),),
}


class _Tokens:
    """A cursor over a DDL string's tokens: names, punctuation, numbers."""

    _TOKEN = re.compile(r"\s*(`[^`]+`|[A-Za-z_][A-Za-z0-9_]*|\d+|[<>(),:])")

    def __init__(self, text: str) -> None:
        self.text = text
        self.items: list[str] = []
        position = 0
        while position < len(text):
            if text[position:].strip() == "":
                break
            m = self._TOKEN.match(text, position)
            if m is None:
                raise InvalidConfigError(f"value schema DDL: cannot read {text[position : position + 20]!r}")
            self.items.append(m.group(1))
            position = m.end()
        self.at = 0

    def peek(self) -> str | None:
        return self.items[self.at] if self.at < len(self.items) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token.upper() != expected):
            raise InvalidConfigError(
                f"value schema DDL {self.text!r}: expected {expected or 'more'} at token {self.at + 1}, found {token!r}"
            )
        self.at += 1
        return token


def parse_ddl(text: str) -> pa.Schema:
    """A value schema from a Spark-style DDL string: ``"user string, ts timestamp, n int NOT NULL"``."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidConfigError("value schema DDL must be a non-empty string")
    tokens = _Tokens(text)
    fields = _fields(tokens, end=None)
    if tokens.peek() is not None:
        raise InvalidConfigError(f"value schema DDL {text!r}: unexpected {tokens.peek()!r}")
    schema = pa.schema(fields)
    check_schema(schema)
    return schema


def _fields(tokens: _Tokens, end: str | None) -> list[pa.Field]:
    fields = []
    while True:
        name = tokens.take().strip("`")
        if tokens.peek() == ":":
            tokens.take(":")
        kind = _type(tokens)
        nullable = True
        if (tokens.peek() or "").upper() == "NOT":
            tokens.take("NOT")
            tokens.take("NULL")
            nullable = False
        fields.append(pa.field(name, kind, nullable=nullable))
        if tokens.peek() == ",":
            tokens.take(",")
            continue
        if tokens.peek() == end:
            return fields
        raise InvalidConfigError(f"value schema DDL {tokens.text!r}: expected ',' after field {name!r}")


def _type(tokens: _Tokens) -> pa.DataType:
    word = tokens.take().upper()
    if word in _DDL_TYPES:
        return _DDL_TYPES[word]
    if word in ("DECIMAL", "DEC", "NUMERIC"):
        tokens.take("(")
        precision = int(tokens.take())
        tokens.take(",")
        scale = int(tokens.take())
        tokens.take(")")
        return pa.decimal128(precision, scale)
    if word == "ARRAY":
        tokens.take("<")
        item = _type(tokens)
        tokens.take(">")
        return pa.list_(item)
    if word == "MAP":
        tokens.take("<")
        key = _type(tokens)
        tokens.take(",")
        value = _type(tokens)
        tokens.take(">")
        return pa.map_(key, value)
    if word == "STRUCT":
        tokens.take("<")
        fields = _fields(tokens, end=">")
        tokens.take(">")
        return pa.struct(fields)
    raise InvalidConfigError(f"value schema DDL {tokens.text!r}: unknown type {word!r}")


def check_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` if it is a valid value schema (PROTOCOL.md 11.8, *Types*), else ``InvalidConfigError``."""
    if not isinstance(schema, pa.Schema) or len(schema) == 0:
        raise InvalidConfigError("a value schema is a pyarrow.Schema with at least one field")
    names = [field.name for field in schema]
    duplicated = sorted({name for name in names if names.count(name) > 1})
    if duplicated:
        raise InvalidConfigError(f"value schema field names must be unique: {duplicated} appear more than once")
    for field in schema:
        if field.name.startswith(RESERVED_PREFIX):
            raise InvalidConfigError(
                f"value schema field {field.name!r}: names starting {RESERVED_PREFIX!r} are plog's own"
            )
        _check_type(field.name, field.type)
    return schema


def _check_type(name: str, kind: pa.DataType) -> None:
    if kind in _DDL_TYPES.values() or pa.types.is_decimal128(kind):
        return
    if pa.types.is_list(kind):
        return _check_type(f"{name}[]", kind.value_type)
    if pa.types.is_map(kind):
        _check_type(f"{name} key", kind.key_type)
        return _check_type(f"{name} value", kind.item_type)
    if pa.types.is_struct(kind):
        for i in range(kind.num_fields):
            _check_type(f"{name}.{kind.field(i).name}", kind.field(i).type)
        return
    raise InvalidConfigError(
        f"value schema field {name!r} has type {kind}, which typed topics do not store "
        "(PROTOCOL.md 11.8: no unsigned, large or time-of-day types; timestamps are us in UTC)"
    )


def encode_schema(schema: pa.Schema) -> str:
    """The stored form: base64 of the IPC schema message, without metadata (PROTOCOL.md 11.8)."""
    plain = pa.schema([field.remove_metadata() for field in check_schema(schema)])
    return base64.b64encode(plain.serialize().to_pybytes()).decode("ascii")


def decode_schema(text: str) -> pa.Schema:
    """The value schema a stored ``schema`` string holds."""
    try:
        return check_schema(pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text, validate=True))))
    except (ValueError, pa.ArrowException) as exc:
        raise InvalidConfigError(f"stored value schema does not decode: {exc}") from None


def reads_type(reader: pa.DataType, data: pa.DataType) -> bool:
    """Whether a reader of type ``reader`` reads values of type ``data`` (equal, or a widening)."""
    if reader.equals(data) or any(reader.equals(w) for w in _WIDER.get(data, ())):
        return True
    if pa.types.is_decimal128(reader) and pa.types.is_decimal128(data):
        return reader.scale == data.scale and reader.precision >= data.precision
    if pa.types.is_list(reader) and pa.types.is_list(data):
        return reads_type(reader.value_type, data.value_type)
    if pa.types.is_map(reader) and pa.types.is_map(data):
        return reader.key_type.equals(data.key_type) and reads_type(reader.item_type, data.item_type)
    if pa.types.is_struct(reader) and pa.types.is_struct(data):
        return not _direction_problems(_struct_schema(reader), _struct_schema(data), "")
    return False


def _struct_schema(kind: pa.StructType) -> pa.Schema:
    return pa.schema([kind.field(i) for i in range(kind.num_fields)])


def _direction_problems(reader: pa.Schema, data: pa.Schema, context: str) -> list[str]:
    """Why a reader with ``reader`` cannot read data written with ``data`` (PROTOCOL.md 11.8 table)."""
    problems = []
    written = {field.name: field for field in data}
    for field in reader:
        old = written.get(field.name)
        if old is None:
            if not field.nullable:
                problems.append(f"{context}: field {field.name!r} is not nullable, and the data has no such field")
        elif not reads_type(field.type, old.type):
            problems.append(
                f"{context}: field {field.name!r} is read as {field.type} but the data holds {old.type}, "
                "which is neither that type nor a widening of it"
            )
        elif old.nullable and not field.nullable:
            problems.append(f"{context}: field {field.name!r} is read as not nullable, but the data allows nulls")
    return problems


def evolution_problems(entries: list[pa.Schema], new: pa.Schema, mode: str) -> list[str]:
    """What keeps ``new`` from following ``entries`` (oldest first) under ``mode``; empty if allowed.

    Every mode but NONE checks the backward direction against every entry, because readers read all
    history as the newest schema; the forward direction is checked against the last entry, or every
    entry in the ``_TRANSITIVE`` modes (PROTOCOL.md 11.8, *Evolution*).
    """
    if mode not in COMPATIBILITY_MODES:
        raise InvalidConfigError(f"value schema compatibility {mode!r} is not one of {list(COMPATIBILITY_MODES)}")
    check_schema(new)
    if mode == "NONE" or not entries:
        return []
    problems = []
    for n, old in enumerate(entries, 1):
        problems += _direction_problems(new, old, f"backward (the new schema reading version {n}'s data)")
    if mode.startswith(("FORWARD", "FULL")):
        first = 1 if mode.endswith("_TRANSITIVE") else len(entries)
        for n in range(first, len(entries) + 1):
            problems += _direction_problems(entries[n - 1], new, f"forward (version {n} reading the new schema's data)")
    return problems


@dataclass(frozen=True)
class SchemaEntry:
    """One entry of a topic's ``value_schemas`` list (PROTOCOL.md 11.8): a version and its stored schema."""

    version: int
    encoded: str
    created_ms: int

    @property
    def schema(self) -> pa.Schema:
        """The entry's value schema."""
        return _decoded(self.encoded)

    def to_dict(self) -> dict[str, object]:
        """The JSON object stored in the topic metadata (``fields`` is informational)."""
        return {
            "version": self.version,
            "schema": self.encoded,
            "fields": [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in self.schema],
            "created_ms": self.created_ms,
        }


@lru_cache(maxsize=256)
def _decoded(encoded: str) -> pa.Schema:
    return decode_schema(encoded)


@dataclass(frozen=True)
class SchemaHistory:
    """A typed topic's value schemas, oldest first, and its compatibility mode (PROTOCOL.md 11.8).

    The list only grows: :meth:`evolved` checks a new schema against every entry under the mode and
    returns the history with it appended; entries are never changed, so a stored batch's version
    names its schema forever.
    """

    entries: tuple[SchemaEntry, ...]
    compatibility: str = "BACKWARD"

    @classmethod
    def first(cls, schema: pa.Schema, compatibility: str | None, now_ms: int) -> SchemaHistory:
        """The history of a topic created typed: version 1 is ``schema``."""
        mode = check_compatibility(compatibility or "BACKWARD")
        return cls((SchemaEntry(1, encode_schema(schema), now_ms),), mode)

    @classmethod
    def from_json(cls, entries: object, compatibility: object) -> SchemaHistory:
        """Parse the two metadata fields; ``ValueError`` naming what is wrong (the caller reports corruption)."""
        if not isinstance(entries, list) or not entries:
            raise ValueError("value_schemas must be a non-empty array")
        parsed = []
        for n, entry in enumerate(entries, 1):
            if not isinstance(entry, dict) or entry.get("version") != n or not isinstance(entry.get("schema"), str):
                raise ValueError(f"value_schemas entry {n} is not {{'version': {n}, 'schema': <base64>, ...}}")
            created = entry.get("created_ms", 0)
            parsed.append(SchemaEntry(n, entry["schema"], created if isinstance(created, int) else 0))
            _decoded(entry["schema"])  # raises InvalidConfigError (a ValueError) when it does not decode
        mode = compatibility if compatibility is not None else "BACKWARD"
        if mode not in COMPATIBILITY_MODES:
            raise ValueError(f"value_schema_compatibility {mode!r} is not one of {list(COMPATIBILITY_MODES)}")
        return cls(tuple(parsed), str(mode))

    @property
    def current(self) -> SchemaEntry:
        """The newest entry: what writers write and new readers read as."""
        return self.entries[-1]

    def entry(self, version: int) -> SchemaEntry:
        """Entry ``version``; ``InvalidConfigError`` when the topic has no such version."""
        if not 1 <= version <= len(self.entries):
            raise InvalidConfigError(f"value schema version {version} does not exist (versions 1..{len(self.entries)})")
        return self.entries[version - 1]

    def evolved(self, schema: pa.Schema, compatibility: str | None, now_ms: int) -> SchemaHistory:
        """This history with ``schema`` appended (and the mode changed, if given), checked under the
        mode in force now; ``InvalidConfigError`` naming every rule it breaks."""
        problems = evolution_problems([e.schema for e in self.entries], schema, self.compatibility)
        if problems:
            raise InvalidConfigError(
                f"the value schema change is refused under {self.compatibility}: " + "; ".join(problems)
            )
        mode = check_compatibility(compatibility or self.compatibility)
        if encode_schema(schema) == self.current.encoded:
            return SchemaHistory(self.entries, mode)  # the same schema: no new version
        entry = SchemaEntry(len(self.entries) + 1, encode_schema(schema), now_ms)
        return SchemaHistory((*self.entries, entry), mode)


def check_compatibility(mode: object) -> str:
    """``mode`` if it is one of :data:`COMPATIBILITY_MODES` (case-insensitive), upper-cased."""
    if isinstance(mode, str) and mode.upper() in COMPATIBILITY_MODES:
        return mode.upper()
    raise InvalidConfigError(f"value schema compatibility {mode!r} is not one of {list(COMPATIBILITY_MODES)}")


def object_schema_problem(history: SchemaHistory | None, version: int | None, encoded: str | None) -> str | None:
    """Why a segment object stating value schema ``version`` and ``encoded`` (None: untyped) does not
    belong to a topic with value schemas ``history`` (None: untyped), or None when it does (PROTOCOL.md
    11.8: a typed topic holds typed objects only, each with the topic's schema of its version). A version
    beyond ``history`` is a problem too; a caller that may hold old metadata reads it again first."""
    if history is None:
        return None if version is None else f"a typed object in an untyped topic (value schema version {version})"
    if version is None:
        return "an untyped object in a typed topic"
    if version > len(history.entries):
        return f"value schema version {version}, which the topic does not have"
    if history.entry(version).encoded != encoded:
        return f"the object's value schema is not the topic's version {version}"
    return None
