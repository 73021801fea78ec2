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
  already there: its tasks see it and write nothing, and a replayed ``commit``
  changes nothing, so no record is ever visible twice;
* batches of failed task attempts are not listed either.

The sink's transactional id is derived from the ``checkpointLocation`` option
(or an explicit ``transactionalId``) *and* the query id Spark keeps in that
checkpoint (task property ``sql.streaming.queryId``): a restart from the
checkpoint finds the same producer id, while a query started afresh at the
same location (its checkpoint deleted) gets a new one, so its batch 0 is not
mistaken for a replay of the old query's batch 0. Without either option the
query fails at start: the sink never degrades to at-least-once.

A batch write (``df.write``) is one transaction of a fresh producer id.

Executors never make a Python object per row: routing (``topic`` column, then
the client's ``Router``: ``partition`` column, Kafka's murmur2 of the key, null
keys sticky exactly as the producer places them) is done with pyarrow and
NumPy on whole Arrow batches, rows are buffered per partition and appended as
stored batches of ``batchSize`` rows by background threads, while the task
goes on receiving data.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
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
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from coordinator.maintainer import maintain_written
from coordinator.transactions import Decision, TransactionCoordinator, allocate_producer_id
from pyspark_logsource.client.routing import DEFAULT_BATCH_BYTES, Router, partition_order
from pyspark_logsource.spark.options import SINK_OPTIONS, split_options
from pyspark_logsource.spark.workers import executor_root
from segment_format.documents import INT64_MAX, INT64_MIN
from segment_format.errors import (
    InvalidConfigError,
    InvalidRecordError,
    InvalidTopicError,
    PlogError,
    UnknownTopicOrPartitionError,
)
from segment_format.log.appender import TAIL_HINT_SKEW_MS
from segment_format.log.partition_log import PartitionLog
from segment_format.log.reader import COMMITTED
from segment_format.records import TIMESTAMP_TYPE, normalize_payload, now_ms
from segment_format.root import LogRoot
from segment_format.segment import ATTR_TRANSACTIONAL, BatchMeta
from segment_format.topic import TopicMetadata, is_compacted
from segment_format.typed.layout import TypedLayout, entry_layout, payload_with_value

__all__ = ["PlogBatchWriter", "PlogCommitMessage", "PlogStreamWriter", "sink_id_for"]

#: A partition's buffered rows are appended once they hold this many bytes, whatever their count.
FLUSH_BYTES = 16 * 1024 * 1024
#: Threads a task appends on, each partition always on the same one (``_TaskWriter``).
APPEND_LANES = 4
#: Appends a task may have queued or running (bounds the memory of a fast task).
MAX_PENDING_APPENDS = 2 * APPEND_LANES
#: A streaming task hands the driver the bytes of each object it created up to this size, and of at most this
#: many bytes in all, so that the driver's maintenance merges them without reading them back (PROTOCOL.md
#: 10.1): small objects are the ones merging must read, one GET each, and the ones cheap to carry in a commit
#: message. The task's total stays under Spark's ``spark.task.maxDirectResultSize`` (1 MiB), so the message
#: still travels with the task's result, and a micro-batch needs 2,000 tasks to reach the 1 GiB default of
#: ``spark.driver.maxResultSize``. A batch write (one commit, one pass) hands nothing over.
HANDED_OBJECT_BYTES = 256 * 1024
HANDED_TASK_BYTES = 512 * 1024
BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"
#: Spark runs the jobs of a query run in a job group named by the run's id (a restart is a new run).
RUN_ID_PROPERTY = "spark.jobGroup.id"

#: The columns the sink writes, and the Spark types each may have.
_COLUMN_TYPES: dict[str, tuple[type, ...]] = {
    "value": (BinaryType, StringType),
    "key": (BinaryType, StringType),
    "topic": (StringType,),
    "partition": (IntegerType, LongType, ShortType, ByteType),
    "headers": (ArrayType,),
    "timestamp": (TimestampType, TimestampNTZType, LongType),
}
#: Columns of the plog (and Kafka) source schema that carry nothing to write; ignored, as Kafka's sink does.
_IGNORED_COLUMNS = {"offset", "timestamptype"}


def option_error(name: str, message: str) -> InvalidConfigError:
    """An ``InvalidConfigError`` whose message names the sink option first."""
    return InvalidConfigError(f"plog sink option '{name}': {message}")


def column_error(name: str, message: str) -> InvalidRecordError:
    """An ``InvalidRecordError`` whose message names the input column first."""
    return InvalidRecordError(f"plog sink column '{name}': {message}")


#: Every column name the sink knows (lower case): its own and the ignored ones.
_SINK_COLUMNS = set(_COLUMN_TYPES) | _IGNORED_COLUMNS
#: Input columns that are not a typed topic's value fields: the sink's own and the ignored ones (lower case).
_NOT_FIELDS = (set(_COLUMN_TYPES) - {"value"}) | _IGNORED_COLUMNS


