"""The producer's background sender thread: writes the buffers the accumulator seals.

It takes every buffer sealed since it last looked, in sealing order, and writes each run of
consecutive buffers of one topic together: append each partition's rows as one object holding
a batch per buffer, through the ``TransactionManager`` (producer id, sequence numbers,
transaction), write one change notice, fill in the buffers' offsets, and set ``done`` so that
the futures of ``send`` return (or raise the write's error). A producer that seals buffers
faster than they are written thus makes fewer, larger objects (fewer requests on object
stores), as Kafka's sender drains several batches into one request. After the futures are
complete it hands the partitions it wrote to its ``BackgroundMaintainer`` (``maintenance.py``), which
maintains them when a pass is due (PROTOCOL.md 10.1) on a thread of its own, off the path of later writes.

A buffer's records are built into an Arrow batch and routed (``routing.Router``) once per
buffer, vectorised, by the thread that seals it (``prepare``): usually the ``send`` that filled
it, so that ``send`` itself stays a few list appends but for one call in a few thousand. This
thread then takes the GIL only a few times per run of buffers (the encoding is one Arrow call
per ``BATCHES_PER_CALL`` batches): while a caller's loop of ``send`` holds the GIL, each
retake waits out the interpreter's switch interval, and with a NumPy or Arrow call per buffer
here the sender fell behind the loop it serves (``benchmarks/profile_send.py``).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from coordinator.quotas import ClientQuota
from coordinator.throttle import quota_steps
from pyspark_logsource.client.accumulator import Buffer, RecordAccumulator, RoutedBuffer
from pyspark_logsource.client.maintenance import BackgroundMaintainer
from pyspark_logsource.client.routing import Router, partition_groups
from pyspark_logsource.client.transactions import TransactionManager
from segment_format.log.appender import AppendResult
from segment_format.records import payload_batch
from segment_format.root import LogRoot
from segment_format.topic import TopicMetadata, is_shared
from segment_format.typed.layout import TypedLayout

__all__ = ["Sender"]

_log = logging.getLogger(__name__)

#: The budget of a maintenance pass after a producer's writes (the next pass continues where it stopped).
MAINTENANCE_BUDGET_S = 1.0


class Sender:
    """The thread that takes sealed buffers from a ``RecordAccumulator`` and writes them to ``root``."""

    def __init__(
        self,
        accumulator: RecordAccumulator,
        root: LogRoot,
        router_for: Callable[[str], Router],
        transactions: TransactionManager,
        compression: str | None,
        quota: ClientQuota | None = None,
    ) -> None:
        self.accumulator = accumulator
        self.root = root
        self.router_for = router_for
        self.transactions = transactions
        self.compression = compression
        #: The producer's quotas (PROTOCOL.md 11.10): this thread waits out their delay after each round.
        self.quota = quota
        #: Set by ``stop``: ends the wait for a quota's delay.
        self.stopping = threading.Event()
        #: Names this producer in the maintainer lease (PROTOCOL.md 10.1).
        self.owner = f"producer-{uuid.uuid4().hex}"
        self.maintainer = BackgroundMaintainer(root, self.owner, MAINTENANCE_BUDGET_S)
        self._thread = threading.Thread(target=self.run, name="plog-producer-sender", daemon=True)

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def stop(self) -> None:
        """Let the thread end without waiting out a quota's delay (the producer is closing)."""
        self.stopping.set()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to end (it ends once the accumulator is closed and drained), then for the
        maintenance its writes asked for."""
        self._thread.join(timeout)
        self.maintainer.close(timeout)

    def run(self) -> None:
        """The thread's loop: take sealed buffers, write them, report them completed."""
        while True:
            work = self.accumulator.take_sealed()
            if work is None:
                return
            limit = None if self.quota is None else self.quota.step_bytes()
            for step in quota_steps(work, lambda buffer: buffer.nbytes, limit):
                if self.quota is not None:  # waits before the step is written (PROTOCOL.md 11.10)
                    self.quota.acquire(sum(b.nbytes for b in step), _requests(step), stop=self.stopping)
                written: dict[str, set[int]] = {}
                for run in _runs(step):
                    written.setdefault(run[0].topic, set()).update(self.write_run(run))
                self.accumulator.completed(step)
                self.maintain(written)

    def maintain(self, written: dict[str, set[int]]) -> None:
        """After the futures are complete: have the partitions written maintained, per topic, if a pass is
        due (PROTOCOL.md 10.1), on the maintainer's thread; a pass that is not due costs no request
        (``maybe_maintain`` caches the lease's expiry). A tier of small commits this producer just completed is
        merged here first, from the bytes it kept (PROTOCOL.md 10.2): a few milliseconds, and only this root
        knows which commits it made."""
        for topic in written:
            try:
                self.root.merge_own_tier(topic)
            except Exception as exc:  # noqa: BLE001 - never fail the producer; the next pass merges the tier
                _log.warning("plog producer: merging its tier of topic %r failed: %s", topic, exc)
        self.maintainer.submit(written)

    def write_run(self, buffers: list[Buffer]) -> set[int]:
        """Write sealed buffers of one topic (and one value schema version) together: per partition
        one object holding a batch per buffer, and one change notice; then their futures see the
        offsets, or the error. A producer that seals buffers faster than they are written thus makes
        fewer, larger objects and notices (fewer requests), whose batches compress while the first
        are written. Each buffer keeps its own outcome: it fails only if building it, an append
        holding its records, or the notice failed (its records that were not yet written then are
        not written), as when buffers were written one by one. Returns the partitions written."""
        topic = buffers[0].topic
        written: set[int] = set()
        try:
            meta = self.root.topic(topic)
            routed: dict[int, RoutedBuffer] = {}
            for number, buffer in enumerate(buffers):
                try:
                    if buffer.route_error is not None:
                        raise buffer.route_error
                    routed[number] = buffer.routed if buffer.routed is not None else self._routed(buffer, meta)
                except Exception as exc:  # noqa: BLE001 - this buffer's records only (a value out of range)
                    self._failed(buffer, exc)
                    continue
                buffer.out_partitions = routed[number].partitions
            failed, written = self._append_by_partition(topic, meta, routed, buffers)
            for number, error in failed.items():
                self._failed(buffers[number], error)
            if written:
                # One notice for the partitions just written, before the futures complete (PROTOCOL.md 9.1).
                self.root.notify(topic, sorted(written), meta)
        except BaseException as exc:  # the futures carry it to the caller
            for buffer in buffers:
                if buffer.error is None:
                    self._failed(buffer, exc)
        finally:
            for buffer in buffers:
                # The futures keep their buffer alive, not its Arrow copy of the records.
                buffer.routed = None
                buffer.done.set()
        return written

    def prepare(self, buffer: Buffer) -> None:
        """Build and route a buffer's records as it is sealed (``RecordAccumulator.on_seal``): in the
        thread that seals it, usually the caller's ``send`` that filled it. Kept on the buffer for
        ``write_run``, or the error, which fails the buffer's records there, as building them there would.

        The work holds the GIL whichever thread does it. Done here, it spares this thread the GIL's
        switch interval on every NumPy and Arrow call of it while the caller's loop of ``send`` holds the
        GIL, which made the sender fall behind the loop (``benchmarks/profile_send.py``)."""
        if buffer.routed is not None:
            return  # a send_batch table: routed by the caller
        try:
            meta = buffer.meta if buffer.meta is not None else self.root.topic(buffer.topic)
            buffer.routed = self._routed(buffer, meta)
        except Exception as exc:  # noqa: BLE001 - this buffer's records only: write_run fails them
            buffer.route_error = exc

    def _failed(self, buffer: Buffer, exc: BaseException) -> None:
        """Fail a buffer's futures with ``exc``, and the open transaction with it (it must not commit
        without these records: Kafka's abortable error)."""
        buffer.error = exc
        self.transactions.metrics.failed(buffer.record_count)  # Kafka's record-error-rate: records whose send failed
        self.transactions.send_failed(exc)

    def _routed(self, buffer: Buffer, meta: TopicMetadata) -> RoutedBuffer:
        """A buffer's records as a payload batch, the partition of each, and its batch per partition."""
        if buffer.layout is None:
            payload = payload_batch(buffer.timestamps_ms(), buffer.keys, buffer.values, buffer.dense_headers())
        else:  # a typed topic's dicts, as a struct column of the version the buffer was opened with
            payload = typed_payload_batch(buffer, buffer.layout)
        given = buffer.given_partitions()
        partitions = self.router_for(buffer.topic).route(
            meta,
            payload.column(1),
            payload.column(2),
            given=given,
            unset=None if given is None else given < 0,
            key_objects=buffer.keys,
        )
        pieces = []
        for part, where in partition_groups(partitions):
            batch = payload if where is None else payload.take(pa.array(where))
            pieces.append((part, where, batch, batch.nbytes))
        return RoutedBuffer(payload, partitions, pieces)

    def _append_by_partition(
        self,
        topic: str,
        meta: TopicMetadata,
        routed: dict[int, RoutedBuffer],
        buffers: list[Buffer],
    ) -> tuple[dict[int, BaseException], set[int]]:
        """Append each partition's rows of every routed buffer (a batch per buffer, in send order), as
        few objects as ``segment.bytes`` allows; fill each buffer's offsets and, when the log stamps
        records itself (LogAppendTime), its stored timestamps. Returns the buffers (by number) whose
        records an append failed to write, with its error, and the partitions written."""
        # Per partition, in buffer order: (buffer number, its rows there (None: all), those rows as a batch, bytes).
        slices: dict[int, list[tuple[int, np.ndarray | None, pa.RecordBatch, int]]] = {}
        for number, routed_buffer in routed.items():
            for part, where, batch, nbytes in routed_buffer.pieces:
                slices.setdefault(part, []).append((number, where, batch, nbytes))
        failed: dict[int, BaseException] = {}
        written: set[int] = set()
        stamped = meta.config["message.timestamp.type"] == "LogAppendTime"
        if is_shared(meta.config):
            # A shared topic: every partition's batches in one object and one commit (PROTOCOL.md 7.3).
            parts = sorted(slices)
            items = [(self.root.partition(topic, p, meta), topic, p, [s[2] for s in slices[p]]) for p in parts]
            for part, shared in zip(parts, self.transactions.append_many(items, self.compression), strict=True):
                self._place(buffers, routed, slices[part], shared, stamped, failed)
                if not isinstance(shared, BaseException):
                    written.add(part)
            return failed, written
        object_bytes = meta.config["segment.bytes"]
        for part in sorted(slices):
            log = self.root.partition(topic, part, meta)
            # A buffer that failed in one partition is not written further: its futures report the failure.
            kept = [s for s in slices[part] if s[0] not in failed]
            for group in quota_steps(kept, lambda item: item[3], object_bytes):  # objects of segment.bytes at most
                try:
                    outcome: AppendResult | BaseException = self.transactions.append(
                        log, topic, part, [s[2] for s in group], self.compression
                    )
                except Exception as exc:  # noqa: BLE001 - the buffers in this object fail; the others go on
                    outcome = exc
                self._place(buffers, routed, group, outcome, stamped, failed)
                if not isinstance(outcome, BaseException):
                    written.add(part)
        return failed, written

    @staticmethod
    def _place(
        buffers: list[Buffer],
        routed: dict[int, RoutedBuffer],
        group: list[tuple[int, np.ndarray | None, pa.RecordBatch, int]],
        outcome: AppendResult | BaseException,
        stamped: bool,
        failed: dict[int, BaseException],
    ) -> None:
        """Give the buffers of ``group`` (one append's batches) their offsets and, when the log stamps records
        (LogAppendTime), their timestamps; or, when the append failed, its error."""
        if isinstance(outcome, BaseException):
            for number, _rows, _batch, _nbytes in group:
                failed.setdefault(number, outcome)
            return
        for (number, rows, batch, _nbytes), base in zip(group, outcome.base_offsets, strict=True):
            buffer = buffers[number]
            offsets = np.arange(base, base + batch.num_rows, dtype=np.int64)
            if rows is None:  # every row of the buffer went to this partition
                buffer.out_offsets = offsets
            else:
                if buffer.out_offsets is None:
                    buffer.out_offsets = np.empty(len(routed[number].partitions), np.int64)
                buffer.out_offsets[rows] = offsets
            if stamped:
                if buffer.out_timestamps is None:
                    stamps = routed[number].payload.column(0).cast(pa.int64())
                    buffer.out_timestamps = np.asarray(stamps, np.int64).copy()
                buffer.out_timestamps[slice(None) if rows is None else rows] = outcome.log_append_time_ms


