"""Topics: configuration and versioned metadata (PROTOCOL.md 4).

Topic metadata is a chain of immutable JSON objects ``meta/<version>.json``,
each created with put-if-absent; the highest version is current. Version 0 is
the creation, so two concurrent ``create_topic`` calls cannot both succeed.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import pyarrow as pa

from . import numbered
from .config import ConfigKey, ConfigSchema, boolean_from_text, integer_from_text, is_type
from .documents import JsonDocument
from .errors import (
    CorruptRecordError,
    InvalidConfigError,
    ObjectNotFoundError,
    PlogError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from .layout import topic_meta_key, topic_meta_prefix, topic_prefix, validate_topic_name
from .notice import write_notices, write_root_notice
from .protocol import INITIAL, RootProtocol
from .records import now_ms
from .segment import COMPRESSIONS
from .stores.base import Store
from .typed.value_schema import SchemaHistory

DAY_MS = 24 * 3600 * 1000


def _staleness_below_delete_delay(config: dict[str, Any], schema: ConfigSchema) -> None:
    """Assumption A4: W < D, or a writer's stale knowledge could outlive the objects it refers to."""
    if config["file.delete.delay.ms"] and config["writer.max.staleness.ms"] >= config["file.delete.delay.ms"]:
        raise InvalidConfigError(
            "writer.max.staleness.ms must be below file.delete.delay.ms (PROTOCOL.md 2, assumption A4)"
        )


def _compaction_lags_ordered(config: dict[str, Any], schema: ConfigSchema) -> None:
    """PROTOCOL.md 11.6: a record cannot have to stay longer than it may stay uncompacted."""
    if config["min.compaction.lag.ms"] > config["max.compaction.lag.ms"]:
        raise schema.error(
            "min.compaction.lag.ms",
            config["min.compaction.lag.ms"],
            f"is above max.compaction.lag.ms={config['max.compaction.lag.ms']}",
        )


def _ratio_from_text(value: Any) -> float:
    # Command lines and Spark options give numbers as text.
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            raise ValueError("is not a number") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError("is not a number")
    return float(value)


def is_compacted(config: dict[str, Any]) -> bool:
    """Whether a topic config's ``cleanup.policy`` includes ``compact`` (PROTOCOL.md 11.6)."""
    return "compact" in str(config.get("cleanup.policy", "delete")).split(",")


#: ``max.compaction.lag.ms``'s default: unbounded, written as the largest int64 (PROTOCOL.md 11.6).
UNBOUNDED_MS = 2**63 - 1


def _int_key(name: str, default: int, minimum: int, doc: str) -> ConfigKey:
    # Values typed on a command line arrive as text: "2048" and 60000.0 are integers too.
    return ConfigKey(name, int, default, doc, minimum=minimum, parse=integer_from_text)


#: Topic configuration (Kafka's names and, where sensible, defaults); PROTOCOL.md 4 has the same table.
#: ``storage.layout`` values (PROTOCOL.md 4, 7.3).
SHARED = "shared"
PARTITIONED = "partitioned"
#: The protocol feature shared topics need (PROTOCOL.md 7.3, 12.2).
SHARED_OBJECTS = "sharedObjects"


def is_shared(config: dict[str, Any]) -> bool:
    """Whether a topic's config makes it a shared topic (PROTOCOL.md 7.3)."""
    return config.get("storage.layout") == SHARED


