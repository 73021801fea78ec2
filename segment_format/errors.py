"""The exception hierarchy of plog.

Every error that plog raises on purpose derives from :class:`PlogError`, so a
caller can catch the project's errors without catching programming mistakes.
The names follow Kafka's error codes where Kafka has one, so that a Kafka user
recognises them (``UnknownTopicOrPartitionError``, ``OffsetOutOfRangeError``...).

Each error names its culprit (the topic, partition, offset, option or object)
in its message, because the message is often all a data engineer sees in a
Spark driver log.
"""

from __future__ import annotations


class PlogError(Exception):
    """Base class of every error plog raises on purpose."""


class StorageError(PlogError):
    """The storage backend failed or answered something the protocol forbids."""


class ObjectNotFoundError(StorageError):
    """An object that was asked for does not exist (it may have been deleted by retention)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"object not found: {key!r}")
        self.key = key


class InvalidConfigError(PlogError, ValueError):
    """A configuration key or value is unknown or out of range; the message names it."""


class InvalidTopicError(PlogError, ValueError):
    """A topic name breaks Kafka's rule: ``[a-zA-Z0-9._-]{1,249}``, neither ``.`` nor ``..``."""


class TopicAlreadyExistsError(PlogError):
    """``create_topic`` was called for a topic that exists."""


class UnknownTopicOrPartitionError(PlogError, KeyError):
    """The topic does not exist, or the partition number is outside ``[0, partitions)``."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want the plain sentence.
        return str(self.args[0]) if self.args else ""


class OffsetOutOfRangeError(PlogError, IndexError):
    """An offset lies before the log start offset or after the log end offset."""


class InvalidRecordError(PlogError, TypeError):
    """A record's key, value, timestamp or headers has the wrong type or shape."""


class DataLossError(PlogError):
    """Offsets a reader needs are gone (retention, delete_records, a deleted or re-created topic).

    The Spark source raises it when ``failOnDataLoss`` is true (the default); with false it logs a
    warning and skips ahead instead.
    """


class IncompatibleSchemaError(PlogError):
    """Stored records of a typed topic cannot be read as the reader's value schema (PROTOCOL.md 11.8):
    a type the reader's does not widen, or a null where it says not null. Restart with the newest schema."""


class CorruptRecordError(PlogError):
    """Stored bytes fail their checksum or do not parse; never returned as data.

    ``key`` is the object and ``offset`` the first offset of the damaged batch,
    when it is known.
    """

    def __init__(self, message: str, key: str | None = None, offset: int | None = None) -> None:
        where = []
        if key is not None:
            where.append(f"object {key!r}")
        if offset is not None:
            where.append(f"offset {offset}")
        super().__init__(f"{message} ({', '.join(where)})" if where else message)
        self.key = key
        self.offset = offset


class ConcurrentAppendError(PlogError):
    """An append lost the race for its offsets more times than its retry budget allows."""


class ConcurrentCreateError(PlogError):
    """Creating the next numbered object lost the race to other writers more times than the retry bound allows."""


class FencedError(PlogError):
    """A writer with an older epoch tried to write after a newer holder took over."""


class OutOfOrderSequenceError(PlogError):
    """An idempotent producer's batch sequence leaves a gap: records may have been lost."""


class KafkaTimeoutError(PlogError, TimeoutError):
    """An operation did not finish within its timeout (``future.get(timeout)``, ``flush``)."""


class ProducerClosedError(PlogError):
    """``send`` was called on a producer that has been closed."""


class CommitFailedError(PlogError):
    """An offset commit was refused: the group rebalanced and this member no longer owns the partition."""


class UnsupportedProtocolError(PlogError):
    """The root requires a protocol version or a feature this code does not implement (PROTOCOL.md 12).

    ``role`` is ``"reader"`` or ``"writer"``; ``versions`` names the required
    versions above what this code knows and ``features`` the unknown feature
    names, so that the message says exactly what an upgrade of plog must bring.
    """

    def __init__(
        self, message: str, role: str = "reader", versions: dict[str, int] | None = None, features: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message)
        self.role = role
        self.versions = dict(versions or {})
        self.features = tuple(features)
