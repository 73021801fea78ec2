"""The partition log: a chain of immutable segment objects named by base offset.

One partition is the objects under its prefix (PROTOCOL.md, "The partition log")::

    <partition>/
      log/00000000000000000000-00000000000000004000.g1.arrow   rewritten: merged from appended objects
      log/00000000000000000000.arrow                           appended, superseded (deleted after a delay)
      log/00000000000000004000.arrow                           appended: offsets 4000..4099
      log/00000000000000004100.arrow                           appended: the tail, 4100..end-1
      start/00000000000000000000.json                          log start offset markers

The chain is resolved from one listing: rewritten objects from the log start
up to the *frontier* (the highest end of any rewritten object), then the
appended objects at or after the frontier, each ending where the next begins.
An append claims offsets ``[end, end+n)`` by creating ``log/<end>.arrow``
with put-if-absent; a writer that loses the race re-resolves and retries.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from .errors import (
    ConcurrentAppendError,
    CorruptRecordError,
    FencedError,
    ObjectNotFoundError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    StorageError,
)
from .layout import (
    appended_name,
    parse_segment_name,
    parse_start_marker,
    rewritten_name,
    start_marker_name,
)
from .records import RECORD_SCHEMA, TIMESTAMP_TYPE, now_ms, with_offsets
from .segment import (
    ATTR_CONTROL,
    ATTR_LOG_APPEND_TIME,
    ATTR_TRANSACTIONAL,
    BatchMeta,
    EncodedBatch,
    SegmentIndex,
    assemble_segment,
    encode_batch,
    ipc_options,
    raw_messages,
    read_batches,
    read_index,
)
from .storage import ObjectInfo, Store

log = logging.getLogger(__name__)

MAX_APPEND_ATTEMPTS = 64
#: Store errors tolerated in one append before giving up (each may or may not have created the object).
MAX_AMBIGUOUS_FAILURES = 5

READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"
COMMITTED = "committed"
ABORTED = "aborted"

#: ``resolver(producer_id, transaction, topic, partition, base_offset, last_offset)`` tells whether a
#: transactional batch is part of a committed transaction ("committed"), not ("aborted"), or not yet
#: decided (None). The coordinator supplies it (PROTOCOL.md 11.2); this layer knows nothing of how.
TransactionResolver = Callable[[int, int, str, int, int, int], "str | None"]


#: Batches of one append are encoded (mostly compression, which releases the GIL) on up to this many threads.
ENCODE_THREADS = min(4, os.cpu_count() or 1)
_encode_pool_lock = threading.Lock()
_encode_pool_owner: tuple[int, ThreadPoolExecutor] | None = None


def _encode_one(
    job: tuple[pa.RecordBatch, BatchMeta, int], options: ipc.IpcWriteOptions, append_ms: int | None
) -> EncodedBatch:
    payload, meta, offset = job
    if append_ms is not None:  # LogAppendTime: the log stamps the records
        payload = payload.set_column(
            0, "timestamp", pa.array(np.full(payload.num_rows, append_ms, np.int64)).cast(TIMESTAMP_TYPE)
        )
        meta = replace(meta, attributes=meta.attributes | ATTR_LOG_APPEND_TIME)
    return encode_batch(with_offsets(payload, offset), meta, options)


def _encode_batches(
    jobs: list[tuple[pa.RecordBatch, BatchMeta, int]], options: ipc.IpcWriteOptions, append_ms: int | None
) -> list[EncodedBatch]:
    """Encode the batches of one append, in order; the first failure (in order) is raised, as one by one."""
    global _encode_pool_owner
    if len(jobs) < 2 or ENCODE_THREADS < 2:
        return [_encode_one(job, options, append_ms) for job in jobs]
    owner = _encode_pool_owner
    if owner is None or owner[0] != os.getpid():  # a forked child cannot use its parent's threads
        with _encode_pool_lock:
            owner = _encode_pool_owner
            if owner is None or owner[0] != os.getpid():
                owner = _encode_pool_owner = (
                    os.getpid(),
                    ThreadPoolExecutor(ENCODE_THREADS, thread_name_prefix="plog-encode"),
                )
    return list(owner[1].map(lambda job: _encode_one(job, options, append_ms), jobs))


class _ChainGap(CorruptRecordError):
    """A listing whose objects do not join up: corruption, unless a new listing joins up."""


@dataclass(frozen=True)
class SegmentRef:
    """One segment object of the resolved chain."""

    key: str
    base_offset: int
    #: Exclusive end; None only for the last appended object until its index is read.
    end_offset: int | None
    generation: int
    size: int


@dataclass
class LogView:
    """A resolved snapshot of a partition: its chain, start and end offsets."""

    segments: list[SegmentRef]
    start_offset: int
    end_offset: int
    #: Objects listed but not on the chain, with the key of whatever superseded them.
    superseded: list[tuple[ObjectInfo, str]]
    start_marker: str | None
    running_max_timestamp: int = -1

    def segment_for(self, offset: int) -> int:
        """Index in ``segments`` of the segment holding ``offset`` (offset must be in range)."""
        bases = [s.base_offset for s in self.segments]
        return bisect.bisect_right(bases, offset) - 1


@dataclass
class PartitionListing:
    """A partition's listing sorted into the objects chain resolution reads (PROTOCOL.md 7.1, 7.2)."""

    #: ``(base, info)`` of each appended object, in listing order.
    appended: list[tuple[int, ObjectInfo]]
    #: ``(base, end, generation, info)`` of each rewritten object, in listing order.
    rewritten: list[tuple[int, int, int, ObjectInfo]]
    #: ``(offset, key)`` of each start marker, in listing order.
    markers: list[tuple[int, str]]


