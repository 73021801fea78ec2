"""The small value types of the client, named as in kafka-python."""

from __future__ import annotations

from typing import NamedTuple


class TopicPartition(NamedTuple):
    """A (topic, partition) pair."""

    topic: str
    partition: int


class RecordMetadata(NamedTuple):
    """Where a sent record landed. ``offset`` is -1 when ``acks=0`` (not waited for)."""

    topic: str
    partition: int
    offset: int
    timestamp: int


class ConsumerRecord(NamedTuple):
    """One record as ``Consumer.poll`` returns it; ``timestamp`` is epoch milliseconds."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


class OffsetAndTimestamp(NamedTuple):
    """Answer of ``offsets_for_times`` for one partition."""

    offset: int
    timestamp: int | None
