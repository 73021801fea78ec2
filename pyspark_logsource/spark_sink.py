"""The Spark sink: ``df.writeStream.format("plog")`` exactly-once, and ``df.write.format("plog")``.

Executors append the rows they receive to the target partitions as
*transactional* batches (PROTOCOL.md 11.2): producer id = the sink's, and
transaction number = the micro-batch id (read from the task's local property
``streaming.sql.batchId``). Nothing they write is visible to read_committed
readers. The driver's ``commit(messages, batchId)`` then creates the single
decision object for ``(sink producer id, batchId)`` listing exactly the offset
ranges the successful tasks reported:

* the whole micro-batch becomes visible at once, in every partition and topic;
* a replayed batch (Spark re-runs ``batchId`` after a crash) finds the decision
  already there: its new batches are not listed, so they are never visible;
* batches of failed task attempts are not listed either.

A batch write (``df.write``) is one transaction with a fresh transaction number.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from coordinator.transactions import Decision, TransactionCoordinator, allocate_producer_id
from segment_format.errors import InvalidConfigError, InvalidRecordError, PlogError
from segment_format.log import COMMITTED
from segment_format.records import normalize_payload, now_ms
from segment_format.root import LogRoot
from segment_format.segment import ATTR_TRANSACTIONAL, BatchMeta, ipc_options

from .partitioner import partitions_for_keys

SINK_OPTIONS = {"url", "path", "topic", "checkpointlocation", "transactionalid", "compression", "batchsize"}
#: Rows written per stored batch (and appended object) by one task.
DEFAULT_BATCH_ROWS = 65536
BATCH_ID_PROPERTY = "streaming.sql.batchId"


def _storage_options(options: dict[str, str]) -> dict[str, Any]:
    return {k[len("storage."):]: v for k, v in options.items() if k.lower().startswith("storage.")}


def _check_schema(schema: StructType, has_topic_option: bool) -> None:
    """Validate input columns like Spark's Kafka sink, naming the culprit."""
    fields = {f.name.lower(): f for f in schema.fields}
    binary_or_string = (BinaryType, StringType)
    if "value" not in fields:
        raise InvalidRecordError("the plog sink needs a 'value' column (binary or string)")
    checks: dict[str, tuple[type, ...]] = {
        "value": binary_or_string,
        "key": binary_or_string,
        "topic": (StringType,),
        "partition": (IntegerType, LongType, ShortType),
        "timestamp": (TimestampType, TimestampNTZType, LongType),
        "headers": (ArrayType,),
    }
    for name, types in checks.items():
        if name in fields and not isinstance(fields[name].dataType, types):
            raise InvalidRecordError(
                f"column {name!r} has type {fields[name].dataType.simpleString()}; "
                f"expected {' or '.join(t.__name__.removesuffix('Type').lower() for t in types)}"
            )
    unknown = set(fields) - set(checks)
    if unknown:
        raise InvalidRecordError(f"unexpected column(s) {sorted(unknown)} for the plog sink; allowed: {sorted(checks)}")
    if "topic" not in fields and not has_topic_option:
        raise InvalidConfigError("the plog sink needs the 'topic' option or a 'topic' column")


@dataclass
class PlogCommitMessage(WriterCommitMessage):
    """What one task wrote: offset ranges per topic and partition, and its record count."""

    batches: dict[str, dict[str, list[list[int]]]] = field(default_factory=dict)
    records: int = 0


