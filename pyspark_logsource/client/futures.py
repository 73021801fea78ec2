"""What the producer's sends return: ``FutureRecordMetadata`` (``send``), ``BatchSendResult`` (``send_batch``)
and ``BatchSendFuture`` (``send_batch(..., wait=False)``)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from pyspark_logsource.client.accumulator import Buffer
from pyspark_logsource.client.types import RecordMetadata
from segment_format.errors import KafkaTimeoutError

__all__ = ["BatchSendFuture", "BatchSendResult", "FutureRecordMetadata", "UnacknowledgedFutureRecordMetadata"]


class FutureRecordMetadata(tuple[Buffer, int]):
    """The result of ``send``: ``get(timeout)`` waits for the write and returns ``RecordMetadata``.

    Underneath, the pair ``(buffer, index)``: ``send`` makes one per record, and a tuple is built
    in C, about 60 ns sooner than an object with attributes (a tenth of a send).
    """

    __slots__ = ()

    #: The offset reported: None for the one the log gave; -1 for ``acks=0``, as Kafka reports it.
    _reported_offset: int | None = None

    def is_done(self) -> bool:
        """Whether the record has been written (or failed)."""
        return self[0].done.is_set()

    def succeeded(self) -> bool:
        """Whether the record has been written successfully."""
        return self[0].done.is_set() and self[0].error is None

    def get(self, timeout: float | None = None) -> RecordMetadata:
        """Wait up to ``timeout`` seconds; raise the write's error, or ``KafkaTimeoutError``."""
        buffer, index = self
        if buffer.owner is not None and not buffer.done.is_set():
            buffer.owner.hurry(buffer)  # someone waits: no flush interval for this one
        if not buffer.done.wait(timeout):
            raise KafkaTimeoutError(f"record to {buffer.topic!r} not written within {timeout} s")
        if buffer.error is not None:
            raise buffer.error
        assert buffer.out_partitions is not None and buffer.out_offsets is not None
        offset = int(buffer.out_offsets[index]) if self._reported_offset is None else self._reported_offset
        stamps = buffer.out_timestamps
        timestamp = int(stamps[index]) if stamps is not None else buffer.timestamp_ms(index)
        return RecordMetadata(buffer.topic, int(buffer.out_partitions[index]), offset, timestamp)

    def __repr__(self) -> str:
        return f"FutureRecordMetadata({self[0].topic!r}, record {self[1]} of its batch)"

    # A future is one record's, not a value: equal only to itself, as any object (not as a tuple).
    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    __hash__ = object.__hash__  # type: ignore[assignment]


class UnacknowledgedFutureRecordMetadata(FutureRecordMetadata):
    """``send``'s result with ``acks=0``: the record's offset is not reported (-1), as in Kafka."""

    __slots__ = ()
    _reported_offset = -1


@dataclass(frozen=True)
class BatchSendResult:
    """What ``send_batch`` wrote: per partition the first and last offset, and the record count."""

    topic: str
    offsets: dict[int, tuple[int, int]]
    record_count: int


class BatchSendFuture:
    """``send_batch(..., wait=False)``'s result: ``get(timeout)`` waits for the table to be written and
    returns its ``BatchSendResult``, or raises the write's error (so does ``flush``, as for ``send``)."""

    def __init__(self, topic: str, buffers: list[Buffer], record_count: int) -> None:
        self.topic = topic
        self.buffers = buffers
        self.record_count = record_count

    def is_done(self) -> bool:
        """Whether every part of the table has been written (or failed)."""
        return all(buffer.done.is_set() for buffer in self.buffers)

    def get(self, timeout: float | None = None) -> BatchSendResult:
        """Wait up to ``timeout`` seconds; raise the write's first error, or ``KafkaTimeoutError``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for buffer in self.buffers:
            if buffer.owner is not None and not buffer.done.is_set():
                buffer.owner.hurry(buffer)  # someone waits: no flush interval for these
        for buffer in self.buffers:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not buffer.done.wait(remaining):
                raise KafkaTimeoutError(f"table to {self.topic!r} not written within {timeout} s")
        offsets: dict[int, tuple[int, int]] = {}
        for buffer in self.buffers:
            if buffer.error is not None:
                raise buffer.error
            assert buffer.out_partitions is not None and buffer.out_offsets is not None
            for part in np.unique(buffer.out_partitions):
                rows = buffer.out_offsets[buffer.out_partitions == part]
                first, last = int(rows.min()), int(rows.max())
                known = offsets.get(int(part))
                offsets[int(part)] = (first, last) if known is None else (min(known[0], first), max(known[1], last))
        return BatchSendResult(self.topic, offsets, self.record_count)

    def __repr__(self) -> str:
        return f"BatchSendFuture({self.topic!r}, {self.record_count} records)"
