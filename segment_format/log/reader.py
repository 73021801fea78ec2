"""Reading a partition (PROTOCOL.md 9): records from an offset, the last stable offset, lookup by time.

Reads go through the partition's :class:`~segment_format.log.chain.LogChain`:
the cached view is followed to the tail before each read, and listed again
when an object read has been merged or deleted under the reader. Batches are
located with the segment indexes and fetched in few requests (each is billed
on S3): a small object is read whole with its index, a larger one in ranges of
at least :data:`~segment_format.segment.READ_AHEAD` bytes, the bytes read ahead
kept for the next read. Every batch is verified against its CRC32C each time
it is decoded, whichever request brought its bytes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import CorruptRecordError, ObjectNotFoundError, OffsetOutOfRangeError
from ..segment import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    READ_AHEAD,
    WHOLE_READ,
    SegmentIndex,
    batch_range,
    decode_range,
    decode_range_ahead,
    read_batches,
)
from ..typed.layout import Projection, TypedLayout
from ..typed.value_schema import SchemaHistory, object_schema_problem
from .chain import LogChain, LogView
from .shared_spans import span_window

#: How far a read with ``decode_ahead`` decodes past itself: this many reads like it, in batches.
DECODE_AHEAD_READS = 2

#: (process id, object key, value fields, futures by batch number): batches decoding ahead of a read.
_Ahead = tuple[int, str, tuple[str, ...] | None, dict[int, Future[pa.RecordBatch]]]

READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"
COMMITTED = "committed"
ABORTED = "aborted"


class TransactionResolver(Protocol):
    """``resolver(producer_id, transaction, topic, partition, base_offset, last_offset, timeout_ms)``
    tells whether a transactional batch is part of a committed transaction ("committed"), not ("aborted"),
    or not yet decided (None).

    ``timeout_ms`` is the transaction's timeout as the object holding the batch states it (None when it
    does not: a merged object), for a resolver that aborts transactions left undecided past it;
    ``appended_ms`` the latest time a record of that object was appended (PROTOCOL.md 11.6), by which a
    resolver knows whether the batch's decision can have been collected yet. The coordinator supplies it
    (PROTOCOL.md 11.2); this layer knows nothing of how.
    """

    def __call__(
        self,
        producer_id: int,
        transaction: int,
        topic: str,
        partition: int,
        base_offset: int,
        last_offset: int,
        timeout_ms: int | None = None,
        /,
        *,
        appended_ms: int | None = None,
    ) -> str | None: ...


def batch_outcome(
    resolver: TransactionResolver | None, idx: SegmentIndex, i: int, topic: str, partition: int
) -> str | None:
    """COMMITTED, ABORTED or None (undecided, or no resolver) for transactional batch ``i`` of ``idx``."""
    if resolver is None:
        return None
    return resolver(
        int(idx.producer_ids[i]),
        int(idx.transactions[i]),
        topic,
        partition,
        int(idx.base_offsets[i]),
        int(idx.last_offsets[i]),
        idx.meta.transaction_timeout_ms,
        appended_ms=idx.meta.append_bounds()[1],
    )


class LogReader:
    """Reads one partition's records, remembering what makes the next read cheap.

    Four things are remembered between reads: the offset below which every
    transaction is known decided (so last-stable-offset scans start there),
    the decoded batch a read stopped inside (so that a consumer reading
    fewer records than a batch holds does not read, verify and decompress the
    same batch again for every poll; objects never change, so it stays right),
    the bytes of one object read ahead of what a read needed (so that the
    next read needs no request): at most about
    :data:`~segment_format.segment.WHOLE_READ` bytes per reader, dropped once
    read through; and, after a read asked to ``decode_ahead``, the batches
    that follow it in those bytes, decoding on the pool while the caller
    handles what it got (at most :data:`DECODE_AHEAD_READS` reads like it;
    verified like every decode, and taken by the next read of the same object
    with the same fields, else cancelled).
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
        #: (object key, first byte, bytes) read from storage and not yet all decoded; unverified until decoded.
        self._buffer: tuple[str, int, bytes | pa.Buffer] | None = None
        #: (process id, object key, fields, futures by batch number) of batches decoding ahead of the next read.
        self._ahead: _Ahead | None = None
        #: The value fields ``_decoded`` was decoded with (typed topics; None: all), set with it.
        self._decoded_fields: tuple[str, ...] | None = None
        #: A typed topic's value schemas as this process knows them (set by the log; None: untyped).
        self.known_schemas: Callable[[], SchemaHistory | None] = lambda: None
        #: Reads the topic's metadata again, for an object of a version this process has not seen yet.
        self.refresh_schemas: Callable[[], None] | None = None

    def read(
        self,
        offset: int,
        max_records: int | None = None,
        max_bytes: int | None = None,
        isolation: str = READ_UNCOMMITTED,
        resolver: TransactionResolver | None = None,
        projection: Projection | None = None,
        decode_ahead: bool = False,
        max_decoded_bytes: int | None = None,
    ) -> tuple[list[pa.RecordBatch], int]:
        """Record batches from ``offset`` on, and the offset to read next.

        The contract is :meth:`segment_format.log.partition_log.PartitionLog.read`'s, which delegates here.
        """
        for _ in range(8):
            view = self.chain.view(refresh=False, whole=WHOLE_READ)
            # Probe the tail only when this read may reach the known end: a consumer polling fewer records
            # than an object holds would otherwise pay a request per poll (PROTOCOL.md 9). A view gone
            # stale meanwhile is safe: an object merged or deleted since is missing, and the chain is resolved again.
            if _may_reach_end(view, offset, max_records, max_bytes):
                view = self.chain.follow_tail(WHOLE_READ)
            if offset < view.start_offset or offset > view.end_offset:
                view = self.chain.view(whole=WHOLE_READ)
                if offset < view.start_offset or offset > view.end_offset:
                    raise OffsetOutOfRangeError(
                        f"offset {offset} is out of range for {self.name}: "
                        f"valid offsets are {view.start_offset}..{view.end_offset}"
                    )
            if offset == view.end_offset:
                return [], offset
            try:
                return self._read_from(
                    view,
                    offset,
                    max_records,
                    max_bytes,
                    isolation,
                    resolver,
                    projection,
                    decode_ahead,
                    max_decoded_bytes,
                )
            except ObjectNotFoundError:
                self._buffer = None
                self._drop_ahead()
                self.chain.view(whole=WHOLE_READ, relist_commits=True)  # merged or deleted under us: resolve again
        raise CorruptRecordError("partition keeps changing under the reader", key=self.chain.prefix, offset=offset)

    def _visible(self, idx: SegmentIndex, i: int, isolation: str, resolver: TransactionResolver | None) -> bool | None:
        """Whether batch ``i`` is returned: True, False (skip it), None (undecided: stop before it)."""
        attributes = int(idx.attributes[i])
        if attributes & ATTR_CONTROL:
            return False
        if not attributes & ATTR_TRANSACTIONAL or isolation == READ_UNCOMMITTED:
            return True
        state = batch_outcome(resolver, idx, i, self.topic, self.partition)
        return None if state is None else state == COMMITTED

    def last_stable_offset(
        self, resolver: TransactionResolver | None, whole: int = WHOLE_READ, follow: bool = True
    ) -> int:
        """The first offset of the earliest undecided transactional batch, or the log end (PROTOCOL.md 11.2).

        ``whole`` is passed to the index reads (:meth:`LogChain.index`): by default the LSO is asked for
        before a read of what it finds, so a small object is fetched whole with its index; a caller that
        only plans (a Spark driver) passes 0 and fetches indexes alone. ``follow=False``: of the view held,
        without a probe of the tail (a reader whose change notice says nothing was appended since it looked).
        """
        view = self.chain.follow_tail(whole) if follow or self.chain.cached_view is None else self.chain.cached_view
        position = max(self._stable_hint, view.start_offset)
        if not view.segments or position >= view.end_offset:
            return view.end_offset
        for ref in view.segments[max(view.segment_for(position), 0) :]:
            idx = self.chain.index(ref, whole)
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
        projection: Projection | None = None,
        decode_ahead: bool = False,
        max_decoded_bytes: int | None = None,
    ) -> tuple[list[pa.RecordBatch], int]:
        out: list[pa.RecordBatch] = []
        records = 0
        decoded_bytes = 0
        stored = 0
        position = offset
        final: tuple[str, int, pa.RecordBatch, int] | None = None  # the last batch read, and its last offset
        final_fields: tuple[str, ...] | None = None
        s = view.segment_for(position)
        while s < len(view.segments) and position < view.end_offset:
            idx = self.chain.index(view.segments[s], WHOLE_READ)
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
            layout = idx.meta.layout
            self._check_entry(idx, layout)
            fields = None if layout is None or projection is None else projection.decode_fields(layout)
            if layout is not None and projection is not None and projection.filters:
                # Batches whose statistics prove no record meets the filters are not decoded (11.8).
                flags = [
                    visible and projection.may_match(_stats(idx, i), layout, int(idx.record_counts[i]))
                    for i, visible in zip(range(first, last + 1), flags, strict=True)
                ]
            skip = {i for i, visible in zip(range(first, last + 1), flags, strict=True) if not visible}
            decoded = self._decoded
            if (
                decoded is not None
                and decoded[3] == position
                and decoded[0] == idx.key
                and decoded[1] == first
                and self._decoded_fields == fields
            ):
                # This read continues inside the batch the previous one stopped in: verified and decoded then.
                batches: list[pa.RecordBatch | None] = [decoded[2]]
                if last > first:
                    batches += self._batches(idx, first + 1, last, fields, skip, decode_ahead)
            else:
                batches = self._batches(idx, first, last, fields, skip, decode_ahead)
            ending = batches[-1]
            final = None if ending is None else (idx.key, last, ending, int(idx.last_offsets[last]))
            final_fields = fields
            for batch, visible in zip(batches, flags, strict=True):
                if not visible or batch is None:
                    continue
                batch = _from_offset(batch, position)
                if layout is not None and projection is not None:
                    batch = projection.apply(batch, layout, f"{self.name}: ")
                if batch.num_rows:
                    out.append(batch)
                    records += batch.num_rows
                    decoded_bytes += batch.nbytes
            stored += nbytes
            position = int(idx.last_offsets[last]) + 1
            if last == idx.batch_count - 1:
                position = max(position, idx.meta.next_offset)
                s += 1
            if (
                stopped
                or (max_records is not None and records >= max_records)
                or (max_bytes is not None and stored >= max_bytes)
                or (max_decoded_bytes is not None and decoded_bytes >= max_decoded_bytes)
            ):
                break
        if max_decoded_bytes is not None and decoded_bytes > max_decoded_bytes:
            out, position = _within_bytes(out, max_decoded_bytes, position)
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
            # Kept with the fields it was decoded with: a later read with other fields must not take it.
            self._decoded = (final[0], final[1], final[2], position)
            self._decoded_fields = final_fields
        return out, position

    def _check_entry(self, idx: SegmentIndex, layout: TypedLayout | None) -> None:
        """A typed object's schema must be the topic's entry of its version (PROTOCOL.md 11.8), when this
        process knows that entry, and a typed topic holds only typed objects: else batches would be read
        with a schema the topic never had."""
        version, encoded = (None, None) if layout is None else (layout.version, layout.encoded)
        history = self.known_schemas()
        problem = object_schema_problem(history, version, encoded)
        unseen = history is not None and version is not None and version > len(history.entries)
        if problem and unseen and self.refresh_schemas is not None:
            # A writer confirmed its version current before creating the object (11.8): it is in the
            # metadata now, so reading it again finds it; a version still missing then is not the topic's.
            self.refresh_schemas()
            problem = object_schema_problem(self.known_schemas(), version, encoded)
        if problem:
            raise CorruptRecordError(problem, key=idx.key)

    def _batches(
        self,
        idx: SegmentIndex,
        first: int,
        last: int,
        fields: tuple[str, ...] | None = None,
        skip: set[int] | frozenset[int] = frozenset(),
        decode_ahead: bool = False,
    ) -> list[pa.RecordBatch | None]:
        """Batches ``first..last`` of ``idx``'s object, verified, with a request only when no kept bytes hold them.

        Bytes come from, in turn: this reader's buffer; the whole object, if
        its index read left it in the cache's ``objects``; or one range read
        from ``first`` on, widened to the object's data end when that is at
        most :data:`WHOLE_READ` bytes away, else to whole batches covering at
        least :data:`READ_AHEAD` bytes. What is read beyond ``last`` is kept
        for the next read; with ``decode_ahead``, the batches that follow in it
        start decoding for that read (the class docstring).
        """
        start, end = batch_range(idx, first, last)
        buf = self._buffer
        # Bytes are keyed by the object that holds them: a run's (PROTOCOL.md 7.3) are its shared object's.
        data_key = idx.data_key
        if buf is None or buf[0] != data_key or start < buf[1] or end > buf[1] + len(buf[2]):
            whole = self.chain.cache.objects.take(data_key)
            if whole is not None:
                buf = (data_key, 0, whole)
            else:
                fetch_end = _read_ahead_end(idx, start, end)
                span = self._shared_span(data_key, start, fetch_end) if idx.is_run else None
                buf = span or (data_key, start, self.chain.store.get_range_buffer(data_key, start, fetch_end))
            self._buffer = buf
        _key, buf_start, data = buf
        ahead = self._take_ahead(idx.key, fields)
        try:
            batches = decode_range(idx, first, last, buf_start, data, fields, skip, ahead)
        except Exception:  # a corrupt batch: keep nothing, so that a retry reads storage again
            self._buffer = None
            _cancel(ahead)
            raise
        if end >= buf_start + len(data) or last == idx.batch_count - 1:
            self._buffer = None  # read through: nothing kept is needed again
        elif decode_ahead:
            # The next read most likely starts where this one ends: its batches, up to DECODE_AHEAD_READS
            # reads like this one, decode on the pool meanwhile, from bytes already here (no request).
            following = min(idx.batch_count - 1, last + DECODE_AHEAD_READS * (last - first + 1))
            kept = {i: future for i, future in (ahead or {}).items() if i > last}
            kept.update(decode_range_ahead(idx, max(kept, default=last) + 1, following, buf_start, data, fields))
            self._ahead = (os.getpid(), idx.key, fields, kept)
        return batches

    def _shared_span(self, data_key: str, start: int, end: int) -> tuple[str, int, pa.Buffer] | None:
        """Bytes ``[start, end)`` of shared object ``data_key`` from a span read for every partition of the topic
        this process reads (:mod:`~segment_format.log.shared_spans`): a kept one, else one read now when the
        object holds runs of other such partitions. None: read the range alone."""
        spans = self.chain.cache.spans
        kept = spans.covering(data_key, start, end)
        if kept is not None:
            return (data_key, *kept)
        wanted = spans.wanted(self.topic)
        sequence = self.chain.sequence
        if self.partition not in wanted or sequence is None:
            return None
        ranges = spans.planned(data_key)
        if ranges is None:
            # (Were an object in two commits, the span would cover fewer runs: the others read their own ranges.)
            ranges = [e.byte_range() for e in sequence.object_entries(data_key) if e.partition in wanted]
        first, stop = span_window(ranges, start, end)
        if (first, stop) == (start, end):
            return None
        data = spans.read(data_key, first, lambda: self.chain.store.get_range_buffer(data_key, first, stop))
        if first + data.size < end:  # another reader's window from the same byte, planned from fewer commits
            return None
        return data_key, first, data

    def _take_ahead(self, key: str, fields: tuple[str, ...] | None) -> dict[int, Future[pa.RecordBatch]] | None:
        """The batches decoding ahead if they are ``key``'s, decoded with ``fields``, in this process;
        others are dropped (:meth:`_drop_ahead`). Nothing is kept: the caller keeps what it does not use."""
        ahead = self._ahead
        if ahead is None:
            return None
        if ahead[:3] == (os.getpid(), key, fields):
            self._ahead = None
            return ahead[3]
        self._drop_ahead()
        return None

    def _drop_ahead(self) -> None:
        """Forget the batches decoding ahead, cancelling those not started yet; in a forked child, only
        forget them. The child has none of its parent's threads, so it must not wait for their futures,
        nor even cancel them: a future's lock held by a parent's thread at the fork stays held forever."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == os.getpid():
            _cancel(ahead[3])

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


def _stats(idx: SegmentIndex, i: int) -> dict[str, Any] | None:
    """Batch ``i``'s ``value_stats`` entry (None when the object has no statistics)."""
    if idx.value_stats is None:
        return None
    try:
        entry = idx.value_stats[i].as_py()
    except (OverflowError, ValueError):  # a bound beyond Python's datetime (year 9999): no skip decided
        return None
    return entry if isinstance(entry, dict) else None


