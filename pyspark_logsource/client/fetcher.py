"""The consumer's fetcher: positions of the assigned partitions, and the reads that move them.

``Fetcher`` keeps the assignment (sorted) and, per partition, the next offset to read.
``fetch`` reads from the partitions in turn, round-robin from a moving start, up to
``max_records`` records and ``fetch_max_bytes`` bytes, as the Arrow batches the log returns;
a partition without a position starts at ``auto_offset_reset``, and one whose position fell
out of the log (retention, ``delete_records``) is reset the same way. ``fetch_waiting`` repeats
an attempt with a growing back-off (1 ms doubling to ``fetch_poll_max_ms``) until records come
or the timeout passes. ``to_records`` and ``to_arrow`` turn fetched batches into what ``poll``
and ``poll_arrow`` return.

**Reads decode ahead**, as Kafka's consumer fetches ahead: each read asks its log to start decoding the
batches that follow it in the bytes already read (up to two reads' worth, on the codec pool), so that the
next poll of the partition finds them decoded (``PartitionLog.read``'s ``decode_ahead``). No request is
added. As Kafka bounds its fetched data by ``fetch.max.bytes``, reads decode ahead only while two reads'
worth of every assigned partition (``max_partition_fetch_bytes`` each) fits in ``fetch_max_bytes``: with the
defaults, for up to 25 partitions.

**Waiting at the end costs one request per interval, not one per partition** (PROTOCOL.md 9.1).
In a root whose protocol lists ``changeNotices``, a partition that a fetch found empty is
*parked*: later fetches skip it until its topic's change notice, read at most every
``notice_interval_ms``, has changed since the read that came before the empty probe. Waiting on
several topics in a root that also lists ``rootNotice``, the fetcher reads the root change notice
instead, and the topics' notices only after it changed (``NoticeWatch.poll``): one GET per interval
whatever the number of topics. A
partition stopped at an open transaction (read_committed) waits for a decision, not an
append: it is parked too, and also probed again every ``BLOCKED_RECHECK_S`` (``notice.py``) in case its
decider died before writing the notice. In a root without the feature every fetch probes
every partition, as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from itertools import repeat
from typing import Any

import numpy as np
import pyarrow as pa

from pyspark_logsource.client.metrics import ConsumerMetrics
from pyspark_logsource.client.types import ConsumerRecord, TopicPartition
from segment_format.errors import InvalidConfigError, OffsetOutOfRangeError, UnknownTopicOrPartitionError
from segment_format.log.chain import LogView
from segment_format.log.partition_log import PartitionLog
from segment_format.log.reader import DECODE_AHEAD_READS
from segment_format.notice import ParkedPartitions, default_notice_interval_ms
from segment_format.parallel import io_map
from segment_format.records import RECORD_SCHEMA
from segment_format.root import LogRoot
from segment_format.stores.base import ObjectInfo
from segment_format.topic import TopicMetadata

__all__ = ["ARROW_SCHEMA", "Fetched", "Fetcher", "RepeatedColumns", "to_arrow", "to_records"]

#: Columns of ``poll_arrow``'s table, in order.
ARROW_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        *RECORD_SCHEMA,
    ]
)

#: What a fetch returns: record batches (``RECORD_SCHEMA``), each with its partition, in read order.
Fetched = list[tuple[TopicPartition, pa.RecordBatch]]

_tuple_new = tuple.__new__


class Fetcher:
    """The assignment, the positions, and the reads (see the module docstring).

    ``config`` is the consumer's checked config; ``resolve`` decides transactions for
    read_committed reads (``TransactionCoordinator.resolve``).
    """

    def __init__(self, root: LogRoot, config: dict[str, Any], resolve: Callable[..., Any]) -> None:
        self.root = root
        self.config = config
        self.resolve = resolve
        #: The assigned partitions, sorted.
        self.assignment: list[TopicPartition] = []
        #: The next offset to read, per assigned partition that has one.
        self.positions: dict[TopicPartition, int] = {}
        #: Where the next fetch starts its round of the assignment.
        self.next_partition = 0
        #: Partitions waiting for their topic's change notice, when the root promises notices (PROTOCOL.md 9.1).
        #: How often a change notice is read while waiting (a local root's is short: a read of a small file).
        self.notice_interval_s = (config["notice_interval_ms"] or default_notice_interval_ms(root.store)) / 1000
        self.waiting = ParkedPartitions.if_promised(
            root.store,
            root.protocol.version.writer_features,
            self.notice_interval_s,
            root.root_reads,  # one read of the root notice serves the notices and the root's metadata
            root.topic_change,  # a shared topic's next commit is its notice
        )
        #: ``poll_arrow``'s topic and partition columns, kept between polls.
        self.columns = RepeatedColumns()
        #: Kafka's fetch metrics of the consumer (``Consumer.metrics``).
        self.metrics = ConsumerMetrics()

    def set_assignment(self, tps: list[TopicPartition]) -> None:
        """Read exactly ``tps`` from now on; positions of partitions kept are kept."""
        self.note_assignment(tps)
        self.positions = {tp: off for tp, off in self.positions.items() if tp in set(tps)}
        if self.waiting is not None:
            self.waiting.keep_only(self.assignment)

    def note_assignment(self, tps: list[TopicPartition]) -> None:
        """Take ``tps`` as the partitions read (a group's rebalance sets positions itself), and say so to the
        shared spans, so that a shared object's runs of all of them are read as one range."""
        dropped = {tp.topic for tp in self.assignment}
        self.assignment = sorted(set(tps))
        # A shared object holds runs of many partitions: the assigned ones are read in one range per topic.
        by_topic: dict[str, set[int]] = {}
        for tp in self.assignment:
            by_topic.setdefault(tp.topic, set()).add(tp.partition)
        for topic in dropped - by_topic.keys():
            self.root.index_cache.spans.want(topic, ())
        for topic, partitions in by_topic.items():
            self.root.index_cache.spans.want(topic, partitions)

    def log(self, tp: TopicPartition) -> PartitionLog:
        """The log of one partition."""
        return self.root.partition(tp.topic, tp.partition)

    def reset(self, tp: TopicPartition) -> None:
        """Give ``tp`` the position ``auto_offset_reset`` says (``OffsetOutOfRangeError`` for 'none')."""
        policy = self.config["auto_offset_reset"]
        if policy == "none":
            raise OffsetOutOfRangeError(f"no position for {tp} and auto_offset_reset is 'none'")
        # The tail is followed, not listed: a consumer usually resets right after end_offsets listed the
        # chain. A start gone stale since is safe: a read below the real start is out of range, and
        # reset_out_of_range moves it there.
        view = self.log(tp).follow_tail()
        self.positions[tp] = view.start_offset if policy == "earliest" else view.end_offset

    def reset_many(self, tps: list[TopicPartition]) -> None:
        """:meth:`reset` for several partitions: one listing per topic, not a request per partition.

        Each topic's incarnation is listed once (``LogRoot.partition_listings``) and every partition's
        chain resolved from its part (the last index of a partition with records is read, one GET),
        topics and partitions in parallel. A partition whose new position is its end, in a topic whose
        notice was read before the listing started, is parked at once: that listing is the probe
        (PROTOCOL.md 9.1, *Parking from a listing*), so it costs no tail check.
        """
        policy = self.config["auto_offset_reset"]
        if policy == "none":
            raise OffsetOutOfRangeError(f"no position for {tps[0]} and auto_offset_reset is 'none'")
        by_topic: dict[str, list[int]] = {}
        for tp in tps:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        topics = sorted(by_topic)
        waiting = self.waiting

        def listed(topic: str) -> tuple[TopicMetadata, bool, float, dict[int, list[ObjectInfo]]] | None:
            try:
                meta = self.root.topic(topic)
            except UnknownTopicOrPartitionError:
                return None  # deleted meanwhile: left to the per-partition reset, which reports it
            # Whether the topic's notice was read before this listing starts: then the listing is a probe.
            noticed = waiting is not None and waiting.watch.known(topic, meta.topic_id)
            at = time.monotonic()
            return meta, noticed, at, self.root.partition_listings(topic, meta)

        found = dict(zip(topics, io_map(listed, topics), strict=True))
        jobs: list[tuple[TopicPartition, TopicMetadata, bool, float, list[ObjectInfo]]] = []
        for tp in tps:
            topic = found[tp.topic]
            # A partition beyond the partitions this metadata has is left to the per-partition reset.
            if topic is not None and tp.partition in topic[3]:
                jobs.append((tp, topic[0], topic[1], topic[2], topic[3][tp.partition]))

        def resolve(job: tuple[TopicPartition, TopicMetadata, bool, float, list[ObjectInfo]]) -> LogView:
            tp, meta, _noticed, at, listing = job
            return self.root.partition(tp.topic, tp.partition, meta).chain.view_from(listing, at)

        for (tp, meta, noticed, _at, _listing), view in zip(jobs, io_map(resolve, jobs), strict=True):
            self.positions[tp] = view.start_offset if policy == "earliest" else view.end_offset
            if noticed and waiting is not None and self.positions[tp] == view.end_offset:
                waiting.park(tp, view.end_offset, meta.topic_id)
        for tp in tps:
            if tp not in self.positions:
                self.reset(tp)

    def reset_out_of_range(self, tp: TopicPartition) -> None:
        """``tp``'s position is outside the log: below its start go to the start, else by ``auto_offset_reset``."""
        view = self.log(tp).view()
        position = self.positions.get(tp, 0)
        if position < view.start_offset or self.config["auto_offset_reset"] == "earliest":
            self.positions[tp] = view.start_offset
        else:
            self.positions[tp] = view.end_offset

    def fetch(self, max_records: int, max_bytes: float | None = None) -> Fetched:
        """One round over the assignment: up to ``max_records`` records, ``fetch_max_bytes`` bytes in all
        (or ``max_bytes``, if smaller: a quota's burst) and ``max_partition_fetch_bytes`` per partition
        (all soft: a partition gives at least one batch)."""
        out: Fetched = []
        if not self.assignment:
            return out
        started = time.monotonic()
        # The partitions of a shared topic followed in this round share one probe of its head (PROTOCOL.md 9.1).
        self.root.index_cache.round_started = started
        remaining = max_records
        budget = self.config["fetch_max_bytes"] if max_bytes is None else min(self.config["fetch_max_bytes"], max_bytes)
        n = len(self.assignment)
        # A round's bytes are shared out over the assignment, so that its partitions move through the log
        # side by side: a shared object's span, read once for all of them, then serves every one of them
        # within the round (PROTOCOL.md 7.3, *Reading*) instead of being evicted before the last comes to it.
        # The objects a round touches are its bytes' worth and one or two at each edge: a third of the kept
        # spans leaves room for them.
        kept = self.root.index_cache.spans.capacity_bytes // 3
        per_partition = max(1, min(self.config["max_partition_fetch_bytes"], int(budget) // n, kept // n))
        # Bytes decoded ahead stay within fetch_max_bytes over the assignment, as Kafka's fetched data does.
        decode_ahead = n * min(budget, per_partition) * DECODE_AHEAD_READS <= budget
        # Positions move only once the records are handed out: if a later partition raises
        # (auto_offset_reset='none'), the records fetched before it must not be skipped.
        advanced: dict[TopicPartition, int] = {}
        waiting = self.waiting
        if waiting is not None:
            waiting.wake({tp.topic for tp in self.assignment}, lambda topic: self.root.topic(topic).topic_id)
        unplaced = [tp for tp in self.assignment if tp not in self.positions]
        if len(unplaced) > 1:  # after the notices were read: the listings that place them are their probes
            self.reset_many(unplaced)
        order = [self.assignment[(self.next_partition + i) % n] for i in range(n)]
        if waiting is not None and waiting.hinted:
            # A notice just changed: the partitions it names first, then the rest of the round.
            order.sort(key=lambda tp: tp not in waiting.hinted)
        served = 0  # partitions of ``order`` this round came to: the next round starts after them
        for tp in order:
            if remaining <= 0 or budget <= 0:
                break
            served += 1
            if out and waiting is not None and waiting.hinted and tp not in waiting.hinted:
                break  # hand out what the notice pointed at now; the other woken partitions come next poll
            if tp not in self.positions:
                self.reset(tp)
            if waiting is not None and waiting.is_parked(tp, self.positions[tp]):
                continue
            log = self.log(tp)
            try:
                batches, next_offset = log.read(
                    self.positions[tp],
                    max_records=remaining,
                    max_bytes=min(budget, per_partition),
                    isolation=self.config["isolation_level"],
                    resolver=self.resolve,
                    decode_ahead=decode_ahead,  # a consumer reads on from here at its next poll
                    max_decoded_bytes=None if max_bytes is None else max(1, int(budget)),
                )
            except OffsetOutOfRangeError:
                if self.config["auto_offset_reset"] == "none":
                    raise
                self.reset_out_of_range(tp)
                continue
            for batch in batches:
                out.append((tp, batch))
                remaining -= batch.num_rows
                budget -= batch.nbytes  # decoded bytes: at least the stored ones, so the bound only tightens
            advanced[tp] = next_offset
            self.metrics.lag[tp] = log.view(refresh=False).end_offset - next_offset  # the end this read saw
            if not batches and next_offset == self.positions[tp] and waiting is not None:
                # read_committed stops at an open transaction before the end: it waits for a decision.
                waiting.park(tp, next_offset, log.topic_id, blocked=log.view(refresh=False).end_offset > next_offset)
        self.positions.update(advanced)
        hinted = waiting is not None and waiting.hinted
        # A round cut short (records or bytes) continues where it stopped, so that no partition waits many
        # rounds behind the others; a whole round moves the first partition on by one, as before.
        self.next_partition = (self.next_partition + (1 if served >= n or hinted else served)) % n
        self.metrics.fetched((batch for _, batch in out), time.monotonic() - started, self.assignment)
        return out

    def one_value_type(self, fetched: Fetched) -> Fetched:
        """The fetched batches whose value type is the first one's; the partitions of the others go back
        to their first record not returned, so that a later poll returns them (one table has one value
        type: typed topics carry their own schema, PROTOCOL.md 11.8)."""
        if len({batch.schema.field(3).type for _, batch in fetched}) <= 1:
            return fetched
        first = fetched[0][1].schema.field(3).type
        kept: Fetched = []
        for tp, batch in fetched:
            if batch.schema.field(3).type == first:
                kept.append((tp, batch))
            elif batch.num_rows:
                offset = int(batch.column(0)[0].as_py())
                self.positions[tp] = min(self.positions.get(tp, offset), offset)
        return kept

    def fetch_waiting(
        self,
        timeout_ms: int,
        max_records: int | None,
        attempt: Callable[[int], Fetched],
        default_limit: int | None = None,
    ) -> Fetched:
        """Call ``attempt(limit)`` until it returns records or ``timeout_ms`` passes, backing off in between.

        ``limit`` is ``max_records``, else ``default_limit``, else ``max_poll_records``.
        """
        if not isinstance(timeout_ms, (int, float)) or timeout_ms < 0:
            raise InvalidConfigError(f"timeout_ms={timeout_ms!r} must be >= 0")
        limit = max_records if max_records is not None else default_limit or self.config["max_poll_records"]
        if not isinstance(limit, int) or limit < 1:
            raise InvalidConfigError(f"max_records={max_records!r} must be a positive int")
        deadline = time.monotonic() + timeout_ms / 1000
        backoff = 0.001
        while True:
            fetched = attempt(limit)
            remaining = deadline - time.monotonic()
            if fetched or remaining <= 0:
                return fetched
            time.sleep(min(backoff, remaining))
            # No longer than a notice's interval: a parked partition's probe costs nothing before that.
            backoff = min(backoff * 2, self.config["fetch_poll_max_ms"] / 1000, self.notice_interval_s)


def to_records(
    fetched: Fetched,
    key_deserializer: Callable[[bytes], Any] | None,
    value_deserializer: Callable[[bytes], Any] | None,
) -> dict[TopicPartition, list[ConsumerRecord]]:
    """``poll``'s answer: the fetched records as ``ConsumerRecord`` tuples, grouped by partition."""
    out: dict[TopicPartition, list[ConsumerRecord]] = {}
    for tp, batch in fetched:
        records = out.setdefault(tp, [])
        n = batch.num_rows
        offsets = batch.column(0).to_numpy().tolist()
        stamps = batch.column(1).view(pa.int64()).to_numpy().tolist()
        keys = batch.column(2).to_pylist()
        values = batch.column(3).to_pylist()
        headers_col = batch.column(4)
        if headers_col.null_count == n:
            headers: list[Any] = [[]] * n
        else:
            headers = [[(h["key"], h["value"]) for h in hs] if hs else [] for hs in headers_col.to_pylist()]
        if key_deserializer is not None:
            keys = [None if k is None else key_deserializer(k) for k in keys]
        if value_deserializer is not None:
            values = [None if v is None else value_deserializer(v) for v in values]
        topic, partition = tp
        # tuple.__new__ is what ConsumerRecord._make calls, minus a Python frame per record.
        records.extend(
            map(
                _tuple_new,
                repeat(ConsumerRecord, n),
                zip(
                    repeat(topic, n),
                    repeat(partition, n),
                    offsets,
                    stamps,
                    repeat(0, n),
                    keys,
                    values,
                    headers,
                    strict=True,
                ),
            )
        )
    return out


class RepeatedColumns:
    """The ``topic`` and ``partition`` columns of ``poll_arrow``'s tables, built once and then sliced.

    Every row of a fetched batch has the same topic and partition. Building those columns afresh costs
    about 2 ns a record (``pa.repeat`` of a string), a twentieth of a whole ``poll_arrow``; a slice of
    a column kept from before costs nothing, and Arrow arrays are immutable, so tables handed out may
    share them. A slice carries its whole column when a table is pickled, so a kept column is sliced
    only for batches of at least half its length: a table never carries more than twice its own rows.
    A column grows to the longest batch asked for, up to :attr:`MAX_ROWS` rows.
    """

    #: Longest column kept; longer batches get a column of their own.
    MAX_ROWS = 1 << 20

    def __init__(self) -> None:
        self._topics: dict[str, pa.Array] = {}
        self._partitions: dict[int, pa.Array] = {}

    def topic(self, name: str, n: int) -> pa.Array:
        """``n`` rows of ``name`` (string)."""
        return self._rows(self._topics, name, n, lambda: pa.repeat(pa.scalar(name, pa.string()), n))

    def partition(self, number: int, n: int) -> pa.Array:
        """``n`` rows of ``number`` (int32)."""
        return self._rows(self._partitions, number, n, lambda: pa.array(np.full(n, number, np.int32)))

    def _rows(self, kept: dict[Any, pa.Array], value: Any, n: int, build: Callable[[], pa.Array]) -> pa.Array:
        """``n`` rows of ``value``: a slice of its kept column when that is at most twice as long, else
        ``build()``, kept when longer than the kept column (and at most ``MAX_ROWS``)."""
        column = kept.get(value)
        if column is not None and n <= len(column) <= 2 * n:
            return column.slice(0, n)
        built = build()
        if (column is None or n > len(column)) and n <= self.MAX_ROWS:
            kept[value] = built
        return built


def to_arrow(fetched: Fetched, columns: RepeatedColumns | None = None) -> pa.Table:
    """``poll_arrow``'s answer: the fetched records as one table with ``ARROW_SCHEMA``.

    ``columns``: the caller's kept topic and partition columns (a fetcher's), else built for this call.
    """
    if not fetched:
        return ARROW_SCHEMA.empty_table()
    schema = poll_arrow_schema(fetched)
    columns = columns if columns is not None else RepeatedColumns()
    batches = []
    for tp, batch in fetched:
        n = batch.num_rows
        topic, partition = columns.topic(tp.topic, n), columns.partition(tp.partition, n)
        batches.append(pa.RecordBatch.from_arrays([topic, partition, *batch.columns], schema=schema))
    return pa.Table.from_batches(batches, schema=schema)


def poll_arrow_schema(fetched: Fetched) -> pa.Schema:
    """``poll_arrow``'s schema for these batches: :data:`ARROW_SCHEMA`, with a typed topic's ``value`` a
    struct of its fields (PROTOCOL.md 11.8). One table has one value type, so batches of topics whose
    values differ (typed and untyped, or two value schemas) are refused, naming the topics."""
    value_types = {batch.schema.field(3).type: tp.topic for tp, batch in fetched}
    if len(value_types) > 1:
        raise InvalidConfigError(
            f"poll_arrow returns one table, but topics {sorted(set(value_types.values()))} have different value "
            "types (typed topics carry their own schema): poll them with separate consumers, or use poll()"
        )
    value_type = next(iter(value_types))
    if value_type == pa.binary():
        return ARROW_SCHEMA
    return pa.schema([f if f.name != "value" else pa.field("value", value_type) for f in ARROW_SCHEMA])
