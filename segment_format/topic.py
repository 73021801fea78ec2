"""Topics: configuration and versioned metadata (PROTOCOL.md, "Topics").

Topic metadata is a chain of immutable JSON objects ``meta/<version>.json``,
each created with put-if-absent; the highest version is current. Version 0 is
the creation, so two concurrent ``create_topic`` calls cannot both succeed.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from . import numbered
from .errors import InvalidConfigError, ObjectNotFoundError, TopicAlreadyExistsError, UnknownTopicOrPartitionError
from .layout import topic_meta_key, topic_meta_prefix, topic_prefix, validate_topic_name
from .records import now_ms
from .segment import COMPRESSIONS
from .storage import Store

DAY_MS = 24 * 3600 * 1000

#: Topic configuration keys with their defaults (Kafka's names and, where sensible, defaults).
TOPIC_CONFIG_DEFAULTS: dict[str, Any] = {
    "cleanup.policy": "delete",
    "compression.type": "lz4",
    "segment.bytes": 64 * 1024 * 1024,
    "segment.ms": 7 * DAY_MS,
    "retention.ms": 7 * DAY_MS,
    "retention.bytes": -1,
    "message.timestamp.type": "CreateTime",
    "file.delete.delay.ms": 20 * 60 * 1000,
    "writer.max.staleness.ms": 10_000,
    "max.message.bytes": 64 * 1024 * 1024,
    "auto.maintenance.enable": True,
    "auto.maintenance.interval.ms": 60_000,
}

_CHOICES = {
    "cleanup.policy": {"delete", "compact", "compact,delete", "delete,compact"},
    "compression.type": set(COMPRESSIONS) - {"uncompressed", "lz4_frame"} | {"uncompressed"},
    "message.timestamp.type": {"CreateTime", "LogAppendTime"},
}
#: Boolean keys: stored as JSON true/false; "true"/"false" (any case) from a command line are accepted.
_BOOLEAN = {"auto.maintenance.enable"}
_MINIMUM = {
    "segment.bytes": 1024,
    "segment.ms": 1,
    "retention.ms": -1,
    "retention.bytes": -1,
    "file.delete.delay.ms": 0,
    "writer.max.staleness.ms": 1,
    "max.message.bytes": 1,
    "auto.maintenance.interval.ms": 0,
}


def validate_config(config: dict[str, Any] | None) -> dict[str, Any]:
    """Return the full configuration (defaults filled in) or raise naming the bad key or value."""
    merged = dict(TOPIC_CONFIG_DEFAULTS)
    for key, value in (config or {}).items():
        if key not in TOPIC_CONFIG_DEFAULTS:
            raise InvalidConfigError(f"unknown topic config {key!r}; known: {sorted(TOPIC_CONFIG_DEFAULTS)}")
        if key in _BOOLEAN:
            text = str(value).lower()
            if text not in ("true", "false"):
                raise InvalidConfigError(f"topic config {key}={value!r} is not true or false")
            value = text == "true"
        elif key in _CHOICES:
            if value not in _CHOICES[key]:
                raise InvalidConfigError(f"topic config {key}={value!r} is not one of {sorted(_CHOICES[key])}")
        else:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise InvalidConfigError(f"topic config {key}={value!r} is not an integer")
            try:
                value = int(value)
            except (TypeError, ValueError):
                raise InvalidConfigError(f"topic config {key}={value!r} is not an integer") from None
            if value < _MINIMUM[key]:
                raise InvalidConfigError(f"topic config {key}={value} is below its minimum {_MINIMUM[key]}")
        merged[key] = value
    if merged["file.delete.delay.ms"] and merged["writer.max.staleness.ms"] >= merged["file.delete.delay.ms"]:
        raise InvalidConfigError("writer.max.staleness.ms must be below file.delete.delay.ms (PROTOCOL.md, A4)")
    return merged


@dataclass(frozen=True)
class TopicMetadata:
    """One version of a topic's metadata."""

    name: str
    topic_id: str
    partitions: int
    config: dict[str, Any] = field(default_factory=dict)
    version: int = 0
    created_ms: int = 0

    def to_json(self) -> bytes:
        """Serialise for storage."""
        return json.dumps(asdict(self), sort_keys=True, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes) -> TopicMetadata:
        """Parse a stored metadata object."""
        return cls(**json.loads(data))

    def check_partition(self, partition: object) -> int:
        """Return ``partition`` if it is an int in range, else raise ``UnknownTopicOrPartitionError``."""
        if not isinstance(partition, int) or isinstance(partition, bool) or not 0 <= partition < self.partitions:
            raise UnknownTopicOrPartitionError(
                f"partition {partition!r} does not exist in topic {self.name!r} "
                f"(it has partitions 0..{self.partitions - 1})"
            )
        return partition