TOPIC_CONFIG = ConfigSchema(
    "topic config",
    [
        ConfigKey(
            "cleanup.policy",
            str,
            "delete",
            "delete (retention), compact (keep each key's last record, PROTOCOL.md 11.6), or both",
            allowed=("delete", "compact", "compact,delete", "delete,compact"),
        ),
        ConfigKey(
            "compression.type",
            str,
            "lz4",
            "Arrow IPC buffer compression of new batches",
            # Every codec name of the segment format except pyarrow's alias lz4_frame.
            allowed=tuple(sorted(set(COMPRESSIONS) - {"lz4_frame"})),
        ),
        _int_key("segment.bytes", 64 * 1024 * 1024, 1024, "size at which merging closes a segment"),
        _int_key("segment.ms", 7 * DAY_MS, 1, "age span at which merging closes a segment"),
        _int_key("retention.ms", 7 * DAY_MS, -1, "segments whose newest record is older are retired; -1 keeps"),
        _int_key("retention.bytes", -1, -1, "retire the oldest segments while the partition is larger; -1: no limit"),
        ConfigKey(
            "message.timestamp.type",
            str,
            "CreateTime",
            "CreateTime, or LogAppendTime: the writer stamps records with its clock",
            allowed=("CreateTime", "LogAppendTime"),
        ),
        _int_key("file.delete.delay.ms", 20 * 60 * 1000, 0, "D of assumption A4"),
        _int_key("writer.max.staleness.ms", 60_000, 1, "W of assumption A4; must be below D"),
        _int_key("max.message.bytes", 64 * 1024 * 1024, 1, "largest batch a producer may send"),
        ConfigKey(
            "auto.maintenance.enable",
            bool,
            True,
            "writers maintain the topic as they write (PROTOCOL.md 10.1)",
            parse=boolean_from_text,
        ),
        _int_key("auto.maintenance.interval.ms", 60_000, 0, "least time between two self-maintenance passes"),
        ConfigKey(
            "min.cleanable.dirty.ratio",
            float,
            0.5,
            "compact a partition once this share of its cleanable bytes is dirty (11.6)",
            minimum=0.0,
            maximum=1.0,
            parse=_ratio_from_text,
        ),
        _int_key("min.compaction.lag.ms", 0, 0, "records stay uncompacted at least this long after they are readable"),
        _int_key("max.compaction.lag.ms", UNBOUNDED_MS, 1, "records stay uncompacted at most about this long"),
        _int_key("delete.retention.ms", DAY_MS, 0, "tombstones are kept this long after compaction passed them"),
        ConfigKey(
            "storage.layout",
            str,
            PARTITIONED,
            "shared: flushes write shared objects and commits (PROTOCOL.md 7.3); partitioned: an object per "
            "partition and flush; fixed when the topic is created",
            allowed=(SHARED, PARTITIONED),
        ),
        _int_key(
            "shared.move.ms",
            10 * 60 * 1000,
            0,
            "shared topics: a partition's runs move into its own segment once the oldest is this old (10.2)",
        ),
    ],
    checks=[_staleness_below_delete_delay, _compaction_lags_ordered],
)

#: Topic configuration keys with their defaults.
TOPIC_CONFIG_DEFAULTS: dict[str, Any] = TOPIC_CONFIG.defaults()


def default_layout(protocol: RootProtocol) -> str:
    """The ``storage.layout`` of a topic created without one (PROTOCOL.md 4, 7.3): ``shared`` where the root
    lists ``sharedObjects`` (a root without a protocol object gets object 0, ``INITIAL``, with its first topic)."""
    version = INITIAL if protocol.number is None else protocol.version
    return SHARED if SHARED_OBJECTS in version.writer_features else PARTITIONED


def validate_config(config: dict[str, Any] | None) -> dict[str, Any]:
    """Return the full configuration (defaults filled in) or raise naming the bad key or value."""
    return TOPIC_CONFIG.validate(config)


def _config_with_defaults(config: Any) -> dict[str, Any]:
    """A stored config with the default of every key it lacks (PROTOCOL.md 4: objects older than a key lack it).

    Keys this code does not know are kept, unchecked: a newer writer may have added them.
    """
    if not isinstance(config, dict):
        raise TypeError("expected an object")
    for key, value in config.items():
        # A known key holds its table's JSON type (PROTOCOL.md 3.1, 4): a null or a string where an integer
        # belongs would otherwise reach the writer or the cleaner as a value it cannot use.
        if key in TOPIC_CONFIG and not is_type(value, TOPIC_CONFIG[key].type):
            raise TypeError(f"config {key!r} is {value!r}, not of the JSON type of {key!r}")
    return {**TOPIC_CONFIG_DEFAULTS, **config}


