"""How a typed topic's records are stored and read (PROTOCOL.md 11.8, *Stored columns* and *Reading*).

In memory a typed record looks like an untyped one whose ``value`` is a struct of the value
schema's fields (null for a tombstone); on storage the fields are top-level columns, so that a
reader of two fields decodes two::

    in memory (logical)                       stored (one IPC stream per object, one version)
    offset      int64                         offset            int64
    timestamp   timestamp[ms, UTC]            timestamp         timestamp[ms, UTC]
    key         binary                        key               binary
    value       struct<f1, f2, ...> (null:    headers           list<struct<key, value>>
                tombstone)                    __plog_tombstone  bool, not null
    headers     list<struct<key, value>>      f1, f2, ...       the fields of version v, nullable

    schema metadata of the stored stream: {"plog.value_schema_version": "<v>"}

Keeping the logical shape of section 5 (``value`` in the fourth column) is what lets chains,
offsets, transactions and compaction work on typed batches unchanged: a tombstone is a null
``value`` in both.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime
from decimal import Decimal
from functools import lru_cache
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import CorruptRecordError, IncompatibleSchemaError, InvalidRecordError
from ..records import RECORD_SCHEMA
from .value_schema import SchemaEntry, decode_schema, reads_type

TOMBSTONE_COLUMN = "__plog_tombstone"
VERSION_METADATA_KEY = b"plog.value_schema_version"
#: Stored columns before the value fields, in order; the fields start at _FIELDS_AT.
_LEADING = ("offset", "timestamp", "key", "headers")
_FIELDS_AT = len(_LEADING) + 1


class TypedLayout:
    """The stored and in-memory schemas of one value schema version, and the conversions between them."""

    def __init__(self, version: int, encoded: str) -> None:
        self.version = version
        self.encoded = encoded
        self.value_schema = decode_schema(encoded)
        self.names = tuple(self.value_schema.names)
        #: The in-memory ``value`` type: every field nullable, as a tombstone's fields are null.
        self.value_type = pa.struct([pa.field(f.name, f.type) for f in self.value_schema])
        self.logical_schema = pa.schema(
            [
                RECORD_SCHEMA.field(n) if n != "value" else pa.field("value", self.value_type)
                for n in RECORD_SCHEMA.names
            ]
        )
        self.payload_schema = pa.schema(
            [self.logical_schema.field(n) for n in ("timestamp", "key", "value", "headers")]
        )
        self.stored_schema = pa.schema(
            [
                *(RECORD_SCHEMA.field(n) for n in _LEADING),
                pa.field(TOMBSTONE_COLUMN, pa.bool_(), nullable=False),
                *(pa.field(f.name, f.type) for f in self.value_schema),
            ],
            metadata={VERSION_METADATA_KEY: str(version).encode()},
        )
        self.schema_bytes = self.stored_schema.serialize().to_pybytes()
        #: The fields that get per-batch statistics: the top-level ones of a primitive type (11.8).
        self.stats_fields = tuple(f.name for f in self.value_schema if not pa.types.is_nested(f.type))
        self.stats_type = pa.struct(
            [
                pa.field(
                    name,
                    pa.struct(
                        [
                            pa.field("min", self.value_schema.field(name).type),
                            pa.field("max", self.value_schema.field(name).type),
                            pa.field("null_count", pa.int64(), nullable=False),
                        ]
                    ),
                )
                for name in self.stats_fields
            ]
        )
        self._required = [i for i, f in enumerate(self.value_schema) if not f.nullable]
        self._name_set = frozenset(self.names)
        self._python_checks = {f.name: (python_types(f.type), not f.nullable) for f in self.value_schema}

    # ------------------------------------------------------------------ storage

    def to_stored(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """A logical batch (value struct of this version) as its stored columns."""
        value = batch.column(3)
        tombstone = value.is_null()
        fields = value.flatten() if len(self.names) else []  # parent nulls propagated: a tombstone's fields are null
        columns = [batch.column(0), batch.column(1), batch.column(2), batch.column(4), tombstone, *fields]
        return pa.RecordBatch.from_arrays(columns, schema=self.stored_schema)

    def from_stored(
        self, batch: pa.RecordBatch, fields: Sequence[str] | None = None, *, key: str | None = None
    ) -> pa.RecordBatch:
        """A stored batch as a logical one; ``fields``: the stored batch holds only those value fields.

        Checks what 11.8 asks of readers: a tombstone's fields are null, and every other record has a
        value in each field its version marks non-nullable (else ``CorruptRecordError``).
        """
        # IPC decodes the included columns in stored order, whatever order ``fields`` names them in.
        names = self.names if fields is None else tuple(sorted(fields, key=self.names.index))
        value_type = self.value_type if fields is None else pa.struct([self.value_type.field(n) for n in names])
        # By position, not name: a value field may be called like a record column ("key", "offset"...).
        tombstone = batch.column(_FIELDS_AT - 1)
        n_tombstones = int(pc.sum(tombstone).as_py() or 0)
        columns = [batch.column(_FIELDS_AT + i) for i in range(len(names))]  # decoded in schema order
        for name, column in zip(names, columns, strict=True):
            if (
                n_tombstones
                and column.null_count < batch.num_rows
                and bool(pc.any(pc.and_(tombstone, column.is_valid())).as_py())
            ):
                raise CorruptRecordError(
                    f"a tombstone of value schema version {self.version} has field {name!r} set", key=key
                )
            if self.value_schema.field(name).nullable is False and column.null_count > n_tombstones:
                raise CorruptRecordError(
                    f"field {name!r} is null in a record of value schema version {self.version}, "
                    "which marks it not null",
                    key=key,
                )
        value = pa.StructArray.from_arrays(columns, fields=list(value_type), mask=tombstone)
        return pa.RecordBatch.from_arrays(
            [batch.column(0), batch.column(1), batch.column(2), value, batch.column(3)],
            schema=pa.schema(
                [*self.logical_schema][:3] + [pa.field("value", value_type), self.logical_schema.field(4)]
            ),
        )

    def batch_stats(self, stored: pa.RecordBatch) -> dict[str, dict[str, Any]]:
        """A stored batch's ``value_stats`` entry (PROTOCOL.md 11.8, *Filtering on fields*): per primitive
        field its least and greatest non-null value (NaN excluded; null when there is none) and null count."""
        out = {}
        for name in self.stats_fields:
            column = stored.column(_FIELDS_AT + self.names.index(name))
            if column.null_count == len(column):
                low = high = None
            else:
                bounds = pc.min_max(column)
                low, high = _plain(bounds["min"]), _plain(bounds["max"])
                if isinstance(low, float) and low != low:  # only NaNs: min_max skips NaN unless all are
                    low = high = None
            out[name] = {"min": low, "max": high, "null_count": column.null_count}
        return out

    def stored_indices(self, fields: Sequence[str] | None) -> list[int] | None:
        """Column positions of the stored stream to decode for ``fields`` (None: all)."""
        if fields is None:
            return None
        return [*range(len(_LEADING) + 1), *(len(_LEADING) + 1 + self.names.index(n) for n in fields)]

    # ------------------------------------------------------------------ writing

    def conform(self, value: pa.Array | pa.ChunkedArray, topic: str) -> pa.Array:
        """``value`` (a struct column) as exactly this version's value type, or ``InvalidRecordError``
        naming the field, the value's type and the version (PROTOCOL.md 11.8, *Checked on write*).

        Fields match by name; a missing nullable field is null; an unknown field, a missing
        non-nullable one, a null in a non-nullable field of a record that is not a tombstone, or a
        type that is neither this one nor a widening of it (or the same values in another Arrow
        representation: large strings, other timestamp units or zones) is refused.
        """
        if isinstance(value, pa.ChunkedArray):
            value = pa.concat_arrays(value.chunks) if value.num_chunks != 1 else value.chunk(0)
        where = f"topic {topic!r} (value schema version {self.version})"
        if value.type.equals(self.value_type):
            self._check_required(value, where)
            return value
        if not pa.types.is_struct(value.type):
            raise InvalidRecordError(f"{where}: the value must be a struct of {list(self.names)}, not {value.type}")
        given = {value.type.field(i).name: i for i in range(value.type.num_fields)}
        unknown = sorted(set(given) - set(self.names))
        if unknown:
            raise InvalidRecordError(f"{where}: unknown field(s) {unknown}; the schema has {list(self.names)}")
        children = value.flatten()
        columns = []
        for field in self.value_type:
            if field.name not in given:
                if not self.value_schema.field(field.name).nullable:
                    raise InvalidRecordError(f"{where}: non-nullable field {field.name!r} is missing")
                columns.append(pa.nulls(len(value), field.type))
                continue
            columns.append(_cast_field(children[given[field.name]], field, where))
        out = pa.StructArray.from_arrays(columns, fields=list(self.value_type), mask=value.is_null())
        self._check_required(out, where)
        return out

    def _check_required(self, value: pa.Array, where: str) -> None:
        if not self._required:
            return
        tombstones = value.null_count
        for i in self._required:
            child = value.field(i)
            if child.null_count > tombstones or (
                tombstones and bool(pc.any(pc.and_(value.is_valid(), child.is_null())).as_py())
            ):
                row = pc.index(pc.and_(value.is_valid(), child.is_null()), True).as_py()
                raise InvalidRecordError(
                    f"{where}: field {self.names[i]!r} is not nullable, but record {row} has no value for it"
                )

    def check_python_value(self, value: Any, topic: str) -> None:
        """Refuse, naming the field, a ``send`` value (a dict of fields, or None) that cannot conform:
        an unknown field, a missing or null non-nullable one, a value of a type that cannot be the
        field's. Cheap, per record; what only Arrow can judge (an int out of an int32's range, say)
        is judged when the batch is built."""
        if value is None:
            return
        if not isinstance(value, dict):
            raise InvalidRecordError(
                f"topic {topic!r} (value schema version {self.version}): a value is a dict of fields "
                f"{list(self.names)} or None (a tombstone), not {type(value).__name__}"
            )
        for name, (types, required) in self._python_checks.items():
            item = value.get(name)
            if item is None:
                if required:
                    raise InvalidRecordError(
                        f"topic {topic!r} (value schema version {self.version}): field {name!r} is not nullable "
                        "and has no value"
                    )
            elif not isinstance(item, types) or (isinstance(item, bool) and bool not in types):
                raise InvalidRecordError(
                    f"topic {topic!r} (value schema version {self.version}): field {name!r} holds {item!r} of "
                    f"type {type(item).__name__}, which is not {self.value_type.field(name).type}"
                )
        if len(value) > len(self.names) or not self._name_set.issuperset(value):
            raise InvalidRecordError(
                f"topic {topic!r} (value schema version {self.version}): unknown field(s) "
                f"{sorted(set(value) - self._name_set)}; the schema has {list(self.names)}"
            )

    def values_from_python(self, values: Sequence[Any], topic: str) -> pa.Array:
        """Python values (a dict per record, None for a tombstone) as a conformed value column."""
        where = f"topic {topic!r} (value schema version {self.version})"
        names = set(self.names)
        for row, value in enumerate(values):
            if value is None:
                continue
            if not isinstance(value, dict):
                raise InvalidRecordError(
                    f"{where}: a value is a dict of fields {list(self.names)} or None, "
                    f"not {type(value).__name__} (record {row})"
                )
            if not names.issuperset(value):
                raise InvalidRecordError(
                    f"{where}: unknown field(s) {sorted(set(value) - names)} in record {row}; "
                    f"the schema has {list(self.names)}"
                )
        try:
            array = pa.array(values, type=self.value_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            raise InvalidRecordError(_python_culprit(self, values, where)) from None
        self._check_required(array, where)
        return array


def _plain(scalar: pa.Scalar) -> Any:
    """A statistics bound as a value the index row can hold: dates and times as their integer count
    (Python's datetime stops at year 9999, Arrow's does not), everything else as Python's value."""
    if pa.types.is_temporal(scalar.type):
        return scalar.cast(pa.int64() if pa.types.is_timestamp(scalar.type) else pa.int32()).as_py()
    return scalar.as_py()


