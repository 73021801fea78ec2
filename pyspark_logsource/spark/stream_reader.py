"""``spark.readStream.format("plog")``: micro-batches of offset ranges, offsets in Spark's checkpoint."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from coordinator.groups.documents import offsets_to_json
from coordinator.transactions import TransactionCoordinator
from pyspark_logsource.spark.compat import (  # admission control came in PySpark 4.2
    DataSourceStreamReader,
    InputPartition,
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark_logsource.spark.options import (
    BATCH_START_KEY,
    SourceOptions,
    checkpoint_offsets,
)
from pyspark_logsource.spark.partition_reader import input_partitions, read_partition
from pyspark_logsource.spark.planning import (
    TP,
    GroupOffsetsWriter,
    OffsetRange,
    allocate_rows,
    cut_by_bytes,
    data_loss,
    discover,
    log,
    open_partition_log,
    resolve_offsets,
    tail_view,
)
from pyspark_logsource.spark.typed import ReaderSchema, current_reader_schema
from segment_format.errors import (
    ObjectNotFoundError,
    PlogError,
    UnknownTopicOrPartitionError,
)
from segment_format.log.chain import LogView
from segment_format.log.partition_log import PartitionLog
from segment_format.log.reader import READ_COMMITTED
from segment_format.notice import ParkedPartitions
from segment_format.parallel import io_map
from segment_format.root import METADATA_MAX_AGE_S, LogRoot
from segment_format.stores.base import ObjectInfo
from segment_format.topic import TopicMetadata

#: How old the driver's listing of a partition must be before a planned micro-batch lists it again.
START_RECHECK_S = 30.0

# ---------------------------------------------------------------------------- streaming


class PlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("plog")``: micro-batches of offset ranges, offsets in Spark's checkpoint.

    One instance lives on the driver for the whole query run and answers
    ``latestOffset`` / ``partitions`` / ``commit``; copies of it are pickled
    to executors only to call :meth:`read`, which uses nothing but the input
    partition it is given.
    """

    def __init__(self, options: SourceOptions, reading: ReaderSchema | None = None) -> None:
        self.opts = options
        #: The value schema typed topics are read as for the whole run (PROTOCOL.md 11.8): the one Spark's
        #: plan has, fixed when the query was defined (None: the current one, found when the run starts).
        self.reading = reading
        self._root: LogRoot | None = None
        self._started = False
        self._latest: dict[TP, int] | None = None
        self._target: dict[TP, int] | None = None
        self._initial: dict[str, Any] | None = None  # what initialOffset() returned, to pin the first batch
        self._last_trigger = time.monotonic()
        self._names: list[str] = []
        self._names_at = -math.inf
        self._group: GroupOffsetsWriter | None = None
        self._transactions: TransactionCoordinator | None = None
        #: Partitions whose end ``latestOffset`` found at the batch start, waiting for their topic's
        #: change notice (PROTOCOL.md 9.1); None in a root without notices. Driver only.
        self._waiting: ParkedPartitions | None = None
        #: Before PySpark 4.2 Spark calls ``latestOffset()`` with no start: the end of the last batch this
        #: reader returned or was handed (None after a restart, until Spark hands it one).
        self._position: dict | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_root"] = None
        state["_group"] = None
        state["_transactions"] = None
        state["_waiting"] = None
        return state

    # -------------------------------------------------------------- helpers

    @property
    def root(self) -> LogRoot:
        """The driver's handle on the plog root (opened on first use)."""
        if self._root is None:
            self._root = LogRoot(self.opts.url, self.opts.storage_options)
            # Metadata and topic names stay current while the root notice is unchanged (PROTOCOL.md 9.1):
            # an idle micro-batch refreshes them with the GET that also tells it of new records.
            self._root.follow_root_notice()
        return self._root

    def _parking(self) -> ParkedPartitions | None:
        """The partitions waiting on notices (created on first use), or None in a root without notices.

        Spark asks for the latest offsets again as soon as a trigger finds nothing (every 10 ms
        with the default trigger): with notices an idle query reads one object per second (its
        topic's notice, or the root's for several topics) instead of probing every partition on every call.
        """
        if self._waiting is None:
            self._waiting = ParkedPartitions.if_promised(
                self.root.store,
                self.root.protocol.version.writer_features,
                self.opts.notice_interval_ms / 1000,
                self.root.root_reads,
                self.root.topic_change,
            )
        return self._waiting

    def _stable(self, plog: PartitionLog) -> int:
        """The newest offset a batch may end at: the log end, or for read_committed the last stable offset."""
        if self.opts.isolation_level != READ_COMMITTED:
            return tail_view(plog).end_offset
        if self._transactions is None:
            self._transactions = TransactionCoordinator(self.root.store, self.root.protocol).for_reader(self.root)
        return plog.last_stable_offset(self._transactions.resolve, whole=0)  # the driver plans; tasks read

    def _start(self) -> bool:
        """Checks that need the log, once per query run: the subscription's topics and partitions exist.
        Whether they were made now (the root's metadata and topic names were then just read)."""
        if self._started:
            return False
        discover(self.root, self.opts.subscription, refresh=True, require=True)
        self._reader_schema()
        self._started = True
        return True

    def _reader_schema(self) -> ReaderSchema:
        """The value schema of the run (found on first use when the data source did not give one)."""
        if self.reading is None:
            self.reading = current_reader_schema(self.root, self.opts)
        return self.reading

    def _discover(self, refresh: bool = False) -> dict[TP, TopicMetadata]:
        sub = self.opts.subscription
        if sub.kind != "subscribePattern":
            return discover(self.root, sub, refresh=refresh, require=False)
        # Listing every topic lists the whole root: do it at most once per metadata age.
        # The root keeps both while the root notice is unchanged (PROTOCOL.md 9.1): idle, one GET.
        if refresh or time.monotonic() - self._names_at >= METADATA_MAX_AGE_S:
            # Current as of a root notice read at most a notice interval old (the one latestOffset makes).
            fresh_s = min(self.opts.notice_interval_ms / 1000, METADATA_MAX_AGE_S)
            self._names = [n for n in self.root.topic_names(fresh_s, refresh=refresh) if sub.matches(n)]
            self._names_at = time.monotonic()
        metas = self.root.topics(self._names, refresh=refresh)
        return {(name, p): meta for name, meta in metas.items() for p in range(meta.partitions)}

    def _place(self, tps: Sequence[TP], found: Mapping[TP, TopicMetadata]) -> dict[TP, LogView]:
        """Resolve the chains of ``tps`` from one listing per topic, in parallel, and park those whose topic's
        notice was read before the listing at their end (PROTOCOL.md 9.1, *Parking from a listing*).

        For partitions this driver has not resolved yet (a query's start, a restart): one LIST per topic
        instead of a LIST or a tail check per partition. Call it after the notices were read (``wake``)."""
        waiting = self._parking()
        by_topic: dict[str, list[TP]] = {}
        for tp in tps:
            if tp in found:
                by_topic.setdefault(tp[0], []).append(tp)
        topics = sorted(by_topic)

        def listed(topic: str) -> tuple[bool, float, dict[int, list[ObjectInfo]]]:
            meta = found[by_topic[topic][0]]
            noticed = waiting is not None and waiting.watch.known(topic, meta.topic_id)
            at = time.monotonic()
            return noticed, at, self.root.partition_listings(topic, meta)

        listings = dict(zip(topics, io_map(listed, topics), strict=True))
        jobs = [tp for topic in topics for tp in by_topic[topic] if tp[1] in listings[topic][2]]

        def resolve(tp: TP) -> LogView:
            _noticed, at, parts = listings[tp[0]]
            return open_partition_log(self.root, tp, found[tp]).chain.view_from(parts[tp[1]], at)

        views = dict(zip(jobs, io_map(resolve, jobs), strict=True))
        if waiting is not None:
            committed = self.opts.isolation_level == READ_COMMITTED
            for tp, view in views.items():
                # read_committed waits at the last stable offset: known here for an empty log only (the
                # others are probed, which finds it).
                if listings[tp[0]][0] and not (committed and view.start_offset < view.end_offset):
                    waiting.park(tp, view.end_offset, found[tp].topic_id)
        return views

    def _resolved(self, tp: TP, meta: TopicMetadata) -> bool:
        """Whether this driver has resolved ``tp``'s chain (listed it, or followed its tail) already."""
        try:
            return open_partition_log(self.root, tp, meta).chain.listed_monotonic > -math.inf
        except UnknownTopicOrPartitionError:
            return True  # nothing to place: the loop reports it

    def _earliest(self, tp: TP) -> int | None:
        try:
            return open_partition_log(self.root, tp).view().start_offset
        except UnknownTopicOrPartitionError:
            return None

    # -------------------------------------------------------------- Spark's calls (driver)

    def initialOffset(self) -> dict:
        """Where a new query starts: ``startingOffsets`` (or a starting timestamp) for every partition."""
        # A start that has just read the subscription's metadata afresh need not read it again.
        found = self._discover(refresh=not self._start())
        waiting = self._parking()
        if waiting is not None:  # the notices first, so that the listings below are probes (PROTOCOL.md 9.1)
            waiting.wake({tp[0] for tp in found}, lambda topic: self.root.topic(topic).topic_id)
        views = self._place(sorted(found), found)
        offsets = resolve_offsets(
            self.root,
            self.opts.starting,
            found,
            ending=False,
            fail_on_data_loss=self.opts.fail_on_data_loss,
            timestamp_strategy=self.opts.starting_timestamp_strategy,
            latest=self._stable,
            views=views,
        )
        self._initial = offsets_to_json(offsets)
        self._position = dict(self._initial)
        return dict(self._initial)

    def getDefaultReadLimit(self) -> ReadLimit:
        """The limit the options ask for; ``latestOffset`` applies all of them unless told to read all."""
        self._start()
        o = self.opts
        if o.max_offsets_per_trigger is not None:
            return ReadMaxRows(o.max_offsets_per_trigger)
        if o.max_bytes_per_trigger is not None:
            return ReadMaxBytes(o.max_bytes_per_trigger)
        if o.min_offsets_per_trigger is not None:
            return ReadMinRows(o.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """``Trigger.AvailableNow``: read up to the offsets that exist now, and no further."""
        self._start()
        target = {}
        for tp, meta in self._discover(refresh=True).items():
            target[tp] = self._stable(open_partition_log(self.root, tp, meta))
        self._target = target

    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:
        """The next batch's end: the latest offsets, bounded by the read limits and AvailableNow's target.

        PySpark before 4.2 calls it with neither (no admission control): the start is then the end of the
        last batch this reader saw, and the batch reads all available (read-limit options are refused when
        the query starts, see :func:`pyspark_logsource.spark.compat.check_stream_options`).
        """
        if start is None:
            end = self._latest_offset(self._position, ReadAllAvailable())
        else:
            end = self._latest_offset(start, limit if limit is not None else self.getDefaultReadLimit())
        self._position = end
        return end

    def _latest_offset(self, start: dict | None, limit: ReadLimit) -> dict:
        """:meth:`latestOffset` for a known ``start`` (None: unknown, PySpark before 4.2 after a restart)."""
        self._start()
        opts = self.opts
        if start is not None:
            self._record_group_offsets(start)
        begin = checkpoint_offsets(start) if start is not None else {}
        found = self._discover()
        latest: dict[TP, int] = {}
        eff_start: dict[TP, int] = {}
        logs: dict[TP, PartitionLog] = {}
        views = {}
        waiting = self._parking()
        if waiting is not None:
            waiting.keep_only(found)
            waiting.wake({tp[0] for tp in found}, lambda topic: self.root.topic(topic).topic_id)
            # Partitions this driver never resolved (after a restart): one listing per topic places them all.
            fresh = [tp for tp in found if tp not in waiting.parked and not self._resolved(tp, found[tp])]
            if len(fresh) > 1:
                self._place(fresh, found)
        for tp in sorted(set(begin) | set(found)):
            parked = waiting.parked.get(tp) if waiting is not None else None
            if parked is not None and tp in begin and begin[tp] <= parked.position:
                # Its topic's notice has not changed since the probe that found this latest offset: no
                # acknowledged append (or decision) since, so no probe now (PROTOCOL.md 9.1).
                plog = open_partition_log(self.root, tp, found.get(tp))
                latest[tp], eff_start[tp] = parked.position, begin[tp]
                logs[tp], views[tp] = plog, plog.view(refresh=False)
                continue
            try:
                plog = open_partition_log(self.root, tp, found.get(tp))
                view = tail_view(plog)
            except UnknownTopicOrPartitionError:
                if tp in begin:
                    data_loss(
                        opts.fail_on_data_loss,
                        f"partition {tp[0]}-{tp[1]} no longer exists (its topic was deleted) at offset {begin[tp]}",
                    )
                continue
            end = view.end_offset
            if tp in begin and end < begin[tp]:
                view = plog.view()
                data_loss(
                    opts.fail_on_data_loss,
                    f"{tp[0]}-{tp[1]} ends at offset {view.end_offset}, "
                    f"before the query's position {begin[tp]} (was the topic "
                    "re-created?)",
                )
                latest[tp] = eff_start[tp] = view.start_offset  # go on from the new log's start
                continue
            if tp in begin:
                eff_start[tp] = begin[tp]
            else:  # a new partition or topic: read it from its start
                eff_start[tp] = view.start_offset if view.start_offset <= end else end
            # read_committed: never past the first undecided transaction (a start inside one waits for it).
            latest[tp] = max(eff_start[tp], self._stable(plog))
            logs[tp], views[tp] = plog, view
            if waiting is not None and tp in begin:
                waiting.park(tp, latest[tp], plog.topic_id, blocked=view.end_offset > latest[tp])
        self._latest = dict(latest)

        if self._target is not None:  # AvailableNow: never past the offsets that existed when it began
            for tp in list(latest):
                if tp in self._target:
                    latest[tp] = max(eff_start[tp], min(latest[tp], self._target[tp]))
                elif tp in begin:
                    latest[tp] = eff_start[tp]
                else:
                    del latest[tp]

        if not isinstance(limit, ReadAllAvailable):
            max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else opts.max_offsets_per_trigger
            max_bytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else opts.max_bytes_per_trigger
            min_rows = limit.min_rows if isinstance(limit, ReadMinRows) else opts.min_offsets_per_trigger
            growing = {tp: latest[tp] - eff_start[tp] for tp in latest if latest[tp] > eff_start[tp]}
            if (
                min_rows is not None
                and start is not None  # always, with a limit (PySpark 4.2 and later)
                and self._target is None
                and sum(growing.values()) < min_rows
                and (time.monotonic() - self._last_trigger) * 1000 < opts.max_trigger_delay_ms
            ):
                return start
            if max_rows is not None:
                for tp, n in allocate_rows(growing, max_rows).items():
                    latest[tp] = eff_start[tp] + n
            if max_bytes is not None:
                grow = [tp for tp in growing if tp in logs]
                starts, ends = {tp: eff_start[tp] for tp in grow}, {tp: latest[tp] for tp in grow}
                try:
                    cut = cut_by_bytes(
                        {tp: logs[tp] for tp in grow}, {tp: views[tp] for tp in grow}, starts, ends, max_bytes
                    )
                except ObjectNotFoundError:  # a cached view named segments merged or deleted since: resolve
                    cut = cut_by_bytes(
                        {tp: logs[tp] for tp in grow}, {tp: logs[tp].view() for tp in grow}, starts, ends, max_bytes
                    )
                for tp in grow:
                    latest[tp] = min(latest[tp], cut[tp])

        # ``latest`` is the batch's end; partitions of deleted topics (failOnDataLoss=false) drop out here.
        if latest == begin and start is not None:
            return start
        self._last_trigger = time.monotonic()
        batch_end: dict[str, Any] = offsets_to_json(latest)
        if self._initial is not None and start == self._initial:
            # The first batch's end carries its start. Spark does not log a start offset: if the driver dies
            # before the first batch commits, the re-run starts from ``initialOffset()`` called again, which
            # for "latest" or a timestamp now resolves later; ``partitions`` takes the start from here instead.
            batch_end[BATCH_START_KEY] = dict(start)
        return batch_end

    def reportLatestOffset(self) -> dict | None:
        """The newest offsets seen (no limits applied), shown as ``latestOffset`` in the query progress."""
        return offsets_to_json(self._latest) if self._latest is not None else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        """The batch's offset ranges, a task each (more with ``minPartitions``); deterministic for replays."""
        self._position = end  # a restart (before PySpark 4.2) learns its position here
        if start == end:
            return []
        pinned = end.get(BATCH_START_KEY)  # a first batch's own start (see ``latestOffset``) wins over ``start``
        begin = checkpoint_offsets(pinned if pinned is not None else start)
        until = checkpoint_offsets(end)
        fail = self.opts.fail_on_data_loss
        ranges = []
        for tp, stop in sorted(until.items()):
            first = begin.get(tp)
            if first is None:  # first seen in this batch: from its log start
                first = self._earliest(tp)
                if first is None:
                    data_loss(fail, f"partition {tp[0]}-{tp[1]} no longer exists")
                    continue
                if first > stop:
                    data_loss(fail, f"offsets [0, {first}) of new partition {tp[0]}-{tp[1]} are gone")
                    continue
            if stop < first:
                data_loss(fail, f"{tp[0]}-{tp[1]} went back from offset {first} to {stop}")
                continue
            ranges.append(OffsetRange(tp[0], tp[1], first, stop))
        self._recheck_start(ranges)
        return input_partitions(self.opts, self.root, ranges, self._reader_schema())

    def _recheck_start(self, ranges: list[OffsetRange]) -> None:
        """List again the planned partition listed longest ago, if over ``START_RECHECK_S`` ago.

        Tasks read the chain and the log start planned here (PROTOCOL.md 9, planned reads), and between
        listings the driver only follows tails, which never shows a start moved by retention or
        ``delete_records``: one listing per planned micro-batch brings each start up to date within
        one micro-batch per partition, at one LIST per micro-batch at most.
        """
        oldest: PartitionLog | None = None
        for r in ranges:
            try:
                plog = open_partition_log(self.root, (r.topic, r.partition))
            except UnknownTopicOrPartitionError:
                continue
            if oldest is None or plog.chain.listed_monotonic < oldest.chain.listed_monotonic:
                oldest = plog
        if oldest is not None and time.monotonic() - oldest.chain.listed_monotonic >= START_RECHECK_S:
            try:
                oldest.view()
            except PlogError as exc:  # planning goes on with the start known; the next micro-batch tries again
                log.warning("could not list %s again to check its log start: %s", oldest.name, exc)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        """Read one range (runs on an executor)."""
        return read_partition(partition)

    def commit(self, end: dict) -> None:
        """Spark committed the batch ending at ``end``; with ``groupIdForLag``, record it for lag tools."""
        if self._position is None:
            self._position = end
        self._record_group_offsets(end)

    def _record_group_offsets(self, processed: dict) -> None:
        """Write ``processed`` under ``groups/<groupIdForLag>/offsets/`` (best effort: lag is only a report).

        Spark calls ``commit`` for a batch only when it plans the next one, so
        ``latestOffset`` records its ``start`` too: by then the previous batch
        has been committed to the sink, and lag tools see it at once.
        """
        group = self.opts.group_id_for_lag
        if group is None:
            return
        try:
            if self._group is None:
                self._group = GroupOffsetsWriter(self.root.store, group)
            self._group.commit(offsets_to_json(checkpoint_offsets(processed)))
        except (PlogError, OSError) as exc:
            log.warning("could not record the offsets of group %r: %s", group, exc)

    def stop(self) -> None:
        """Release the root when the query stops."""
        if self._root is not None:
            self._root.close()
            self._root = None


# ---------------------------------------------------------------------------- the data source


class FailedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Stands in for a stream reader whose options are bad: every call raises the options error."""

    def __init__(self, error: PlogError) -> None:
        self.error = error

    def _fail(self) -> Any:
        raise self.error

    def initialOffset(self) -> dict:
        return self._fail()

    def getDefaultReadLimit(self) -> ReadLimit:
        return self._fail()

    def prepareForTriggerAvailableNow(self) -> None:
        self._fail()

    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:
        return self._fail()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return self._fail()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return self._fail()
