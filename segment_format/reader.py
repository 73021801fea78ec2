"""Reading a partition (PROTOCOL.md 9): records from an offset, the last stable offset, lookup by time.

Reads go through the partition's :class:`~segment_format.chain.LogChain`:
the cached view is followed to the tail before each read, and listed again
when an object read has been merged or deleted under the reader. Batches are
located with the segment indexes and fetched with one range read per run of
batches, each verified against its CRC32C before it is decoded.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .chain import LogChain, LogView
from .errors import CorruptRecordError, ObjectNotFoundError, OffsetOutOfRangeError
from .segment import ATTR_CONTROL, ATTR_TRANSACTIONAL, SegmentIndex, read_batches

READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"
COMMITTED = "committed"
ABORTED = "aborted"

#: ``resolver(producer_id, transaction, topic, partition, base_offset, last_offset)`` tells whether a
#: transactional batch is part of a committed transaction ("committed"), not ("aborted"), or not yet
#: decided (None). The coordinator supplies it (PROTOCOL.md 11.2); this layer knows nothing of how.
TransactionResolver = Callable[[int, int, str, int, int, int], "str | None"]


class LogReader:
    """Reads one partition's records, remembering what makes the next read cheap.

    Two things are remembered between reads: the offset below which every
    transaction is known decided (so last-stable-offset scans start there),
    and the decoded batch a read stopped inside (so that a consumer reading
    fewer records than a batch holds does not read, verify and decompress the
    same batch again for every poll; objects never change, so it stays right).
    """

    def __init__(self, chain: LogChain, topic: str, partition: int, name: str) -> None:
        self.chain = chain
        self.topic = topic
        self.partition = partition
        self.name = name
        #: Everything below this offset is known decided (PROTOCOL.md 11.2), so LSO scans start here.
        self._stable_hint = 0
        #: (object key, batch number, decoded batch, next offset) when the last read stopped inside that batch.
        self._decoded: tuple[str, int, pa.RecordBatch, int] | None = None

    def read(
        self,
        offset: int,
        max_records: int | None = None,
        max_bytes: int | None = None,
        isolation: str = READ_UNCOMMITTED,
        resolver: TransactionResolver | None = None,
    ) -> tuple[list[pa.RecordBatch], int]:
        """Record batches from ``offset`` on, and the offset to read next.

        The contract is :meth:`segment_format.log.PartitionLog.read`'s, which delegates here.
        """
        for _ in range(8):
            view = self.chain.follow_tail()
            if offset < view.start_offset or offset > view.end_offset:
                view = self.chain.view()
                if offset < view.start_offset or offset > view.end_offset:
                    raise OffsetOutOfRangeError(
                        f"offset {offset} is out of range for {self.name}: "
                        f"valid offsets are {view.start_offset}..{view.end_offset}"
                    )
            if offset == view.end_offset:
                return [], offset
            try:
                return self._read_from(view, offset, max_records, max_bytes, isolation, resolver)
            except ObjectNotFoundError:
                self.chain.view()  # merged or deleted under us: resolve again
        raise CorruptRecordError("partition keeps changing under the reader", key=self.chain.prefix, offset=offset)

    def _visible(self, idx: SegmentIndex, i: int, isolation: str, resolver: TransactionResolver | None) -> bool | None:
        """Whether batch ``i`` is returned: True, False (skip it), None (undecided: stop before it)."""
        attributes = int(idx.attributes[i])
        if attributes & ATTR_CONTROL:
            return False
        if not attributes & ATTR_TRANSACTIONAL or isolation == READ_UNCOMMITTED:
            return True
        if resolver is None:
            return None
        state = resolver(
            int(idx.producer_ids[i]),
            int(idx.transactions[i]),
            self.topic,
            self.partition,
            int(idx.base_offsets[i]),
            int(idx.last_offsets[i]),
        )
        return None if state is None else state == COMMITTED

    def last_stable_offset(self, resolver: TransactionResolver | None) -> int:
        """The first offset of the earliest undecided transactional batch, or the log end (PROTOCOL.md 11.2)."""
        view = self.chain.follow_tail()
        position = max(self._stable_hint, view.start_offset)
        if not view.segments or position >= view.end_offset:
            return view.end_offset
        for ref in view.segments[max(view.segment_for(position), 0) :]:
            idx = self.chain.index(ref)
            candidates = np.flatnonzero(((idx.attributes & ATTR_TRANSACTIONAL) != 0) & (idx.last_offsets >= position))
            for i in candidates:
                if self._visible(idx, int(i), READ_COMMITTED, resolver) is None:
                    self._stable_hint = int(idx.base_offsets[i])
                    return self._stable_hint
        self._stable_hint = view.end_offset
        return view.end_offset

    def _read_from(
        self,
        view: LogView,
        offset: int,
        max_records: int | None,
        max_bytes: int | None,
        isolation: str = READ_UNCOMMITTED,
        resolver: TransactionResolver | None = None,
    ) -> tuple[list[pa.RecordBatch], int]:
        out: list[pa.RecordBatch] = []
        records = 0
        stored = 0
        position = offset
        final: tuple[str, int, pa.RecordBatch, int] | None = None  # the last batch read, and its last offset
        s = view.segment_for(position)
        while s < len(view.segments) and position < view.end_offset:
            idx = self.chain.index(view.segments[s])
            first = idx.batch_for_offset(position)
            if first >= idx.batch_count:
                position = max(position, idx.meta.next_offset)
                s += 1
                continue
            # Extend the range read while the limits allow, estimating records from offsets.
            last = first
            estimate = int(idx.last_offsets[first]) - position + 1
            nbytes = int(idx.lengths[first])
            while (
                last + 1 < idx.batch_count
                and (max_records is None or records + estimate < max_records)
                and (max_bytes is None or stored + nbytes < max_bytes)
            ):
                last += 1
                estimate += int(idx.record_counts[last])
                nbytes += int(idx.lengths[last])
            flags: list[bool] = []
            stopped = False
            for i in range(first, last + 1):
                visible = self._visible(idx, i, isolation, resolver)
                if visible is None:
                    last, stopped = i - 1, True
                    break
                flags.append(visible)
            if last < first:
                break  # the next batch is undecided: this is the last stable offset
            decoded = self._decoded
            if decoded is not None and decoded[3] == position and decoded[0] == idx.key and decoded[1] == first:
                # This read continues inside the batch the previous one stopped in: verified and decoded then.
                batches = [decoded[2]]
                if last > first:
                    batches += read_batches(self.chain.store, idx, first + 1, last)
            else:
                batches = read_batches(self.chain.store, idx, first, last)
            final = (idx.key, last, batches[-1], int(idx.last_offsets[last]))
            for batch, visible in zip(batches, flags, strict=True):
                if not visible:
                    continue
                batch = _from_offset(batch, position)
                if batch.num_rows:
                    out.append(batch)
                    records += batch.num_rows
            stored += nbytes
            position = int(idx.last_offsets[last]) + 1
            if last == idx.batch_count - 1:
                position = max(position, idx.meta.next_offset)
                s += 1
            if (
                stopped
                or (max_records is not None and records >= max_records)
                or (max_bytes is not None and stored >= max_bytes)
            ):
                break
        if max_records is not None and records > max_records:
            trimmed, total = [], 0
            for batch in out:
                if total + batch.num_rows >= max_records:
                    batch = batch.slice(0, max_records - total)
                    trimmed.append(batch)
                    position = int(batch.column(0)[-1].as_py()) + 1
                    break
                trimmed.append(batch)
                total += batch.num_rows
            out = trimmed
        # Keep the last batch if max_records cut the read short inside it: a consumer asks for the rest next.
        self._decoded = None
        if final is not None and position <= final[3]:
            self._decoded = (final[0], final[1], final[2], position)
        return out, position

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        """The earliest offset whose timestamp is >= ``timestamp_ms``; None if there is none.

        Binary search over segments by their running maximum timestamp (one
        index read per step), then over batches, then a scan of one batch.
        """
        view = self.chain.view()
        segments = view.segments
        lo, hi = 0, len(segments)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.chain.index(segments[mid]).meta.running_max_timestamp >= timestamp_ms:
                hi = mid
            else:
                lo = mid + 1
        for s in range(lo, len(segments)):
            idx = self.chain.index(segments[s])
            b = idx.batch_for_timestamp(timestamp_ms)
            for first in range(b, idx.batch_count):
                batch = read_batches(self.chain.store, idx, first, first)[0]
                batch = _from_offset(batch, view.start_offset)
                ts = batch.column(1).cast(pa.int64()).to_numpy(zero_copy_only=False)
                hits = np.flatnonzero(ts >= timestamp_ms)
                if hits.size:
                    return int(batch.column(0)[int(hits[0])].as_py())
        return None


def _from_offset(batch: pa.RecordBatch, offset: int) -> pa.RecordBatch:
    """Drop the records before ``offset`` (offsets may have gaps after compaction)."""
    first = batch.column(0)[0].as_py()
    if first >= offset:
        return batch
    offsets = batch.column(0)
    if batch.column(0)[-1].as_py() - first + 1 == batch.num_rows:
        return batch.slice(offset - first)
    keep = int(pc.sum(pc.less(offsets, offset)).as_py() or 0)
    return batch.slice(keep)