def _requests(buffers: list[Buffer]) -> int:
    """The store requests writing ``buffers`` takes, about: a PUT per partition written, and per topic its
    notice and the root notice (PROTOCOL.md 9.1)."""
    partitions: dict[str, set[int]] = {}
    for buffer in buffers:
        pieces = buffer.routed.pieces if buffer.routed is not None else [(0,)]
        partitions.setdefault(buffer.topic, set()).update(piece[0] for piece in pieces)
    return sum(len(parts) + 2 for parts in partitions.values())


def _runs(work: list[Buffer]) -> list[list[Buffer]]:
    """``work`` cut into runs of consecutive buffers of one topic and one value schema layout."""
    runs: list[list[Buffer]] = []
    for buffer in work:
        if runs and runs[-1][0].topic == buffer.topic and _version(runs[-1][0]) == _version(buffer):
            runs[-1].append(buffer)
        else:
            runs.append([buffer])
    return runs


def _version(buffer: Buffer) -> int | None:
    """The value schema version a buffer's records were checked against (None: an untyped topic)."""
    return None if buffer.layout is None else buffer.layout.version


def typed_payload_batch(buffer: Buffer, layout: TypedLayout) -> pa.RecordBatch:
    """A typed topic's buffered records as a payload batch: ``value`` a struct of ``layout``'s fields."""
    untyped = payload_batch(buffer.timestamps_ms(), buffer.keys, [None] * len(buffer.values), buffer.dense_headers())
    value = layout.values_from_python(buffer.values, buffer.topic)
    return pa.RecordBatch.from_arrays(
        [untyped.column(0), untyped.column(1), value, untyped.column(3)], schema=layout.payload_schema
    )
