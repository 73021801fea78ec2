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

The pass is here; what it finds on a view before reading a batch (the LSO, the cleanable run, the map
start, whether it is due) in :mod:`.compaction_plan`, its offset map in :mod:`.offset_map`, and the
resolving of committed transactions it shares with merges in :mod:`.transaction_resolution`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..layout import new_rewrite_id, rewritten_name
from ..parallel import ordered_map
from ..records import now_ms
from ..segment import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    WHOLE_READ,
    EncodedBatch,
    SegmentIndex,
    assemble_segment,
    decode_batch,
    ipc_options,
    raw_messages,
)
from .chain import LogChain, LogView, SegmentRef
from .compaction_plan import CLOCK_SKEW_MS, CompactionPlan, DecisionTimes, element_end, is_clean, plan_compaction
from .offset_map import DEFAULT_DEDUPE_BUFFER_SIZE, PassMap
from .reader import ABORTED, COMMITTED, TransactionResolver, batch_outcome
from .transaction_resolution import plain_batch


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


@dataclass
class _Element:
    """One chain element as a pass read it: its index, its stored batches and those decoded."""

    ref: SegmentRef
    index: SegmentIndex
    raw: list[EncodedBatch]
    batches: list[pa.RecordBatch]


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

    def plan(
        self,
        view: LogView,
        now: int,
        resolver: TransactionResolver | None,
        decided_ms: DecisionTimes | None = None,
    ) -> CompactionPlan:
        """The pass's plan for ``view`` at wall-clock ``now``: reads indexes, never batches."""
        return plan_compaction(
            self.chain,
            view,
            now,
            resolver,
            decided_ms,
            map_limit=self.map_limit(),
            topic=self.topic,
            partition=self.partition,
        )

    def _outcome(self, idx: SegmentIndex, i: int, resolver: TransactionResolver | None) -> str | None:
        """COMMITTED, ABORTED or None (undecided) for transactional batch ``i``."""
        return batch_outcome(resolver, idx, i, self.topic, self.partition)

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
        while cleaned < plan.cleanable and element_end(refs[cleaned], indexes[cleaned]) <= map_end:
            cleaned += 1
        expire = self._tombstones_expire(refs, indexes, cleaned, now)
        cleaned_end = element_end(refs[cleaned - 1], indexes[cleaned - 1]) if cleaned else map_end
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
        cleanable_end = element_end(refs[plan.cleanable - 1], indexes[plan.cleanable - 1])
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
            map_end = min(element_end(element.ref, element.index), lso)
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