def _check_schema(schema: StructType, has_topic_option: bool, meta: TopicMetadata | None = None) -> None:
    """Validate the input columns like Spark's Kafka sink, naming the culprit.

    ``meta``: the ``topic`` option's topic. For a typed one (PROTOCOL.md 11.8) the value is a struct
    column ``value`` or one column per field, checked against its current value schema now, so that
    a mismatch fails the query when it starts. Without the option, input that looks typed (a struct
    ``value``, or field columns and no binary or string ``value``) is checked per topic when written.
    """
    fields = {f.name.lower(): f for f in schema.fields}
    if meta is not None and meta.schema_history is not None:
        _check_column_types(fields, typed=True)
        _check_typed_value(schema, meta)
        return
    value = fields.get("value")
    value_type = value.dataType if value is not None else None
    if (
        meta is None
        and not has_topic_option
        and not isinstance(value_type, _TEXT)
        and (isinstance(value_type, StructType) or any(name not in _SINK_COLUMNS for name in fields))
    ):
        # A struct value, or field columns: values of typed topics, checked per topic (the topic column's)
        # when written. Input with a binary or string value is an untyped topic's, checked as always.
        _check_column_types(fields, typed=True)
        if "topic" not in fields:
            raise option_error("topic", "missing: set the 'topic' option or give the data a 'topic' column")
        return
    if "value" not in fields:
        raise column_error(
            "value", f"missing: the plog sink needs a 'value' column (binary or string); the input has {sorted(fields)}"
        )
    _check_column_types(fields, typed=False)
    unknown = sorted(set(fields) - set(_COLUMN_TYPES) - _IGNORED_COLUMNS)
    if unknown:
        raise column_error(
            unknown[0], f"is not a column the sink writes (it writes {sorted(_COLUMN_TYPES)}; select only those)"
        )
    if "topic" not in fields and not has_topic_option:
        raise option_error("topic", "missing: set the 'topic' option or give the data a 'topic' column")


#: The Spark types of an untyped topic's values.
_TEXT = (BinaryType, StringType)


def _check_column_types(fields: dict[str, StructField], typed: bool) -> None:
    """The sink's own columns have types it writes (``value`` too, unless the topic may be typed)."""
    for name, types in _COLUMN_TYPES.items():
        if typed and name == "value":
            continue
        if name in fields and not isinstance(fields[name].dataType, types):
            raise column_error(
                name,
                f"has type {fields[name].dataType.simpleString()}; expected {' or '.join(t.typeName() for t in types)}",  # type: ignore[attr-defined]
            )
    headers = fields.get("headers")
    if headers is not None and isinstance(headers.dataType, ArrayType):
        element = headers.dataType.elementType
        names = {f.name.lower(): f.dataType for f in element.fields} if isinstance(element, StructType) else {}
        if not (
            set(names) == {"key", "value"}
            and isinstance(names["key"], StringType)
            and isinstance(names["value"], (BinaryType, StringType))
        ):
            raise column_error(
                "headers",
                f"has type {headers.dataType.simpleString()}; expected array<struct<key:string,value:binary>>",
            )


def _value_columns(names: list[str], value_is_struct: bool) -> list[str] | None:
    """A typed topic's value in the input: None for a struct column ``value`` (the only non-sink column),
    else the columns that are its fields: every column but the sink's own (``key``, ``topic``,
    ``partition``, ``headers``, ``timestamp``) and the ignored ``offset`` and ``timestampType``."""
    fields = [n for n in names if n.lower() not in _NOT_FIELDS]
    if len(fields) == 1 and fields[0].lower() == "value" and value_is_struct:
        return None
    return fields


def _typed_problem(exc: InvalidRecordError) -> InvalidRecordError:
    """A typed value's refusal (which names the field, its type and the version) as the sink's error."""
    return InvalidRecordError(
        f"plog sink: {exc} (a typed topic's value is a struct column 'value', or one column per field)"
    )


def _check_typed_value(schema: StructType, meta: TopicMetadata) -> None:
    """Check the input's value columns against the topic's current value schema, before any row is read:
    Spark's types as the Arrow ones it will send, conformed as an empty batch (names, types, missing fields)."""
    assert meta.schema_history is not None
    layout = entry_layout(meta.schema_history.current)
    value = next((f for f in schema.fields if f.name.lower() == "value"), None)
    columns = _value_columns(schema.fieldNames(), value is not None and isinstance(value.dataType, StructType))
    if columns is None:
        assert value is not None
        spark_value = value.dataType
    else:
        if not columns:
            raise column_error(
                "value",
                f"missing: topic {meta.name!r} is typed; give its value as a struct column 'value' or as columns "
                f"of its fields {list(layout.names)}; the input has {schema.fieldNames()}",
            )
        by_name = {f.name: f for f in schema.fields}
        spark_value = StructType([by_name[n] for n in columns])
    arrow = to_arrow_schema(StructType([StructField("value", spark_value)]), timezone="UTC").field(0).type
    empty = pa.array([], type=arrow)
    try:
        layout.conform(_renamed_fields(empty, layout.names), meta.name)
    except InvalidRecordError as exc:
        raise _typed_problem(exc) from None