class _SinkBase:
    """Shared by the streaming and the batch writer: options, routing and transactional appends."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        lowered = {k.lower(): v for k, v in options.items()}
        unknown = {k for k in lowered if k not in SINK_OPTIONS and not k.startswith("storage.")}
        if unknown:
            raise InvalidConfigError(f"unknown plog sink option(s) {sorted(unknown)}")
        url = lowered.get("url") or lowered.get("path")
        if not url:
            raise InvalidConfigError("the plog sink needs the 'url' option (or .save(url) / .start(url))")
        self.url = url
        self.storage_options = _storage_options(options)
        self.topic = lowered.get("topic")
        self.compression = lowered.get("compression")
        if self.compression is not None:
            ipc_options(self.compression)
        try:
            self.batch_rows = int(lowered.get("batchsize", DEFAULT_BATCH_ROWS))
        except ValueError:
            raise InvalidConfigError(f"option batchSize={lowered['batchsize']!r} is not an integer") from None
        _check_schema(schema, self.topic is not None)
        root = LogRoot(url, self.storage_options)
        if self.topic is not None:
            root.topic(self.topic)  # unknown topic: fail at start, naming it
        self.coordinator_store_url = url

    def _root(self) -> LogRoot:
        root = getattr(self, "_cached_root", None)
        if root is None:
            root = self._cached_root = LogRoot(self.url, self.storage_options)
        return root

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_cached_root", None)
        return state

    def _write(self, iterator: Iterator[pa.RecordBatch], producer_id: int, txn: int) -> PlogCommitMessage:
        root = self._root()
        ranges: dict[str, dict[str, list[list[int]]]] = {}
        records = 0
        sticky: dict[str, int] = {}
        for batch in iterator:
            if batch.num_rows == 0:
                continue
            table = pa.Table.from_batches([batch])
            table = table.rename_columns([c.lower() for c in table.column_names])
            if "timestamp" in table.column_names and pa.types.is_timestamp(table.column("timestamp").type):
                table = table.set_column(table.column_names.index("timestamp"), "timestamp",
                                         pc.cast(table.column("timestamp"), pa.timestamp("ms", tz="UTC"), safe=False))
            topics = (table.column("topic").to_numpy(zero_copy_only=False) if "topic" in table.column_names
                      else np.full(table.num_rows, self.topic, dtype=object))
            if self.topic is not None and "topic" in table.column_names:
                topics = np.where(pd_isnull(topics), self.topic, topics)
            for topic in sorted({str(t) for t in topics if t is not None}):
                rows = table.filter(pa.array(topics == topic)) if len(set(topics)) > 1 else table
                records += self._write_topic(root, topic, rows, producer_id, txn, ranges, sticky)
            if any(t is None for t in topics):
                raise InvalidRecordError("a row has a null 'topic' and no 'topic' option is set")
        return PlogCommitMessage(ranges, records)

    def _write_topic(self, root: LogRoot, topic: str, table: pa.Table, producer_id: int, txn: int,
                     ranges: dict[str, dict[str, list[list[int]]]], sticky: dict[str, int]) -> int:
        meta = root.topic(topic)
        payload = normalize_payload(table)
        if "partition" in table.column_names and table.column("partition").null_count < table.num_rows:
            partitions = table.column("partition").to_numpy(zero_copy_only=False)
            partitions = np.where(pd_isnull(partitions), -1, partitions).astype(np.int64)
        else:
            keys = payload.column("key")
            partitions = (partitions_for_keys(keys, meta.partitions) if keys.null_count < len(keys)
                          else np.full(len(keys), -1, np.int32)).astype(np.int64)
        bad = partitions >= meta.partitions
        if bad.any():
            meta.check_partition(int(partitions[np.flatnonzero(bad)[0]]))
        nulls = partitions < 0
        if nulls.any():  # null keys: sticky per task, as Kafka's partitioner is per batch
            if topic not in sticky:
                sticky[topic] = random.randrange(meta.partitions)
            partitions[nulls] = sticky[topic]
        combined = payload.combine_chunks()
        for part in np.unique(partitions):
            rows = combined.filter(pa.array(partitions == part)).to_batches()
            log = root.partition(topic, int(part), meta)
            for batch in rows:
                for start in range(0, batch.num_rows, self.batch_rows):
                    chunk = batch.slice(start, self.batch_rows)
                    result = log.append(
                        [(chunk, BatchMeta(producer_id, 0, -1, ATTR_TRANSACTIONAL, transaction=txn))],
                        compression=self.compression,
                        extra={"transaction.timeout.ms": 7 * 24 * 3600 * 1000},
                    )
                    ranges.setdefault(topic, {}).setdefault(str(int(part)), []).append(
                        [result.base_offsets[0], result.next_offset - 1]
                    )
        return payload.num_rows


def pd_isnull(values: np.ndarray) -> np.ndarray:
    """Elementwise None/NaN test for an object or numeric numpy array."""
    if values.dtype == object:
        return np.array([v is None for v in values], dtype=bool)
    if np.issubdtype(values.dtype, np.floating):
        return np.isnan(values)
    return np.zeros(len(values), dtype=bool)


def _merge(messages: list[Any]) -> dict[str, dict[str, list[list[int]]]]:
    merged: dict[str, dict[str, list[list[int]]]] = {}
    for message in messages:
        if message is None:
            continue
        for topic, parts in message.batches.items():
            for part, spans in parts.items():
                merged.setdefault(topic, {}).setdefault(part, []).extend(spans)
    for parts in merged.values():
        for spans in parts.values():
            spans.sort()
    return merged


def sink_id_for(options: dict[str, str]) -> str:
    """The sink's transactional id: ``transactionalId``, else derived from ``checkpointLocation``."""
    lowered = {k.lower(): v for k, v in options.items()}
    if lowered.get("transactionalid"):
        return lowered["transactionalid"]
    checkpoint = lowered.get("checkpointlocation")
    if checkpoint:
        normalized = checkpoint if "://" in checkpoint else os.path.abspath(checkpoint)
        return "spark-sink:" + hashlib.sha256(normalized.rstrip("/").encode()).hexdigest()
    raise InvalidConfigError(
        "the plog streaming sink needs a 'checkpointLocation' or 'transactionalId' option to be exactly-once; "
        "it does not fall back to at-least-once"
    )


