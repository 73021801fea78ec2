"""Planning a shared topic's reads per shared object, not per partition (PROTOCOL.md 7.3, *Reading*).

A shared topic's recent records are runs of shared objects, one object per flush holding every partition's
run. Planned per partition as a partitioned topic's are, a micro-batch would cost tasks x objects reads,
each task reading its partition's slice of every object. Planned here, a task reads consecutive commits
whole instead: for each commit, in commit order, every partition's run of it, with the span of the shared
object that holds them read once (:mod:`segment_format.log.shared_spans`)::

    commits:     41 (object A)    42 (object B)    43 (object C)    44 (object D)
    task 1:      p0 p1 ... p63    p0 p1 ... p63                        A and B: two reads
    task 2:                                       p0 p1 ... p63    ... C and D: two reads

Each partition's offsets stay in order within a task (its runs follow commit order), and the tasks together
read exactly the planned ranges. The part of a range below a partition's chain end (runs already moved into
its own segments, 10.2) is planned per partition, as a partitioned topic's range is. Every piece carries the
index of the run it reads, taken from the driver's commits, so a task lists and reads no commit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pyspark_logsource.spark.input_partition import PlogInputPartition, PlogObjectsInputPartition
from segment_format.log.chain import LogChain, SegmentRef
from segment_format.shared.commit import parse_commit_name

__all__ = ["SHARED_TASK_BYTES", "plan_shared"]

#: Stored bytes of runs a task reads when ``minPartitions`` does not ask for more tasks: large enough that
#: a micro-batch of a wide topic is a few tasks, small enough that the spans a task keeps stay small.
SHARED_TASK_BYTES = 16 * 1024 * 1024


def _commit_order(ref: SegmentRef) -> int:
    """A run ref's place in its topic's commit order: the first commit number of the document holding it."""
    document = ref.key.split("#", 1)[0].rsplit("/", 1)[-1]
    parsed = parse_commit_name(document)
    return -1 if parsed is None else parsed[0]


def _narrowed(part: PlogInputPartition, start: int, until: int, refs: tuple[SegmentRef, ...]) -> PlogInputPartition:
    return replace(part, start=start, until=until, segments=refs)


def plan_shared(
    parts: Sequence[tuple[PlogInputPartition, LogChain]], min_tasks: int | None
) -> list[PlogInputPartition | PlogObjectsInputPartition]:
    """One shared topic's planned reads: ``parts`` (one per partition range, with the driver's chain of that
    partition, whose view planned it) regrouped into tasks of consecutive commits.

    ``min_tasks``: ``minPartitions``; without it, tasks of about :data:`SHARED_TASK_BYTES` stored bytes.
    """
    if len(parts) < 2:
        return [part for part, _chain in parts]  # one partition: its task reads each object once already
    out: list[PlogInputPartition | PlogObjectsInputPartition] = []
    runs: list[tuple[int, int, int, PlogInputPartition]] = []  # (commit order, partition, start, piece)
    run_bytes = 0
    for part, chain in parts:
        segments = tuple(ref for ref in part.segments if ref.generation >= 0)
        if not part.segments or len(segments) == len(part.segments):
            out.append(part)  # no run in it (or no planned chain: the task resolves its own)
            continue
        if segments:
            out.append(_narrowed(part, part.start, min(part.until, segments[-1].end_offset or part.until), segments))
        for ref in part.segments[len(segments) :]:
            lo, hi = max(part.start, ref.base_offset), min(part.until, ref.end_offset or part.until)
            run = replace(_narrowed(part, lo, hi, (ref,)), runs=((ref.key, chain.index(ref)),))
            runs.append((_commit_order(ref), part.partition, lo, run))
            run_bytes += ref.size
    if not runs:
        return out
    runs.sort(key=lambda r: r[:3])
    target = run_bytes / min_tasks if min_tasks else SHARED_TASK_BYTES
    group: list[PlogInputPartition] = []
    group_bytes = 0
    last_commit = None
    for commit, _partition, _start, run in runs:
        # Cut only between commits, so that each shared object's runs are read by one task.
        if group and commit != last_commit and group_bytes >= target:
            out.append(PlogObjectsInputPartition(run.topic, tuple(group)))
            group, group_bytes = [], 0
        group.append(run)
        group_bytes += run.segments[0].size
        last_commit = commit
    out.append(PlogObjectsInputPartition(group[0].topic, tuple(group)))
    return out
