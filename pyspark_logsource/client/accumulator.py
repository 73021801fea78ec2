"""The producer's record accumulator: records ``send`` buffers, per topic, until a batch is sealed.

``send`` appends a record to the open ``Buffer`` of its topic (a few list appends under one
lock). A buffer is sealed when it holds ``batch_size`` bytes, when ``linger_ms`` has passed since
it was opened, or on ``flush``/``close``; the sender thread (``sender.py``) takes sealed buffers
and writes them, and the futures of ``send`` (``futures.py``) wait on their buffer's ``done``.
Buffered bytes are bounded by ``buffer_memory``: ``send`` blocks up to ``max_block_ms`` for room.

::

    send ──append──> open[topic]: Buffer ──seal──> sealed: [Buffer, ...] ──take──> sender thread
                      (values, keys, ...)   (batch_size, linger,         (writes, then
                                             flush, close)                 done.set())
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from segment_format.errors import KafkaTimeoutError

__all__ = ["RECORD_OVERHEAD", "Buffer", "RecordAccumulator"]

#: Bytes a record counts beyond its key and value in batch sizes (the accumulator's and the router's).
RECORD_OVERHEAD = 24


class Buffer:
    """Records accumulated for one topic, written together; futures wait on ``done``.

    Columns are plain lists, one entry per record (``partitions`` holds -1 where ``send`` was
    given none); the sender fills the ``out_*`` arrays, then sets ``done`` (or ``error``).
    """

    __slots__ = (
        "topic",
        "values",
        "keys",
        "timestamps",
        "headers",
        "partitions",
        "nbytes",
        "created",
        "done",
        "error",
        "out_partitions",
        "out_offsets",
        "out_timestamps",
        "has_headers",
        "has_partitions",
    )

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.values: list[bytes | None] = []
        self.keys: list[bytes | None] = []
        self.timestamps: list[int] = []
        self.headers: list[Any] = []
        self.partitions: list[int] = []
        self.has_headers = False
        self.has_partitions = False
        self.nbytes = 0
        self.created = time.monotonic()
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.out_partitions: np.ndarray | None = None
        self.out_offsets: np.ndarray | None = None
        #: Per row, the time the log stamped it with (LogAppendTime topics only).
        self.out_timestamps: np.ndarray | None = None


class RecordAccumulator:
    """The open and sealed buffers of a producer, and the bytes they hold (see the module docstring)."""

    def __init__(self, batch_size: int, buffer_memory: int, max_block_ms: int, linger_ms: int) -> None:
        self.batch_size = batch_size
        self.buffer_memory = buffer_memory
        self.max_block_ms = max_block_ms
        self.linger = linger_ms / 1000
        # append() takes the condition's lock directly: the Condition's own ``with`` costs two Python calls.
        self._mutex = threading.RLock()
        self._lock = threading.Condition(self._mutex)
        self._open: dict[str, Buffer] = {}
        self._sealed: list[Buffer] = []
        self._writing: list[Buffer] = []  # taken by the sender, not yet completed: flush waits for them too
        self._queued_bytes = 0
        self._flush_requested = False
        self.closed = False

    def append(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        timestamp_ms: int,
        headers: Any,
        partition: int | None,
    ) -> tuple[Buffer, int]:
        """Buffer one record; returns its buffer and its index there. Blocks while ``buffer_memory`` is full."""
        size = (len(value) if value is not None else 0) + (len(key) if key is not None else 0) + RECORD_OVERHEAD
        with self._mutex:
            if self._queued_bytes > self.buffer_memory:
                self._wait_for_room()
            buffer = self._open.get(topic)
            if buffer is None:
                buffer = self._open[topic] = Buffer(topic)
                self._lock.notify_all()
            index = len(buffer.values)
            buffer.values.append(value)
            buffer.keys.append(key)
            buffer.timestamps.append(timestamp_ms)
            buffer.headers.append(headers)
            buffer.partitions.append(-1 if partition is None else partition)
            if headers is not None:
                buffer.has_headers = True
            if partition is not None:
                buffer.has_partitions = True
            buffer.nbytes += size
            self._queued_bytes += size
            if buffer.nbytes >= self.batch_size:
                self._seal(topic)
        return buffer, index

    def _wait_for_room(self) -> None:
        deadline = time.monotonic() + self.max_block_ms / 1000
        while self._queued_bytes > self.buffer_memory:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KafkaTimeoutError(f"buffer_memory full for {self.max_block_ms} ms")
            self._lock.wait(remaining)

    def _seal(self, topic: str) -> None:
        buffer = self._open.pop(topic, None)
        if buffer is not None:
            self._sealed.append(buffer)
            self._lock.notify_all()

    # ------------------------------------------------------------------ the sender's side

    def take_sealed(self) -> list[Buffer] | None:
        """Wait for sealed buffers (sealing those whose linger has passed) and take them, in sealing
        order; None once closed and empty. They count as in flight until ``completed``."""
        with self._lock:
            while True:
                now = time.monotonic()
                for topic, buffer in list(self._open.items()):
                    if self._flush_requested or self.closed or now - buffer.created >= self.linger:
                        self._seal(topic)
                # Every buffer open at the flush is sealed now: later ones linger again.
                self._flush_requested = False
                if self._sealed:
                    break
                if self.closed:
                    return None
                oldest = min((b.created for b in self._open.values()), default=None)
                self._lock.wait(None if oldest is None else max(0.0, oldest + self.linger - now))
            work, self._sealed = self._sealed, []
            self._writing.extend(work)
            return work

    def completed(self, work: list[Buffer]) -> None:
        """The sender wrote ``work`` (taken from ``take_sealed``): release their bytes, wake blocked senders."""
        with self._lock:
            done = {id(b) for b in work}
            self._writing = [b for b in self._writing if id(b) not in done]
            self._queued_bytes -= sum(b.nbytes for b in work)
            self._lock.notify_all()

    # ------------------------------------------------------------------ flush and close

    def request_flush(self) -> list[Buffer]:
        """Ask the sender to seal every open buffer now; returns the buffers not yet written.

        That includes the buffers the sender is writing at this moment: a flush (and so a
        transaction's commit) must not return before their appends have been recorded.
        """
        with self._lock:
            pending = list(self._writing) + list(self._sealed) + list(self._open.values())
            self._flush_requested = True
            self._lock.notify_all()
        return pending

    def close(self) -> None:
        """Seal everything; the sender writes it and then stops."""
        with self._lock:
            self.closed = True
            self._lock.notify_all()

    def metrics(self) -> dict[str, Any]:
        """Queued bytes, open buffers, buffers being written."""
        with self._lock:
            return {
                "queued_bytes": self._queued_bytes,
                "open_buffers": len(self._open),
                "in_flight": len(self._writing),
            }