def parse_listing(
    prefix: str,
    infos: Sequence[ObjectInfo],
    *,
    on_unparsed: Callable[[ObjectInfo, str, str], None] | None = None,
    on_marker: Callable[[int, str], None] | None = None,
) -> PartitionListing:
    """Sort the listing ``infos`` of the partition at ``prefix`` by what their names say they are.

    Names under ``log/`` or ``start/`` that are not segment object or marker
    names are skipped (a reader ignores them), after being passed to
    ``on_unparsed`` as ``(info, folder, name)``; each marker is passed to
    ``on_marker`` as ``(offset, key)``. Both are called in listing order, so
    that a caller reporting on them (the verifier) reports in that order.
    """
    listing = PartitionListing([], [], [])
    for info in infos:
        folder, _, name = info.key[len(prefix) :].partition("/")
        if folder == "log":
            parsed = parse_segment_name(name)
            if parsed is None:
                if on_unparsed is not None:
                    on_unparsed(info, folder, name)
            elif parsed.end_offset is None:
                listing.appended.append((parsed.base_offset, info))
            else:
                listing.rewritten.append((parsed.base_offset, parsed.end_offset, parsed.generation, info))
        elif folder == "start":
            offset = parse_start_marker(name)
            if offset is None:
                if on_unparsed is not None:
                    on_unparsed(info, folder, name)
                continue
            listing.markers.append((offset, info.key))
            if on_marker is not None:
                on_marker(offset, info.key)
    return listing


@dataclass(frozen=True)
class ChainHole:
    """Offsets ``[lo, hi)`` that no object of a partition's chain holds (PROTOCOL.md 7.2 step 3)."""

    lo: int
    hi: int
    #: The chain object just past the hole; None for a hole between rewritten objects.
    key: str | None
    #: Why the offsets are missing, worded for a verify report.
    why: str
    #: The message a reader raises :class:`_ChainGap` with.
    message: str


@dataclass
class ResolvedChain:
    """The chain a listing resolves to (PROTOCOL.md 7.2), before any index is read."""

    #: The rewritten elements, then the appended ones; the last appended element's end is None (unknown).
    segments: list[SegmentRef]
    #: Index in ``segments`` of the first appended element (``len(segments)`` when there is none).
    appended_from: int
    #: Objects listed but not on the chain, with the key of the chain's last element ("" for an empty chain).
    superseded: list[tuple[ObjectInfo, str]]
    #: The largest start marker's offset and key, None when there is no marker.
    marker_offset: int | None
    marker_key: str | None