class PlogStreamWriter(_SinkBase, DataSourceStreamArrowWriter):
    """Exactly-once micro-batch writer (see the module docstring)."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        super().__init__(options, schema)
        self.sink_id = sink_id_for(options)
        self.producer_id = TransactionCoordinator(self._root().store).producer_id_for(self.sink_id)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PlogCommitMessage:
        """Executor side: append this task's rows as transactional batches of transaction ``batchId``."""
        from pyspark import TaskContext

        context = TaskContext.get()
        batch_id = context.getLocalProperty(BATCH_ID_PROPERTY) if context is not None else None
        if batch_id is None:
            raise PlogError(f"the plog sink could not learn the micro-batch id (task property {BATCH_ID_PROPERTY})")
        return self._write(iterator, self.producer_id, int(batch_id))

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - Spark's name
        """Driver side: create the decision for ``batchId``; a replay finds it there and changes nothing."""
        coordinator = TransactionCoordinator(self._root().store)
        decision = Decision(COMMITTED, self.producer_id, batchId, batches=_merge(messages), created_ms=now_ms())
        stands = coordinator.decide(decision)
        if stands.state != COMMITTED:
            raise PlogError(
                f"micro-batch {batchId} of sink {self.sink_id!r} was aborted (transaction timeout) before it "
                "could commit; its records are not visible"
            )

    def abort(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - Spark's name
        """Leave the transaction undecided: Spark re-runs ``batchId``, and that run's commit lists only its own data."""


class PlogBatchWriter(_SinkBase, DataSourceArrowWriter):
    """``df.write.format("plog")``: one Spark job is one transaction."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        super().__init__(options, schema)
        store = self._root().store
        self.producer_id = allocate_producer_id(store, owner="spark-batch-write")
        self.txn = 0

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PlogCommitMessage:
        """Executor side: append this task's rows as transactional batches."""
        return self._write(iterator, self.producer_id, self.txn)

    def commit(self, messages: list[Any]) -> None:
        """Make the whole job visible at once."""
        coordinator = TransactionCoordinator(self._root().store)
        coordinator.decide(Decision(COMMITTED, self.producer_id, self.txn, batches=_merge(messages),
                                    created_ms=now_ms()))

    def abort(self, messages: list[Any]) -> None:
        """A failed job: abort, so nothing it wrote is ever visible."""
        TransactionCoordinator(self._root().store).abort_if_undecided(self.producer_id, self.txn)