def _field_name(name: str, names: tuple[str, ...]) -> str:
    """``name`` as the value schema spells it when only its case differs (Spark's names are case-insensitive)."""
    if name in names:
        return name
    matches = [n for n in names if n.lower() == name.lower()]
    return matches[0] if len(matches) == 1 else name


def _renamed_fields(value: pa.StructArray, names: tuple[str, ...]) -> pa.StructArray:
    """``value`` with its fields named as the value schema spells them (same children, same nulls)."""
    given = [value.type.field(i).name for i in range(value.type.num_fields)]
    wanted = [_field_name(n, names) for n in given]
    if wanted == given:
        return value
    children = [value.field(i) for i in range(len(given))]
    mask = value.is_null() if value.null_count else None
    return pa.StructArray.from_arrays(children, names=wanted, mask=mask)


def _typed_value(table: pa.Table, layout: TypedLayout, topic: str) -> pa.Array:
    """The value column of a typed topic's payload from the input rows, conformed to ``layout``
    (``InvalidRecordError`` naming the field, before anything is appended: PROTOCOL.md 11.8)."""
    names = table.column_names
    columns = _value_columns(names, "value" in names and pa.types.is_struct(table.column("value").type))
    if columns is None:
        value = table.column("value")
        value = value.combine_chunks() if isinstance(value, pa.ChunkedArray) else value
    elif not columns:
        raise column_error("value", f"missing: topic {topic!r} is typed; give its value as a struct or its fields")
    else:
        # The top-level form cannot express a null value (a tombstone): every row is a record of fields.
        children = [table.column(n).combine_chunks() for n in columns]
        value = pa.StructArray.from_arrays(children, names=columns)
    try:
        return layout.conform(_renamed_fields(value, layout.names), topic)
    except InvalidRecordError as exc:
        raise _typed_problem(exc) from None


def sink_id_for(options: dict[str, str]) -> str:
    """The sink's id: ``transactionalId``, else derived from ``checkpointLocation`` (streaming only)."""
    lowered = {k.lower(): v for k, v in options.items()}
    if lowered.get("transactionalid"):
        return lowered["transactionalid"]
    checkpoint = lowered.get("checkpointlocation")
    if checkpoint:
        if checkpoint.startswith("file:"):  # file:/x, file:///x and /x are one directory
            checkpoint = "/" + checkpoint[len("file:") :].lstrip("/")
        normalized = checkpoint if "://" in checkpoint else os.path.abspath(checkpoint)
        return "spark-sink:" + hashlib.sha256(normalized.rstrip("/").encode()).hexdigest()
    raise option_error(
        "checkpointLocation",
        "missing: the plog streaming sink needs a 'checkpointLocation' (or 'transactionalId') option to "
        "write exactly once; it does not fall back to at-least-once",
    )


def transactional_id_for(sink_id: str, query_id: str | None) -> str:
    """The transactional id of a run of the sink: its id and the (persistent) query id of its checkpoint."""
    return sink_id if not query_id else f"{sink_id}/query:{query_id}"


@dataclass
class PlogCommitMessage(WriterCommitMessage):
    """What one task wrote: offset ranges per topic and partition, its record count, and under which id."""

    batches: dict[str, dict[str, list[list[int]]]] = field(default_factory=dict)
    records: int = 0
    producer_id: int = -1
    txn: int = -1
    #: True when the task found its micro-batch committed already (a replay) and wrote nothing.
    replayed: bool = False
    #: Tail hints of the partitions it appended to (``Decision.tails``' shape, PROTOCOL.md 11.2).
    tails: dict[str, dict[str, dict[str, list[int]]]] = field(default_factory=dict)
    #: Small objects it created, by key, with their bytes: for the driver's maintenance (PROTOCOL.md 10.1).
    objects: dict[str, bytes] = field(default_factory=dict)


# ---------------------------------------------------------------------------- executor side

_PRODUCER_IDS: dict[tuple[str, str, str], int] = {}


def _producer_id(url: str, storage_key: str, coordinator: TransactionCoordinator, tid: str) -> int:
    key = (url, storage_key, tid)
    found = _PRODUCER_IDS.get(key)
    if found is None:
        found = _PRODUCER_IDS[key] = coordinator.producer_id_for(tid)
    return found


#: Per worker and query run: the first micro-batch whose decision a task of this worker looked up, and
#: the producer id it was to be written under. Only the first micro-batch of a run can be a replay.
_RUN_FIRST_BATCH: dict[tuple[str, str, str, str], tuple[int, int]] = {}
#: Per root and producer id: the micro-batch whose decision this worker last read for tail hints, and
#: that decision (None: missing, an empty micro-batch decides nothing). One entry each, so a worker that
#: runs for days keeps no history; the coordinator's cache is not used for the same reason.
_HINTS: dict[tuple[str, str, int], tuple[int, Decision | None]] = {}