@dataclass(frozen=True)
class TopicMetadata(JsonDocument):
    """One version of a topic's metadata: ``topics/<topic>/meta/<version:020d>.json`` (PROTOCOL.md 4).

    A :class:`JsonDocument`: the fields below are the document's fields. Objects
    written before it was one (indented JSON) read the same; new ones are compact.
    A config key the object lacks reads as its default.
    """

    name: str
    topic_id: str
    partitions: int
    # Absent (an object damaged, or written by hand): every key's default, as for each key an object lacks (4).
    config: dict[str, Any] = field(
        default_factory=lambda: dict(TOPIC_CONFIG_DEFAULTS), metadata={"decode": _config_with_defaults}
    )
    version: int = 0
    created_ms: int = 0
    #: Typed topics (PROTOCOL.md 11.8): every value schema, oldest first, and the compatibility mode.
    value_schemas: list[dict[str, Any]] | None = None
    value_schema_compatibility: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object; an untyped topic's has no value schema fields."""
        doc = super().to_dict()
        if self.value_schemas is None:
            del doc["value_schemas"], doc["value_schema_compatibility"]
        return doc

    @classmethod
    def from_dict(cls, doc: Any, *, what: str = "") -> TopicMetadata:
        """Parse the JSON object; a typed topic's value schemas must parse (else the version is corrupt)."""
        meta = super().from_dict(doc, what=what)
        if meta.value_schemas is not None or meta.value_schema_compatibility is not None:
            try:
                meta.schema_history  # noqa: B018 - parsed and cached now, so a damaged list is found here
            except ValueError as exc:
                raise CorruptRecordError(f"{what or 'topic metadata'}: {exc}") from exc
        return meta

    @cached_property
    def schema_history(self) -> SchemaHistory | None:
        """A typed topic's value schemas (None for an untyped topic)."""
        if self.value_schemas is None and self.value_schema_compatibility is None:
            return None
        return SchemaHistory.from_json(self.value_schemas, self.value_schema_compatibility)

    @property
    def value_schema(self) -> pa.Schema | None:
        """A typed topic's current value schema (None for an untyped topic)."""
        history = self.schema_history
        return None if history is None else history.current.schema

    @staticmethod
    def history_fields(history: SchemaHistory | None) -> dict[str, Any]:
        """The keyword arguments that store ``history`` in a metadata version."""
        if history is None:
            return {}
        return {
            "value_schemas": [entry.to_dict() for entry in history.entries],
            "value_schema_compatibility": history.compatibility,
        }

    def check_partition(self, partition: object) -> int:
        """Return ``partition`` if it is an int in range, else raise ``UnknownTopicOrPartitionError``."""
        if not isinstance(partition, int) or isinstance(partition, bool) or not 0 <= partition < self.partitions:
            raise UnknownTopicOrPartitionError(
                f"partition {partition!r} does not exist in topic {self.name!r} "
                f"(it has partitions 0..{self.partitions - 1})"
            )
        return partition


def read_topic_version(store: Store, name: str, version: int) -> TopicMetadata:
    """Version ``version`` of ``name``'s metadata; ``ObjectNotFoundError`` if it is absent.

    ``CorruptRecordError`` unless the object says it is that version of that
    topic: the key is authoritative (PROTOCOL.md 3.1), so another topic's or
    version's bytes under it are corrupt.
    """
    key = topic_meta_key(name, version)
    return TopicMetadata.from_json(store.get(key), what=key, keyed={"name": name, "version": version})


