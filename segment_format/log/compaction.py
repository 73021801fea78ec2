"""Compaction of one partition (PROTOCOL.md 11.6): keep each key's last record, drop what it superseded.

::

    chain      [ elem 0 | elem 1 | ... | elem k-1 | ...          | last element ]
                 clean to its end       dirty: appended, merged     never rewritten
                 (clean_end >= end)     or clean_end < end
    map range  [start, LSO): every visible record with a key   ->  offset map: key -> greatest offset
    cleanable  the longest run from elem 0 of elements that are not the last, end at or below the
               LSO and, with min.compaction.lag.ms, became readable long enough ago
    rewritten  the cleanable run, in groups of consecutive elements (clean ones apart from dirty ones)
               of up to segment.bytes, each as one compacted object, created in ascending offset
               order:  log/<base>-<end>.g<gen>.c<compacted_ms:013d><8 hex>.arrow ; a lone clean
               element that loses nothing is left as it is

A compacted object covers exactly the offsets of the elements it replaces, so offsets never change
and the chain joins up whatever prefix of a pass's creates happened; readers skip the gaps. Objects
it replaces leave the chain and are deleted D later, as for merges (PROTOCOL.md 10).
"""

from __future__ import annotations

import time
from collections.abc import Callable
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


def is_clean(ref: SegmentRef, index: SegmentIndex) -> bool:
    """Whether every record of the element passed through a compaction (``clean_end`` at its end)."""
    end = ref.end_offset if ref.end_offset is not None else index.meta.next_offset
    return index.meta.clean_end is not None and index.meta.clean_end >= end


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
        ratio = config["min.cleanable.dirty.ratio"]
        due = first_dirty < cleanable and (overdue or dirty_bytes >= ratio * run_bytes)
        return CompactionPlan(lso, cleanable, first_dirty, run_bytes, dirty_bytes, due)

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

        Nothing is created once the listing is more than W old (assumption A4): the pass stops there, and what it
        created so far is a prefix of its ascending creates, which the chain joins up.
        """
        plan = self.plan(view, now, resolver, decided_ms)
        if plan.cleanable == 0 or not (plan.due or (force and plan.first_dirty < plan.cleanable)):
            return 0
        elements = [self._read(ref) for ref in view.segments if ref.base_offset < plan.lso]
        last_offsets = self._offset_map(elements, plan.lso, resolver)
        expire = self._tombstones_expire(elements, plan.cleanable, now)
        limit = self.chain.config["segment.bytes"]
        groups: list[_Group] = []
        for position, element in enumerate(elements[: plan.cleanable]):
            kept, changed, tombstones = self._kept(element, last_offsets, expire[position], resolver)
            clean = is_clean(element.ref, element.index)
            size = sum(len(batch.message) for batch in kept)
            group = groups[-1] if groups else None
            if (
                group is None
                or group.clean != clean
                or group.version != (element.index.meta.value_schema_version, element.index.meta.value_schema)
                or (group.members and group.size + size > limit)
                or (clean and not group.may_join(element.index, tombstones, now))
            ):
                group = _Group(clean, (element.index.meta.value_schema_version, element.index.meta.value_schema))
                groups.append(group)
            group.add(element, kept, tombstones, now)
            group.size += size
            group.changed = group.changed or changed
        written = 0
        try:
            for group in groups:
                if group.clean and len(group.members) == 1 and not group.changed:
                    continue  # rewriting it would only rename it
                written += self._write_object(group.members, now, listed_monotonic)
        except _ListingTooOld:
            pass  # a later pass, on a fresh listing, continues; what was created is an ascending prefix
        return written

    def _read(self, ref: SegmentRef) -> _Element:
        idx = self.chain.index(ref, WHOLE_READ)
        raw = raw_messages(self.chain.store, idx, self.chain.cache.objects.take(ref.key))
        batches = ordered_map(lambda i: decode_batch(idx, i, raw[i].message), range(idx.batch_count))
        return _Element(ref, idx, raw, batches)

    def _offset_map(self, elements: list[_Element], lso: int, resolver: TransactionResolver | None) -> pa.Array:
        """The offset map's values: for each key with a visible record below ``lso``, its greatest offset.

        Offsets are unique in a partition, so a record is its key's last exactly when its offset is
        among these.
        """
        keys, offsets = [], []
        for element in elements:
            idx = element.index
            for i, batch in enumerate(element.batches):
                attributes = int(idx.attributes[i])
                if attributes & ATTR_CONTROL:
                    continue
                if attributes & ATTR_TRANSACTIONAL and self._outcome(idx, i, resolver) != COMMITTED:
                    continue  # aborted (undecided ones lie at or above the LSO)
                if int(idx.base_offsets[i]) >= lso:
                    continue
                below = batch if int(idx.last_offsets[i]) < lso else batch.filter(pc.less(batch.column(0), lso))
                keys.append(below.column(2))
                offsets.append(below.column(0))
        if not keys:
            return np.empty(0, np.int64)
        table = pa.table({"key": pa.concat_arrays(keys), "offset": pa.concat_arrays(offsets)})
        table = table.filter(pc.is_valid(table.column("key")))
        last = table.group_by("key").aggregate([("offset", "max")]).column("offset_max")
        return np.sort(last.to_numpy())

    def _tombstones_expire(self, elements: list[_Element], cleanable: int, now: int) -> list[bool]:
        """Per element: whether its tombstones that are their key's last may be dropped (11.6, rule 3)."""
        config = self.chain.config
        retention = config["delete.retention.ms"]
        settle = max(retention, config["file.delete.delay.ms"])
        out, all_clean_below = [], True
        for element in elements[:cleanable]:
            meta = element.index.meta
            first_compacted = meta.first_compacted_ms
            out.append(
                all_clean_below
                and meta.append_bounds()[1] <= now - retention - CLOCK_SKEW_MS
                and first_compacted is not None
                and first_compacted <= now - settle - CLOCK_SKEW_MS
            )
            all_clean_below = all_clean_below and is_clean(element.ref, element.index)
        return out

    def _kept(
        self,
        element: _Element,
        last_offsets: np.ndarray,
        expire_tombstones: bool,
        resolver: TransactionResolver | None,
    ) -> tuple[list[EncodedBatch], bool, bool]:
        """The element's batches as a rewrite keeps them, whether that differs from what is stored, and
        whether a tombstone is among them."""
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
            offsets = batch.column(0).to_numpy()
            found = np.searchsorted(last_offsets, offsets)
            last = pa.array(
                last_offsets[np.minimum(found, len(last_offsets) - 1)] == offsets
                if len(last_offsets)
                else np.zeros(len(offsets), bool)
            )
            keep = pc.or_(pc.invert(has_key), last)
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

    def _write_object(self, group: list[tuple[_Element, list[EncodedBatch]]], now: int, listed_monotonic: float) -> int:
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
