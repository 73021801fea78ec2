"""Compaction of one partition (PROTOCOL.md 11.6): keep each key's last record, drop what it superseded.

::

    chain      [ elem 0 | elem 1 | ... | elem k-1 | ...          | last element ]
                 clean to its end       dirty: appended, merged     never rewritten
                 (clean_end >= end)     or clean_end < end
    map range  from the map start (the least map_end the clean elements state, or first_dirty; the
               start when every record below the LSO fits) up to the LSO, element by element while
               the map has room (log.cleaner.dedupe.buffer.size, 24 bytes an entry)  ->  offset map:
               key -> greatest offset, keyed by the keys themselves when the records fit (an Arrow
               group-by), else by 16-byte key hashes; where it stopped is the *map end*
    cleanable  the longest run from elem 0 of elements that are not the last, end at or below the
               LSO and, with min.compaction.lag.ms, became readable long enough ago
    rewritten  the cleanable run up to the map end, read element by element, in groups of consecutive
               elements (clean ones apart from dirty ones)
               of up to segment.bytes, each as one compacted object, created in ascending offset
               order:  log/<base>-<end>.g<gen>.c<compacted_ms:013d><8 hex>.arrow ; a lone clean
               element that loses nothing is left as it is

A compacted object covers exactly the offsets of the elements it replaces, so offsets never change
and the chain joins up whatever prefix of a pass's creates happened; readers skip the gaps. Objects
it replaces leave the chain and are deleted D later, as for merges (PROTOCOL.md 10).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from ..layout import new_rewrite_id, rewritten_name
from ..parallel import ordered_map
from ..records import now_ms
from ..segment import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    WHOLE_READ,
    BatchMeta,
    EncodedBatch,
    SegmentIndex,
    assemble_segment,
    decode_batch,
    encode_batch,
    ipc_options,
    raw_messages,
)
from .chain import LogChain, LogView, SegmentRef
from .reader import ABORTED, COMMITTED, TransactionResolver, batch_outcome

#: Kafka's ``log.cleaner.dedupe.buffer.size`` default (128 MiB): the offset map's size limit in bytes.
DEFAULT_DEDUPE_BUFFER_SIZE = 128 * 1024 * 1024

#: Bytes an offset map entry counts for: a 16-byte key hash and an 8-byte offset, as Kafka's.
MAP_ENTRY_BYTES = 24

#: The map stops taking elements once it holds this share of its entries (Kafka's
#: ``log.cleaner.io.buffer.load.factor``), so that merging a new element into it stays amortised.
MAP_LOAD_FACTOR = 0.9

#: ε of assumption A4 (PROTOCOL.md 2; 11.6 adds it wherever a time from another machine's clock is compared).
CLOCK_SKEW_MS = 1_000

#: ``decided_ms(producer_id, transaction)``: when the transaction's decision was created (its
#: ``created_ms``), None if unknown. Compaction with ``min.compaction.lag.ms`` > 0 needs it to know
#: when a transaction's records became readable (PROTOCOL.md 11.6, *Visible times*).
DecisionTimes = Callable[[int, int], "int | None"]


@dataclass(frozen=True)
class CompactionPlan:
    """What a pass found on a view: the last stable offset, the cleanable run, and whether it is due."""

    lso: int
    #: Number of chain elements in the cleanable run (from the first element).
    cleanable: int
    #: Index of the first element not clean to its end (``cleanable`` when the run is all clean).
    first_dirty: int
    cleanable_bytes: int
    dirty_bytes: int
    due: bool
    #: Index of the element holding the map frontier: the least ``map_end`` of the clean elements before
    #: ``first_dirty``, else ``first_dirty``; the map starts there when ``bounded`` (PROTOCOL.md 11.6).
    map_start: int = 0
    #: Whether the records below the LSO do not all fit in the map: passes then map from ``map_start``.
    bounded: bool = False
    #: Whether a forced pass has anything to do: a dirty element, or one at or above the map frontier.
    work: bool = False


@dataclass(frozen=True)
class CompactionPass:
    """What the last pass did: objects written, where its offset map started and ended (offsets), and
    whether it stopped at the map end before the end of the cleanable run (the rest stays for a later
    pass)."""

    written: int
    map_start: int
    map_end: int
    cleanable_end: int
    map_entries: int
    #: Whether the map held the keys themselves (the pass's records fit), not their hashes.
    exact_keys: bool = False

    @property
    def partial(self) -> bool:
        """Whether the map filled before the end of the cleanable run."""
        return self.map_end < self.cleanable_end


#: The two 128-bit SipHash keys of :func:`key_hashes`, drawn per process: the map lives only in memory, so
#: nothing needs them to agree between processes, and keys no one knows make collisions impossible to aim at.
_HASH_KEYS = (os.urandom(16).decode("latin-1"), os.urandom(16).decode("latin-1"))


def key_hashes(keys: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """16-byte digests of non-null ``keys``, as (high, low) 64-bit halves (PROTOCOL.md 11.6): SipHash-2-4 of
    each key under two independent random keys, computed a column at a time by pandas' ``hash_array``."""
    # pandas (a dependency) takes about half a second to import, and most passes need no hashes at all.
    from pandas.util import hash_array

    values = keys.to_numpy(zero_copy_only=False)  # bytes objects: hashed as they are, whatever the encoding
    hi, lo = (hash_array(values, encoding="latin-1", hash_key=key, categorize=False) for key in _HASH_KEYS)
    return hi.astype(np.uint64, copy=False), lo.astype(np.uint64, copy=False)


