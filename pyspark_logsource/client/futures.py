"""What the producer's sends return: ``FutureRecordMetadata`` (``send``) and ``BatchSendResult`` (``send_batch``)."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark_logsource.client.accumulator import Buffer
from pyspark_logsource.client.types import RecordMetadata
from segment_format.errors import KafkaTimeoutError

__all__ = ["BatchSendResult", "FutureRecordMetadata"]


class FutureRecordMetadata:
    """The result of ``send``: ``get(timeout)`` waits for the write and returns ``RecordMetadata``."""

    __slots__ = ("_buffer", "_index", "_acks0")

    def __init__(self, buffer: Buffer, index: int, acks0: bool) -> None:
        self._buffer = buffer
        self._index = index
        self._acks0 = acks0

    def is_done(self) -> bool:
        """Whether the record has been written (or failed)."""
        return self._buffer.done.is_set()

    def succeeded(self) -> bool:
        """Whether the record has been written successfully."""
        return self._buffer.done.is_set() and self._buffer.error is None

    def get(self, timeout: float | None = None) -> RecordMetadata:
        """Wait up to ``timeout`` seconds; raise the write's error, or ``KafkaTimeoutError``."""
        buffer = self._buffer
        if not buffer.done.wait(timeout):
            raise KafkaTimeoutError(f"record to {buffer.topic!r} not written within {timeout} s")
        if buffer.error is not None:
            raise buffer.error
        assert buffer.out_partitions is not None and buffer.out_offsets is not None
        offset = -1 if self._acks0 else int(buffer.out_offsets[self._index])
        stamps = buffer.out_timestamps
        timestamp = int(stamps[self._index]) if stamps is not None else buffer.timestamp_ms(self._index)
        return RecordMetadata(buffer.topic, int(buffer.out_partitions[self._index]), offset, timestamp)


@dataclass(frozen=True)
class BatchSendResult:
    """What ``send_batch`` wrote: per partition the first and last offset, and the record count."""

    topic: str
    offsets: dict[int, tuple[int, int]]
    record_count: int