class TopicCatalog:
    """Creates, reads, changes and deletes topic metadata on a store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def create(self, name: str, partitions: int = 1, config: dict[str, Any] | None = None) -> TopicMetadata:
        """Create a topic; raises ``TopicAlreadyExistsError`` if it exists."""
        validate_topic_name(name)
        if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
            raise InvalidConfigError(f"partitions must be a positive int, got {partitions!r}")
        meta = TopicMetadata(name, uuid.uuid4().hex, partitions, validate_config(config), 0, now_ms())
        if not self.store.put_if_absent(topic_meta_key(name, 0), meta.to_json()):
            raise TopicAlreadyExistsError(f"topic {name!r} already exists")
        return meta

    def get(self, name: str) -> TopicMetadata:
        """The current metadata of ``name``; ``UnknownTopicOrPartitionError`` if it does not exist."""
        infos = self.store.list(topic_meta_prefix(name))
        if not infos:
            raise UnknownTopicOrPartitionError(f"unknown topic {name!r}")
        try:
            return TopicMetadata.from_json(self.store.get(infos[-1].key))
        except ObjectNotFoundError:  # deleted between list and get
            raise UnknownTopicOrPartitionError(f"unknown topic {name!r}") from None

    def exists(self, name: str) -> bool:
        """Whether the topic exists."""
        return bool(self.store.list(topic_meta_prefix(name)))

    def names(self) -> list[str]:
        """All topic names, sorted."""
        names = set()
        for info in self.store.list("topics/"):
            parts = info.key.split("/")
            if len(parts) == 4 and parts[2] == "meta":
                names.add(parts[1])
        return sorted(names)

    def update(
        self, name: str, *, partitions: int | None = None, config: dict[str, Any] | None = None
    ) -> TopicMetadata:
        """Write a new metadata version: more partitions (never fewer) and/or config changes."""

        def make_body(version: int) -> bytes:
            # Built on version - 1, the one this version replaces; a lost race rebuilds on the newer one.
            try:
                current = TopicMetadata.from_json(self.store.get(topic_meta_key(name, version - 1)))
            except ObjectNotFoundError:
                current = self.get(name)  # version - 1 was collected: the newest is what we replace
            new_partitions = current.partitions if partitions is None else partitions
            if not isinstance(new_partitions, int) or new_partitions < current.partitions:
                raise InvalidConfigError(
                    f"topic {name!r} has {current.partitions} partitions; it can grow but not shrink to {partitions!r}"
                )
            new_config = validate_config({**current.config, **(config or {})})
            return TopicMetadata(name, current.topic_id, new_partitions, new_config, version, now_ms()).to_json()

        self.get(name)  # unknown topic: UnknownTopicOrPartitionError, not a create at version 0
        _, body = numbered.create_next(self.store, topic_meta_prefix(name), make_body, first=1)
        return TopicMetadata.from_json(body)

    def delete(self, name: str) -> None:
        """Delete the topic's metadata and data. Writers still holding its topic id write garbage only."""
        self.get(name)
        # Metadata first, so the topic disappears at once; data objects follow.
        for info in self.store.list(topic_meta_prefix(name)):
            self.store.delete(info.key)
        self.store.delete_prefix(topic_prefix(name))
