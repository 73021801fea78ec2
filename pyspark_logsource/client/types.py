"""The small value types of the client, named as in kafka-python, and the check of a ``TopicPartition`` argument."""

from __future__ import annotations

from typing import NamedTuple

from segment_format.errors import InvalidConfigError


class TopicPartition(NamedTuple):
    """A (topic, partition) pair."""

    topic: str
    partition: int


def check_tp(tp: object) -> TopicPartition:
    """``tp`` as a ``TopicPartition``; ``InvalidConfigError`` unless it is a (str, int) pair."""
    if not (isinstance(tp, tuple) and len(tp) == 2 and isinstance(tp[0], str) and isinstance(tp[1], int)):
        raise InvalidConfigError(f"expected a TopicPartition(topic, partition), got {tp!r}")
    return TopicPartition(tp[0], tp[1])


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
