"""The value schema a query reads typed topics as (PROTOCOL.md 11.8, *Reading*).

A query reads every batch of a typed topic as one value schema version: the topic's current one
when the query was defined (``DataSource.schema()``), which is the schema Spark plans with. A
running streaming query keeps it, whatever producers write meanwhile (fields added since are
dropped, a batch it cannot read fails the query); a restart defines the query again and so reads
with the newest version. The chosen version, a *pin* ``(version, encoded schema)`` per topic, goes
into every input partition, so executors never look the schema up themselves.

One query reads typed topics only, or untyped ones only: the ``value`` column cannot be both
binary and a struct. Several typed topics may be read together when their value schemas (as read,
after ``valueFields``) have the same fields and types.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
from pyspark.sql.types import StructType

from pyspark_logsource.spark.conversion import check_source_schema, spark_schema, typed_spark_schema
from pyspark_logsource.spark.option_schema import option_error
from pyspark_logsource.spark.options import SourceOptions
from pyspark_logsource.spark.planning import discover
from segment_format.errors import InvalidRecordError, UnknownTopicOrPartitionError
from segment_format.root import LogRoot
from segment_format.topic import TopicMetadata
from segment_format.typed.layout import Projection, entry_layout
from segment_format.typed.value_schema import SchemaEntry

#: A value schema version as input partitions carry it: (version number, encoded schema).
Pin = tuple[int, str]


def _read_type(entry: SchemaEntry, fields: tuple[str, ...] | None, topic: str) -> pa.StructType:
    """The value type a read of ``entry`` with ``valueFields`` gives (the option's error names unknown fields)."""
    try:
        return Projection(entry_layout(entry), fields).value_type
    except InvalidRecordError:
        names = entry.schema.names
        unknown = [f for f in fields or () if f not in names]
        raise option_error(
            "valueFields",
            f"unknown value field(s) {unknown}: topic {topic!r} (value schema version {entry.version}) has {names}",
        ) from None


class ReaderSchema:
    """What a query reads: untyped topics (``value_type`` None), or typed ones with values of ``value_type``.

    ``pins`` holds, per typed topic, the value schema version its batches are read as. Topics a
    pattern subscription finds later are pinned when first planned, to their newest version that
    reads as ``value_type``.
    """

    def __init__(self, value_type: pa.StructType | None = None, pins: Mapping[str, Pin] | None = None) -> None:
        self.value_type = value_type
        self.pins: dict[str, Pin] = dict(pins or {})

    @property
    def typed(self) -> bool:
        """Whether the query reads typed topics."""
        return self.value_type is not None

    def spark_schema(self, opts: SourceOptions) -> StructType:
        """The query's Spark schema."""
        if self.value_type is None:
            return spark_schema(opts.include_headers)
        return typed_spark_schema(self.value_type, opts.include_headers, opts.flatten_value)

    def pin_for(self, meta: TopicMetadata, opts: SourceOptions) -> Pin | None:
        """The version ``meta``'s topic is read as (None: untyped); an error if it does not fit the query."""
        history = meta.schema_history
        if (history is None) != (self.value_type is None):
            kind = "typed" if history is not None else "untyped"
            raise option_error(
                opts.subscription.kind,
                f"topic {meta.name!r} is {kind}, but the query reads {'un' if history is not None else ''}typed "
                "topics (its schema was fixed when it was defined): read typed and untyped topics in separate "
                "queries",
            )
        if history is None:
            return None
        pin = self.pins.get(meta.name)
        if pin is not None:
            return pin
        for entry in reversed(history.entries):
            try:
                kind_read = _read_type(entry, opts.value_fields, meta.name)
            except ValueError:  # the option's error: this version lacks a field of valueFields
                continue
            if kind_read.equals(self.value_type):
                pin = self.pins[meta.name] = (entry.version, entry.encoded)
                return pin
        raise option_error(
            opts.subscription.kind,
            f"no value schema version of topic {meta.name!r} reads as the query's value "
            f"{self.value_type}: restart the query to read with the topics' current schemas",
        )


def _typed_or_untyped(metas: Mapping[str, TopicMetadata], opts: SourceOptions) -> bool:
    """Whether the topics are typed (all of them) or untyped (all of them); an error naming both kinds if mixed."""
    typed = sorted(name for name, meta in metas.items() if meta.schema_history is not None)
    untyped = sorted(name for name, meta in metas.items() if meta.schema_history is None)
    if typed and untyped:
        raise option_error(
            opts.subscription.kind,
            f"covers typed topics {typed} and untyped topics {untyped}: a query reads one kind "
            "(the value column is a struct or binary); read them in separate queries",
        )
    if not typed:
        for name, given in (("flattenValue", opts.flatten_value), ("valueFields", opts.value_fields)):
            if given:
                what = f"untyped topics {untyped}" if untyped else "no existing topic"
                raise option_error(name, f"applies to typed topics only, and the subscription covers {what}")
    return bool(typed)


def _topics(root: LogRoot, opts: SourceOptions) -> dict[str, TopicMetadata]:
    """The subscription's topics that exist now (unknown ones are reported when the query plans)."""
    try:
        found = discover(root, opts.subscription, refresh=True, require=False)
    except UnknownTopicOrPartitionError:
        return {}
    return {tp[0]: meta for tp, meta in sorted(found.items())}


def current_reader_schema(root: LogRoot, opts: SourceOptions) -> ReaderSchema:
    """The schema a query defined now reads: every typed topic's current value schema version.

    Typed topics read together must read as the same value type; an error naming them otherwise.
    """
    metas = _topics(root, opts)
    if not _typed_or_untyped(metas, opts):
        return ReaderSchema()
    types: dict[str, pa.StructType] = {}
    pins: dict[str, Pin] = {}
    for name, meta in metas.items():
        assert meta.schema_history is not None
        entry = meta.schema_history.current
        types[name] = _read_type(entry, opts.value_fields, name)
        pins[name] = (entry.version, entry.encoded)
    first = next(iter(types))
    differ = [name for name, kind in types.items() if not kind.equals(types[first])]
    if differ:
        raise option_error(
            opts.subscription.kind,
            f"typed topics {sorted(types)} have different value schemas ({first!r}: {types[first]}; "
            + "; ".join(f"{name!r}: {types[name]}" for name in differ)
            + "): read them in separate queries, or read the same fields of each with valueFields",
        )
    reading = ReaderSchema(types[first], pins)
    reading.spark_schema(opts)  # flattenValue's name collisions fail the query's definition
    return reading


def reader_schema_for(root: LogRoot, opts: SourceOptions, schema: StructType) -> ReaderSchema:
    """The reader schema that gives Spark's ``schema``, found in the topics' value schema histories.

    For a reader whose data source did not keep the one :meth:`DataSource.schema` chose (a schema the
    user gave with ``.schema(...)``, for one): each typed topic's newest version that reads as it.
    """
    metas = _topics(root, opts)
    if not _typed_or_untyped(metas, opts):
        check_source_schema(schema, opts)
        return ReaderSchema()
    tried: list[str] = []
    for name, meta in metas.items():
        assert meta.schema_history is not None
        for entry in reversed(meta.schema_history.entries):
            try:
                candidate = ReaderSchema(_read_type(entry, opts.value_fields, name))
            except ValueError:
                continue
            if candidate.spark_schema(opts) == schema:
                for other in metas.values():  # every topic must read as it, else an error naming the topic
                    candidate.pin_for(other, opts)
                return candidate
            tried.append(f"{name} v{entry.version}")
        break  # the first topic decides the value type; the others are checked against it above
    raise option_error(
        "schema",
        f"{schema.simpleString()} is not the schema of any value schema version of the typed topics "
        f"(tried {', '.join(tried)}): leave the schema out to read with the current one",
    )
