"""What a compaction pass finds on a view before it reads a batch (PROTOCOL.md 11.6): its plan.

::

    chain      [ elem 0 | ... | elem j | ... | first_dirty | ... | elem k-1 | ... | last element ]
                 clean to their end (clean_end >= end)    dirty, or clean         never cleanable
               |<------------------------- cleanable run -------------------->|
                 elements not the last, ending at or below the LSO, readable for min.compaction.lag.ms
    map start  elem j: the element holding the least map_end that a clean element below first_dirty
               states (or first_dirty); the map starts there when the records below the LSO do not fit
    due        work to do, and dirty bytes >= min.cleanable.dirty.ratio of the run's, or a dirty element,
               or one from the map start up to first_dirty, appended max.compaction.lag.ms ago or more

Planning reads indexes only (their ``clean_end``, ``map_end``, append times and transactional batches),
so that a maintainer learns whether a partition is due without reading a record, and ``plog segments``
can show the plan. The pass itself (:mod:`segment_format.log.compaction`) reads batches only when it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..segment import ATTR_CONTROL, ATTR_TRANSACTIONAL, SegmentIndex
from .chain import LogChain, LogView, SegmentRef
from .offset_map import MAP_LOAD_FACTOR, OffsetMap
from .reader import TransactionResolver, batch_outcome

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


def element_end(ref: SegmentRef, index: SegmentIndex) -> int:
    """The offset after the element's last (its chain end, else its object's ``next_offset``)."""
    return ref.end_offset if ref.end_offset is not None else index.meta.next_offset


def is_clean(ref: SegmentRef, index: SegmentIndex) -> bool:
    """Whether every record of the element passed through a compaction (``clean_end`` at its end)."""
    return index.meta.clean_end is not None and index.meta.clean_end >= element_end(ref, index)


def plan_compaction(
    chain: LogChain,
    view: LogView,
    now: int,
    resolver: TransactionResolver | None,
    decided_ms: DecisionTimes | None,
    *,
    map_limit: int,
    topic: str,
    partition: int,
) -> CompactionPlan:
    """The pass's plan for ``view`` of ``chain`` at wall-clock ``now``, with an offset map of ``map_limit``
    bytes: reads indexes, never batches."""
    config = chain.config
    elements = view.segments
    indexes = [chain.index(ref) for ref in elements]
    lso = _last_stable_offset(view, indexes, resolver, topic, partition)
    lag = config["min.compaction.lag.ms"]
    slack = config["file.delete.delay.ms"] - config["writer.max.staleness.ms"]  # D - W: a late landing
    cleanable = 0
    for idx in indexes[:-1]:
        if idx.meta.next_offset > lso:
            break
        if lag > 0:
            visible = _visible_bound(idx, slack, decided_ms)
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
    bounded = records > MAP_LOAD_FACTOR * OffsetMap(map_limit).capacity
    map_start, frontier = _map_start(elements, indexes, first_dirty)
    # An element between the map start and first_dirty may still hold a value superseded above the
    # map end of the pass that cleaned it: it counts for the lag rule like a dirty one (guarantee 5).
    overdue = overdue or any(indexes[i].meta.append_bounds()[0] <= now - max_lag for i in range(map_start, first_dirty))
    ratio = config["min.cleanable.dirty.ratio"]
    # A forced pass also runs when the map of the pass that cleaned an element stopped below the LSO:
    # a record between them (the tail's, say) may supersede one in it.
    work = first_dirty < cleanable or map_start < first_dirty or frontier < lso
    due = work and (overdue or (first_dirty < cleanable and dirty_bytes >= ratio * run_bytes))
    return CompactionPlan(lso, cleanable, first_dirty, run_bytes, dirty_bytes, due, map_start, bounded, work)


def _map_start(elements: list[SegmentRef], indexes: list[SegmentIndex], first_dirty: int) -> tuple[int, int]:
    """The element holding the least ``map_end`` stated by a clean element before ``first_dirty`` (an
    element without one counts its end), or ``first_dirty``: below it no record is superseded by a
    record below it (11.6, *Bounded offset maps*); and the least ``map_end`` stated (the log end if none)."""
    start = first_dirty
    # The least stated (dirty elements are judged as dirty); an empty chain states none.
    least = element_end(elements[-1], indexes[-1]) if elements else 0
    for j in range(first_dirty):
        stated = indexes[j].meta.map_end
        frontier = element_end(elements[j], indexes[j]) if stated is None else stated
        least = min(least, frontier)
        i = j + 1
        while i < start and element_end(elements[i], indexes[i]) <= frontier:
            i += 1
        start = min(start, i)
    return start, least


def _last_stable_offset(
    view: LogView, indexes: list[SegmentIndex], resolver: TransactionResolver | None, topic: str, partition: int
) -> int:
    """The first offset of the earliest undecided transactional batch at or after the start, else the end."""
    for idx in indexes:
        for i in np.flatnonzero((idx.attributes & ATTR_TRANSACTIONAL) != 0):
            if int(idx.last_offsets[i]) < view.start_offset or int(idx.attributes[i]) & ATTR_CONTROL:
                continue
            if batch_outcome(resolver, idx, int(i), topic, partition) is None:
                return max(int(idx.base_offsets[i]), view.start_offset)
    return view.end_offset


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
