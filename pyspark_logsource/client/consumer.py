"""The consumer: kafka-python's ``KafkaConsumer`` API on a plog root.

Each assigned partition has a position (the next offset to read). ``poll``
reads from the partitions in turn, round-robin, up to ``max_records``;
``poll_arrow`` returns the same records as one Arrow table without creating a
Python object per record. With a timeout, an empty poll waits for new data
with a growing back-off (1 ms doubling to ``fetch_poll_max_ms``), checking
only the object that would come next in each partition.

With a ``group_id``, ``subscribe`` joins a consumer group (PROTOCOL.md 11.4,
``coordinator/groups.py``): partitions are divided among the group's members
by ``partition_assignment_strategy``, a background thread heartbeats, and
``poll`` runs rebalances (``on_partitions_revoked`` / ``on_partitions_assigned``
of the listener given to ``subscribe``). Offsets are committed with
``commit``/``commit_async`` or ``enable_auto_commit``, fenced by generation.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import repeat
from typing import Any

import numpy as np
import pyarrow as pa

from coordinator.assignors import STRATEGIES
from coordinator.groups import Generation, GroupClient, GroupMember, make_member_id, validate_group_id
from coordinator.transactions import TransactionCoordinator
from pyspark_logsource.client.types import ConsumerRecord, OffsetAndTimestamp, TopicPartition
from segment_format.errors import (
    CommitFailedError,
    InvalidConfigError,
    KafkaTimeoutError,
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
)
from segment_format.records import RECORD_SCHEMA
from segment_format.root import LogRoot

CONSUMER_DEFAULTS: dict[str, Any] = {
    "auto_offset_reset": "latest",
    "max_poll_records": 500,
    "fetch_max_bytes": 50 * 1024 * 1024,
    "fetch_poll_max_ms": 100,
    "isolation_level": "read_committed",
    "enable_auto_commit": True,
    "auto_commit_interval_ms": 5000,
    "session_timeout_ms": 10000,
    "heartbeat_interval_ms": 3000,
    "max_poll_interval_ms": 300000,
    "partition_assignment_strategy": ("range", "cooperative-sticky"),
    "client_id": "",
    "key_deserializer": None,
    "value_deserializer": None,
    "metadata_max_age_ms": 5000,
}

_tuple_new = tuple.__new__
log = logging.getLogger(__name__)

#: Columns of ``poll_arrow``'s table, in order.
ARROW_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        *RECORD_SCHEMA,
    ]
)


def _check_consumer_config(config: dict[str, Any]) -> dict[str, Any]:
    unknown = set(config) - set(CONSUMER_DEFAULTS)
    if unknown:
        raise InvalidConfigError(f"unknown consumer config {sorted(unknown)}; known: {sorted(CONSUMER_DEFAULTS)}")
    merged = {**CONSUMER_DEFAULTS, **config}
    if merged["auto_offset_reset"] not in ("earliest", "latest", "none"):
        raise InvalidConfigError(f"auto_offset_reset={merged['auto_offset_reset']!r} must be earliest, latest or none")
    if merged["isolation_level"] not in ("read_committed", "read_uncommitted"):
        raise InvalidConfigError(
            f"isolation_level={merged['isolation_level']!r} must be read_committed or read_uncommitted"
        )
    for key in (
        "max_poll_records",
        "fetch_max_bytes",
        "fetch_poll_max_ms",
        "metadata_max_age_ms",
        "auto_commit_interval_ms",
        "session_timeout_ms",
        "heartbeat_interval_ms",
        "max_poll_interval_ms",
    ):
        if not isinstance(merged[key], int) or isinstance(merged[key], bool) or merged[key] < 1:
            raise InvalidConfigError(f"{key}={merged[key]!r} must be a positive int")
    if merged["heartbeat_interval_ms"] >= merged["session_timeout_ms"]:
        raise InvalidConfigError(
            f"heartbeat_interval_ms={merged['heartbeat_interval_ms']} must be lower "
            f"than session_timeout_ms={merged['session_timeout_ms']}"
        )
    strategies = merged["partition_assignment_strategy"]
    if isinstance(strategies, str):
        strategies = (strategies,)
    if not isinstance(strategies, (list, tuple)) or not strategies or any(s not in STRATEGIES for s in strategies):
        raise InvalidConfigError(
            f"partition_assignment_strategy={merged['partition_assignment_strategy']!r} "
            f"must be one or a list of {', '.join(STRATEGIES)}"
        )
    merged["partition_assignment_strategy"] = tuple(strategies)
    if not isinstance(merged["enable_auto_commit"], bool):
        raise InvalidConfigError(f"enable_auto_commit={merged['enable_auto_commit']!r} must be a bool")
    return merged


def _commit_offset(tp: TopicPartition, value: object) -> int:
    """An offset to commit: an int, or anything with an ``offset`` (kafka-python's OffsetAndMetadata)."""
    offset = getattr(value, "offset", value)
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise InvalidConfigError(f"commit offset {value!r} for {tp} must be a non-negative int")
    return offset


def _check_tp(tp: object) -> TopicPartition:
    if not (isinstance(tp, tuple) and len(tp) == 2 and isinstance(tp[0], str) and isinstance(tp[1], int)):
        raise InvalidConfigError(f"expected a TopicPartition(topic, partition), got {tp!r}")
    return TopicPartition(tp[0], tp[1])


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
        self.root = LogRoot(url, storage_options)
        self._transactions = TransactionCoordinator(self.root.store)
        self._member: GroupMember | None = None
        self._group_client: GroupClient | None = None
        self._listener: Any = None
        self._hooks = _RebalanceHooks(self)
        self._standalone_id = make_member_id(self.config["client_id"])
        self._last_auto_commit = time.monotonic()
        self._executor: ThreadPoolExecutor | None = None
        self._assignment: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int] = {}
        self._subscription: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self._manual = False
        self._next_partition = 0
        self._last_metadata = 0.0
        self._closed = False

    # ------------------------------------------------------------------ assignment

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions (no group); validates each."""
        tps = [_check_tp(tp) for tp in partitions]
        for tp in tps:
            self.root.partition(tp.topic, tp.partition)
        if self._subscription or self._pattern:
            raise InvalidConfigError("assign() after subscribe(): call unsubscribe() first")
        self._manual = True
        self._set_assignment(tps)

    def assignment(self) -> set[TopicPartition]:
        """The partitions currently assigned."""
        self._refresh_subscription()
        return set(self._assignment)

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
        for name in names:
            self.root.topic(name)
        if pattern is not None:
            try:
                self._pattern = re.compile(pattern)
            except re.error as exc:
                raise InvalidConfigError(f"subscribe pattern {pattern!r} is not a valid regex: {exc}") from None
        self._subscription = names
        self._listener = listener
        self._last_metadata = 0.0
        self._refresh_subscription()
        if self.group_id is not None and self._member is None:
            self._member = GroupMember(
                self.root.store,
                self.group_id,
                client_id=self.config["client_id"],
                strategies=self.config["partition_assignment_strategy"],
                session_timeout_ms=self.config["session_timeout_ms"],
                heartbeat_interval_ms=self.config["heartbeat_interval_ms"],
                max_poll_interval_ms=self.config["max_poll_interval_ms"],
                partitions_for=self._partition_counts,
                metadata_max_age_ms=self.config["metadata_max_age_ms"],
            )
            self._member.start(self._subscribed_names())

    def subscription(self) -> set[str]:
        """The subscribed topic names."""
        return set(self._subscription)

    def unsubscribe(self) -> None:
        """Drop every subscription and assignment (and leave the group)."""
        self._leave_group(autocommit=True)
        self._subscription = set()
        self._pattern = None
        self._manual = False
        self._set_assignment([])

    def _set_assignment(self, tps: list[TopicPartition]) -> None:
        self._assignment = sorted(set(tps))
        self._positions = {tp: off for tp, off in self._positions.items() if tp in set(tps)}

    def _subscribed_names(self) -> set[str]:
        names = set(self._subscription)
        if self._pattern is not None:
            names |= {n for n in self.root.catalog.names() if self._pattern.fullmatch(n)}
        return names

    def _refresh_subscription(self) -> None:
        if self._manual or not (self._subscription or self._pattern):
            return
        if time.monotonic() - self._last_metadata < self.config["metadata_max_age_ms"] / 1000:
            return
        self._last_metadata = time.monotonic()
        names = self._subscribed_names()
        if self.group_id is not None:  # the group assigns the partitions; tell it what we subscribe to
            if self._member is not None:
                self._member.set_topics(names)
            return
        tps: list[TopicPartition] = []
        for name in sorted(names):
            try:
                meta = self.root.topic(name, refresh=True)
            except UnknownTopicOrPartitionError:
                continue
            tps.extend(TopicPartition(name, p) for p in range(meta.partitions))
        self._set_assignment(tps)

    # ------------------------------------------------------------------ positions

    def _log(self, tp: TopicPartition):  # noqa: ANN202 - PartitionLog, kept internal
        return self.root.partition(tp.topic, tp.partition)

    def _require_assigned(self, tp: TopicPartition) -> TopicPartition:
        tp = _check_tp(tp)
        if tp not in self._assignment:
            self._refresh_subscription()
            if tp not in self._assignment:
                raise InvalidConfigError(f"partition {tp} is not assigned to this consumer")
        return tp

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Set the next offset to read; checked against the log when it is read."""
        tp = self._require_assigned(partition)
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise OffsetOutOfRangeError(f"seek offset {offset!r} for {tp} must be a non-negative int")
        # A jump is checked against the current log, not a view cached before a retention or
        # delete_records moved its start: list the partition again (as seek_to_beginning does).
        self._log(tp).view()
        self._positions[tp] = offset

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Move to the log start offset of the partitions (all assigned if none given)."""
        for tp in partitions or tuple(self._assignment):
            tp = self._require_assigned(tp)
            self._positions[tp] = self._log(tp).view().start_offset

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Move to the log end offset of the partitions (all assigned if none given)."""
        for tp in partitions or tuple(self._assignment):
            tp = self._require_assigned(tp)
            self._positions[tp] = self._log(tp).view().end_offset

    def position(self, partition: TopicPartition) -> int:
        """The offset of the next record ``poll`` will return for this partition."""
        tp = self._require_assigned(partition)
        if tp not in self._positions:
            self._reset(tp)
        return self._positions[tp]

    def _reset(self, tp: TopicPartition) -> None:
        policy = self.config["auto_offset_reset"]
        if policy == "none":
            raise OffsetOutOfRangeError(f"no position for {tp} and auto_offset_reset is 'none'")
        view = self._log(tp).view()
        self._positions[tp] = view.start_offset if policy == "earliest" else view.end_offset

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The log start offset of each partition."""
        return {
            tp: self.root.partition(tp.topic, tp.partition).view().start_offset for tp in map(_check_tp, partitions)
        }

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The log end offset (the offset the next record will get) of each partition."""
        if self.config["isolation_level"] == "read_committed":  # Kafka: the last stable offset
            return {
                tp: self.root.partition(tp.topic, tp.partition).last_stable_offset(self._transactions.resolve)
                for tp in map(_check_tp, partitions)
            }
        return {tp: self.root.partition(tp.topic, tp.partition).view().end_offset for tp in map(_check_tp, partitions)}

    def offsets_for_times(
        self, timestamps: dict[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """For each partition the earliest offset whose timestamp is >= the given ms, or None."""
        out: dict[TopicPartition, OffsetAndTimestamp | None] = {}
        for tp, ts in timestamps.items():
            tp = _check_tp(tp)
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

    def _fetch(self, max_records: int) -> list[tuple[TopicPartition, pa.RecordBatch]]:
        self._refresh_subscription()
        out: list[tuple[TopicPartition, pa.RecordBatch]] = []
        if not self._assignment:
            return out
        remaining = max_records
        budget = self.config["fetch_max_bytes"]
        n = len(self._assignment)
        # Positions move only once the records are handed out: if a later partition raises
        # (auto_offset_reset='none'), the records fetched before it must not be skipped.
        advanced: dict[TopicPartition, int] = {}
        for i in range(n):
            if remaining <= 0:
                break
            tp = self._assignment[(self._next_partition + i) % n]
            if tp not in self._positions:
                self._reset(tp)
            log = self._log(tp)
            try:
                batches, next_offset = log.read(
                    self._positions[tp],
                    max_records=remaining,
                    max_bytes=budget,
                    isolation=self.config["isolation_level"],
                    resolver=self._transactions.resolve,
                )
            except OffsetOutOfRangeError:
                if self.config["auto_offset_reset"] == "none":
                    raise
                self._reset_out_of_range(tp)
                continue
            for batch in batches:
                out.append((tp, batch))
                remaining -= batch.num_rows
            advanced[tp] = next_offset
        self._positions.update(advanced)
        self._next_partition = (self._next_partition + 1) % n
        return out

    def _reset_out_of_range(self, tp: TopicPartition) -> None:
        view = self._log(tp).view()
        position = self._positions.get(tp, 0)
        if position < view.start_offset or self.config["auto_offset_reset"] == "earliest":
            self._positions[tp] = view.start_offset
        else:
            self._positions[tp] = view.end_offset

    def _fetch_waiting(self, timeout_ms: int, max_records: int | None) -> list[tuple[TopicPartition, pa.RecordBatch]]:
        if self._closed:
            raise InvalidConfigError("poll() on a closed consumer")
        if not isinstance(timeout_ms, (int, float)) or timeout_ms < 0:
            raise InvalidConfigError(f"timeout_ms={timeout_ms!r} must be >= 0")
        limit = self.config["max_poll_records"] if max_records is None else max_records
        if not isinstance(limit, int) or limit < 1:
            raise InvalidConfigError(f"max_records={max_records!r} must be a positive int")
        deadline = time.monotonic() + timeout_ms / 1000
        backoff = 0.001
        while True:
            self._group_step()
            fetched = self._fetch(limit)
            remaining = deadline - time.monotonic()
            if fetched or remaining <= 0:
                return fetched
            time.sleep(min(backoff, remaining))
            backoff = min(backoff * 2, self.config["fetch_poll_max_ms"] / 1000)

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records from the assigned partitions, grouped by partition, up to ``max_records``."""
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        key_de = self.config["key_deserializer"]
        value_de = self.config["value_deserializer"]
        for tp, batch in self._fetch_waiting(timeout_ms, max_records):
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
            if key_de is not None:
                keys = [None if k is None else key_de(k) for k in keys]
            if value_de is not None:
                values = [None if v is None else value_de(v) for v in values]
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

    def poll_arrow(self, timeout_ms: int = 0, max_records: int | None = None) -> pa.Table:
        """Like ``poll``, as one Arrow table with ``ARROW_SCHEMA`` and no per-record Python objects."""
        fetched = self._fetch_waiting(timeout_ms, max_records)
        if not fetched:
            return ARROW_SCHEMA.empty_table()
        batches = []
        for tp, batch in fetched:
            n = batch.num_rows
            topic = pa.repeat(pa.scalar(tp.topic, pa.string()), n)
            partition = pa.array(np.full(n, tp.partition, np.int32))
            batches.append(pa.RecordBatch.from_arrays([topic, partition, *batch.columns], schema=ARROW_SCHEMA))
        return pa.Table.from_batches(batches, schema=ARROW_SCHEMA)

    def read_to_end(self, timeout_ms: int = 30_000, max_records: int = 500_000) -> pa.Table:
        """Every record of the assigned partitions from their positions up to their end offsets, as one table.

        The end offsets are taken once, when the call starts (``end_offsets``: the last stable offsets
        under read_committed), so records appended meanwhile are left for later polls. The table has
        ``ARROW_SCHEMA`` and is sorted by topic, partition and offset. Raises ``KafkaTimeoutError`` if
        the ends are not reached within ``timeout_ms`` (records below them have stayed unreadable).
        """
        tps = sorted(self.assignment())
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
        return pa.concat_tables(tables).sort_by(
            [("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")]
        )

    def __iter__(self) -> Iterator[ConsumerRecord]:
        while not self._closed:
            for records in self.poll(timeout_ms=self.config["fetch_poll_max_ms"]).values():
                yield from records

    # ------------------------------------------------------------------ groups

    def _partition_counts(self, topics: Iterable[str]) -> dict[str, int]:
        counts = {}
        for name in topics:
            try:
                counts[name] = self.root.catalog.get(name).partitions
            except UnknownTopicOrPartitionError:
                continue
        return counts

    def _client(self) -> GroupClient:
        if self.group_id is None:
            raise InvalidConfigError("offsets can only be committed or read with a group_id")
        if self._member is not None:
            return self._member.client
        if self._group_client is None:
            self._group_client = GroupClient(self.root.store, self.group_id)
        return self._group_client

    def _group_step(self) -> None:
        """Run from ``poll``: auto-commit when due, then the group's rebalance steps (callbacks run here)."""
        if self.group_id is None:
            return
        if (
            self.config["enable_auto_commit"]
            and (time.monotonic() - self._last_auto_commit) * 1000 >= self.config["auto_commit_interval_ms"]
        ):
            self._auto_commit()
        if self._member is not None:
            self._member.on_poll(self._hooks)

    def _auto_commit(self) -> None:
        self._last_auto_commit = time.monotonic()
        try:
            self.commit()
        except CommitFailedError as exc:
            log.warning("auto-commit of group %s failed: %s", self.group_id, exc)

    def _offsets_to_commit(self, offsets: Mapping[TopicPartition, Any] | None) -> dict[tuple[str, int], int]:
        if offsets is None:
            return {(tp.topic, tp.partition): self._positions[tp] for tp in self._assignment if tp in self._positions}
        if not isinstance(offsets, Mapping):
            raise InvalidConfigError(f"commit offsets must be a dict of TopicPartition -> offset, got {offsets!r}")
        out = {}
        for tp, value in offsets.items():
            tp = _check_tp(tp)
            out[(tp.topic, tp.partition)] = _commit_offset(tp, value)
        return out

    def _commit_now(self, offsets: dict[tuple[str, int], int]) -> None:
        if not offsets:
            return
        if self._member is not None:
            self._member.commit(offsets)
        else:
            self._client().standalone_commit(offsets, self._standalone_id)

    def commit(self, offsets: Mapping[TopicPartition, Any] | None = None) -> None:
        """Commit ``offsets`` ({tp: next offset to read}); by default the assigned partitions' positions.

        Raises ``CommitFailedError`` when this member no longer owns a partition
        (the group rebalanced; generation fencing), or, without a subscription,
        when the group has live members.
        """
        self._check_open("commit")
        self._client()
        self._commit_now(self._offsets_to_commit(offsets))

    def commit_async(
        self,
        offsets: Mapping[TopicPartition, Any] | None = None,
        callback: Callable[[dict[TopicPartition, int], Exception | None], Any] | None = None,
    ) -> Future[None]:
        """Commit in the background; ``callback(offsets, exception_or_None)`` runs when it is done."""
        self._check_open("commit_async")
        self._client()
        chosen = self._offsets_to_commit(offsets)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="plog-commit")

        def run() -> None:
            error: Exception | None = None
            try:
                self._commit_now(chosen)
            except Exception as exc:  # noqa: BLE001 - handed to the callback and the future
                error = exc
            if callback is not None:
                callback({TopicPartition(t, p): o for (t, p), o in chosen.items()}, error)
            if error is not None:
                raise error

        return self._executor.submit(run)

    def committed(self, partition: TopicPartition) -> int | None:
        """The group's committed offset of ``partition`` (the next offset to read), or None."""
        tp = _check_tp(partition)
        return self._client().committed().get((tp.topic, tp.partition))

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise InvalidConfigError(f"{what}() on a closed consumer")

    def _leave_group(self, autocommit: bool) -> None:
        member, self._member = self._member, None
        if member is None:
            return
        try:
            if autocommit and self.config["enable_auto_commit"] and member.adopted is not None:
                try:
                    member.commit(
                        {
                            (tp.topic, tp.partition): self._positions[tp]
                            for tp in self._assignment
                            if tp in self._positions
                        }
                    )
                except CommitFailedError as exc:
                    log.warning("commit of group %s on leaving failed: %s", self.group_id, exc)
            revoked = sorted(self._assignment)
            self._assignment = []
            if revoked and self._listener is not None:
                self._listener.on_partitions_revoked(revoked)
        finally:
            member.close()

    def close(self, autocommit: bool = True) -> None:
        """Leave the group (committing first if auto-commit is on) and release the store. Idempotent."""
        if not self._closed:
            try:
                self._leave_group(autocommit)
                if self._executor is not None:
                    self._executor.shutdown(wait=True)
            finally:
                self._closed = True
                self.root.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _RebalanceHooks:
    """The consumer's side of a rebalance (``coordinator.groups.RebalanceHooks``), run from ``poll``."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer

    def commit_before_revoke(self) -> None:
        if self.consumer.config["enable_auto_commit"]:
            self.consumer._auto_commit()

    def revoke(self, partitions: list[tuple[str, int]]) -> None:
        c = self.consumer
        gone = {TopicPartition(*tp) for tp in partitions}
        c._assignment = [tp for tp in c._assignment if tp not in gone]
        if c._listener is not None:
            c._listener.on_partitions_revoked(sorted(gone))

    def assign(
        self,
        generation: Generation,
        assigned: list[tuple[str, int]],
        added: list[tuple[str, int]],
        retained: list[tuple[str, int]],
    ) -> None:
        c = self.consumer
        tps = [TopicPartition(*tp) for tp in assigned]
        keep = {TopicPartition(*tp) for tp in retained}
        positions = {tp: c._positions[tp] for tp in tps if tp in keep and tp in c._positions}
        if len(positions) < len(tps):
            committed = c._client().committed(generation)
            for tp in tps:
                if tp not in positions and (tp.topic, tp.partition) in committed:
                    positions[tp] = committed[(tp.topic, tp.partition)]
        c._positions = positions  # the rest start at auto_offset_reset when first read
        c._assignment = sorted(tps)
        c._next_partition = 0
        if c._listener is not None:
            cooperative = c._member is not None and c._member.cooperative
            c._listener.on_partitions_assigned(
                sorted(TopicPartition(*tp) for tp in (added if cooperative else assigned))
            )