def resolve_chain(
    prefix: str, listing: PartitionListing, on_hole: Callable[[ChainHole], None] | None = None
) -> ResolvedChain:
    """Resolve a partition's chain from its parsed listing (PROTOCOL.md 7.2 steps 1-4).

    ``prefix`` is the partition's prefix, the key a :class:`_ChainGap` is
    raised with.

    Without ``on_hole`` the returned chain is guaranteed to have no hole:
    each element starts at or before the end of the one before it (rewritten
    objects may overlap; appended ones end where the next begins), and the
    first starts at or below the start marker. At the first hole it raises :class:`_ChainGap`
    instead, because a reader must never serve offsets from a chain with a
    hole: the listing may merely straddle a merge and its deletions, and a new
    listing may join up. With ``on_hole`` every hole is passed to it, in chain
    order, and resolution continues past it with the next object that exists,
    so that :func:`~segment_format.inspect.verify` reports all of them in one
    pass. Both use this one walk so that the verifier checks exactly the chain
    readers read.
    """

    def hole(found: ChainHole) -> None:
        if on_hole is None:
            raise _ChainGap(found.message, key=prefix)
        on_hole(found)

    appended, rewritten, markers = listing.appended, listing.rewritten, listing.markers
    marker_offset, marker_key = max(markers) if markers else (None, None)
    chain: list[SegmentRef] = []
    frontier = max((r[1] for r in rewritten), default=None)
    if rewritten and frontier is not None and (marker_offset is None or marker_offset < frontier):
        position = marker_offset if marker_offset is not None else min(r[0] for r in rewritten)
        while position < frontier:
            covering = [r for r in rewritten if r[0] <= position < r[1]]
            if not covering:
                # Some rewritten object ends at the frontier and does not cover position, so it starts above it.
                following = min((r[0] for r in rewritten if r[0] > position), default=frontier)
                hole(
                    ChainHole(
                        position,
                        following,
                        None,
                        "no rewritten object covers them",
                        f"gap in the chain: no segment object covers offset {position}",
                    )
                )
                position = following
                continue
            base, end, gen, info = max(covering, key=lambda r: (r[1], r[2]))
            chain.append(SegmentRef(info.key, base, end, gen, info.size))
            position = end
    appended_from = len(chain)
    tail_from = frontier if frontier is not None else -1
    if marker_offset is not None:
        tail_from = max(tail_from, marker_offset)
    tail = [(b, i) for b, i in appended if frontier is None or b >= frontier]
    # Drop appended objects that end at or before the start (their successor begins at or before it).
    while len(tail) > 1 and tail[1][0] <= tail_from:
        tail.pop(0)
    # The walk stops only at the frontier, so the rewritten part ends there and the tail starts at or after it.
    rewritten_end = chain[-1].end_offset if chain else None
    if rewritten_end is not None and tail and tail[0][0] != rewritten_end:
        hole(
            ChainHole(
                rewritten_end,
                tail[0][0],
                tail[0][1].key,
                "between the rewritten objects and the appended ones",
                f"gap in the chain: rewritten segments end at {rewritten_end} "
                f"but the next appended object starts at {tail[0][0]}",
            )
        )
    for n, (base, info) in enumerate(tail):
        tail_end = tail[n + 1][0] if n + 1 < len(tail) else None
        chain.append(SegmentRef(info.key, base, tail_end, 0, info.size))
    chosen = {ref.key for ref in chain}
    last_key = chain[-1].key if chain else ""
    superseded = [(info, last_key) for _base, info in appended if info.key not in chosen]
    superseded += [(info, last_key) for *_range, info in rewritten if info.key not in chosen]
    if chain and marker_offset is not None and chain[0].base_offset > marker_offset:
        hole(
            ChainHole(
                marker_offset,
                chain[0].base_offset,
                chain[0].key,
                f"the start marker says the log starts at {marker_offset}",
                f"gap in the chain: the log starts at {marker_offset} but its first object at {chain[0].base_offset}",
            )
        )
    return ResolvedChain(chain, appended_from, superseded, marker_offset, marker_key)


@dataclass(frozen=True)
class AppendResult:
    """Where an append landed: offsets of each batch, the object created."""

    key: str
    base_offsets: list[int]
    next_offset: int
    log_append_time_ms: int


@dataclass
class _Tail:
    end_offset: int
    running_max_timestamp: int
    learned_monotonic: float
    #: ``writer_epoch`` of the object that ends at ``end_offset`` (-1 if it has none).
    writer_epoch: int = -1


class IndexCache:
    """An LRU of parsed segment indexes; safe because objects never change once created."""

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, SegmentIndex] = OrderedDict()

    def get(self, store: Store, key: str, size: int | None) -> SegmentIndex:
        """The index of ``key``, read once and then served from memory."""
        item = self._items.get(key)
        if item is not None:
            self._items.move_to_end(key)
            return item
        item = read_index(store, key, size)
        self._items[key] = item
        if len(self._items) > self.capacity:
            self._items.popitem(last=False)
        return item

    def forget(self, key: str) -> None:
        """Drop a key (after its object was deleted)."""
        self._items.pop(key, None)