def _python_culprit(layout: TypedLayout, values: Sequence[Any], where: str) -> str:
    """Which field and value of ``values`` pyarrow could not take, for the error message."""
    for field in layout.value_type:
        for row, value in enumerate(values):
            if value is None or value.get(field.name) is None:
                continue
            item = value[field.name]
            try:
                pa.array([item], type=field.type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
                return (
                    f"{where}: field {field.name!r} holds {item!r}, which is not {field.type} "
                    f"(record {row}, a {type(item).__name__}: {exc})"
                )
    return f"{where}: the values do not conform to the schema {layout.value_schema}"


def _cast_field(column: pa.Array, field: pa.Field, where: str) -> pa.Array:
    """``column`` as ``field``'s type when it is that type, a widening, or the same values differently kept."""
    if column.type.equals(field.type):
        return column
    if _implicit(column.type, field.type):
        try:
            return pc.cast(column, field.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise InvalidRecordError(f"{where}: field {field.name!r} of type {column.type}: {exc}") from None
    raise InvalidRecordError(
        f"{where}: field {field.name!r} holds values of type {column.type}, the schema says {field.type} "
        "(cast the column first: only widenings are implicit)"
    )


def _implicit(given: pa.DataType, target: pa.DataType) -> bool:
    """Whether a write may take ``given`` values for a ``target`` field without the user casting."""
    if reads_type(target, given):
        return True
    same_values = {
        pa.utf8(): (pa.types.is_large_string, pa.types.is_string_view),
        pa.binary(): (pa.types.is_large_binary, pa.types.is_binary_view),
    }
    if any(check(given) for check in same_values.get(target, ())):
        return True
    if pa.types.is_timestamp(target) and pa.types.is_timestamp(given):
        return given.tz is not None  # an instant in any unit or zone; a zoneless one is ambiguous
    if pa.types.is_list(target) and (pa.types.is_list(given) or pa.types.is_large_list(given)):
        return given.value_type.equals(target.value_type) or _implicit(given.value_type, target.value_type)
    if pa.types.is_struct(target) and pa.types.is_struct(given):
        names = {target.field(i).name: target.field(i) for i in range(target.num_fields)}
        return all(
            given.field(i).name in names
            and (
                given.field(i).type.equals(names[given.field(i).name].type)
                or _implicit(given.field(i).type, names[given.field(i).name].type)
            )
            for i in range(given.num_fields)
        )
    return False


@lru_cache(maxsize=256)
def layout_for(version: int, encoded: str) -> TypedLayout:
    """The layout of a value schema version (shared: building one serialises a schema)."""
    return TypedLayout(version, encoded)


def entry_layout(entry: SchemaEntry) -> TypedLayout:
    """The layout of a topic's schema entry."""
    return layout_for(entry.version, entry.encoded)


class Projection:
    """What a reader of a typed topic wants: every batch read as one version's schema (``reader``),
    and, optionally, only some of its fields, which are then all that is decoded (PROTOCOL.md 11.8)."""

    def __init__(
        self, reader: TypedLayout, fields: Sequence[str] | None = None, filters: Sequence[FieldFilter] = ()
    ) -> None:
        for name, op, _value in filters:
            if name not in reader.names or op not in _OPS:
                raise InvalidRecordError(
                    f"filter ({name!r}, {op!r}) names no field of {list(reader.names)} or no op of {_OPS}"
                )
        #: Conditions every returned record is meant to meet; batches whose statistics prove none can are
        #: skipped undecoded (PROTOCOL.md 11.8, *Filtering on fields*). The caller still applies them.
        self.filters = tuple(filters)
        if fields is not None:
            unknown = [f for f in fields if f not in reader.names]
            if unknown:
                raise InvalidRecordError(
                    f"unknown value field(s) {unknown}; value schema version {reader.version} has {list(reader.names)}"
                )
        self.reader = reader
        self.fields = None if fields is None else tuple(n for n in reader.names if n in set(fields))
        names = reader.names if self.fields is None else self.fields
        self.value_type = pa.struct([reader.value_type.field(n) for n in names])
        self._null_checks: dict[tuple[int, str], bool] = {}
        self.logical_schema = pa.schema(
            [reader.logical_schema.field(i) if i != 3 else pa.field("value", self.value_type) for i in range(5)]
        )

    def may_match(self, stats: dict[str, Any] | None, layout: TypedLayout, record_count: int) -> bool:
        """False when batch statistics (``value_stats``' entry, None: the object has none) prove that no
        record of the batch meets every filter; True whenever they cannot tell."""
        if self.filters and not self.readable(layout):
            return True  # decoded and read, so that what cannot be read is an error, not a skip
        for name, op, value in self.filters:
            if name not in layout.names:  # the batch's version lacks the field: all null
                if op != "is_null":
                    return False
                continue
            entry = None if stats is None else stats.get(name)
            if entry is None or pa.types.is_floating(layout.value_type.field(name).type):
                continue  # no statistics, or NaN, which Spark orders above everything, is not in them
            try:
                if not _stats_allow(entry, op, value, record_count):
                    return False
            except TypeError:  # a widened type (a date against a timestamp): cannot tell
                continue
        return True

    def checks_nulls(self, layout: TypedLayout) -> bool:
        """Whether data of ``layout``'s version may hold a null where this reader says not null (a
        field it lacks, or marks nullable): its batches are then checked, even when the types match."""
        key = (layout.version, layout.encoded)
        found = self._null_checks.get(key)
        if found is None:
            found = any(
                not self.reader.value_schema.field(name).nullable
                and (name not in layout.names or layout.value_schema.field(name).nullable)
                for name in self.value_type.names
            )
            self._null_checks[key] = found
        return found

    def readable(self, layout: TypedLayout) -> bool:
        """Whether every field read from ``layout``'s version is its reader type or a widening of it and
        needs no null check: only such batches may be skipped by statistics, unread (an unreadable
        batch is an error, never skipped; PROTOCOL.md 11.8)."""
        return not self.checks_nulls(layout) and all(
            name not in layout.names or reads_type(self.value_type.field(name).type, layout.value_type.field(name).type)
            for name in self.value_type.names
        )

    def decode_fields(self, layout: TypedLayout) -> tuple[str, ...] | None:
        """The fields to decode from an object of ``layout``'s version (None: all of them)."""
        if self.fields is None:
            return None
        return tuple(n for n in self.fields if n in layout.names)

    def apply(self, batch: pa.RecordBatch, layout: TypedLayout, what: str = "") -> pa.RecordBatch:
        """A batch decoded from an object of ``layout``'s version (with :meth:`decode_fields`) as this
        projection's schema (:func:`read_as`)."""
        return read_as(batch, layout, self, what=what)


#: A condition on a value field: (field, op, value); ops as in :data:`_OPS` (``in`` takes a list).
FieldFilter = tuple[str, str, Any]
_OPS = ("==", "!=", "<", "<=", ">", ">=", "in", "is_null", "is_not_null")


def _stats_allow(entry: dict[str, Any], op: str, value: Any, record_count: int) -> bool:
    """Whether a batch with these statistics of a field may hold a record where ``field op value``."""
    low, high, nulls = entry["min"], entry["max"], entry["null_count"]
    if op == "is_null":
        return bool(nulls)
    if op == "is_not_null":
        return bool(nulls < record_count)
    if low is None:  # no non-null value: no comparison holds
        return False
    if op == "==":
        return bool(low <= value <= high)
    if op == "!=":
        return not (low == high == value)
    if op == "<":
        return bool(low < value)
    if op == "<=":
        return bool(low <= value)
    if op == ">":
        return bool(high > value)
    if op == ">=":
        return bool(high >= value)
    return any(v is not None and low <= v <= high for v in value)  # "in"


def read_as(batch: pa.RecordBatch, layout: TypedLayout, projection: Projection, *, what: str = "") -> pa.RecordBatch:
    """A logical batch of ``layout``'s version read as ``reader``'s (PROTOCOL.md 11.8, *Reading*).

    Fields the batch's version lacks are null, fields the reader lacks are dropped, narrower types are
    cast up. What cannot be read so (a type the reader's does not widen, a null where the reader's
    schema says not null) raises ``IncompatibleSchemaError`` naming the field and both versions:
    never silently dropped or altered.
    """
    value = batch.column(3)
    out = read_value(value, layout, projection, what=what)
    if out is value and batch.schema.equals(projection.logical_schema):
        return batch
    return _with_value(batch, projection, out)


def read_value(value: pa.Array, layout: TypedLayout, projection: Projection, *, what: str = "") -> pa.Array:
    """A value column of ``layout``'s version read as ``projection``'s (see :func:`read_as`)."""
    reader = projection.reader
    if value.type.equals(projection.value_type) and not projection.checks_nulls(layout):
        return value
    given = {value.type.field(i).name: i for i in range(value.type.num_fields)}
    children = value.flatten()
    columns = []
    for field in projection.value_type:
        name = field.name
        if name not in given:
            column = pa.nulls(len(value), field.type)
        else:
            column = children[given[name]]
            if not column.type.equals(field.type):
                if not reads_type(field.type, column.type):
                    raise IncompatibleSchemaError(
                        f"{what}field {name!r} is {column.type} in value schema version {layout.version}, which "
                        f"version {reader.version} reads as {field.type}: not a widening; read with a newer schema"
                    )
                column = pc.cast(column, field.type)
        if not reader.value_schema.field(name).nullable and column.null_count > value.null_count:
            raise IncompatibleSchemaError(
                f"{what}field {name!r} is null in a record of value schema version {layout.version}, "
                f"which version {reader.version} reads as not nullable"
            )
        columns.append(column)
    return pa.StructArray.from_arrays(columns, fields=list(projection.value_type), mask=value.is_null())


def _with_value(batch: pa.RecordBatch, projection: Projection, value: pa.Array) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [batch.column(0), batch.column(1), batch.column(2), value, batch.column(4)], schema=projection.logical_schema
    )


#: Columns of a user table that are not value fields (the record's other parts and its routing).
RECORD_COLUMNS = ("key", "timestamp", "headers", "partition", "topic")


def typed_payload(table: pa.Table, layout: TypedLayout, topic: str) -> pa.Table:
    """A user table for a typed topic as payload columns (``layout.payload_schema``), checked.

    The value is either a struct column ``value`` (a null struct is a tombstone) or the fields as
    top-level columns: every column that is not one of :data:`RECORD_COLUMNS`. Key, timestamp and
    headers are taken as for untyped topics (:func:`~segment_format.records.normalize_payload`).
    """
    names = table.column_names
    if "value" in names and pa.types.is_struct(table.column("value").type):
        unknown = [n for n in names if n not in (*RECORD_COLUMNS, "value")]
        if unknown:
            raise InvalidRecordError(
                f"topic {topic!r}: unexpected column(s) {unknown} beside the struct column 'value'; "
                "give the fields either inside 'value' or as top-level columns"
            )
        value: pa.Array = _one_chunk(table.column("value"))
    else:
        fields = [n for n in names if n not in RECORD_COLUMNS]
        if not fields:
            raise InvalidRecordError(
                f"topic {topic!r}: the data has no value fields; the schema has {list(layout.names)}"
            )
        value = pa.StructArray.from_arrays([_one_chunk(table.column(n)) for n in fields], names=fields)
    return payload_with_value(table, layout.conform(value, topic), layout)


def payload_with_value(table: pa.Table, value: pa.Array, layout: TypedLayout) -> pa.Table:
    """Payload columns (``layout.payload_schema``): ``table``'s key, timestamp and headers, taken as for
    untyped topics (:func:`~segment_format.records.normalize_payload`), and ``value``, already conformed."""
    from ..records import normalize_payload  # records is below this module; imported here to keep that order

    kept = [n for n in table.column_names if n in ("key", "timestamp", "headers")]
    base = normalize_payload(table.select(kept).append_column("value", pa.nulls(table.num_rows, pa.binary())))
    return pa.Table.from_arrays([base.column(0), base.column(1), value, base.column(3)], schema=layout.payload_schema)


def _one_chunk(column: pa.ChunkedArray) -> pa.Array:
    return column.chunk(0) if column.num_chunks == 1 else pa.concat_arrays(column.chunks)


#: Python types a value of each Arrow type may be given as (checked per record on ``send``).
_PYTHON_TYPES: list[tuple[Any, tuple[type, ...]]] = [
    (pa.types.is_boolean, (bool,)),
    (pa.types.is_integer, (int,)),
    (pa.types.is_floating, (float, int)),
    (pa.types.is_string, (str,)),
    (pa.types.is_binary, (bytes, bytearray, memoryview)),
    (pa.types.is_decimal, (Decimal, int)),
    (pa.types.is_date, (date,)),
    (pa.types.is_timestamp, (datetime, date)),
    (pa.types.is_list, (list, tuple)),
    (pa.types.is_struct, (dict,)),
    (pa.types.is_map, (dict, list)),
]


def python_types(kind: pa.DataType) -> tuple[type, ...]:
    """The Python types a value of Arrow type ``kind`` may be given as."""
    for check, types in _PYTHON_TYPES:
        if check(kind):
            return types
    return (object,)
