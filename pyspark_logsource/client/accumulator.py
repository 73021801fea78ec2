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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from segment_format.errors import KafkaTimeoutError, ProducerClosedError
from segment_format.topic import is_compacted
from segment_format.typed.layout import entry_layout

__all__ = ["RECORD_OVERHEAD", "Buffer", "RecordAccumulator", "RoutedBuffer"]

#: Bytes a record counts beyond its key and value in batch sizes (the accumulator's and the router's).
RECORD_OVERHEAD = 24

#: ``Buffer.sole_partition`` once its records name different partitions (or some name one and some none).
MIXED = object()


@dataclass
class RoutedBuffer:
    """A sealed buffer's records as a payload batch, the partition of each, and per partition its rows
    (None: all of them) as a batch with that batch's bytes (``Sender.prepare`` makes it at the seal)."""

    payload: pa.RecordBatch
    partitions: np.ndarray
    pieces: list[tuple[int, np.ndarray | None, pa.RecordBatch, int]]


class Buffer:
    """Records accumulated for one topic, written together; futures wait on ``done``.

    ``values``, ``keys`` and ``timestamps_ns`` are plain lists, one entry per record (the send time
    in nanoseconds: ``time.time_ns()`` is the cheapest clock call, and the sender divides them all
    in one vectorised step). ``headers``, ``partitions`` and ``given_timestamps`` (a ``timestamp_ms``
    the caller chose, which replaces the send time) are sparse, ``{record index: value}``, because
    most records have none. Explicit partitions are noted per record only once they differ:
    while every record so far names the same partition (or none), ``sole_partition`` holds it
    and nothing is stored per record, as in a loop of ``send(topic, v, partition=p)``.
    ``meta`` is the topic's metadata when the buffer was opened: sends
    into an open buffer check it instead of the root's cache, and the sender reads it again anyway.
    The sender fills the ``out_*`` arrays, then sets ``done`` (or ``error``).
    """

    __slots__ = (
        "topic",
        "meta",
        "keys_required",
        "layout",
        "values",
        "keys",
        "timestamps_ns",
        "headers",
        "partitions",
        "sole_partition",
        "given_timestamps",
        "nbytes",
        "created",
        "done",
        "error",
        "out_partitions",
        "out_offsets",
        "out_timestamps",
        "routed",
        "route_error",
        "table_rows",
        "owner",
    )

    def __init__(self, topic: str, meta: Any = None) -> None:
        self.topic = topic
        self.meta = meta
        #: A compacted topic refuses records without a key (PROTOCOL.md 11.6): sends of one take the full path.
        self.keys_required = meta is not None and is_compacted(meta.config)
        #: A typed topic's value schema layout when the buffer opened (PROTOCOL.md 11.8): its values are
        #: dicts, built into a struct column by the sender; plain bytes sends take the full path, which refuses them.
        history = None if meta is None else meta.schema_history
        self.layout = None if history is None else entry_layout(history.current)
        self.values: list[Any] = []
        self.keys: list[bytes | None] = []
        self.timestamps_ns: list[int] = []
        self.headers: dict[int, Any] = {}
        self.partitions: dict[int, int] = {}
        #: The explicit partition of every record so far (None: none has one); MIXED once they differ,
        #: and ``partitions`` then holds them. Send's short path takes records whose partition ``is`` it.
        self.sole_partition: int | object | None = None
        self.given_timestamps: dict[int, int] = {}
        self.nbytes = 0
        self.created = time.monotonic()
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.out_partitions: np.ndarray | None = None
        self.out_offsets: np.ndarray | None = None
        #: Per row, the time the log stamped it with (LogAppendTime topics only).
        self.out_timestamps: np.ndarray | None = None
        #: The records as a payload batch and the partition of each, made when the buffer was sealed
        #: (``RecordAccumulator.on_seal``), or why they could not be; None until then.
        self.routed: RoutedBuffer | None = None
        self.route_error: Exception | None = None
        #: A ``send_batch`` table's row count (0: a buffer of ``send``'s records, counted in ``values``).
        self.table_rows = 0
        #: The accumulator holding it, which a caller waiting on its result hurries (``RecordAccumulator.hurry``).
        self.owner: RecordAccumulator | None = None

    @classmethod
    def of_table(cls, topic: str, meta: Any, routed: RoutedBuffer) -> Buffer:
        """A buffer holding a ``send_batch`` table's rows, already routed (``routed``)."""
        buffer = cls(topic, meta)
        buffer.routed = routed
        buffer.table_rows = routed.payload.num_rows
        buffer.nbytes = routed.payload.nbytes
        return buffer

    @property
    def record_count(self) -> int:
        """The records the buffer holds."""
        return self.table_rows if self.table_rows else len(self.values)

    def dense_headers(self) -> list[Any] | None:
        """Every record's headers (None where it has none), or None when no record has any."""
        if not self.headers:
            return None
        headers: list[Any] = [None] * len(self.values)
        for index, record_headers in self.headers.items():
            headers[index] = record_headers
        return headers

    def timestamps_ms(self) -> np.ndarray:
        """Every record's timestamp in ms: the one given, else its send time (one vectorised division)."""
        return _scatter(np.asarray(self.timestamps_ns, np.int64) // 1_000_000, self.given_timestamps)

    def note_partition(self, index: int, partition: int | None) -> None:
        """Note record ``index``'s explicit partition (None: it has none)."""
        sole = self.sole_partition
        if index == 0:
            self.sole_partition = partition
            return
        if sole is not MIXED:
            if partition == sole and partition.__class__ is sole.__class__:
                return
            if sole is not None:  # the records so far all named it: now they are noted one by one
                self.partitions = dict.fromkeys(range(index), sole)  # type: ignore[arg-type]
            self.sole_partition = MIXED
        if partition is not None:
            self.partitions[index] = partition

    def given_partitions(self) -> np.ndarray | None:
        """Every record's explicit partition, -1 where it has none; None when no record has one."""
        sole = self.sole_partition
        if sole is None:
            return None
        if sole is not MIXED:
            return np.full(len(self.values), sole, np.int64)
        return _scatter(np.full(len(self.values), -1, np.int64), self.partitions) if self.partitions else None

    def timestamp_ms(self, index: int) -> int:
        """The timestamp record ``index`` was sent with: the one given, else its send time."""
        given = self.given_timestamps.get(index)
        return self.timestamps_ns[index] // 1_000_000 if given is None else given


def _scatter(dense: np.ndarray, sparse: dict[int, int]) -> np.ndarray:
    """``dense`` with ``sparse``'s values written at their indexes."""
    if sparse:
        dense[np.fromiter(sparse.keys(), np.int64)] = np.fromiter(sparse.values(), np.int64)
    return dense


#: Sealed bytes that a flush takes at once, without waiting for the flush interval: their fixed cost is small.
FLUSH_EARLY_BYTES = 8 * 1024 * 1024


class RecordAccumulator:
    """The open and sealed buffers of a producer, and the bytes they hold (see the module docstring)."""

    def __init__(
        self, batch_size: int, buffer_memory: int, max_block_ms: int, linger_ms: int, flush_interval_ms: int = 0
    ) -> None:
        self.batch_size = batch_size
        self.buffer_memory = buffer_memory
        self.max_block_ms = max_block_ms
        self.linger = linger_ms / 1000
        #: Group commit: sealed buffers wait until this long after the last flush began, so that a steady
        #: stream's flushes (whose cost on an object store is fixed requests) each carry that much more; a
        #: caller waiting on a result, ``flush`` and ``close`` do not wait for it, nor do FLUSH_EARLY_BYTES.
        self.flush_interval = flush_interval_ms / 1000
        self._last_take = -float("inf")
        #: Buffers a caller waits on (``hurry``): once sealed, they are taken without the flush interval.
        self._waited: set[int] = set()
        #: The lock of every field here. Appends take it directly (``Producer.send`` inlines ``append``):
        #: the Condition's own ``with`` costs two Python calls, and a plain Lock is cheaper than an RLock.
        self.lock = threading.Lock()
        self._condition = threading.Condition(self.lock)
        #: Each topic's open buffer. ``Producer.send`` peeks here without the lock for the buffer's metadata.
        self.open_buffers: dict[str, Buffer] = {}
        #: Each topic's tables from ``send_batch`` not sealed yet (already routed): they linger as an open
        #: buffer does, and are sealed together once they hold ``batch_size`` bytes, so that consecutive
        #: small tables share a flush.
        self.open_tables: dict[str, list[Buffer]] = {}
        self._sealed: list[Buffer] = []
        self._writing: list[Buffer] = []  # taken by the sender, not yet completed: flush waits for them too
        #: Bytes of sealed buffers not yet written (see ``open_buffer``: what ``buffer_memory`` bounds).
        self.queued_bytes = 0
        self._flush_requested = False
        self.closed = False
        #: Called with each buffer as it is sealed, under the lock, in the thread that seals it (a ``send``
        #: that filled it, or the sender at linger, flush or close); it must not raise. The producer builds
        #: and routes the buffer's records there (``Sender.prepare``).
        self.on_seal: Callable[[Buffer], None] | None = None

    def append(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        timestamp_ns: int,
        headers: Any,
        partition: int | None,
        meta: Any = None,
        timestamp_ms: int | None = None,
    ) -> tuple[Buffer, int]:
        """Buffer one record; returns its buffer and its index there. Blocks while ``buffer_memory`` is full.

        ``timestamp_ns`` is the send time; ``timestamp_ms``, when given, is the record's timestamp instead.
        """
        size = (len(value) if value is not None else 0) + (len(key) if key is not None else 0) + RECORD_OVERHEAD
        with self.lock:
            buffer = self.open_buffers.get(topic) or self.open_buffer(topic, meta)
            index = len(buffer.values)
            buffer.values.append(value)
            buffer.keys.append(key)
            buffer.timestamps_ns.append(timestamp_ns)
            if headers is not None:
                buffer.headers[index] = headers
            buffer.note_partition(index, partition)
            if timestamp_ms is not None:
                buffer.given_timestamps[index] = timestamp_ms
            buffer.nbytes += size
            if buffer.nbytes >= self.batch_size:
                self.seal(topic)
        return buffer, index

    def open_buffer(self, topic: str, meta: Any) -> Buffer:
        """Open a buffer for ``topic`` (the caller holds the lock and found none open); returns the
        topic's open buffer.

        ``buffer_memory`` is checked here, once per buffer, as Kafka's producer checks it when it
        allocates a batch: sealed buffers not yet written count, so a new one waits (up to
        ``max_block_ms``) while they hold more than ``buffer_memory``; open ones add at most
        ``batch_size`` each. Raises ``ProducerClosedError`` once closed: the sender may have
        stopped, and a buffer opened now would never be written.
        """
        if self.closed:
            raise ProducerClosedError("send() on a closed producer")
        self.seal_tables(topic)  # tables sent before this record are written before it
        if self.queued_bytes > self.buffer_memory:
            self.wait_for_room()  # releases the lock while it waits: another send may open the buffer
            existing = self.open_buffers.get(topic)
            if existing is not None:
                return existing
        buffer = self.open_buffers[topic] = Buffer(topic, meta)
        buffer.owner = self
        self._condition.notify_all()
        return buffer

    def wait_for_room(self) -> None:
        """Wait (the caller holds the lock) until ``buffer_memory`` has room, up to ``max_block_ms``."""
        deadline = time.monotonic() + self.max_block_ms / 1000
        while self.queued_bytes > self.buffer_memory:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KafkaTimeoutError(f"buffer_memory full for {self.max_block_ms} ms")
            self._condition.wait(remaining)

    def add_tables(self, topic: str, buffers: list[Buffer], linger: bool = True) -> None:
        """Queue one ``send_batch`` table's buffers (records already routed: ``buffer.routed``), together, after
        every record sent to ``topic`` before them; with ``linger`` they wait with the topic's other tables
        until those hold ``batch_size`` bytes or ``linger_ms`` passed, else they are sealed now (with them),
        in time for one round of the sender. Blocks while ``buffer_memory`` is full, as ``send`` does."""
        with self._condition:
            if self.closed:
                raise ProducerClosedError("send_batch() on a closed producer")
            self.seal(topic)  # records sent before the table are written before it
            if self.queued_bytes > self.buffer_memory:
                self.wait_for_room()
            tables = self.open_tables.setdefault(topic, [])
            for buffer in buffers:
                buffer.owner = self
            tables.extend(buffers)
            if not linger or sum(table.nbytes for table in tables) >= self.batch_size:
                self.seal_tables(topic)
            self._condition.notify_all()

    def seal_tables(self, topic: str) -> None:
        """Seal ``topic``'s lingering tables, if any, for the sender (the caller holds the lock)."""
        tables = self.open_tables.pop(topic, None)
        if tables:
            self.queued_bytes += sum(table.nbytes for table in tables)
            self._sealed.extend(tables)
            self._condition.notify_all()

    def seal(self, topic: str) -> None:
        """Seal ``topic``'s open buffer, if any, for the sender (the caller holds the lock)."""
        buffer = self.open_buffers.pop(topic, None)
        if buffer is not None:
            self.queued_bytes += buffer.nbytes
            self._sealed.append(buffer)
            try:
                # Sealed first: a send interrupted in on_seal (KeyboardInterrupt) leaves the buffer to be
                # built by the sender, not lost with its futures. The sender cannot take it meanwhile: we hold the lock.
                if self.on_seal is not None:
                    self.on_seal(buffer)
            finally:
                self._condition.notify_all()

    # ------------------------------------------------------------------ the sender's side

    def take_sealed(self) -> list[Buffer] | None:
        """Wait for sealed buffers (sealing those whose linger has passed) and take them, in sealing
        order; None once closed and empty. They count as in flight until ``completed``."""
        with self._condition:
            while True:
                now = time.monotonic()
                for topic, buffer in list(self.open_buffers.items()):
                    if self._flush_requested or self.closed or now - buffer.created >= self.linger:
                        self.seal(topic)
                for topic, tables in list(self.open_tables.items()):
                    if self._flush_requested or self.closed or now - tables[0].created >= self.linger:
                        self.seal_tables(topic)
                asked = self._flush_requested or self.closed
                # Every buffer open at the flush is sealed now: later ones linger again.
                self._flush_requested = False
                next_flush = self._last_take + self.flush_interval
                if self._sealed and (asked or now >= next_flush or self._worth_taking_early()):
                    break
                if self.closed and not self._sealed:
                    return None
                opened = [b.created + self.linger for b in self.open_buffers.values()]
                opened += [tables[0].created + self.linger for tables in self.open_tables.values()]
                if self._sealed:
                    opened.append(next_flush)
                wake = min(opened, default=None)
                self._condition.wait(None if wake is None else max(0.0, wake - now))
            work, self._sealed = self._sealed, []
            self._writing.extend(work)
            self._last_take = now
            if self._waited:
                self._waited.difference_update(id(b) for b in work)
            return work

    def _worth_taking_early(self) -> bool:
        """Whether sealed buffers go before the flush interval has passed: someone waits on one, or they hold
        FLUSH_EARLY_BYTES (the caller holds the lock)."""
        waited = self._waited
        if waited and any(id(b) in waited for b in self._sealed):
            return True
        return sum(buffer.nbytes for buffer in self._sealed) >= FLUSH_EARLY_BYTES

    def hurry(self, buffer: Buffer) -> None:
        """A caller waits on ``buffer``'s result: once sealed (at its linger, as before), the sender takes it
        without waiting for the flush interval, as Kafka's producer sends a batch as soon as it is ready."""
        if not self.flush_interval:
            return  # nothing is held back: a waiting caller costs no lock
        with self._condition:
            if buffer.done.is_set() or any(b is buffer for b in self._writing):
                return
            self._waited.add(id(buffer))
            self._condition.notify_all()

    def completed(self, work: list[Buffer]) -> None:
        """The sender wrote ``work`` (taken from ``take_sealed``): release their bytes, wake blocked senders."""
        with self._condition:
            done = {id(b) for b in work}
            self._writing = [b for b in self._writing if id(b) not in done]
            self.queued_bytes -= sum(b.nbytes for b in work)
            self._condition.notify_all()

    # ------------------------------------------------------------------ flush and close

    def request_flush(self) -> list[Buffer]:
        """Ask the sender to seal every open buffer now; returns the buffers not yet written.

        That includes the buffers the sender is writing at this moment: a flush (and so a
        transaction's commit) must not return before their appends have been recorded.
        """
        with self._condition:
            pending = list(self._writing) + list(self._sealed) + list(self.open_buffers.values())
            pending += [table for tables in self.open_tables.values() for table in tables]
            self._flush_requested = True
            self._condition.notify_all()
        return pending

    def close(self) -> None:
        """Seal everything; the sender writes it and then stops."""
        with self._condition:
            self.closed = True
            self._condition.notify_all()

    def metrics(self) -> dict[str, Any]:
        """Kafka's buffer gauges (``buffer-total-bytes``, ``buffer-available-bytes``), and plog's own: bytes
        queued, open buffers, buffers being written."""
        with self._condition:
            queued = (
                self.queued_bytes
                + sum(b.nbytes for b in self.open_buffers.values())
                + sum(t.nbytes for tables in self.open_tables.values() for t in tables)
            )
            return {
                "buffer-total-bytes": self.buffer_memory,
                "buffer-available-bytes": max(0, self.buffer_memory - queued),
                "plog-queued-bytes": queued,
                "plog-open-buffers": len(self.open_buffers),
                "plog-buffers-in-flight": len(self._writing),
            }
