"""A compaction pass's offset map (PROTOCOL.md 11.6, *Bounded offset maps*): key -> greatest offset, bounded.

::

    elements from the map start, one at a time and each whole:
        their visible keyed records below the LSO, (key, offset) ...
              |
              v
    PassMap   exact: the keys themselves, as Arrow arrays          (a pass whose records all fit)
              | key bytes + 12 an entry; past the limit, a group-by keeps each key's greatest
              | offset; distinct keys still above half the limit:
              v
    OffsetMap hashed: 16-byte SipHash digests (hi, lo) + offset,    (any other pass, from the start)
              three sorted numpy arrays, 24 bytes an entry, limit // 24 entries;
              full past 90 % of them: it takes no more elements (where it stopped is the map end)
              |
              v  finish()
    superseded(record)   in an element the map took: its own offset is not among the map's (a sorted search)
                         below the map start: the map holds a greater offset of its key (a lookup)

Kafka's cleaner bounds its map the same way (``log.cleaner.dedupe.buffer.size``, 128 MiB, 24 bytes an
entry), so that a pass holds about the same memory however large the partition: elements enter whole or
not at all, so every record below the map end is in the map, and the pass cleans only up to it. Hashes
are needed only to bound memory; a pass whose records fit keys the map by the keys themselves, so that
none is hashed and no collision can drop a record. The pass that fills and asks the map is
:class:`~segment_format.log.compaction.LogCompactor`.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: Kafka's ``log.cleaner.dedupe.buffer.size`` default (128 MiB): the offset map's size limit in bytes.
DEFAULT_DEDUPE_BUFFER_SIZE = 128 * 1024 * 1024

#: Bytes an offset map entry counts for: a 16-byte key hash and an 8-byte offset, as Kafka's.
MAP_ENTRY_BYTES = 24

#: The map stops taking elements once it holds this share of its entries (Kafka's
#: ``log.cleaner.io.buffer.load.factor``), so that merging a new element into it stays amortised.
MAP_LOAD_FACTOR = 0.9

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