def _run_producer(
    url: str, storage_key: str, coordinator: TransactionCoordinator, tid: str, txn: int, run_id: str | None
) -> tuple[int, Decision | None]:
    """``_batch_producer``, looked up once per worker and query run instead of once per task.

    Spark re-runs a micro-batch whose commit it did not record only when a query run starts: only
    the first micro-batch of a run can find its decision made. Within a run, the driver decides
    micro-batch N after all of its tasks succeeded, so a later micro-batch (or another task of the
    first one) on this worker needs no lookup. Were one ever decided already, the tasks would write
    batches its decision does not list, invisible for ever (PROTOCOL.md 11.2), and the driver's
    commit would find that decision standing.
    """
    if run_id is None:
        return _batch_producer(url, storage_key, coordinator, tid, txn)
    key = (url, storage_key, tid, run_id)
    first = _RUN_FIRST_BATCH.get(key)
    if first is not None and txn >= first[0]:
        return (first[1] if txn == first[0] else _producer_id(url, storage_key, coordinator, tid)), None
    producer_id, decided = _batch_producer(url, storage_key, coordinator, tid, txn)
    if decided is None:
        _RUN_FIRST_BATCH[key] = (txn, producer_id)
    return producer_id, decided


def _hints(
    url: str, storage_key: str, coordinator: TransactionCoordinator, producer_id: int, txn: int
) -> Decision | None:
    """The committed decision of the micro-batch before ``txn``, for its tail hints (once per worker)."""
    if txn <= 0:
        return None
    key = (url, storage_key, producer_id)
    seen = _HINTS.get(key)
    if seen is not None and seen[0] == txn - 1:
        return seen[1]
    try:
        found = coordinator.read_decision(producer_id, txn - 1)
    except PlogError:  # a hint is an optimisation: a damaged decision is reported by its readers
        found = None
    if found is not None and found.state != COMMITTED:
        found = None
    _HINTS[key] = (txn - 1, found)
    return found


def _batch_producer(
    url: str, storage_key: str, coordinator: TransactionCoordinator, tid: str, txn: int
) -> tuple[int, Decision | None]:
    """The producer id micro-batch ``txn`` is written under, and its decision so far (None: undecided).

    Normally the sink's own producer id. If that transaction was aborted (it timed out while the query was
    down), the batch can never commit under it; its re-run goes to the producer id of
    ``<tid>/batch:<txn>/retry:1``, then ``retry:2`` and so on: the first one whose transaction is not aborted.
    Decisions never change, so every task and the driver walk to the same one, and a committed one ends the
    walk: a replay of it writes nothing.
    """
    retry = 0
    while True:
        name = tid if retry == 0 else f"{tid}/batch:{txn}/retry:{retry}"
        producer_id = _producer_id(url, storage_key, coordinator, name)
        decided = coordinator.decision(producer_id, txn)
        if decided is None or decided.state == COMMITTED:
            return producer_id, decided
        retry += 1


