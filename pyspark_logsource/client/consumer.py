"""The consumer: kafka-python's ``KafkaConsumer`` API on a plog root, as a facade over its parts.

Each assigned partition has a position (the next offset to read), kept by the
``Fetcher`` (``fetcher.py``). ``poll`` reads from the partitions in turn,
round-robin, up to ``max_records``; ``poll_arrow`` returns the same records as
one Arrow table without creating a Python object per record. With a timeout,
an empty poll waits for new data with a growing back-off (1 ms doubling to
``fetch_poll_max_ms``), checking only the object that would come next in each
partition.

With a ``group_id``, ``subscribe`` joins a consumer group (PROTOCOL.md 11.4,
``ConsumerGroup`` in ``consumer_group.py`` over ``coordinator/groups.py``):
partitions are divided among the group's members by
``partition_assignment_strategy``, a background thread heartbeats, and ``poll``
runs rebalances (``on_partitions_revoked`` / ``on_partitions_assigned`` of the
listener given to ``subscribe``). Offsets are committed with
``commit``/``commit_async`` or ``enable_auto_commit``, fenced by generation.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from typing import Any

import pyarrow as pa

from coordinator.groups import GroupMember, validate_group_id
from coordinator.quotas import ClientQuota
from coordinator.transactions import TransactionCoordinator
from pyspark_logsource.client.config import CONSUMER_CONFIG
from pyspark_logsource.client.consumer_group import ConsumerGroup
from pyspark_logsource.client.fetcher import ARROW_SCHEMA, Fetched, Fetcher, to_arrow, to_records
from pyspark_logsource.client.metrics import counting_root, store_metrics
from pyspark_logsource.client.types import ConsumerRecord, OffsetAndTimestamp, TopicPartition, check_tp
from segment_format.errors import (
    InvalidConfigError,
    KafkaTimeoutError,
    OffsetOutOfRangeError,
)
from segment_format.parallel import io_map

#: ``poll_arrow``'s record limit without ``max_records``: none to speak of, its fetches are bounded by bytes.
ARROW_POLL_RECORDS = 2**62

__all__ = ["ARROW_SCHEMA", "CONSUMER_DEFAULTS", "Consumer"]

#: Every consumer config key with its default (declared in :data:`~pyspark_logsource.client.config.CONSUMER_CONFIG`).
CONSUMER_DEFAULTS: dict[str, Any] = CONSUMER_CONFIG.defaults()


def _check_consumer_config(config: dict[str, Any]) -> dict[str, Any]:
    return CONSUMER_CONFIG.validate(config)


class Consumer:
    """Reads records from topics of a plog root (``url``: any fsspec URL or a local path)."""

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        group_id: str | None = None,
        **config: Any,
    ) -> None:
        self.config = _check_consumer_config(config)
        self.group_id = validate_group_id(group_id) if group_id is not None else None
        self.root = counting_root(url, storage_options)  # counts its store requests, for metrics()
        # Metadata and topic names stay current while the root notice is unchanged (PROTOCOL.md 9.1): an idle
        # consumer of many topics refreshes them with the GET that also tells it of new records.
        self.root.follow_root_notice()
        self._transactions = TransactionCoordinator(self.root.store, self.root.protocol).for_reader(self.root)
        self._fetcher = Fetcher(self.root, self.config, self._transactions.resolve)
        self._quota = ClientQuota(
            self.root.store,
            "consumer_byte_rate",
            self.config["quota_user"],
            self.config["client_id"],
            self.config["quota_refresh_ms"] / 1000,
        )
        self._group = ConsumerGroup(self.root, self.group_id, self.config, self._fetcher)
        self._subscription: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self._manual = False
        self._last_metadata = 0.0
        self._closed = False

    @property
    def _member(self) -> GroupMember | None:
        """The live group membership, if any (tests watch it)."""
        return self._group.member

    # ------------------------------------------------------------------ assignment

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions (no group); validates each."""
        tps = [check_tp(tp) for tp in partitions]
        for tp in tps:
            self.root.partition(tp.topic, tp.partition)
        if self._subscription or self._pattern:
            raise InvalidConfigError("assign() after subscribe(): call unsubscribe() first")
        self._manual = True
        self._fetcher.set_assignment(tps)

    def assignment(self) -> set[TopicPartition]:
        """The partitions currently assigned."""
        self._refresh_subscription()
        return set(self._fetcher.assignment)

    def subscribe(self, topics: Iterable[str] = (), pattern: str | None = None, listener: Any = None) -> None:
        """Read all partitions of ``topics`` (or of topics matching ``pattern``, now and later).

        With a ``group_id`` this joins the group, which divides the partitions
        among its members; ``listener`` (an object with
        ``on_partitions_revoked(revoked)`` and ``on_partitions_assigned(assigned)``,
        like kafka-python's ``ConsumerRebalanceListener``) is called from ``poll``.
        """
        if listener is not None and not (
            callable(getattr(listener, "on_partitions_revoked", None))
            and callable(getattr(listener, "on_partitions_assigned", None))
        ):
            raise InvalidConfigError(
                f"listener {listener!r} needs on_partitions_revoked and on_partitions_assigned methods"
            )
        if self._manual:
            raise InvalidConfigError("subscribe() after assign(): call unsubscribe() first")
        if isinstance(topics, str):
            topics = [topics]
        names = set(topics)
        io_map(self.root.topic, sorted(names))  # each must exist; read in parallel, and cached for the fetcher
        if pattern is not None:
            try:
                self._pattern = re.compile(pattern)
            except re.error as exc:
                raise InvalidConfigError(f"subscribe pattern {pattern!r} is not a valid regex: {exc}") from None
        self._subscription = names
        self._group.listener = listener
        self._last_metadata = 0.0
        self._refresh_subscription()
        self._group.join(self._subscribed_names())

    def subscription(self) -> set[str]:
        """The subscribed topic names."""
        return set(self._subscription)

    def unsubscribe(self) -> None:
        """Drop every subscription and assignment (and leave the group)."""
        self._group.leave(autocommit=True)
        self._subscription = set()
        self._pattern = None
        self._manual = False
        self._fetcher.set_assignment([])

    def _subscribed_names(self) -> set[str]:
        names = set(self._subscription)
        if self._pattern is not None:
            max_age_s = self.config["metadata_max_age_ms"] / 1000
            names |= {n for n in self.root.topic_names(max_age_s) if self._pattern.fullmatch(n)}
        return names

    def _refresh_subscription(self) -> None:
        """Every ``metadata_max_age_ms``: the subscribed topics and their partitions, again.

        The catalog and the metadata come from the root's cache, which stays current while the root
        notice is unchanged (PROTOCOL.md 9.1: every change of topic metadata replaces it), so an idle
        refresh costs at most one GET whatever the number of topics; topics read again are read in
        parallel."""
        if self._manual or not (self._subscription or self._pattern):
            return
        max_age_s = self.config["metadata_max_age_ms"] / 1000
        if time.monotonic() - self._last_metadata < max_age_s:
            return
        self._last_metadata = time.monotonic()
        names = self._subscribed_names()
        if self.group_id is not None:  # the group assigns the partitions; tell it what we subscribe to
            self._group.set_topics(names)
            return
        metas = self.root.topics(sorted(names), max_age_s=max_age_s)
        self._fetcher.set_assignment(
            [TopicPartition(name, p) for name, meta in metas.items() for p in range(meta.partitions)]
        )

    # ------------------------------------------------------------------ positions

    def _require_assigned(self, tp: TopicPartition) -> TopicPartition:
        tp = check_tp(tp)
        if tp not in self._fetcher.assignment:
            self._refresh_subscription()
            if tp not in self._fetcher.assignment:
                raise InvalidConfigError(f"partition {tp} is not assigned to this consumer")
        return tp

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Set the next offset to read; checked against the log when it is read."""
        tp = self._require_assigned(partition)
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise OffsetOutOfRangeError(f"seek offset {offset!r} for {tp} must be a non-negative int")
        # A jump is checked against the current log, not a view cached before a retention or
        # delete_records moved its start: list the partition again (as seek_to_beginning does).
        self._fetcher.log(tp).view()
        self._fetcher.positions[tp] = offset

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Move to the log start offset of the partitions (all assigned if none given)."""
        for tp in partitions or tuple(self._fetcher.assignment):
            tp = self._require_assigned(tp)
            self._fetcher.positions[tp] = self._fetcher.log(tp).view().start_offset

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Move to the log end offset of the partitions (all assigned if none given)."""
        for tp in partitions or tuple(self._fetcher.assignment):
            tp = self._require_assigned(tp)
            self._fetcher.positions[tp] = self._fetcher.log(tp).view().end_offset

    def position(self, partition: TopicPartition) -> int:
        """The offset of the next record ``poll`` will return for this partition."""
        tp = self._require_assigned(partition)
        if tp not in self._fetcher.positions:
            self._fetcher.reset(tp)
        return self._fetcher.positions[tp]

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The log start offset of each partition."""
        return {tp: self.root.partition(tp.topic, tp.partition).view().start_offset for tp in map(check_tp, partitions)}

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The log end offset (the offset the next record will get) of each partition."""
        # One round: the partitions of a shared topic share one probe of its head (PROTOCOL.md 9.1), made after
        # this call began, so every end is as of the call at least.
        tps = [check_tp(tp) for tp in partitions]
        by_topic: dict[str, list[int]] = {}
        for tp in tps:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        for topic, parts in by_topic.items():
            self.root.resolve_unseen(topic, parts)  # one listing for a topic's partitions, not one each
        cache = self.root.index_cache
        previous, cache.round_started = cache.round_started, time.monotonic()
        try:
            if self.config["isolation_level"] == "read_committed":  # Kafka: the last stable offset
                return {
                    tp: self.root.partition(tp.topic, tp.partition).last_stable_offset(self._transactions.resolve)
                    for tp in tps
                }
            return {tp: self.root.partition(tp.topic, tp.partition).follow_tail().end_offset for tp in tps}
        finally:
            cache.round_started = previous

    def offsets_for_times(
        self, timestamps: dict[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """For each partition the earliest offset whose timestamp is >= the given ms, or None."""
        out: dict[TopicPartition, OffsetAndTimestamp | None] = {}
        for tp, ts in timestamps.items():
            tp = check_tp(tp)
            if not isinstance(ts, int) or ts < 0:
                raise InvalidConfigError(f"timestamp {ts!r} for {tp} must be a non-negative int (ms)")
            log = self.root.partition(tp.topic, tp.partition)
            offset = log.offset_for_timestamp(ts)
            if offset is None:
                out[tp] = None
                continue
            batches, _ = log.read(offset, max_records=1)
            stamp = int(batches[0].column(1).cast(pa.int64())[0].as_py()) if batches else None
            out[tp] = OffsetAndTimestamp(offset, stamp)
        return out

    def topics(self) -> set[str]:
        """Names of all topics in the root."""
        return set(self.root.catalog.names())

    def partitions_for_topic(self, topic: str) -> set[int]:
        """Partition numbers of ``topic``."""
        return set(range(self.root.topic(topic, refresh=True).partitions))

    # ------------------------------------------------------------------ fetching

    def _fetch(self, max_records: int) -> Fetched:
        """One fetch attempt of ``poll`` (tests replace it to watch the long poll)."""
        self._refresh_subscription()
        # A fetch is at most the quota's burst, and its records wait for the quotas before poll returns them,
        # as a Kafka broker delays its response: what a consumer receives never runs ahead of its quota (11.10).
        fetched = self._fetcher.fetch(max_records, self._quota.step_bytes())
        if fetched:
            self._quota.acquire(sum(b.nbytes for _, b in fetched), len({tp for tp, _ in fetched}))
        return fetched

    def _attempt(self, limit: int) -> Fetched:
        self._group.step()
        return self._fetch(limit)

    def _fetch_waiting(self, timeout_ms: int, max_records: int | None, default_limit: int | None = None) -> Fetched:
        self._check_open("poll")
        return self._fetcher.fetch_waiting(timeout_ms, max_records, self._attempt, default_limit)

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records from the assigned partitions, grouped by partition, up to ``max_records``."""
        fetched = self._fetch_waiting(timeout_ms, max_records)
        return to_records(fetched, self.config["key_deserializer"], self.config["value_deserializer"])

    def poll_arrow(self, timeout_ms: int = 0, max_records: int | None = None) -> pa.Table:
        """Like ``poll``, as one Arrow table with ``ARROW_SCHEMA`` and no per-record Python objects.

        Without ``max_records`` it is bounded by bytes, as Kafka's fetches are (``fetch_max_bytes``,
        50 MiB, and ``max_partition_fetch_bytes``, 1 MiB per partition), not by ``max_poll_records``:
        that count exists to bound the Python objects ``poll`` makes, which a table does not have.
        """
        fetched = self._fetch_waiting(timeout_ms, max_records, default_limit=ARROW_POLL_RECORDS)
        return to_arrow(self._fetcher.one_value_type(fetched), self._fetcher.columns)

    def read_to_end(self, timeout_ms: int = 30_000, max_records: int = 500_000) -> pa.Table:
        """Every record of the assigned partitions from their positions up to their end offsets, as one table.

        The end offsets are taken once, when the call starts (``end_offsets``: the last stable offsets
        under read_committed), so records appended meanwhile are left for later polls. The table has
        ``ARROW_SCHEMA`` and is sorted by topic, partition and offset. Raises ``KafkaTimeoutError`` if
        the ends are not reached within ``timeout_ms`` (records below them have stayed unreadable).
        """
        tps = sorted(self.assignment())
        schemas = {self._root_topic_schema(tp.topic) for tp in tps}
        if len(schemas) > 1:
            raise InvalidConfigError(
                f"read_to_end returns one table, but topics {sorted({tp.topic for tp in tps})} have different "
                "value types (typed topics carry their own schema): read them with separate consumers"
            )
        ends = self.end_offsets(tps)
        deadline = time.monotonic() + timeout_ms / 1000
        tables = []
        while any(self.position(tp) < ends[tp] for tp in tps):
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                behind = {
                    f"{tp.topic}-{tp.partition}": (self.position(tp), ends[tp])
                    for tp in tps
                    if self.position(tp) < ends[tp]
                }
                raise KafkaTimeoutError(
                    f"read_to_end: the end offsets were not reached in {timeout_ms} ms "
                    f"(partition: (position, end) = {behind})"
                )
            tables.append(self.poll_arrow(timeout_ms=min(left_ms, 1000), max_records=max_records))
        if not tables:
            return ARROW_SCHEMA.empty_table()
        # A schema evolved while reading: the older tables' values are read as the newest (11.8).
        return pa.concat_tables(tables, promote_options="permissive").sort_by(
            [("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")]
        )

    def _root_topic_schema(self, topic: str) -> str | None:
        """A topic's current value schema string (None: untyped), to tell topics of one value type."""
        history = self.root.topic(topic).schema_history
        return None if history is None else history.current.encoded

    def __iter__(self) -> Iterator[ConsumerRecord]:
        while not self._closed:
            for records in self.poll(timeout_ms=self.config["fetch_poll_max_ms"]).values():
                yield from records

    # ------------------------------------------------------------------ groups

    def commit(self, offsets: Mapping[TopicPartition, Any] | None = None) -> None:
        """Commit ``offsets`` ({tp: next offset to read}); by default the assigned partitions' positions.

        Raises ``CommitFailedError`` when this member no longer owns a partition
        (the group rebalanced; generation fencing), or, without a subscription,
        when the group has live members.
        """
        self._check_open("commit")
        self._group.commit(offsets)

    def commit_async(
        self,
        offsets: Mapping[TopicPartition, Any] | None = None,
        callback: Callable[[dict[TopicPartition, int], Exception | None], Any] | None = None,
    ) -> Future[None]:
        """Commit in the background; ``callback(offsets, exception_or_None)`` runs when it is done."""
        self._check_open("commit_async")
        return self._group.commit_async(offsets, callback)

    def committed(self, partition: TopicPartition) -> int | None:
        """The group's committed offset of ``partition`` (the next offset to read), or None."""
        return self._group.committed(partition)

    def metrics(self) -> dict[str, Any]:
        """Kafka's consumer fetch metrics by name (``records-consumed-rate``, ``records-lag-max``,
        ``fetch-throttle-time-avg``, ...) and the store's requests (``pyspark_logsource/client/metrics.py``,
        PROTOCOL.md 11.10)."""
        return {
            **self._fetcher.metrics.snapshot(),
            **store_metrics(self.root.store),
            "fetch-throttle-time-avg": self._quota.throttle_time_avg_ms(),
            "fetch-throttle-time-max": self._quota.throttle_time_max_ms(),
        }

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise InvalidConfigError(f"{what}() on a closed consumer")

    def close(self, autocommit: bool = True) -> None:
        """Leave the group (committing first if auto-commit is on) and release the store. Idempotent."""
        if not self._closed:
            try:
                self._group.leave(autocommit)
                self._group.close()
            finally:
                self._closed = True
                self.root.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
