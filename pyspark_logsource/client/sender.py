"""The producer's background sender thread: writes the buffers the accumulator seals.

For each sealed ``Buffer``, in sealing order: route its records (``routing.Router``), append
each partition's rows as one stored batch through the ``TransactionManager`` (producer id,
sequence numbers, transaction), fill in the buffer's offsets, and set ``done`` so that the
futures of ``send`` return (or raise the write's error). Partitions are computed here, at
write time and vectorised, so ``send`` itself stays a few list appends. After the futures
are complete it maintains the partitions it wrote when a pass is due (PROTOCOL.md 10.1).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from coordinator.maintainer import maintain_written
from pyspark_logsource.client.accumulator import Buffer, RecordAccumulator
from pyspark_logsource.client.routing import Router, partition_order, partitions_present
from pyspark_logsource.client.transactions import TransactionManager
from segment_format.records import payload_batch
from segment_format.root import LogRoot
from segment_format.topic import TopicMetadata
from segment_format.typed_layout import TypedLayout

__all__ = ["Sender"]

#: Longest a maintenance pass holds up the next writes (the next pass continues where it stopped).
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
    ) -> None:
        self.accumulator = accumulator
        self.root = root
        self.router_for = router_for
        self.transactions = transactions
        self.compression = compression
        #: Names this producer in the maintainer lease (PROTOCOL.md 10.1).
        self.owner = f"producer-{uuid.uuid4().hex}"
        self._thread = threading.Thread(target=self.run, name="plog-producer-sender", daemon=True)

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to end (it ends once the accumulator is closed and drained)."""
        self._thread.join(timeout)

    def run(self) -> None:
        """The thread's loop: take sealed buffers, write them, report them completed."""
        while True:
            work = self.accumulator.take_sealed()
            if work is None:
                return
            for buffer in work:
                self.write(buffer)
            self.accumulator.completed(work)
            self.maintain(work)

    def maintain(self, work: list[Buffer]) -> None:
        """After the futures are complete: maintain what was written, if a pass is due (PROTOCOL.md 10.1).

        Runs on this thread so that a producer maintains its topics with no thread or process of its
        own; a pass that is not due costs no request (``maybe_maintain`` caches the lease's expiry).
        """
        written: dict[str, set[int]] = {}
        for buffer in work:
            if buffer.error is None and buffer.out_partitions is not None:
                written.setdefault(buffer.topic, set()).update(partitions_present(buffer.out_partitions))
        maintain_written(self.root, written, owner=self.owner, budget_s=MAINTENANCE_BUDGET_S, writer="producer")

    def write(self, buffer: Buffer) -> None:
        """Write one sealed buffer; its futures then see the offsets, or the error."""
        try:
            meta = self.root.topic(buffer.topic)
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
            buffer.out_partitions = partitions
            buffer.out_offsets, buffer.out_timestamps = self._append_by_partition(
                buffer.topic, meta, payload, partitions
            )
            # One notice for all the partitions just written, before the futures complete (PROTOCOL.md 9.1).
            self.root.notify(buffer.topic, partitions_present(partitions), meta)
        except BaseException as exc:  # the futures carry it to the caller
            buffer.error = exc
        finally:
            buffer.done.set()

    def _append_by_partition(
        self, topic: str, meta: TopicMetadata, payload: pa.RecordBatch, partitions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Append each partition's rows (in send order); return every row's offset and, when the
        log stamps records itself (LogAppendTime), every row's stored timestamp."""
        offsets = np.empty(len(partitions), np.int64)
        stamps: np.ndarray | None = None
        order = partition_order(partitions)
        sorted_parts = partitions[order]
        bounds = np.flatnonzero(np.diff(sorted_parts)) + 1
        starts = np.concatenate(([0], bounds))
        ends = np.concatenate((bounds, [len(order)]))
        for lo, hi in zip(starts, ends, strict=True):
            rows = order[lo:hi]
            part = int(sorted_parts[lo])
            rows_batch = payload if hi - lo == len(order) else payload.take(pa.array(rows))
            log = self.root.partition(topic, part, meta)
            result = self.transactions.append(log, topic, part, [rows_batch], self.compression)
            offsets[rows] = np.arange(result.base_offsets[0], result.next_offset, dtype=np.int64)
            if log.config["message.timestamp.type"] == "LogAppendTime":
                if stamps is None:
                    stamps = np.asarray(payload.column(0).cast(pa.int64()), np.int64).copy()
                stamps[rows] = result.log_append_time_ms
        return offsets, stamps


def typed_payload_batch(buffer: Buffer, layout: TypedLayout) -> pa.RecordBatch:
    """A typed topic's buffered records as a payload batch: ``value`` a struct of ``layout``'s fields."""
    untyped = payload_batch(buffer.timestamps_ms(), buffer.keys, [None] * len(buffer.values), buffer.dense_headers())
    value = layout.values_from_python(buffer.values, buffer.topic)
    return pa.RecordBatch.from_arrays(
        [untyped.column(0), untyped.column(1), value, untyped.column(3)], schema=layout.payload_schema
    )