class PartitionLog:
    """Appends to and reads from one partition's chain of segment objects."""

    def __init__(
        self,
        store: Store,
        prefix: str,
        config: dict,
        *,
        index_cache: IndexCache | None = None,
        name: str = "",
        topic: str = "",
        partition: int = 0,
    ) -> None:
        self.store = store
        self.topic = topic
        self.partition = partition
        #: Everything below this offset is known decided (PROTOCOL.md 11.2), so LSO scans start here.
        self._stable_hint = 0
        self.prefix = prefix
        self.config = config
        self.name = name or prefix
        self.cache = index_cache or IndexCache()
        self._tail: _Tail | None = None
        #: Per producer id written through this log: (epoch, next sequence) (PROTOCOL.md 11.1).
        self._producers: dict[int, tuple[int, int]] = {}
        #: Producer id -> key its last append tried before failing ambiguously.
        self._ambiguous: dict[int, str] = {}
        self._tried_key: str | None = None
        self._view: LogView | None = None
        #: When the cached view was last known current (monotonic s): its listing or its last tail probe.
        self._view_checked = float("-inf")
        self._writer_id = uuid.uuid4().hex
        self._options = ipc_options(config["compression.type"])
        #: (object key, batch number, decoded batch, next offset) when the last read stopped inside that batch
        #: (max_records): a consumer reading fewer records than a batch holds continues there next time, and
        #: objects never change, so the batch is not read, verified and decompressed again for every poll.
        self._decoded: tuple[str, int, pa.RecordBatch, int] | None = None

    # ------------------------------------------------------------------ resolution

    def index(self, ref: SegmentRef) -> SegmentIndex:
        """The verified index of a chain segment; checks it agrees with its name."""
        idx = self.cache.get(self.store, ref.key, ref.size or None)
        if idx.meta.base_offset != ref.base_offset or (
            ref.end_offset is not None and idx.meta.next_offset != ref.end_offset
        ):
            raise CorruptRecordError(
                f"segment covers [{idx.meta.base_offset}, {idx.meta.next_offset}) but its place in the chain "
                f"is [{ref.base_offset}, {ref.end_offset})",
                key=ref.key,
            )
        return idx

    def view(self, refresh: bool = True) -> LogView:
        """Resolve the chain from a fresh listing (or return the cached one)."""
        if self._view is not None and not refresh:
            return self._view
        last_gap: _ChainGap | None = None
        for _ in range(8):
            try:
                checked = time.monotonic()
                self._view = self._resolve()
                self._view_checked = checked
                return self._view
            except ObjectNotFoundError:
                continue  # an object vanished between listing and reading: list again
            except _ChainGap as gap:
                last_gap = gap  # a listing can straddle a merge and its deletions: list again
                continue
        if last_gap is not None:
            raise last_gap
        raise CorruptRecordError("partition keeps changing under the reader; could not resolve it", key=self.prefix)

    def _resolve(self) -> LogView:
        resolved = resolve_chain(self.prefix, parse_listing(self.prefix, self.store.list(self.prefix)))
        chain, marker_offset = resolved.segments, resolved.marker_offset
        if not chain:
            start = marker_offset or 0
            return LogView([], start, start, resolved.superseded, resolved.marker_key)
        last = chain[-1]
        last_index = self.index(last)
        end_offset = last_index.meta.next_offset
        if last.end_offset is None:
            chain[-1] = SegmentRef(last.key, last.base_offset, end_offset, last.generation, last.size)
        start = chain[0].base_offset if marker_offset is None else max(marker_offset, chain[0].base_offset)
        return LogView(
            chain, start, end_offset, resolved.superseded, resolved.marker_key, last_index.meta.running_max_timestamp
        )

    def follow_tail(self) -> LogView:
        """Cheaply extend the cached view with objects appended since (one existence check when idle).

        The check for ``log/<end>.arrow`` can only be trusted while checks come
        less than ``file.delete.delay.ms`` apart: that object may have been
        appended, merged and deleted since the last one, and a reader that only
        looks for it would then wait at ``end`` forever. After a longer pause
        (half the delay, for margin) the chain is listed again instead.
        """
        view = self._view
        now = time.monotonic()
        if view is None or now - self._view_checked >= self.config["file.delete.delay.ms"] / 2000:
            return self.view()
        self._view_checked = now
        while True:
            key = self.prefix + "log/" + appended_name(view.end_offset)
            try:
                idx = self.cache.get(self.store, key, None)
            except ObjectNotFoundError:
                return view
            if idx.meta.base_offset != view.end_offset:
                raise CorruptRecordError("appended segment does not start where its name says", key=key)
            view.segments.append(SegmentRef(key, view.end_offset, idx.meta.next_offset, 0, idx.size))
            view.end_offset = idx.meta.next_offset
            view.running_max_timestamp = idx.meta.running_max_timestamp

    # ------------------------------------------------------------------ appending

    def _fresh_tail(self) -> _Tail:
        staleness_s = self.config["writer.max.staleness.ms"] / 1000
        tail = self._tail
        if tail is None or time.monotonic() - tail.learned_monotonic > staleness_s:
            learned = time.monotonic()
            view = self.view()
            epoch = self.index(view.segments[-1]).meta.extra.get("writer_epoch", -1) if view.segments else -1
            tail = _Tail(view.end_offset, view.running_max_timestamp, learned, epoch)
            self._tail = tail
        return tail

    def append(
        self,
        payloads: Sequence[tuple[pa.RecordBatch, BatchMeta]],
        *,
        durable: bool = True,
        compression: str | None = None,
        writer_epoch: int | None = None,
        extra: dict | None = None,
    ) -> AppendResult:
        """Append batches (payload columns, no offsets) as one new segment object.

        The offsets are claimed by creating ``log/<end>.arrow`` with
        put-if-absent (PROTOCOL.md 8). Losing the race to another writer moves
        to the new end and retries with new offsets, up to
        ``MAX_APPEND_ATTEMPTS`` times. A store error leaves it unknown whether
        the object was created; the same key is then tried again and an object
        found there that is this attempt, or holds this producer's batch, counts
        as the append (11.1). Idempotent batches must continue their producer's
        sequence (``OutOfOrderSequenceError``), and with ``writer_epoch`` the
        append is refused (``FencedError``) after an object of a newer epoch (11.3).
        """
        first = payloads[0][1]
        earlier = self._earlier_attempt(first)
        if earlier is not None:
            return earlier
        self._check_sequences(payloads)
        self._tried_key = None
        try:
            return self._append(payloads, durable, compression, writer_epoch, extra)
        except StorageError:
            if self._tried_key is not None and first.producer_id >= 0 and first.base_sequence >= 0:
                self._ambiguous[first.producer_id] = self._tried_key  # the retry looks here first
            raise

    def _append(
        self,
        payloads: Sequence[tuple[pa.RecordBatch, BatchMeta]],
        durable: bool,
        compression: str | None,
        writer_epoch: int | None,
        extra: dict | None,
    ) -> AppendResult:
        log_append_time = self.config["message.timestamp.type"] == "LogAppendTime"
        codec = compression or self.config["compression.type"]
        options = self._options if compression is None else ipc_options(compression)
        failures = 0
        tail: _Tail | None = None
        for _attempt in range(MAX_APPEND_ATTEMPTS):
            if tail is None:
                tail = self._fresh_tail()
            if writer_epoch is not None and tail.writer_epoch > writer_epoch:
                raise FencedError(
                    f"{self.name}: an append of writer epoch {tail.writer_epoch} ends at {tail.end_offset}; "
                    f"this writer's epoch {writer_epoch} has been fenced"
                )
            append_ms = now_ms()
            jobs = []
            base_offsets = []
            offset = tail.end_offset
            for payload, meta in payloads:
                jobs.append((payload, meta, offset))
                base_offsets.append(offset)
                offset += payload.num_rows
            encoded = _encode_batches(jobs, options, append_ms if log_append_time else None)
            max_ts = max(e.row["max_timestamp"] for e in encoded)
            attempt_id = uuid.uuid4().hex
            segment_extra = {**(extra or {}), "append_id": attempt_id}
            if writer_epoch is not None:
                segment_extra["writer_epoch"] = writer_epoch
            data, meta_out = assemble_segment(
                encoded,
                {
                    "base_offset": tail.end_offset,
                    "next_offset": offset,
                    "running_max_timestamp": max(max_ts, tail.running_max_timestamp),
                    "compression": codec,
                    "created_ms": append_ms,
                    "writer": self._writer_id,
                    "extra": segment_extra,
                },
            )
            key = self.prefix + "log/" + appended_name(tail.end_offset)
            self._tried_key = key
            try:
                created = self.store.put_if_absent(key, data, durable=durable)
            except StorageError:
                failures += 1
                if failures > MAX_AMBIGUOUS_FAILURES:
                    raise
                created = False
            landed = None if created else self._landed(key, attempt_id, payloads[0][1])
            if landed is None and not created and not self.store.exists(key):
                continue  # the failed create did not land: try the same offsets again
            if created:
                result = AppendResult(key, base_offsets, offset, append_ms)
                new_tail = _Tail(
                    offset,
                    meta_out.running_max_timestamp,
                    tail.learned_monotonic,
                    -1 if writer_epoch is None else writer_epoch,
                )
                size = len(data)
            elif landed is not None:
                result, new_tail, size = landed
                new_tail.learned_monotonic = tail.learned_monotonic
            else:
                # Lost the race: another writer holds these offsets. Learn the new end by
                # following the objects from the one that won, not by listing again.
                self._tail = tail = self._tail_after_loss(tail)
                continue
            self._record_sequences(payloads)
            self._tail = new_tail
            view = self._view
            if view is not None and view.end_offset == result.base_offsets[0]:
                view.segments.append(SegmentRef(key, result.base_offsets[0], result.next_offset, 0, size))
                view.end_offset = result.next_offset
                view.running_max_timestamp = new_tail.running_max_timestamp
            return result
        raise ConcurrentAppendError(
            f"append to {self.name} lost the race for offsets {MAX_APPEND_ATTEMPTS} times in a row"
        )

    def _earlier_attempt(self, first: BatchMeta) -> AppendResult | None:
        """After an append that failed ambiguously, find whether it landed (PROTOCOL.md 11.1).

        Follows the appended objects from the key the failed append last tried;
        one of them holding this producer's batch with the same sequence means
        the earlier attempt was stored.
        """
        key = self._ambiguous.pop(first.producer_id, None) if first.producer_id >= 0 else None
        while key is not None:
            landed = self._landed(key, "", first)
            if landed is not None:
                result, tail, _ = landed
                self._tail = None
                return result
            try:
                idx = read_index(self.store, key)
            except (ObjectNotFoundError, CorruptRecordError):
                return None
            key = self.prefix + "log/" + appended_name(idx.meta.next_offset)
        return None

    def _check_sequences(self, payloads: Sequence[tuple[pa.RecordBatch, BatchMeta]]) -> None:
        expected = dict(self._producers)
        for payload, meta in payloads:
            if meta.producer_id < 0 or meta.base_sequence < 0:
                continue
            known = expected.get(meta.producer_id)
            if known is not None:
                epoch, next_sequence = known
                if (meta.producer_epoch == epoch and meta.base_sequence != next_sequence) or (
                    meta.producer_epoch > epoch and meta.base_sequence != 0
                ):
                    raise OutOfOrderSequenceError(
                        f"{self.name}: producer {meta.producer_id} epoch {meta.producer_epoch} sent sequence "
                        f"{meta.base_sequence}, expected {next_sequence if meta.producer_epoch == epoch else 0}"
                    )
                if meta.producer_epoch < epoch:
                    raise FencedError(
                        f"{self.name}: producer {meta.producer_id} epoch {meta.producer_epoch} is older than {epoch}"
                    )
            expected[meta.producer_id] = (meta.producer_epoch, meta.base_sequence + payload.num_rows)

    def _record_sequences(self, payloads: Sequence[tuple[pa.RecordBatch, BatchMeta]]) -> None:
        for payload, meta in payloads:
            if meta.producer_id >= 0 and meta.base_sequence >= 0:
                self._producers[meta.producer_id] = (meta.producer_epoch, meta.base_sequence + payload.num_rows)

    def _landed(self, key: str, attempt_id: str, first: BatchMeta) -> tuple[AppendResult, _Tail, int] | None:
        """The append already stored at ``key`` if it is this attempt or this producer's same batch (11.1).

        A conditional create whose response was lost and that the client
        retried answers "exists" although our bytes are stored; a retry after
        an ambiguous failure finds the earlier attempt by producer id and sequence.
        """
        try:
            idx = read_index(self.store, key)
        except (ObjectNotFoundError, CorruptRecordError):
            return None
        same_attempt = idx.meta.extra.get("append_id") == attempt_id
        same_batch = (
            first.producer_id >= 0
            and first.base_sequence >= 0
            and (int(idx.producer_ids[0]), int(idx.producer_epochs[0]), int(idx.base_sequences[0]))
            == (first.producer_id, first.producer_epoch, first.base_sequence)
        )
        if not (same_attempt or same_batch):
            return None
        result = AppendResult(key, [int(b) for b in idx.base_offsets], idx.meta.next_offset, idx.meta.created_ms)
        tail = _Tail(
            idx.meta.next_offset,
            idx.meta.running_max_timestamp,
            time.monotonic(),
            idx.meta.extra.get("writer_epoch", -1),
        )
        return result, tail, idx.size

    def _tail_after_loss(self, tail: _Tail) -> _Tail | None:
        """The log end after losing the race at ``tail.end_offset``, found by following the appended objects.

        A loser that listed the partition before each retry would always be
        slower than a winner appending back to back (which knows its end), and
        would lose again and again until ``ConcurrentAppendError``; following
        costs one index read per object the others appended. The knowledge
        keeps the age of ``tail`` (PROTOCOL.md A4): the objects followed were
        all created after ``tail`` was learned, so none can have been deleted
        while it is younger than W. None (resolve the chain) if following fails.
        """
        end, running, epoch = tail.end_offset, tail.running_max_timestamp, tail.writer_epoch
        while True:
            try:
                idx = self.cache.get(self.store, self.prefix + "log/" + appended_name(end), None)
            except ObjectNotFoundError:
                break
            except CorruptRecordError:
                return None
            if idx.meta.base_offset != end or idx.meta.next_offset <= end:
                return None
            end, running = idx.meta.next_offset, idx.meta.running_max_timestamp
            epoch = idx.meta.extra.get("writer_epoch", -1)
        if end == tail.end_offset:
            return None  # the object we lost to is gone already: list again
        return _Tail(end, running, tail.learned_monotonic, epoch)

    # ------------------------------------------------------------------ reading

    def read(
        self,
        offset: int,
        max_records: int | None = None,
        max_bytes: int | None = None,
        isolation: str = READ_UNCOMMITTED,
        resolver: TransactionResolver | None = None,
    ) -> tuple[list[pa.RecordBatch], int]:
        """Record batches from ``offset`` on, and the offset to read next.

        Raises ``OffsetOutOfRangeError`` below the log start or beyond the log
        end. Returns no batches at the end. ``max_records`` is exact;
        ``max_bytes`` is a soft bound on stored bytes (at least one batch is returned).
        Control batches are never returned. With ``isolation=READ_COMMITTED``
        batches of aborted (or unlisted) transactions are skipped and the read
        stops at the first undecided one, the last stable offset (PROTOCOL.md 11.2).
        """
        for _ in range(8):
            view = self.follow_tail()
            if offset < view.start_offset or offset > view.end_offset:
                view = self.view()
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
                self.view()  # merged or deleted under us: resolve again
        raise CorruptRecordError("partition keeps changing under the reader", key=self.prefix, offset=offset)

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
        view = self.follow_tail()
        position = max(self._stable_hint, view.start_offset)
        if not view.segments or position >= view.end_offset:
            return view.end_offset
        for ref in view.segments[max(view.segment_for(position), 0) :]:
            idx = self.index(ref)
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
            idx = self.index(view.segments[s])
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
                    batches += read_batches(self.store, idx, first + 1, last)
            else:
                batches = read_batches(self.store, idx, first, last)
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
        view = self.view()
        segments = view.segments
        lo, hi = 0, len(segments)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.index(segments[mid]).meta.running_max_timestamp >= timestamp_ms:
                hi = mid
            else:
                lo = mid + 1
        for s in range(lo, len(segments)):
            idx = self.index(segments[s])
            b = idx.batch_for_timestamp(timestamp_ms)
            for first in range(b, idx.batch_count):
                batch = read_batches(self.store, idx, first, first)[0]
                batch = _from_offset(batch, view.start_offset)
                ts = batch.column(1).cast(pa.int64()).to_numpy(zero_copy_only=False)
                hits = np.flatnonzero(ts >= timestamp_ms)
                if hits.size:
                    return int(batch.column(0)[int(hits[0])].as_py())
        return None

    # ------------------------------------------------------------------ maintenance

    def delete_records(self, before_offset: int) -> int:
        """Advance the log start offset to ``before_offset`` (Kafka's DeleteRecords); returns the new start."""
        view = self.view()
        if not view.start_offset <= before_offset <= view.end_offset:
            raise OffsetOutOfRangeError(
                f"cannot move the start of {self.name} to {before_offset}: "
                f"valid offsets are {view.start_offset}..{view.end_offset}"
            )
        if before_offset > view.start_offset:
            body = json.dumps({"created_ms": now_ms(), "offset": before_offset}).encode()
            self.store.put_if_absent(self.prefix + "start/" + start_marker_name(before_offset), body)
        return self.view().start_offset

    def merge_segments(self) -> int:
        """Merge sealed appended objects at the frontier into segments of up to ``segment.bytes``.

        A group closes when the next object would take it past ``segment.bytes``
        or more than ``segment.ms`` after its first record. Only closed groups
        of two or more objects are rewritten; batches are copied verbatim.
        Returns how many merged segments were written.
        """
        view = self.view()
        appended = [s for s in view.segments if s.generation == 0]
        sealed = appended[:-1]  # never touch the tail object
        limit_bytes = self.config["segment.bytes"]
        limit_ms = self.config["segment.ms"]
        written = 0
        group: list[SegmentRef] = []
        group_bytes = 0
        group_first_ts = 0
        for ref in sealed:
            idx = self.index(ref)
            closes = group and (
                group_bytes + ref.size > limit_bytes or idx.meta.max_timestamp - group_first_ts > limit_ms
            )
            if closes:
                written += self._write_merged(group)
                group, group_bytes = [], 0
            if not group:
                group_first_ts = idx.meta.min_timestamp
            group.append(ref)
            group_bytes += ref.size
        if group and (
            group_bytes >= limit_bytes
            or (appended and len(sealed) and self.index(appended[-1]).meta.min_timestamp - group_first_ts > limit_ms)
        ):
            written += self._write_merged(group)
        if written:
            self.view()
        return written

    def _write_merged(self, group: list[SegmentRef]) -> int:
        if len(group) < 2:
            return 0
        batches: list[EncodedBatch] = []
        for ref in group:
            batches.extend(raw_messages(self.store, self.index(ref)))
        first, last = self.index(group[0]), self.index(group[-1])
        data, _ = assemble_segment(
            batches,
            {
                "base_offset": group[0].base_offset,
                "next_offset": last.meta.next_offset,
                "running_max_timestamp": last.meta.running_max_timestamp,
                "compression": first.meta.compression,
                "created_ms": now_ms(),
                "writer": self._writer_id,
                "generation": 1,
            },
        )
        name = rewritten_name(group[0].base_offset, last.meta.next_offset, 1)
        self.store.put_if_absent(self.prefix + "log/" + name, data)
        return 1

    def apply_retention(self, now: int | None = None) -> int:
        """Move the log start past whole segments beyond ``retention.ms`` / ``retention.bytes``.

        The last segment is never retired. Returns the new log start offset.
        """
        if "delete" not in self.config["cleanup.policy"]:
            return self.view().start_offset
        now = now_ms() if now is None else now
        view = self.view()
        segments = view.segments[:-1]
        retention_ms = self.config["retention.ms"]
        retention_bytes = self.config["retention.bytes"]
        total = sum(s.size for s in view.segments)
        new_start = view.start_offset
        for ref in segments:
            idx = self.index(ref)
            too_old = retention_ms >= 0 and idx.meta.max_timestamp < now - retention_ms
            too_big = retention_bytes >= 0 and total - ref.size >= retention_bytes
            if not (too_old or too_big):
                break
            total -= ref.size
            new_start = max(new_start, idx.meta.next_offset)
        if new_start > view.start_offset:
            return self.delete_records(new_start)
        return view.start_offset

    def collect_garbage(self, now: int | None = None) -> int:
        """Delete objects off the chain once ``file.delete.delay.ms`` has passed since they left it.

        An object leaves the chain when a rewritten segment covering it, or a
        start marker past it, is created; that object's creation time starts the clock.
        """
        now = now_ms() if now is None else now
        delay = self.config["file.delete.delay.ms"]
        view = self.view()
        deleted = 0
        marker_ms = None
        if view.start_marker:
            try:
                marker_ms = json.loads(self.store.get(view.start_marker))["created_ms"]
            except ObjectNotFoundError:
                marker_ms = None
        by_base = {s.base_offset: s for s in view.segments}
        for info, _ in view.superseded:
            parsed = parse_segment_name(info.key.rsplit("/", 1)[-1])
            if parsed is None:
                continue
            end = parsed.end_offset
            if end is None:
                try:
                    end = read_index(self.store, info.key, info.size).meta.next_offset
                except (ObjectNotFoundError, CorruptRecordError):
                    end = parsed.base_offset + 1
            since = None
            if end <= view.start_offset and marker_ms is not None:
                since = marker_ms
            else:
                s = view.segment_for(parsed.base_offset)
                ref = view.segments[s] if s >= 0 else by_base.get(parsed.base_offset)
                if ref is not None and ref.generation > 0:
                    since = self.index(ref).meta.created_ms
            if since is not None and now - since >= delay:
                self.store.delete(info.key)
                self.cache.forget(info.key)
                deleted += 1
        # Segments of the chain entirely below the start are garbage as well.
        for ref in view.segments[:-1]:
            below_start = ref.end_offset is not None and ref.end_offset <= view.start_offset
            if below_start and marker_ms is not None and now - marker_ms >= delay:
                self.store.delete(ref.key)
                self.cache.forget(ref.key)
                deleted += 1
        if deleted:
            self.view()
        return deleted


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


__all__ = ["RECORD_SCHEMA", "AppendResult", "IndexCache", "LogView", "PartitionLog", "SegmentRef"]