def _is_null(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(pc.is_null(column).to_numpy(zero_copy_only=False), dtype=bool)


class _TaskWriter:
    """One task's writes: routes Arrow batches, buffers them per partition, appends in the background.

    The task's thread only routes: the partition of every row (NumPy), one
    gather per batch and a slice per partition present. Once a partition holds
    ``batchSize`` rows (or ``FLUSH_BYTES``), its rows go to a background thread
    that concatenates them and appends them as one object of stored batches
    of ``batchSize`` rows, while the task goes on receiving data. A task has
    ``APPEND_LANES`` such threads and a partition always uses the same one, so
    its appends (and its keys) stay in order while different partitions'
    appends overlap; with many partitions most appends happen at the end of
    the task, where they would otherwise run one after another.
    """

    def __init__(
        self, sink: _SinkBase, root: LogRoot, producer_id: int, txn: int, hints: Decision | None = None
    ) -> None:
        self.sink = sink
        self.root = root
        self.producer_id = producer_id
        self.txn = txn
        self.buffers: dict[tuple[str, int], list[pa.RecordBatch]] = {}
        self.buffered_rows: dict[tuple[str, int], int] = {}
        self.buffered_bytes: dict[tuple[str, int], int] = {}
        self.ranges: dict[str, dict[str, list[list[int]]]] = {}
        self.records = 0
        self.routers: dict[str, Router] = {}
        self.pending: list[Future] = []
        # One thread per lane, each partition always on the same lane: a partition's appends stay in order
        # (and with them its keys'), while different partitions' appends, their syncs above all, overlap.
        self.appenders = [
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"plog-sink-append-{lane}")
            for lane in range(APPEND_LANES)
        ]
        self.meta: dict[str, TopicMetadata] = {}
        #: The previous micro-batch's decision, whose tail hints say where to append (PROTOCOL.md 11.2).
        self.hints = hints
        self.hinted: set[tuple[str, int]] = set()
        self.tails: dict[str, dict[str, dict[str, list[int]]]] = {}
        self.objects: dict[str, bytes] = {}
        self.handed_bytes = 0  # of ``objects``, under ``handed_lock``: the append lanes share them
        self.handed_lock = threading.Lock()

    # -------------------------------------------------------------- routing

    def add(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        # The sink's own columns match in any case, as in Spark; a typed topic's value fields keep theirs.
        names = [c.lower() if c.lower() in _SINK_COLUMNS else c for c in batch.schema.names]
        table = pa.Table.from_batches([batch]).rename_columns(names)
        for ignored in _IGNORED_COLUMNS.intersection(names):
            table = table.drop_columns([ignored])
        if "timestamp" in table.column_names and pa.types.is_timestamp(table.column("timestamp").type):
            # Spark's micro-second timestamps, to the log's milli-seconds (truncating, as Kafka's sink does).
            index = table.column_names.index("timestamp")
            table = table.set_column(index, "timestamp", pc.cast(table.column("timestamp"), TIMESTAMP_TYPE, safe=False))
        if self.sink.topic is not None:
            self._add_topic(self.sink.topic, table)  # the option overrides a topic column, as in Kafka's sink
            return
        if "topic" not in table.column_names:  # refused when the writer is made; here for the type checker
            raise option_error("topic", "missing: set the 'topic' option or give the data a 'topic' column")
        topics = table.column("topic")
        if topics.null_count:
            row = int(np.flatnonzero(_is_null(topics))[0])
            raise column_error(
                "topic",
                f"is null in {topics.null_count} row(s) (the first at row {row} of a "
                "batch) and no 'topic' option is set",
            )
        unique = pc.unique(topics).to_pylist()
        if len(unique) == 1:
            self._add_topic(unique[0], table)
            return
        for name in sorted(unique):
            self._add_topic(name, table.filter(pc.equal(topics, name)))

    def _topic(self, name: str, refresh: bool = False) -> TopicMetadata:
        meta = None if refresh else self.meta.get(name)
        if meta is None:
            error = option_error if name == self.sink.topic else column_error
            try:
                meta = self.root.topic(name, refresh=refresh)
            except UnknownTopicOrPartitionError:
                raise error(
                    "topic", f"topic {name!r} does not exist (create it first: plog topics create {name})"
                ) from None
            except InvalidTopicError as exc:
                raise error("topic", str(exc)) from None
            self.meta[name] = meta
        return meta

    def _add_topic(self, name: str, table: pa.Table) -> None:
        meta = self._topic(name)
        layout = None if meta.schema_history is None else entry_layout(meta.schema_history.current)
        # A typed value is conformed here, before routing and buffering: a refused batch appends nothing.
        # The append conforms again, to the version current then (a struct of an older one is converted).
        typed = None if layout is None else (layout, _typed_value(table, layout, name))
        try:
            payload = normalize_payload(table) if typed is None else payload_with_value(table, typed[1], typed[0])
        except InvalidRecordError as exc:  # names the column: "column 'timestamp' holds ..."
            raise InvalidRecordError(f"plog sink {exc}") from None
        n = payload.num_rows
        if payload.column("key").null_count and is_compacted(meta.config):
            raise column_error(
                "key",
                f"{payload.column('key').null_count} row(s) have a null key, and topic {name!r} is compacted "
                "(cleanup.policy contains 'compact'): compacted topics require a key on every record",
            )
        given: np.ndarray | None = None
        unset: np.ndarray | None = None
        if "partition" in table.column_names and table.column("partition").null_count < n:
            column = table.column("partition")
            given = np.asarray(pc.fill_null(column, -1).to_numpy(zero_copy_only=False), dtype=np.int64)
            unset = _is_null(column) if column.null_count else None  # rows routed by key, as the producer would
        try:
            partitions = self._router(name).route(
                meta, payload.column("key"), payload.column("value"), given=given, unset=unset
            )
        except UnknownTopicOrPartitionError as exc:  # a row's partition does not exist
            raise column_error("partition", str(exc)) from None
        if not n:
            return
        batch = payload.combine_chunks().to_batches()[0]
        # Sizes by the batch's mean row: ``nbytes`` of every slice costs microseconds, and at 64 partitions
        # there are 64 slices per batch; FLUSH_BYTES is a memory bound, for which the mean is close enough.
        row_bytes = batch.nbytes / n
        first = int(partitions[0])
        if (partitions == first).all():
            self._buffer((name, first), batch, batch.nbytes)
        else:
            # One stable sort by partition and one gather, then a zero-copy slice per partition: cheaper than
            # a filter pass over the whole batch for every partition, and it keeps each partition's row order.
            order = partition_order(partitions)
            counts = np.bincount(partitions)
            grouped = batch.take(pa.array(order))
            start = 0
            for part in np.flatnonzero(counts).tolist():
                size = int(counts[part])
                self._buffer((name, part), grouped.slice(start, size), int(size * row_bytes))
                start += size
        self.records += n

    def _router(self, topic: str) -> Router:
        """The topic's ``Router``: the producer's routing (``client/routing.py``), with a default producer's
        ``batch_size``, so null-key rows land as a default ``Producer`` sending the same Arrow batches puts them."""
        router = self.routers.get(topic)
        if router is None:
            router = self.routers[topic] = Router(topic, lambda: self._topic(topic, refresh=True), DEFAULT_BATCH_BYTES)
        return router

    # -------------------------------------------------------------- buffering and appends

    def _buffer(self, tp: tuple[str, int], batch: pa.RecordBatch, nbytes: int) -> None:
        self.buffers.setdefault(tp, []).append(batch)
        rows = self.buffered_rows[tp] = self.buffered_rows.get(tp, 0) + batch.num_rows
        size = self.buffered_bytes[tp] = self.buffered_bytes.get(tp, 0) + nbytes
        if rows >= self.sink.batch_rows:
            self._flush(tp, whole=rows - rows % self.sink.batch_rows)  # whole stored batches; the rest waits
        elif size >= FLUSH_BYTES:
            self._flush(tp)

    def _flush(self, tp: tuple[str, int], whole: int | None = None) -> None:
        """Hand the first ``whole`` buffered rows of ``tp`` (all of them by default) to its append lane."""
        batches = self.buffers.pop(tp, None)
        rows = self.buffered_rows.pop(tp, 0)
        self.buffered_bytes.pop(tp, None)
        if not batches:
            return
        if whole is not None and whole < rows:
            keep = rows - whole  # fewer rows than the last batch holds: earlier flushes left less than a whole one
            last = batches[-1]
            batches[-1] = last.slice(0, last.num_rows - keep)
            rest = last.slice(last.num_rows - keep)
            self.buffers[tp] = [rest]
            self.buffered_rows[tp] = keep
            self.buffered_bytes[tp] = rest.nbytes
        while len(self.pending) > MAX_PENDING_APPENDS:
            self.pending.pop(0).result()  # raises an append's error here, in the task
        lane = self.appenders[tp[1] % APPEND_LANES]
        self.pending.append(lane.submit(self._append, tp, batches))

    def _append(self, tp: tuple[str, int], batches: list[pa.RecordBatch]) -> None:
        """Background thread: append one partition's buffered rows as stored batches of ``batchSize`` rows."""
        topic, part = tp
        log = self.root.partition(topic, part, self.meta[topic])
        if tp not in self.hinted:
            self.hinted.add(tp)
            self._learn_hint(log)
        rows = pa.Table.from_batches(batches)
        if len(batches) > 1:
            rows = rows.combine_chunks()
        meta = BatchMeta(self.producer_id, 0, -1, ATTR_TRANSACTIONAL, transaction=self.txn)
        chunks = rows.to_batches(max_chunksize=self.sink.batch_rows)
        since_ms = now_ms()  # read before the create: the hint's knowledge is no older (PROTOCOL.md 11.2)
        result = log.append(
            [(chunk, meta) for chunk in chunks],
            compression=self.sink.compression,
            transaction_timeout_ms=self.sink.transaction_timeout_ms,
            notify=False,  # the driver notifies once per topic after the commit (PROTOCOL.md 9.1)
            keep_bytes=HANDED_OBJECT_BYTES if self.sink.hands_over_objects else 0,
        )
        if result.data is not None:
            with self.handed_lock:
                if self.handed_bytes + len(result.data) <= HANDED_TASK_BYTES:
                    self.objects[result.key] = result.data
                    self.handed_bytes += len(result.data)
        self.ranges.setdefault(topic, {}).setdefault(str(part), []).append(
            [result.base_offsets[0], result.next_offset - 1]
        )
        self.tails.setdefault(topic, {}).setdefault(log.topic_id, {})[str(part)] = [
            result.next_offset,
            result.running_max_timestamp,
            since_ms,
        ]

    def _learn_hint(self, log: PartitionLog) -> None:
        """Where the previous micro-batch left ``log``'s end, from its decision's tail hints, if fresh enough."""
        if self.hints is None:
            return
        ids = self.hints.tails.get(log.topic)
        parts = ids.get(log.topic_id) if isinstance(ids, dict) else None
        hint = parts.get(str(log.partition)) if isinstance(parts, dict) else None
        # Only a hint that can be a log end: a damaged one past int64 would fail the append with an
        # OverflowError, or be stamped into the new object's segment JSON (an unreadable object), and a
        # negative end would name an object off the chain, its records acknowledged but never readable.
        if not (
            isinstance(hint, list)
            and len(hint) == 3
            and all(type(v) is int and INT64_MIN <= v <= INT64_MAX for v in hint)
            and hint[0] >= 0
        ):
            return
        # The task that reported the hint listed its append's range in the same decision, so the end must
        # be one past the last offset listed: a damaged end past the log's would leave a gap no reader
        # gets over, since the create at a free key succeeds (JSON carries no checksum; this is one).
        ranges = self.hints.batches.get(log.topic, {}).get(str(log.partition), [])
        if hint[0] == max((last for _, last in ranges), default=-2) + 1:
            log.learn_tail(hint[0], hint[1], hint[2])

    def finish(self) -> PlogCommitMessage:
        for tp in list(self.buffers):
            self._flush(tp)
        for future in self.pending:
            future.result()
        self.pending.clear()
        return PlogCommitMessage(
            self.ranges, self.records, self.producer_id, self.txn, tails=self.tails, objects=self.objects
        )

    def close(self, failed: bool = False) -> None:
        """Stop the append lanes; after a failure, appends not started yet are dropped."""
        for lane in self.appenders:
            lane.shutdown(wait=True, cancel_futures=failed)


# ---------------------------------------------------------------------------- shared by both writers


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


def _merge_tails(messages: list[Any]) -> dict[str, dict[str, dict[str, list[int]]]]:
    """The tasks' tail hints, the whole report with the highest end per partition (PROTOCOL.md 11.2).

    A report whose clock is ahead of the driver's by more than the skew bound is dropped: its task's
    clock is off, and a hint dated in the future would be trusted for too long.
    """
    latest = now_ms() + TAIL_HINT_SKEW_MS
    merged: dict[str, dict[str, dict[str, list[int]]]] = {}
    for message in messages:
        for topic, ids in (getattr(message, "tails", None) or {}).items():
            for topic_id, parts in ids.items():
                kept = merged.setdefault(topic, {}).setdefault(topic_id, {})
                for part, hint in parts.items():
                    if hint[2] <= latest and (part not in kept or hint[0] > kept[part][0]):
                        kept[part] = list(hint)
    return merged


class _SinkBase:
    """Shared by the streaming and the batch writer: options, routing and transactional appends."""

    #: Whether tasks put the small objects they created in their commit messages (HANDED_OBJECT_BYTES).
    hands_over_objects = False

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        lowered = {str(k).lower(): str(v) for k, v in options.items()}
        plain, storage = split_options(lowered, option_error)
        values = SINK_OPTIONS.validate(plain)
        url = values["url"] or values["path"]
        if not url:
            raise option_error("url", "missing: give the plog root as the 'url' option (or .save(url) / .start(url))")
        self.url = url
        self.storage_options = storage
        self.topic = values["topic"] or None
        self.compression = values["compression"] or None
        self.batch_rows = values["batchSize"]
        self.transaction_timeout_ms: int = values["transactionTimeout"]
        meta = None
        if self.topic is not None:
            try:
                meta = self._root().topic(self.topic)  # an unknown topic fails the query at start
            except UnknownTopicOrPartitionError:
                raise option_error(
                    "topic", f"topic {self.topic!r} does not exist (create it first: plog topics create {self.topic})"
                ) from None
        _check_schema(schema, self.topic is not None, meta)

    def _storage_key(self) -> str:
        return json.dumps(self.storage_options, sort_keys=True, default=str)

    def _root(self) -> LogRoot:
        # The process's shared root: Spark builds a new writer (unpickled) for every commit on the driver, and
        # a root per writer would re-open the root (protocol check, topic metadata, maintainer lease) each time.
        return executor_root(self.url, self.storage_options)[0]

    def _write(
        self,
        iterator: Iterator[pa.RecordBatch],
        root: LogRoot,
        producer_id: int,
        txn: int,
        hints: Decision | None = None,
    ) -> PlogCommitMessage:
        writer = _TaskWriter(self, root, producer_id, txn, hints)
        try:
            for batch in iterator:
                writer.add(batch)
            message = writer.finish()
        except BaseException:
            writer.close(failed=True)
            raise
        writer.close()
        return message

    def _decide(self, messages: list[Any], producer_id: int, txn: int) -> Decision:
        """Commit the micro-batch's records, then write the notices of the topics they went to (PROTOCOL.md 9.1).

        The tasks' appends wrote no notice: their records are acknowledged by this commit, so one
        notice per topic after the decision is what readers waiting at the end need.
        """
        _, coordinator = executor_root(self.url, self.storage_options)
        batches = _merge(messages)
        decision = Decision(
            COMMITTED, producer_id, txn, batches=batches, created_ms=now_ms(), tails=_merge_tails(messages)
        )
        stands = coordinator.decide(decision)
        self._notify(stands)
        return stands

    def _notify(self, decision: Decision) -> None:
        """The change notices of the topics a decision lists; an error fails the commit (PROTOCOL.md 9.1).

        Spark then runs the micro-batch again; its tasks find the decision, and the replay's
        commit writes the notices again (``PlogStreamWriter.commit``).
        """
        root, _ = executor_root(self.url, self.storage_options)
        for topic, partitions in decision.batches.items():
            with contextlib.suppress(UnknownTopicOrPartitionError):  # deleted meanwhile: nobody waits on it
                root.notify(topic, [int(p) for p in partitions])

    def _maintain(self, decision: Decision, owner: str, messages: list[Any]) -> None:
        """After a commit: maintain the partitions it wrote, if due (PROTOCOL.md 10.1); never fails the commit.

        The objects the tasks handed over are kept for it first (``IndexCache.offer``): this process runs
        every commit of the query, so the merge of a later pass finds them without reading them back.
        """
        root = self._root()
        for message in messages:
            for key, data in (getattr(message, "objects", None) or {}).items():
                root.index_cache.offer(key, data)
        written = {topic: [int(p) for p in parts] for topic, parts in decision.batches.items()}
        maintain_written(root, written, owner=owner, writer="sink")


# ---------------------------------------------------------------------------- the writers


class PlogStreamWriter(_SinkBase, DataSourceStreamArrowWriter):
    """Exactly-once micro-batch writer (see the module docstring)."""

    hands_over_objects = True  # every commit of a query runs in one driver process: its passes merge them

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        super().__init__(options, schema)
        self.sink_id = sink_id_for(options)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PlogCommitMessage:
        """Executor side: append this task's rows as transactional batches of transaction ``batchId``."""
        from pyspark import TaskContext

        context = TaskContext.get()
        batch_id = context.getLocalProperty(BATCH_ID_PROPERTY) if context is not None else None
        if batch_id is None:
            raise PlogError(f"the plog sink could not learn the micro-batch id (task property {BATCH_ID_PROPERTY})")
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY) if context is not None else None
        run_id = context.getLocalProperty(RUN_ID_PROPERTY) if context is not None else None
        txn = int(batch_id)
        root, coordinator = executor_root(self.url, self.storage_options)
        storage_key = self._storage_key()
        tid = transactional_id_for(self.sink_id, query_id)
        producer_id, decided = _run_producer(self.url, storage_key, coordinator, tid, txn, run_id)
        if decided is not None:  # committed: a replay of a batch whose records are visible already
            for _ in iterator:  # a replay of a batch already committed: its records are visible, write nothing
                pass
            return PlogCommitMessage({}, 0, producer_id, txn, replayed=True)
        hints = _hints(self.url, storage_key, coordinator, producer_id, txn)
        return self._write(iterator, root, producer_id, txn, hints)

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - Spark's name
        """Driver side: create the decision for ``batchId``; a replay finds it there and changes nothing."""
        written = [m for m in messages if m is not None and m.producer_id >= 0]
        if not any(m.batches for m in written):
            replayed = [m for m in written if m.replayed]
            if replayed:  # the decision exists: the first run may have died before its notices
                _, coordinator = executor_root(self.url, self.storage_options)
                decided = coordinator.decision(replayed[0].producer_id, batchId)
                if decided is not None and decided.state == COMMITTED:
                    self._notify(decided)
            return  # nothing was written (an empty batch, or a replay whose tasks found the decision)
        producer_ids = {m.producer_id for m in written}
        if len(producer_ids) != 1 or {m.txn for m in written} != {batchId}:
            raise PlogError(
                f"micro-batch {batchId}: tasks wrote as producers {sorted(producer_ids)} with "
                f"transactions {sorted({m.txn for m in written})}; expected one producer and "
                f"transaction {batchId}"
            )
        stands = self._decide(messages, producer_ids.pop(), batchId)
        if stands.state != COMMITTED:
            raise PlogError(
                f"micro-batch {batchId} of sink {self.sink_id!r} was aborted (transaction timeout) before it "
                "could commit; its records are not visible. Restart the query: it re-runs the micro-batch "
                f"under a new transaction. If micro-batches take longer than transactionTimeout "
                f"({self.transaction_timeout_ms} ms), every run is aborted the same way: raise the option, or "
                "bound micro-batches with the source's maxOffsetsPerTrigger"
            )
        self._maintain(stands, owner=f"spark-sink:{stands.producer_id}", messages=messages)

    def abort(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - Spark's name
        """Leave the transaction undecided: Spark re-runs ``batchId``, and that run's commit lists only its own data."""


class PlogBatchWriter(_SinkBase, DataSourceArrowWriter):
    """``df.write.format("plog")``: one Spark job is one transaction."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool = False) -> None:
        if overwrite:
            raise option_error("mode", "'overwrite' is not supported: a log is only appended to; use mode('append')")
        super().__init__(options, schema)
        self.producer_id = allocate_producer_id(self._root().store, owner="spark-batch-write")
        self.txn = 0

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PlogCommitMessage:
        """Executor side: append this task's rows as transactional batches."""
        root, _ = executor_root(self.url, self.storage_options)
        return self._write(iterator, root, self.producer_id, self.txn)

    def commit(self, messages: list[Any]) -> None:
        """Make the whole job visible at once."""
        if any(m is not None and m.batches for m in messages):
            stands = self._decide(messages, self.producer_id, self.txn)
            self._maintain(stands, owner=f"spark-batch-write:{self.producer_id}", messages=messages)

    def abort(self, messages: list[Any]) -> None:
        """A failed job: abort, so nothing it wrote is ever visible."""
        executor_root(self.url, self.storage_options)[1].abort_if_undecided(self.producer_id, self.txn)
