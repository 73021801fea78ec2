"""The consumer: kafka-python's ``KafkaConsumer`` API on a plog root.

Each assigned partition has a position (the next offset to read). ``poll``
reads from the partitions in turn, round-robin, up to ``max_records``;
``poll_arrow`` returns the same records as one Arrow table without creating a
Python object per record. With a timeout, an empty poll waits for new data
with a growing back-off (1 ms doubling to ``fetch_poll_max_ms``), checking
only the object that would come next in each partition.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator
from itertools import repeat
from typing import Any

import numpy as np
import pyarrow as pa

from segment_format.errors import InvalidConfigError, OffsetOutOfRangeError, UnknownTopicOrPartitionError
from segment_format.records import RECORD_SCHEMA
from segment_format.root import LogRoot

from .types import ConsumerRecord, OffsetAndTimestamp, TopicPartition

CONSUMER_DEFAULTS: dict[str, Any] = {
    "auto_offset_reset": "latest",
    "max_poll_records": 500,
    "fetch_max_bytes": 50 * 1024 * 1024,
    "fetch_poll_max_ms": 100,
    "isolation_level": "read_committed",
    "enable_auto_commit": False,
    "client_id": "",
    "key_deserializer": None,
    "value_deserializer": None,
    "metadata_max_age_ms": 5000,
}

_tuple_new = tuple.__new__

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
    for key in ("max_poll_records", "fetch_max_bytes", "fetch_poll_max_ms", "metadata_max_age_ms"):
        if not isinstance(merged[key], int) or merged[key] < 1:
            raise InvalidConfigError(f"{key}={merged[key]!r} must be a positive int")
    return merged


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
        if group_id is not None:
            raise InvalidConfigError(
                "group_id: consumer groups are not available yet; use assign() or subscribe() without a group"
            )
        self.group_id = group_id
        self.root = LogRoot(url, storage_options)
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

    def subscribe(self, topics: Iterable[str] = (), pattern: str | None = None) -> None:
        """Read all partitions of ``topics`` (or of topics matching ``pattern``, now and later)."""
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
        self._last_metadata = 0.0
        self._refresh_subscription()

    def subscription(self) -> set[str]:
        """The subscribed topic names."""
        return set(self._subscription)

    def unsubscribe(self) -> None:
        """Drop every subscription and assignment."""
        self._subscription = set()
        self._pattern = None
        self._manual = False
        self._set_assignment([])

    def _set_assignment(self, tps: list[TopicPartition]) -> None:
        self._assignment = sorted(set(tps))
        self._positions = {tp: off for tp, off in self._positions.items() if tp in set(tps)}

    def _refresh_subscription(self) -> None:
        if self._manual or not (self._subscription or self._pattern):
            return
        if time.monotonic() - self._last_metadata < self.config["metadata_max_age_ms"] / 1000:
            return
        self._last_metadata = time.monotonic()
        names = set(self._subscription)
        if self._pattern is not None:
            names |= {n for n in self.root.catalog.names() if self._pattern.fullmatch(n)}
        tps = []
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
        return {tp: self.root.partition(tp.topic, tp.partition).view().start_offset
                for tp in map(_check_tp, partitions)}

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The log end offset (the offset the next record will get) of each partition."""
        return {tp: self.root.partition(tp.topic, tp.partition).view().end_offset
                for tp in map(_check_tp, partitions)}

    def offsets_for_times(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, OffsetAndTimestamp | None]:
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
                batches, next_offset = log.read(self._positions[tp], max_records=remaining, max_bytes=budget)
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
                map(_tuple_new, repeat(ConsumerRecord, n),
                    zip(repeat(topic, n), repeat(partition, n), offsets, stamps, repeat(0, n), keys, values, headers,
                        strict=True))
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

    def __iter__(self) -> Iterator[ConsumerRecord]:
        while not self._closed:
            for records in self.poll(timeout_ms=self.config["fetch_poll_max_ms"]).values():
                yield from records

    def close(self) -> None:
        """Release the store. Idempotent."""
        if not self._closed:
            self._closed = True
            self.root.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