def _within_bytes(batches: list[pa.RecordBatch], limit: int, position: int) -> tuple[list[pa.RecordBatch], int]:
    """The first records of ``batches`` whose Arrow bytes fit in ``limit`` (at least one record), and the offset
    after them (``position`` when all fit). Rows are cut by the batch's mean row size: a bound on what a quota
    lets through at once, for which the mean is close enough."""
    kept: list[pa.RecordBatch] = []
    total = 0
    for batch in batches:
        if total + batch.nbytes <= limit:
            kept.append(batch)
            total += batch.nbytes
            continue
        rows = int((limit - total) * batch.num_rows // max(1, batch.nbytes))
        rows = max(rows, 0 if kept else 1)
        if rows:
            kept.append(batch.slice(0, rows))
        return kept, int(batch.column(0)[rows].as_py()) if rows < batch.num_rows else position
    return kept, position


def _may_reach_end(view: LogView, offset: int, max_records: int | None, max_bytes: int | None) -> bool:
    """Whether a read from ``offset`` may reach the end of ``view`` before a limit stops it (PROTOCOL.md 9).

    Decided on the view alone: ``max_records`` records left in it, or ``max_bytes`` stored bytes in
    its objects after the one holding ``offset`` (sizes overstate the batches' bytes, so a read this
    calls safe can still reach the end; it then returns what it read, and the next read probes).
    """
    if not view.start_offset <= offset < view.end_offset:
        return True
    if max_records is not None and offset <= view.end_offset - max_records:
        return False
    if max_bytes is None:
        return True
    ahead = 0
    for ref in view.segments[view.segment_for(offset) + 1 :]:
        ahead += ref.size or 0
        if ahead >= max_bytes:
            return False
    return True


def _cancel(futures: dict[int, Future[pa.RecordBatch]] | None) -> None:
    """Cancel those of ``futures`` not started yet (the others finish, and nobody waits for them)."""
    for future in (futures or {}).values():
        future.cancel()


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


def _read_ahead_end(idx: SegmentIndex, start: int, end: int) -> int:
    """Where a range read from ``start`` that needs ``[start, end)`` stops, reading ahead (PROTOCOL.md 9).

    At the object's data end if that is at most :data:`WHOLE_READ` bytes from
    ``start``; otherwise at the end of the last whole batch within
    :data:`READ_AHEAD` bytes of ``start`` (never before ``end``).
    """
    n = idx.batch_count
    data_end = batch_range(idx, n - 1, n - 1)[1]  # a run's data ends with its last batch (PROTOCOL.md 7.3)
    if data_end - start <= WHOLE_READ:
        return data_end
    ends = idx.positions + idx.lengths
    j = int(np.searchsorted(ends, start + READ_AHEAD, side="right")) - 1
    if j >= n - 1:
        return data_end
    return max(end, int(ends[j]))