class OffsetMap:
    """key hash -> greatest offset, within ``limit_bytes`` at 24 bytes an entry (Kafka's SkimpyOffsetMap).

    Entries are three sorted numpy arrays (hash halves, offset). Elements are added whole, in
    ascending offset order; :meth:`add` refuses one that would take the map past its capacity, unless
    the map is empty (a pass always maps at least one element, or it could never progress).
    """

    def __init__(self, limit_bytes: int) -> None:
        self.capacity = max(1, limit_bytes // MAP_ENTRY_BYTES)
        self._hi = np.empty(0, np.uint64)
        self._lo = np.empty(0, np.uint64)
        self._offsets = np.empty(0, np.int64)
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        #: Entries held, counting a key once per pending element: never below the true count.
        self._upper = 0
        #: Set once the map holds more than MAP_LOAD_FACTOR of its capacity: it takes no more elements.
        self.full = False

    def __len__(self) -> int:
        self._settle()
        return len(self._offsets)

    def add(self, hi: np.ndarray, lo: np.ndarray, offsets: np.ndarray) -> bool:
        """Add one element's entries (each key once, its greatest offset; merged quickest when sorted by
        hash, as :func:`_dedupe` leaves them); False: it does not fit, the map is left as it was."""
        if self._upper == 0 or self._upper + len(offsets) <= self.capacity:
            self._pending.append((hi, lo, offsets))
            self._upper += len(offsets)
            return True
        # The bound is reached: count exactly (pending elements may share keys), then try the element.
        self._settle()
        merged = _dedupe([self._hi, hi], [self._lo, lo], [self._offsets, offsets], runs=True)
        if len(merged[2]) > self.capacity:
            return False
        self._hi, self._lo, self._offsets = merged
        self._upper = len(self._offsets)
        self.full = self._upper > MAP_LOAD_FACTOR * self.capacity
        return True

    def lookup(self, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
        """The greatest offset the map holds for each hash, -1 where it holds none."""
        self._settle()
        n = len(self._hi)
        out = np.full(len(hi), -1, np.int64)
        if n == 0 or len(hi) == 0:
            return out
        pos = np.searchsorted(self._hi, hi)
        todo = np.arange(len(hi))
        while len(todo):  # equal high halves are rare: step past them until the low half matches or not
            at = np.minimum(pos[todo], n - 1)
            same_hi = (pos[todo] < n) & (self._hi[at] == hi[todo])
            hit = same_hi & (self._lo[at] == lo[todo])
            out[todo[hit]] = self._offsets[at[hit]]
            todo = todo[same_hi & ~hit]
            pos[todo] += 1
        return out

    @property
    def nbytes(self) -> int:
        """Bytes the entries take, at 24 an entry (an upper bound while elements are pending)."""
        return MAP_ENTRY_BYTES * self._upper

    def offsets(self) -> np.ndarray:
        """The offsets the map holds, one an entry, in no particular order."""
        self._settle()
        return self._offsets

    def _settle(self) -> None:
        if self._pending:
            his, los, offs = zip(*self._pending, strict=True)
            self._hi, self._lo, self._offsets = _dedupe(
                [self._hi, *his], [self._lo, *los], [self._offsets, *offs], runs=True
            )
            self._pending = []
            self._upper = len(self._offsets)


def _dedupe(
    his: list[np.ndarray], los: list[np.ndarray], offsets: list[np.ndarray], runs: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One entry per hash, its greatest offset, sorted by hash. ``runs``: each part is sorted already (a
    merge sort then takes half the time of a quicksort; on unsorted input, twice)."""
    hi, lo, off = np.concatenate(his), np.concatenate(los), np.concatenate(offsets)
    # Sorting by the high half alone is three times quicker than by all three columns; it is enough unless
    # two hashes share their high half, which for the 5.6 M entries of a 128 MiB map happens about once in
    # a million passes: only then are the low halves sorted too.
    order = np.argsort(hi, kind="stable" if runs else "quicksort")
    hi, lo, off = hi[order], lo[order], off[order]
    same = hi[1:] == hi[:-1]
    if (same & (lo[1:] != lo[:-1])).any():
        order = np.lexsort((lo, hi))
        hi, lo, off = hi[order], lo[order], off[order]
        same = (hi[1:] == hi[:-1]) & (lo[1:] == lo[:-1])
    starts = np.flatnonzero(np.concatenate(([True], ~same))) if len(off) else np.empty(0, np.intp)
    greatest = np.maximum.reduceat(off, starts) if len(off) else off
    return hi[starts], lo[starts], greatest


def _last_per_key(keys: pa.Array, offsets: pa.Array) -> tuple[pa.Array, pa.Array]:
    """Each distinct key once, with its greatest offset (an Arrow group-by: new buffers, no Python per record)."""
    table = pa.table({"key": keys, "offset": offsets}).group_by("key").aggregate([("offset", "max")])
    return table.column("key").combine_chunks(), table.column("offset_max").combine_chunks()


class PassMap:
    """One pass's offset map, keyed by the keys themselves while they fit its limit, else by their hashes.

    A pass whose records all fit the map's entries (``exact``) starts with the keys as Arrow arrays:
    no record is hashed and no collision can drop a record. They are counted at their own size (key bytes,
    a 4-byte position and an 8-byte offset each, repeats included until a group-by removes them when the
    limit is reached); should the distinct keys still take more than half the limit, the map turns into an
    :class:`OffsetMap` of hashes, which holds every entry of such a pass. Any other pass hashes from the
    start (PROTOCOL.md 11.6, *Bounded offset maps*).

    Once built (:meth:`finish`), the map answers for a record whether its key's greatest offset in the map
    is greater than its own: for a record of an element the map took, that is whether its own offset is
    not among the map's (offsets are unique in a partition), a sorted search without keys; for one below
    the map start, a lookup of its key.
    """

    def __init__(self, limit_bytes: int, exact: bool) -> None:
        self.limit = limit_bytes
        self.hashed: OffsetMap | None = None if exact else OffsetMap(limit_bytes)
        #: Exact keys and offsets as added (an element's at a time, repeats included) and their bytes.
        self._keys: list[pa.Array] = []
        self._offsets: list[pa.Array] = []
        self._bytes = 0
        #: Whether ``_keys`` is one array of distinct keys (``_offsets`` their greatest offsets).
        self._settled = False
        #: After :meth:`finish`: the offsets the map holds, sorted.
        self._last = np.empty(0, np.int64)

    @property
    def exact(self) -> bool:
        """Whether the map holds the keys themselves."""
        return self.hashed is None

    @property
    def full(self) -> bool:
        """Whether the map takes no more elements."""
        return self.hashed is not None and self.hashed.full

    @property
    def nbytes(self) -> int:
        """Bytes the map holds (24 an entry when hashed)."""
        return self._bytes if self.hashed is None else self.hashed.nbytes

    def __len__(self) -> int:
        return len(self._last)

    def add(self, keys: pa.Array, offsets: pa.Array) -> bool:
        """Add one element's visible keyed records (``keys`` not null); False: they do not fit, the map is
        left as it was (hashed maps only: an exact map makes room by hashing)."""
        if self.hashed is None:
            self._keys.append(keys)
            self._offsets.append(offsets)
            self._bytes += keys.nbytes + offsets.nbytes
            self._settled = False
            if self._bytes > self.limit:
                keys, offsets = self._consolidate()
                # Half the limit left, or the next element would pay for this group-by again soon.
                if self._bytes > self.limit // 2:
                    self.hashed = OffsetMap(self.limit)
                    self._keys, self._offsets, self._bytes = [], [], 0
                    hi, lo = key_hashes(keys)
                    return self.hashed.add(hi, lo, offsets.to_numpy().astype(np.int64))
            return True
        # Hashing every record and keeping each hash's greatest offset in numpy costs less than a group-by
        # on the keys first.
        his, los = key_hashes(keys)
        hi, lo, greatest = _dedupe([his], [los], [offsets.to_numpy().astype(np.int64)])
        return self.hashed.add(hi, lo, greatest)

    def _consolidate(self) -> tuple[pa.Array, pa.Array]:
        """The exact entries, each key once with its greatest offset, kept so."""
        if self._settled:
            return self._keys[0], self._offsets[0]
        if self._keys:
            keys, offsets = _last_per_key(pa.concat_arrays(self._keys), pa.concat_arrays(self._offsets))
        else:
            keys, offsets = pa.array([], pa.binary()), pa.array([], pa.int64())
        self._keys, self._offsets, self._settled = [keys], [offsets], True
        self._bytes = keys.nbytes + offsets.nbytes
        return keys, offsets

    def finish(self) -> None:
        """Settle the map once every element has entered: only then is it looked up."""
        offsets = self._consolidate()[1].to_numpy() if self.hashed is None else self.hashed.offsets()
        self._last = np.sort(offsets.astype(np.int64))

    def superseded(self, keys: pa.Array, offsets: np.ndarray, mapped: bool) -> np.ndarray:
        """For non-null ``keys`` at ``offsets``: whether the map holds a greater offset of the key.
        ``mapped``: the records lie in an element the map took, whose keyed visible records all entered."""
        if mapped:
            at = np.minimum(np.searchsorted(self._last, offsets), max(len(self._last) - 1, 0))
            return ~(self._last[at] == offsets) if len(self._last) else np.ones(len(offsets), bool)
        if self.hashed is not None:
            hi, lo = key_hashes(keys)
            return self.hashed.lookup(hi, lo) > offsets
        map_keys, map_offsets = self._consolidate()
        found = pc.index_in(keys, value_set=map_keys)
        greatest = pc.fill_null(pc.take(map_offsets, found), -1).to_numpy()
        return greatest > offsets


@dataclass
class _Element:
    """One chain element as a pass read it: its index, its stored batches and those decoded."""

    ref: SegmentRef
    index: SegmentIndex
    raw: list[EncodedBatch]
    batches: list[pa.RecordBatch]


def plain_batch(records: pa.RecordBatch, idx: SegmentIndex, i: int, options: ipc.IpcWriteOptions) -> EncodedBatch:
    """``records`` (kept records of batch ``i`` of ``idx``) written as one non-transactional batch: the
    outcome of a committed transaction is known (PROTOCOL.md 11.6, *What a rewrite keeps*). The batch keeps
    its producer fields, timestamp type and ``base_sequence``; a typed topic's keeps its object's layout."""
    meta = BatchMeta(
        producer_id=int(idx.producer_ids[i]),
        producer_epoch=int(idx.producer_epochs[i]),
        base_sequence=int(idx.base_sequences[i]),
        attributes=int(idx.attributes[i]) & ~ATTR_TRANSACTIONAL,
        transaction=-1,
    )
    return encode_batch(records, meta, options, idx.meta.layout)


def resolve_transactions(
    idx: SegmentIndex, raw: list[EncodedBatch], resolver: TransactionResolver, topic: str, partition: int
) -> tuple[list[EncodedBatch], bool]:
    """An object's batches as a merge in a root listing ``boundedHistory`` writes them, and whether a
    transactional batch is among them (PROTOCOL.md 10, *Resolving transactions*).

    Control and non-transactional batches, and transactional ones still undecided, are copied byte for
    byte; decided ones are resolved as compaction's rule 1 says: aborted (or unlisted) ones dropped,
    committed ones written as non-transactional (:func:`plain_batch`). Only those are decoded.
    """
    out: list[EncodedBatch] = []
    remains = False
    options = None
    for i, stored in enumerate(raw):
        attributes = int(idx.attributes[i])
        if attributes & ATTR_CONTROL or not attributes & ATTR_TRANSACTIONAL:
            out.append(stored)
            continue
        outcome = batch_outcome(resolver, idx, i, topic, partition)
        if outcome is None:
            out.append(stored)
            remains = True
        elif outcome == COMMITTED:
            options = options or ipc_options(idx.meta.compression)
            out.append(plain_batch(decode_batch(idx, i, stored.message), idx, i, options))
    return out, remains


def _end(ref: SegmentRef, index: SegmentIndex) -> int:
    return ref.end_offset if ref.end_offset is not None else index.meta.next_offset


def is_clean(ref: SegmentRef, index: SegmentIndex) -> bool:
    """Whether every record of the element passed through a compaction (``clean_end`` at its end)."""
    return index.meta.clean_end is not None and index.meta.clean_end >= _end(ref, index)


@dataclass
class _Group:
    """Consecutive elements written as one compacted object: all clean or all dirty, so that a clean
    element's first compaction time is never replaced by a dirty neighbour's ``now`` (11.6, rule 3 ii)."""

    clean: bool
    #: The value schema version and schema of every member (typed topics; PROTOCOL.md 11.8).
    version: tuple[int | None, str | None] = (None, None)
    members: list[tuple[_Element, list[EncodedBatch]]] = field(default_factory=list)
    size: int = 0
    changed: bool = False
    #: The greatest (first compaction, latest append) of the members, and those of members holding tombstones.
    clock: tuple[int, int] = (0, 0)
    tombstone_clocks: list[tuple[int, int]] = field(default_factory=list)

    def may_join(self, index: SegmentIndex, tombstones: bool, now: int) -> bool:
        """Whether a clean element may join: the object takes the greatest clock of its members, by which
        its tombstones are judged (rule 3 i-ii), so a member holding tombstones must already have it, or
        joining would keep resetting their clocks and they would never expire."""
        mine = _clock(index, now)
        joined = (max(self.clock[0], mine[0]), max(self.clock[1], mine[1]))
        holders = self.tombstone_clocks + ([mine] if tombstones else [])
        return all(clock == joined for clock in holders)

    def add(self, element: _Element, kept: list[EncodedBatch], tombstones: bool, now: int) -> None:
        """Add a member (see :meth:`may_join`)."""
        self.members.append((element, kept))
        mine = _clock(element.index, now)
        self.clock = (max(self.clock[0], mine[0]), max(self.clock[1], mine[1]))
        if tombstones:
            self.tombstone_clocks.append(mine)


def _clock(index: SegmentIndex, now: int) -> tuple[int, int]:
    """(first compaction, latest append) of an element, as its rewrite would state them."""
    first = index.meta.first_compacted_ms
    return (now if first is None else first, index.meta.append_bounds()[1])


class _ListingTooOld(Exception):
    """The pass's listing became older than W: it creates nothing more (assumption A4)."""

    def __init__(self) -> None:
        super().__init__("the compaction pass's listing is older than writer.max.staleness.ms")


class LogCompactor:
    """Compacts one partition's chain; safe with any number of concurrent maintainers (PROTOCOL.md 11.6)."""

    def __init__(self, chain: LogChain, writer_id: str, name: str, topic: str, partition: int) -> None:
        self.chain = chain
        self.writer_id = writer_id
        self.name = name
        self.topic = topic
        self.partition = partition
        #: The offset map's limit in bytes (Kafka's ``log.cleaner.dedupe.buffer.size``), set by whoever
        #: compacts (its LogRoot's ``dedupe_buffer_size``); None: Kafka's default.
        self.dedupe_buffer_size: int | None = None
        #: What the last call of :meth:`compact` did (None: it compacted nothing).
        self.last_pass: CompactionPass | None = None

    # ------------------------------------------------------------------ planning (indexes only)

    def plan(
        self,
        view: LogView,
        now: int,
        resolver: TransactionResolver | None,
        decided_ms: DecisionTimes | None = None,
    ) -> CompactionPlan:
        """The pass's plan for ``view`` at wall-clock ``now``: reads indexes, never batches."""
        config = self.chain.config
        elements = view.segments
        indexes = [self.chain.index(ref) for ref in elements]
        lso = self._last_stable_offset(view, indexes, resolver)
        lag = config["min.compaction.lag.ms"]
        slack = config["file.delete.delay.ms"] - config["writer.max.staleness.ms"]  # D - W: a late landing
        cleanable = 0
        for idx in indexes[:-1]:
            if idx.meta.next_offset > lso:
                break
            if lag > 0:
                visible = self._visible_bound(idx, slack, decided_ms)
                if visible is None or visible + lag + CLOCK_SKEW_MS > now:
                    break
            cleanable += 1
        first_dirty = next((i for i in range(cleanable) if not is_clean(elements[i], indexes[i])), cleanable)
        run_bytes = sum(ref.size for ref in elements[:cleanable])
        dirty_bytes = sum(ref.size for ref in elements[first_dirty:cleanable])
        max_lag = config["max.compaction.lag.ms"]
        overdue = any(
            not is_clean(elements[i], indexes[i]) and indexes[i].meta.append_bounds()[0] <= now - max_lag
            for i in range(first_dirty, cleanable)
        )
        # A partition whose records below the LSO all fit in the map is compacted as with an unbounded
        # map, from the start; otherwise from the map start (11.6, *Bounded offset maps*).
        records = sum(
            int(idx.meta.record_count) for ref, idx in zip(elements, indexes, strict=True) if ref.base_offset < lso
        )
        bounded = records > MAP_LOAD_FACTOR * OffsetMap(self.map_limit()).capacity
        map_start, frontier = self._map_start(elements, indexes, first_dirty)
        # An element between the map start and first_dirty may still hold a value superseded above the
        # map end of the pass that cleaned it: it counts for the lag rule like a dirty one (guarantee 5).
        overdue = overdue or any(
            indexes[i].meta.append_bounds()[0] <= now - max_lag for i in range(map_start, first_dirty)
        )
        ratio = config["min.cleanable.dirty.ratio"]
        # A forced pass also runs when the map of the pass that cleaned an element stopped below the LSO:
        # a record between them (the tail's, say) may supersede one in it.
        work = first_dirty < cleanable or map_start < first_dirty or frontier < lso
        due = work and (overdue or (first_dirty < cleanable and dirty_bytes >= ratio * run_bytes))
        return CompactionPlan(lso, cleanable, first_dirty, run_bytes, dirty_bytes, due, map_start, bounded, work)

    @staticmethod
    def _map_start(elements: list[SegmentRef], indexes: list[SegmentIndex], first_dirty: int) -> tuple[int, int]:
        """The element holding the least ``map_end`` stated by a clean element before ``first_dirty`` (an
        element without one counts its end), or ``first_dirty``: below it no record is superseded by a
        record below it (11.6, *Bounded offset maps*); and the least ``map_end`` stated (the log end if none)."""
        start = first_dirty
        # The least stated (dirty elements are judged as dirty); an empty chain states none.
        least = _end(elements[-1], indexes[-1]) if elements else 0
        for j in range(first_dirty):
            stated = indexes[j].meta.map_end
            frontier = _end(elements[j], indexes[j]) if stated is None else stated
            least = min(least, frontier)
            i = j + 1
            while i < start and _end(elements[i], indexes[i]) <= frontier:
                i += 1
            start = min(start, i)
        return start, least

    def _last_stable_offset(
        self, view: LogView, indexes: list[SegmentIndex], resolver: TransactionResolver | None
    ) -> int:
        """The first offset of the earliest undecided transactional batch at or after the start, else the end."""
        for idx in indexes:
            for i in np.flatnonzero((idx.attributes & ATTR_TRANSACTIONAL) != 0):
                if int(idx.last_offsets[i]) < view.start_offset or int(idx.attributes[i]) & ATTR_CONTROL:
                    continue
                if self._outcome(idx, int(i), resolver) is None:
                    return max(int(idx.base_offsets[i]), view.start_offset)
        return view.end_offset

    def _outcome(self, idx: SegmentIndex, i: int, resolver: TransactionResolver | None) -> str | None:
        """COMMITTED, ABORTED or None (undecided) for transactional batch ``i``."""
        return batch_outcome(resolver, idx, i, self.topic, self.partition)

    @staticmethod
    def _visible_bound(idx: SegmentIndex, slack: int, decided_ms: DecisionTimes | None) -> int | None:
        """No record of the element became readable after this (11.6, *Visible times*); None: unknown."""
        bound = idx.meta.append_bounds()[1]
        for i in np.flatnonzero((idx.attributes & ATTR_TRANSACTIONAL) != 0):
            if decided_ms is None:
                return None
            at = decided_ms(int(idx.producer_ids[i]), int(idx.transactions[i]))
            if at is None:
                return None
            bound = max(bound, at)
        return bound + slack

    # ------------------------------------------------------------------ compacting

    def compact(
        self,
        view: LogView,
        listed_monotonic: float,
        now: int,
        resolver: TransactionResolver | None,
        decided_ms: DecisionTimes | None = None,
        force: bool = False,
    ) -> int:
        """Compact ``view`` (listed at ``listed_monotonic``) if due, or ``force``; returns objects written.

        The offset map holds at most ``dedupe_buffer_size`` bytes (24 an entry): the pass cleans the
        elements whose records all entered it and leaves the rest for a later pass (:attr:`last_pass`
        says where it stopped). Besides the map it holds one ``segment.bytes`` group at a time, and elements
        the map step read, within what the map leaves unused of its limit (:meth:`_build_map`).
        Nothing is created once the listing is more than W old (assumption A4): the pass stops there, and
        what it created so far is a prefix of its ascending creates, which the chain joins up.
        """
        self.last_pass = None
        plan = self.plan(view, now, resolver, decided_ms)
        if plan.cleanable == 0 or not (plan.due or (force and plan.work)):
            return 0
        refs = [ref for ref in view.segments if ref.base_offset < plan.lso]
        indexes = [self.chain.index(ref) for ref in refs]
        # When every record below the LSO fits, the map starts at the start, as an unbounded one would, and
        # holds the keys themselves (as long as they fit the limit): no hashing, no collision.
        offset_map = PassMap(self.map_limit(), exact=not plan.bounded)
        map_start = plan.map_start if plan.bounded else 0
        map_end, held = self._build_map(refs, map_start, plan, offset_map, resolver)
        offset_map.finish()
        cleaned = 0
        while cleaned < plan.cleanable and _end(refs[cleaned], indexes[cleaned]) <= map_end:
            cleaned += 1
        expire = self._tombstones_expire(refs, indexes, cleaned, now)
        cleaned_end = _end(refs[cleaned - 1], indexes[cleaned - 1]) if cleaned else map_end
        written = 0
        try:
            for group in self._groups(refs, cleaned, held, offset_map, map_start, expire, now, resolver):
                stated = group.members[0][0].index.meta.map_end if group.members else None
                # Rewriting it would only rename it; but one whose stated map end lies below what this pass
                # cleaned is rewritten, or the next pass's map would start there again (11.6); a forced
                # pass brings it to its own map end, so that a forced pass after it has nothing to do.
                current = stated is not None and stated >= (map_end if force else cleaned_end)
                if group.clean and len(group.members) == 1 and not group.changed and current:
                    continue
                written += self._write_object(group.members, now, listed_monotonic, map_end)
        except _ListingTooOld:
            pass  # a later pass, on a fresh listing, continues; what was created is an ascending prefix
        cleanable_end = _end(refs[plan.cleanable - 1], indexes[plan.cleanable - 1])
        self.last_pass = CompactionPass(
            written, refs[map_start].base_offset, map_end, cleanable_end, len(offset_map), offset_map.exact
        )
        return written

    def map_limit(self) -> int:
        """The offset map's size limit in bytes: ``dedupe_buffer_size``, else Kafka's default."""
        return DEFAULT_DEDUPE_BUFFER_SIZE if self.dedupe_buffer_size is None else self.dedupe_buffer_size

    def _groups(
        self,
        refs: list[SegmentRef],
        cleaned: int,
        held: dict[int, _Element],
        offset_map: PassMap,
        map_start: int,
        expire: list[bool],
        now: int,
        resolver: TransactionResolver | None,
    ) -> Iterator[_Group]:
        """The groups of the first ``cleaned`` elements, each yielded once closed: elements are read one at
        a time (``held``: those the map step kept), so a pass holds one group of kept batches at a time."""
        limit = self.chain.config["segment.bytes"]
        group: _Group | None = None
        for position in range(cleaned):
            element = held.pop(position, None) or self._read(refs[position])
            mapped = position >= map_start
            kept, changed, tombstones = self._kept(element, offset_map, mapped, expire[position], resolver)
            element.batches = []  # decoded batches are no longer needed: the kept ones are encoded
            clean = is_clean(element.ref, element.index)
            size = sum(len(batch.message) for batch in kept)
            version = (element.index.meta.value_schema_version, element.index.meta.value_schema)
            if (
                group is None
                or group.clean != clean
                or group.version != version
                or (group.members and group.size + size > limit)
                or (clean and not group.may_join(element.index, tombstones, now))
            ):
                if group is not None:
                    yield group
                group = _Group(clean, version)
            group.add(element, kept, tombstones, now)
            group.size += size
            group.changed = group.changed or changed
        if group is not None:
            yield group

    def _read(self, ref: SegmentRef) -> _Element:
        idx = self.chain.index(ref, WHOLE_READ)
        raw = raw_messages(self.chain.store, idx, self.chain.cache.objects.take(ref.key))
        batches = ordered_map(lambda i: decode_batch(idx, i, raw[i].message), range(idx.batch_count))
        return _Element(ref, idx, raw, batches)

    def _build_map(
        self,
        refs: list[SegmentRef],
        map_start: int,
        plan: CompactionPlan,
        offset_map: PassMap,
        resolver: TransactionResolver | None,
    ) -> tuple[int, dict[int, _Element]]:
        """Fill ``offset_map`` from element ``map_start`` up, one element at a time, while it has room;
        returns the map end and the elements read that the rewrite may reuse.

        An element enters whole or not at all, so every record below the map end is in the map, from
        the map start up; the first always enters. Offsets are unique in a partition, so a record is
        its key's last in the map exactly when the map holds its own offset for its key.

        Elements of the cleanable run are kept for the rewrite, so that it does not read them again, within
        ``segment.bytes`` plus what the map leaves unused of its limit (an element counting its stored and
        its decoded bytes): a pass holds about the limit and one ``segment.bytes`` at a time, as a pass
        that read each element twice, and a pass whose map is small reads each element once.
        """
        lso = plan.lso
        segment_bytes = self.chain.config["segment.bytes"]
        held: dict[int, _Element] = {}
        costs: dict[int, int] = {}
        map_end = refs[map_start].base_offset
        for position in range(map_start, len(refs)):
            element = self._read(refs[position])
            keys, offsets = self._visible_keys(element, lso, resolver)
            if len(keys) and not offset_map.add(keys, offsets):
                break
            map_end = min(_end(element.ref, element.index), lso)
            budget = segment_bytes + max(0, offset_map.limit - offset_map.nbytes)
            if position < plan.cleanable:
                held[position] = element
                costs[position] = refs[position].size + sum(batch.nbytes for batch in element.batches)
            # The map grew: give back the last elements kept (the rewrite reads them again) until both fit.
            while held and sum(costs.values()) > budget:
                last = max(held)
                del held[last], costs[last]
            if offset_map.full:
                break
        return map_end, held

    def _visible_keys(
        self, element: _Element, lso: int, resolver: TransactionResolver | None
    ) -> tuple[pa.Array, pa.Array]:
        """Keys and offsets of the element's records that enter the offset map: visible to read_committed
        readers, below ``lso``, with a key."""
        idx = element.index
        keys, offsets = [], []
        for i, batch in enumerate(element.batches):
            attributes = int(idx.attributes[i])
            if attributes & ATTR_CONTROL:
                continue
            if attributes & ATTR_TRANSACTIONAL and self._outcome(idx, i, resolver) != COMMITTED:
                continue  # aborted (undecided ones lie at or above the LSO)
            if int(idx.base_offsets[i]) >= lso:
                continue
            key, offset = batch.column(2), batch.column(0)
            # Only the two columns are filtered: the values are not copied.
            if int(idx.last_offsets[i]) >= lso:
                below = pc.less(offset, lso)
                key, offset = key.filter(below), offset.filter(below)
            if key.null_count:
                valid = pc.is_valid(key)
                key, offset = key.filter(valid), offset.filter(valid)
            keys.append(key)
            offsets.append(offset)
        if not keys:
            return pa.array([], pa.binary()), pa.array([], pa.int64())
        # concat_arrays copies: the map does not keep the element's decoded buffers alive.
        return pa.concat_arrays(keys), pa.concat_arrays(offsets)

    def _tombstones_expire(
        self, refs: list[SegmentRef], indexes: list[SegmentIndex], cleaned: int, now: int
    ) -> list[bool]:
        """Per element: whether its tombstones that are their key's last may be dropped (11.6, rule 3)."""
        config = self.chain.config
        retention = config["delete.retention.ms"]
        settle = max(retention, config["file.delete.delay.ms"])
        out, all_clean_below = [], True
        for ref, index in zip(refs[:cleaned], indexes[:cleaned], strict=True):
            meta = index.meta
            first_compacted = meta.first_compacted_ms
            out.append(
                all_clean_below
                and meta.append_bounds()[1] <= now - retention - CLOCK_SKEW_MS
                and first_compacted is not None
                and first_compacted <= now - settle - CLOCK_SKEW_MS
            )
            all_clean_below = all_clean_below and is_clean(ref, index)
        return out

    def _kept(
        self,
        element: _Element,
        offset_map: PassMap | None,
        mapped: bool,
        expire_tombstones: bool,
        resolver: TransactionResolver | None,
    ) -> tuple[list[EncodedBatch], bool, bool]:
        """The element's batches as a rewrite keeps them, whether that differs from what is stored, and
        whether a tombstone is among them.

        A keyed record is dropped when ``offset_map`` holds a greater offset for its key (rule 2), and,
        with ``expire_tombstones``, a tombstone no map entry supersedes (rule 3). Without a map (None)
        no record is dropped as superseded: only aborted transactions' records (rule 1), and expired
        tombstones. ``mapped``: the element is one the map took (see :meth:`PassMap.superseded`).
        """
        idx = element.index
        options = ipc_options(idx.meta.compression)
        kept: list[EncodedBatch] = []
        changed = tombstones = False
        for i, batch in enumerate(element.batches):
            attributes = int(idx.attributes[i])
            if attributes & ATTR_CONTROL:
                kept.append(element.raw[i])  # markers are copied byte for byte
                continue
            transactional = bool(attributes & ATTR_TRANSACTIONAL)
            if transactional:
                outcome = self._outcome(idx, i, resolver)
                if outcome is None:  # below the log start (the LSO scan starts there): kept as it is
                    kept.append(element.raw[i])
                    continue
                if outcome == ABORTED:
                    changed = True
                    continue
            has_key = pc.is_valid(batch.column(2))
            if offset_map is None:
                keep = pa.array(np.ones(batch.num_rows, bool))
            else:
                keyed = np.asarray(has_key.to_numpy(zero_copy_only=False), bool)
                superseded = np.zeros(batch.num_rows, bool)
                if keyed.all():
                    superseded = offset_map.superseded(batch.column(2), batch.column(0).to_numpy(), mapped)
                elif keyed.any():
                    rows = np.flatnonzero(keyed)
                    keys = batch.column(2).take(pa.array(rows))
                    superseded[rows] = offset_map.superseded(keys, batch.column(0).to_numpy()[rows], mapped)
                keep = pa.array(~superseded)
            tombstone = pc.and_(has_key, pc.is_null(batch.column(3)))
            if expire_tombstones:
                keep = pc.and_(keep, pc.invert(tombstone))
            n_kept = pc.sum(keep).as_py() or 0
            tombstones = tombstones or bool(pc.any(pc.and_(keep, tombstone)).as_py())
            if n_kept == batch.num_rows and not transactional:
                kept.append(element.raw[i])
                continue
            changed = True
            if n_kept == 0:
                continue
            kept.append(plain_batch(batch.filter(keep), idx, i, options))
        return kept, changed, tombstones

    def _write_object(
        self, group: list[tuple[_Element, list[EncodedBatch]]], now: int, listed_monotonic: float, map_end: int
    ) -> int:
        metas = [element.index.meta for element, _ in group]
        refs = [element.ref for element, _ in group]
        batches = [b for _, kept in group for b in kept]
        base, end = refs[0].base_offset, metas[-1].next_offset
        generation = max(ref.generation for ref in refs) + 1
        bounds = [meta.append_bounds() for meta in metas]
        # Records never compacted before pass their first compaction now; the greatest of the inputs' is
        # the one every record of the object is sure to have passed by (11.6, tombstones, rule ii).
        first_compacted = max(now if meta.first_compacted_ms is None else meta.first_compacted_ms for meta in metas)
        fields = {
            "base_offset": base,
            "next_offset": end,
            "running_max_timestamp": metas[-1].running_max_timestamp,
            "compression": metas[0].compression,
            "created_ms": now_ms(),
            "writer": self.writer_id,
            "generation": generation,
            "min_append_ms": min(low for low, _ in bounds),
            "max_append_ms": max(high for _, high in bounds),
            "clean_end": end,
            "first_compacted_ms": first_compacted,
            "compacted_ms": now,
            # Below this, no record the object keeps is superseded (the pass's map reached it): the next
            # pass's map starts at or below the least stated (11.6, *Bounded offset maps*).
            "map_end": max(map_end, end),
        }
        if not batches:  # no record left: retention still judges the range by the replaced elements' times
            fields["min_timestamp"] = min(meta.min_timestamp for meta in metas)
            fields["max_timestamp"] = max(meta.max_timestamp for meta in metas)
        data, _ = assemble_segment(batches, fields, metas[0].layout)
        key = self.chain.prefix + "log/" + rewritten_name(base, end, generation, new_rewrite_id(now))
        bound = listed_monotonic + self.chain.config["writer.max.staleness.ms"] / 1000
        if time.monotonic() >= bound:
            raise _ListingTooOld
        with self.chain.store.deadline(bound):
            self.chain.store.put_if_absent(key, data)
        return 1
