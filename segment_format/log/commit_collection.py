"""Collecting a shared topic's commits once their runs live in segments (PROTOCOL.md 10.2, *Garbage collection*).

::

    commits/  40.json   41.json   42.json   43.json   44.json   <- head, never deleted
              every entry of 40..42 lies below its partition's chain end, in a segment created D ago or more
              -> 40, 41, 42 deleted, in order (the chain stays contiguous from its first element)

A commit element goes once each of its entries lies wholly below its partition's chain end, in a segment
(or below a start marker) created at least ``file.delete.delay.ms`` ago, and every element before it went
too; the head stays, since a writer's next commit and a reader's next probe start from it.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..shared.commit import CommitEntry
from ..shared.sequence import TopicSequence
from .chain import LogView
from .partition_log import PartitionLog

__all__ = ["collect_commits", "moved_view"]


def collect_commits(sequence: TopicSequence, logs: Mapping[int, PartitionLog], now: int) -> int:
    """Delete the prefix of ``sequence``'s commit chain that ``logs`` (the partitions a maintenance pass
    resolved, by number) show moved for at least D; returns how many commit documents were deleted.

    Each log's cached view is taken as it is (no request): a partition not in ``logs``, or not resolved yet,
    keeps every element holding one of its entries, and the elements after it; a view older than a move
    keeps them until a pass resolves the partition again.
    """
    delay = sequence.config["file.delete.delay.ms"]
    # Elements a range covers, D after the range was created; before any range that covers them goes.
    ranges = {element.key: element.commit.created_ms for element in sequence.elements if element.generation}
    covered = [key for key, cover in sequence.superseded.items() if now - ranges.get(cover, now) >= delay]
    for key in covered:
        sequence.store.delete(key)
        del sequence.superseded[key]
    waiting = set(sequence.superseded.values())
    doomed = []
    for element in sequence.elements[:-1]:  # the head stays
        times = [_moved_since(logs.get(entry.partition), entry) for entry in element.commit.entries]
        since = max((t for t in times if t is not None), default=element.commit.created_ms)
        if None in times or now - since < delay or element.key in waiting:
            break  # a range whose covered elements are still listed stays, or a listing would have a hole
        doomed.append(element.key)
    for key in doomed:  # in chain order: a reader listing meanwhile sees a contiguous chain from its first element
        sequence.store.delete(key)
    sequence.forget(len(doomed))
    return len(covered) + len(doomed)


def moved_view(log: PartitionLog | None, entry: CommitEntry) -> LogView | None:
    """The view this process holds of ``entry``'s partition when the entry lies wholly below its chain end
    there (moved into segments, or below the start, PROTOCOL.md 10.2); None otherwise. No request."""
    view = None if log is None else log.chain.cached_view
    if view is None or view.chain_end is None or entry.next_offset > view.chain_end:
        return None
    return view


def _moved_since(log: PartitionLog | None, entry: CommitEntry) -> int | None:
    """When what now holds ``entry``'s records below its partition's chain end was created (a segment, or the
    start marker past them); None when they are not below it on the view this process holds."""
    view = moved_view(log, entry)
    if log is None or view is None:
        return None
    last = entry.next_offset - 1
    if last < view.start_offset:
        return log.cleaner.marker_created_ms(view.start_marker)
    s = view.segment_for(last)
    if s < 0 or view.segments[s].generation < 0:
        return None
    return log.chain.index(view.segments[s]).meta.created_ms