class TopicCatalog:
    """Creates, reads, changes and deletes topic metadata on a store.

    Every call first checks the root's protocol object (PROTOCOL.md 12) through
    ``protocol``, which reads it once and then answers from memory: reads need
    the reader requirements met, changes the writer requirements. Creating a
    topic in a root without a protocol object writes one.
    """

    def __init__(self, store: Store, protocol: RootProtocol | None = None) -> None:
        self.store = store
        self.protocol = protocol if protocol is not None else RootProtocol(store)

    def create(
        self,
        name: str,
        partitions: int = 1,
        config: dict[str, Any] | None = None,
        *,
        value_schema: pa.Schema | None = None,
        value_schema_compatibility: str | None = None,
    ) -> TopicMetadata:
        """Create a topic; raises ``TopicAlreadyExistsError`` if it exists.

        ``value_schema``: the topic is typed (PROTOCOL.md 11.8), its records' values are rows of this
        schema, checked under ``value_schema_compatibility`` (``BACKWARD`` by default) when it evolves.
        """
        validate_topic_name(name)
        if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
            raise InvalidConfigError(f"partitions must be a positive int, got {partitions!r}")
        if value_schema is None and value_schema_compatibility is not None:
            raise InvalidConfigError("value_schema_compatibility is given but no value_schema: the topic is untyped")
        created = now_ms()
        history = (
            None if value_schema is None else SchemaHistory.first(value_schema, value_schema_compatibility, created)
        )
        typed = TopicMetadata.history_fields(history)
        config = dict(config or {})
        if "storage.layout" not in config:  # shared where the root offers it (PROTOCOL.md 4, 7.3)
            config["storage.layout"] = default_layout(self.protocol)
        meta = TopicMetadata(name, uuid.uuid4().hex, partitions, validate_config(config), 0, created, **typed)
        # Enabled together, so that a new root lists them in its protocol object 0 (no wait).
        features = [
            name
            for name, used in (
                ("compaction", is_compacted(meta.config)),
                ("typedTopics", history),
                (SHARED_OBJECTS, is_shared(meta.config)),
            )
            if used
        ]
        if features:
            self.protocol.settle_feature(features, meta.config["file.delete.delay.ms"])
        self.protocol.ensure_written()
        if not self.store.put_if_absent(topic_meta_key(name, 0), meta.to_json()):
            raise TopicAlreadyExistsError(f"topic {name!r} already exists")
        # Its first change notice, so that an absent notice means a deleted topic (PROTOCOL.md 9.1), then
        # the root notice. The topic's notice is best effort: while it is absent, waiting readers compare
        # the topic's id instead. The root notice is not: readers that skip re-reading the catalog while
        # it is unchanged would not see the topic (9.1, *Topic metadata and the root notice*).
        # A shared topic has no notice of its own: its commits are (7.3).
        try:
            write_notices(self.store, {name: (meta.topic_id, ())}, (name,) if is_shared(meta.config) else ())
        except PlogError:
            write_root_notice(self.store, [name])
        return meta

    def get(self, name: str) -> TopicMetadata:
        """The current metadata of ``name``; ``UnknownTopicOrPartitionError`` if it does not exist."""
        self.protocol.require_reader()
        newest = numbered.latest(self.store, topic_meta_prefix(name))
        try:
            if newest is not None:
                return self.read_version(name, newest)
        except ObjectNotFoundError:  # deleted between list and get
            pass
        raise UnknownTopicOrPartitionError(f"unknown topic {name!r}")

    def read_version(self, name: str, version: int) -> TopicMetadata:
        """Version ``version`` of ``name``'s metadata (:func:`read_topic_version`)."""
        return read_topic_version(self.store, name, version)

    def current(self, known: TopicMetadata) -> TopicMetadata:
        """The current metadata of the topic ``known`` is a version of: ``known`` itself if it still is.

        Two GETs instead of a LIST and a GET (PROTOCOL.md 4, *Checking known
        metadata without a listing*): the next version must be absent, then
        ``known``'s own object present with its topic id. Anything else lists
        as :meth:`get` does.
        """
        self.protocol.require_reader()
        name = known.name
        try:
            self.store.get(topic_meta_key(name, known.version + 1))
        except ObjectNotFoundError:
            try:
                again = self.read_version(name, known.version)
            except ObjectNotFoundError:
                pass  # deleted, or an old version collected: list
            else:
                if again.topic_id == known.topic_id:
                    return known
        return self.get(name)

    def exists(self, name: str) -> bool:
        """Whether the topic exists."""
        self.protocol.require_reader()
        return bool(self.store.list(topic_meta_prefix(name)))

    def names(self) -> list[str]:
        """All topic names, sorted."""
        self.protocol.require_reader()
        names = set()
        for info in self.store.list("topics/"):
            parts = info.key.split("/")
            if len(parts) == 4 and parts[2] == "meta":
                names.add(parts[1])
        return sorted(names)

    def newest_versions(self) -> dict[str, int]:
        """Every topic's newest metadata version, from one listing of ``topics/`` (the one :meth:`names`
        makes): reading that version (:meth:`read_version`) gives what :meth:`get` would have at the
        listing, without a listing per topic."""
        self.protocol.require_reader()
        newest: dict[str, int] = {}
        for info in self.store.list("topics/"):
            parts = info.key.split("/")
            if len(parts) == 4 and parts[2] == "meta":
                version = numbered.parse_number(parts[3])
                if version is not None and version >= newest.get(parts[1], -1):
                    newest[parts[1]] = version
        return newest

    def update(
        self,
        name: str,
        *,
        partitions: int | None = None,
        config: dict[str, Any] | None = None,
        evolve: tuple[pa.Schema, str | None] | None = None,
    ) -> TopicMetadata:
        """Write a new metadata version: more partitions (never fewer), config changes, and/or, for a
        typed topic, ``evolve=(schema, compatibility)``: a new value schema version checked under the
        topic's compatibility mode (and the mode changed when ``compatibility`` is given; PROTOCOL.md 11.8).
        Every version copies the value schemas of the one it follows."""

        def make_body(version: int) -> bytes:
            # Built on version - 1, the one this version replaces; a lost race rebuilds on the newer one.
            try:
                current = self.read_version(name, version - 1)
            except ObjectNotFoundError:
                current = self.get(name)  # version - 1 was collected: the newest is what we replace
            new_partitions = current.partitions if partitions is None else partitions
            if not isinstance(new_partitions, int) or new_partitions < current.partitions:
                raise InvalidConfigError(
                    f"topic {name!r} has {current.partitions} partitions; it can grow but not shrink to {partitions!r}"
                )
            new_config = validate_config({**current.config, **(config or {})})
            if new_config["storage.layout"] != current.config.get("storage.layout", PARTITIONED):
                raise InvalidConfigError(
                    f"topic {name!r}: storage.layout is {current.config.get('storage.layout', PARTITIONED)!r} and "
                    "is fixed when the topic is created (PROTOCOL.md 4)"
                )
            history = current.schema_history
            if evolve is not None:
                if history is None:
                    raise InvalidConfigError(f"topic {name!r} is untyped: a topic is typed from its creation or never")
                history = history.evolved(evolve[0], evolve[1], now_ms())  # against the winner of any race
            typed = TopicMetadata.history_fields(history)
            return TopicMetadata(
                name, current.topic_id, new_partitions, new_config, version, now_ms(), **typed
            ).to_json()

        self.protocol.require_writer()
        known = self.get(name)  # unknown topic: UnknownTopicOrPartitionError, not a create at version 0
        wanted = validate_config({**known.config, **(config or {})})
        if is_compacted(wanted) and not is_compacted(known.config):
            self.protocol.settle_feature("compaction", wanted["file.delete.delay.ms"])
        _, body = numbered.create_next(self.store, topic_meta_prefix(name), make_body, first=1)
        write_root_notice(self.store, [name])  # readers relying on it read the metadata again (9.1)
        return TopicMetadata.from_json(body)

    def delete(self, name: str) -> None:
        """Delete the topic's metadata and data. Writers still holding its topic id write garbage only."""
        self.protocol.require_writer()
        self.get(name)
        # Metadata first, so the topic disappears at once; data objects follow.
        for info in self.store.list(topic_meta_prefix(name)):
            self.store.delete(info.key)
        # The change is made: readers relying on the root notice list the catalog again (9.1).
        write_root_notice(self.store, [name])
        self.store.delete_prefix(topic_prefix(name))
