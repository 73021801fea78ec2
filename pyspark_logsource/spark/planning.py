"""Planning for the Spark source: which partitions, from which offset to which, in how many tasks.

Everything here runs on the Spark driver (or the planning worker) and only
reads segment *indexes* and listings, never record data: discovering the
partitions of a subscription, turning ``startingOffsets`` / timestamps into
offsets, admission control (``maxOffsetsPerTrigger``, ``maxBytesPerTrigger``),
splitting ranges over ``minPartitions`` tasks, and recording a consumer
group's processed offsets for lag tools.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from coordinator.keys import lag_offsets_prefix
from pyspark_logsource.spark.option_schema import EARLIEST, LATEST, option_error
from pyspark_logsource.spark.options import OffsetSpec, Subscription
from segment_format import numbered
from segment_format.errors import DataLossError, ObjectNotFoundError
from segment_format.log.chain import LogView
from segment_format.log.partition_log import PartitionLog
from segment_format.root import LogRoot
from segment_format.stores.base import Store
from segment_format.topic import TopicMetadata

log = logging.getLogger("pyspark_logsource.spark")

TP = tuple[str, int]


def data_loss(fail: bool, message: str) -> None:
    """Raise ``DataLossError`` or, with ``failOnDataLoss=false``, log a warning."""
    if fail:
        raise DataLossError(
            f"{message}. Some data has been lost (deleted by retention or delete_records, or the topic was "
            "deleted). Set the option failOnDataLoss=false to skip it and go on"
        )
    log.warning("%s; failOnDataLoss=false: skipping ahead. Some data has been lost.", message)


# ---------------------------------------------------------------------------- discovery


def discover(root: LogRoot, sub: Subscription, *, refresh: bool, require: bool) -> dict[TP, TopicMetadata]:
    """The partitions a subscription covers now, with their topic's metadata.

    ``require``: an unknown ``subscribe`` topic or ``assign``ed partition is an
    error naming the option (when a query starts); otherwise it is left out
    (a topic deleted while the query runs is the caller's business).
    """
    out: dict[TP, TopicMetadata] = {}
    if sub.kind == "subscribePattern":
        names = [n for n in root.topic_names(refresh=refresh) if sub.matches(n)]
    elif sub.kind == "subscribe":
        names = list(sub.topics)
    else:
        names = sorted({t for t, _ in sub.assigned})
    # In parallel. A pattern's listing just read the metadata of topics new to the root (their newest
    # versions): only those it knew already are read again.
    metas: dict[str, TopicMetadata] = root.topics(names, refresh=refresh and sub.kind != "subscribePattern")
    for name in names:
        if name not in metas and require and sub.kind != "subscribePattern":
            raise option_error(sub.kind, f"unknown topic {name!r} (topics: {root.catalog.names()})")
    if sub.kind == "assign":
        for topic, p in sub.assigned:
            meta = metas.get(topic)
            if meta is None:
                continue
            if p >= meta.partitions:
                meta = metas[topic] = root.topic(topic, refresh=True)
            if p < meta.partitions:
                out[(topic, p)] = meta
            elif require:
                raise option_error(
                    "assign",
                    f"partition {p} does not exist in topic {topic!r} (it has partitions 0..{meta.partitions - 1})",
                )
        return out
    for name, meta in metas.items():
        for p in range(meta.partitions):
            out[(name, p)] = meta
    return out


def open_partition_log(root: LogRoot, tp: TP, meta: TopicMetadata | None = None) -> PartitionLog:
    """The log of one partition (``UnknownTopicOrPartitionError`` if it is gone)."""
    return root.partition(tp[0], tp[1], meta)


def tail_view(plog: PartitionLog) -> LogView:
    """A view whose end offset is current: a cheap tail follow after the first full resolve."""
    return plog.follow_tail()


# ---------------------------------------------------------------------------- offsets from options


def _per_partition(spec: OffsetSpec, tps: Iterable[TP]) -> dict[TP, int]:
    """The values of a JSON spec for exactly the partitions ``tps``; all must be named and no others."""
    wanted = set(tps)
    given = {(t, p): v for t, per in spec.offsets.items() for p, v in per.items()}
    extra = sorted(set(given) - wanted)
    if extra:
        raise option_error(
            spec.option,
            "names partitions that are not part of the subscription: " + ", ".join(f"{t}-{p}" for t, p in extra),
        )
    missing = sorted(wanted - set(given))
    if missing:
        raise option_error(
            spec.option,
            "must give every partition of the subscription (use -2 for "
            "earliest, -1 for latest); missing: " + ", ".join(f"{t}-{p}" for t, p in missing),
        )
    return given


def resolve_offsets(
    root: LogRoot,
    spec: OffsetSpec,
    partitions: Mapping[TP, TopicMetadata],
    *,
    ending: bool,
    fail_on_data_loss: bool,
    timestamp_strategy: str = "error",
    latest: Callable[[PartitionLog], int] | None = None,
    views: Mapping[TP, LogView] | None = None,
) -> dict[TP, int]:
    """Turn an offset spec into an offset for every partition (checked against each log).

    ``latest`` gives what "latest" means for a log: its end offset by
    default, the last stable offset for read_committed readers. ``views``: chains the caller
    resolved just now (from one listing per topic); other partitions are listed here.
    """
    out: dict[TP, int] = {}
    per = _per_partition(spec, partitions) if spec.kind in ("offsets", "timestamps") else {}
    for tp, meta in sorted(partitions.items()):
        plog = open_partition_log(root, tp, meta)
        view = views[tp] if views is not None and tp in views else plog.view()

        def newest(plog: PartitionLog = plog, view: LogView = view) -> int:
            # Only when asked for: "latest" under read_committed follows the tail and reads indexes.
            return view.end_offset if latest is None else latest(plog)

        if spec.kind == "earliest":
            out[tp] = view.start_offset
        elif spec.kind == "latest":
            out[tp] = newest()
        elif spec.kind == "offsets":
            value = per[tp]
            if value == EARLIEST:
                out[tp] = view.start_offset
            elif value == LATEST:
                out[tp] = newest()
            elif value > view.end_offset:
                raise option_error(
                    spec.option,
                    f"offset {value} for {tp[0]}-{tp[1]} is past the end of the "
                    f"log (valid offsets are {view.start_offset}.."
                    f"{view.end_offset})",
                )
            elif value < view.start_offset:
                data_loss(
                    fail_on_data_loss,
                    f"plog option '{spec.option}': offset {value} for "
                    f"{tp[0]}-{tp[1]} is before the log start offset "
                    f"{view.start_offset}",
                )
                out[tp] = view.start_offset
            else:
                out[tp] = value
        else:  # one timestamp for all, or one per partition
            ts = spec.timestamp if spec.kind == "timestamp" else per[tp]
            found = plog.offset_for_timestamp(ts)
            if found is None:
                if not ending and timestamp_strategy == "error":
                    raise option_error(
                        spec.option,
                        f"no record of {tp[0]}-{tp[1]} has a timestamp at or "
                        f"after {ts} (set startingOffsetsByTimestampStrategy="
                        "latest to start at the end instead)",
                    )
                found = newest()
            out[tp] = max(found, view.start_offset)
    return out


# ---------------------------------------------------------------------------- admission control


def allocate_rows(available: Mapping[TP, int], limit: int) -> dict[TP, int]:
    """Split ``limit`` records over partitions in proportion to what each has available.

    Exact: the shares add up to ``min(limit, total)`` (largest remainders get
    the leftover records), and no partition gets more than it has.
    """
    total = sum(available.values())
    if total <= limit:
        return dict(available)
    shares = {tp: limit * n / total for tp, n in available.items()}
    out = {tp: min(available[tp], math.floor(s)) for tp, s in shares.items()}
    left = limit - sum(out.values())
    for tp in sorted(available, key=lambda t: (-(shares[t] - math.floor(shares[t])), t)):
        if left <= 0:
            break
        if out[tp] < available[tp]:
            out[tp] += 1
            left -= 1
    return out


def _chunks(plog: PartitionLog, view: LogView, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """(first offset, end offset, stored bytes, segment index) per segment overlapping ``[start, end)``."""
    out: list[tuple[int, int, int, int]] = []
    if not view.segments or start >= end:
        return out
    s = max(0, view.segment_for(start))
    while s < len(view.segments):
        ref = view.segments[s]
        seg_end = ref.end_offset if ref.end_offset is not None else view.end_offset
        if ref.base_offset >= end:
            break
        lo, hi = max(start, ref.base_offset), min(end, seg_end)
        if hi > lo:
            span = max(1, seg_end - ref.base_offset)
            out.append((lo, hi, max(1, round(ref.size * (hi - lo) / span)), s))
        s += 1
    return out


def _cut_segment(plog: PartitionLog, view: LogView, s: int, lo: int, hi: int, fraction: float) -> int:
    """The offset in segment ``s`` after ``fraction`` of the stored bytes of ``[lo, hi)`` (batch index)."""
    idx = plog.index(view.segments[s])
    pieces = []
    b = idx.batch_for_offset(lo)
    while b < idx.batch_count and int(idx.base_offsets[b]) < hi:
        first = max(lo, int(idx.base_offsets[b]))
        last = min(hi, int(idx.last_offsets[b]) + 1)
        if last > first:
            span = int(idx.last_offsets[b]) + 1 - int(idx.base_offsets[b])
            pieces.append((first, last, int(idx.lengths[b]) * (last - first) / max(1, span)))
        b += 1
    budget = fraction * sum(p[2] for p in pieces)
    for first, last, nbytes in pieces:
        if nbytes > budget:
            return first + int((last - first) * budget / nbytes)
        budget -= nbytes
    return hi


def cut_by_bytes(
    logs: Mapping[TP, PartitionLog],
    views: Mapping[TP, LogView],
    start: Mapping[TP, int],
    latest: Mapping[TP, int],
    max_bytes: int,
) -> dict[TP, int]:
    """End offsets so that about ``max_bytes`` stored bytes are read in all, shared by available bytes.

    Bytes are stored (compressed) bytes, estimated from segment sizes and,
    where a cut falls, from the segment's batch index. At least one record is
    admitted when any is available, so a stream always makes progress.
    """
    chunks = {tp: _chunks(logs[tp], views[tp], start[tp], latest[tp]) for tp in latest if latest[tp] > start[tp]}
    sizes = {tp: sum(c[2] for c in cs) for tp, cs in chunks.items()}
    total = sum(sizes.values())
    out = dict(latest)
    if total <= max_bytes:
        return out
    for tp, cs in chunks.items():
        budget = max_bytes * sizes[tp] / total
        position = start[tp]
        for lo, hi, nbytes, s in cs:
            if nbytes <= budget:
                budget -= nbytes
                position = hi
                continue
            position = _cut_segment(logs[tp], views[tp], s, lo, hi, budget / nbytes)
            break
        out[tp] = position
    if all(out[tp] <= start[tp] for tp in chunks) and chunks:
        first = max(chunks, key=lambda t: (latest[t] - start[t], t))
        out[first] = start[first] + 1
    return out


# ---------------------------------------------------------------------------- splitting into tasks


@dataclass(frozen=True)
class OffsetRange:
    """Offsets ``[start, until)`` of one partition, read by one Spark task."""

    topic: str
    partition: int
    start: int
    until: int

    @property
    def size(self) -> int:
        """How many offsets the range spans."""
        return self.until - self.start


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """With ``minPartitions`` above the number of ranges, split the large ones (as Kafka's source does).

    Each range gets a number of near-equal pieces in proportion to its size
    (at least one, at most one per offset), so that there are
    ``minPartitions`` pieces in all when the ranges are big enough.
    Deterministic: the same ranges always give the same pieces, so a re-run
    batch reads exactly what the first run read.
    """
    ranges = [r for r in ranges if r.size > 0]
    if not min_partitions or min_partitions <= len(ranges):
        return ranges
    total = sum(r.size for r in ranges)
    shares = [r.size * min_partitions / total for r in ranges]
    parts = [max(1, min(r.size, math.floor(s))) for r, s in zip(ranges, shares, strict=True)]
    for i in sorted(range(len(ranges)), key=lambda i: (-(shares[i] - math.floor(shares[i])), i)):
        if sum(parts) >= min_partitions:
            break
        if parts[i] < ranges[i].size:
            parts[i] += 1
    out = []
    for r, n in zip(ranges, parts, strict=True):
        for i in range(n):
            lo, hi = r.start + r.size * i // n, r.start + r.size * (i + 1) // n
            out.append(OffsetRange(r.topic, r.partition, lo, hi))
    return out


# ---------------------------------------------------------------------------- consumer group offsets for lag


class GroupOffsetsWriter:
    """Writes a query's processed offsets as ``groups/<group>/offsets/<seq:020d>.json`` after each batch.

    Each object holds ``{"topic": {"partition": next_offset}}`` and is created
    with put-if-absent, so two writers never overwrite each other: ``seq``
    grows by one per commit (a lost race moves on to the next number). The
    stream reader does not learn Spark's batch id, so the number is a commit
    sequence, not the batch id. Only the newest ``keep`` objects are kept: every ``PRUNE_EVERY`` commits
    the older ones are deleted, so the group's listing (which every member of a group of that name makes
    each heartbeat cycle, PROTOCOL.md 11.4) holds at most ``keep + PRUNE_EVERY`` of them.
    """

    #: Commits between two prunes (a listing and the deletions).
    PRUNE_EVERY = 8

    def __init__(self, store: Store, group: str, keep: int = 2) -> None:
        self.store = store
        self.prefix = lag_offsets_prefix(group)
        self.keep = keep
        self._next: int | None = None
        self._last_body: bytes | None = None

    def _existing(self) -> list[int]:
        return numbered.numbers(self.store, self.prefix)

    def commit(self, offsets: Mapping[str, Mapping[str, int]]) -> str | None:
        """Record ``offsets``; returns the key written (None if they equal the last ones written)."""
        body = json.dumps(offsets, sort_keys=True).encode()
        if body == self._last_body:
            return None
        if self._next is None and self._repeats_newest(body):
            return None
        # The cached next number saves a listing per batch; only a lost race pays for one.
        if self._next is not None and numbered.create(self.store, self.prefix, self._next, body):
            n = self._next
        else:
            n, _ = numbered.create_next(self.store, self.prefix, lambda _n: body)
        self._last_body, self._next = body, n + 1
        self._prune()
        return numbered.numbered_key(self.prefix, n)

    def _repeats_newest(self, body: bytes) -> bool:
        """Whether the newest stored object already holds ``body`` (a restarted query re-committing)."""
        newest = numbered.latest(self.store, self.prefix)
        if newest is None:
            return False
        try:
            if self.store.get(numbered.numbered_key(self.prefix, newest)) != body:
                return False
        except ObjectNotFoundError:
            return False
        self._last_body, self._next = body, newest + 1
        return True

    def _prune(self) -> None:
        assert self._next is not None
        if self._next % self.PRUNE_EVERY:  # list and delete in rounds, not on every batch
            return
        for n in self._existing():
            if n < self._next - self.keep:
                self.store.delete(numbered.numbered_key(self.prefix, n))
