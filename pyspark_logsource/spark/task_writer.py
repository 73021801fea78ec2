"""The executor side of the sink: one task's writes, routed, buffered per partition and appended on lanes.

``TaskWriter`` routes Arrow batches to partitions (pyarrow and NumPy, no Python object per row), buffers
them per partition, and appends them as transactional batches on ``APPEND_LANES`` background threads (a
shared topic's rows: one shared object per flush, which the driver commits);
``hints`` reads the previous micro-batch's decision for the tail hints that say where to append.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from coordinator.throttle import quota_steps
from coordinator.transactions import Decision, TransactionCoordinator
from pyspark_logsource.client.routing import DEFAULT_BATCH_BYTES, Router, partition_order
from segment_format.documents import INT64_MAX, INT64_MIN
from segment_format.errors import (
    InvalidRecordError,
    InvalidTopicError,
    PlogError,
    UnknownTopicOrPartitionError,
)
from segment_format.log.appender import AppendResult
from segment_format.log.flush import WrittenObject, write_shared_object
from segment_format.log.partition_log import PartitionLog
from segment_format.log.reader import COMMITTED
from segment_format.records import TIMESTAMP_TYPE, normalize_payload, now_ms
from segment_format.root import LogRoot
from segment_format.segment import ATTR_TRANSACTIONAL, BatchMeta
from segment_format.topic import TopicMetadata, is_compacted, is_shared
from segment_format.typed.layout import entry_layout, payload_with_value

from .option_schema import sink_option_error
from .sink_checks import IGNORED_COLUMNS, SINK_COLUMNS, column_error, typed_value
from .sink_commit import PlogCommitMessage
from .workers import executor_quota

#: A partition's buffered rows are appended once they hold this many bytes, whatever their count.
FLUSH_BYTES = 16 * 1024 * 1024
#: Threads a task appends on, each partition always on the same one (``TaskWriter``).
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


#: Per root and producer id: the micro-batch whose decision this worker last read for tail hints, and
#: that decision (None: missing, an empty micro-batch decides nothing). One entry each, so a worker that
#: runs for days keeps no history; the coordinator's cache is not used for the same reason.
_HINTS: dict[tuple[str, str, int], tuple[int, Decision | None]] = {}


def hints(
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


def _is_null(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(pc.is_null(column).to_numpy(zero_copy_only=False), dtype=bool)


class SinkSettings(Protocol):
    """What a task writer reads of its sink (``sink._SinkBase``), named here so this module needs no import of it."""

    topic: str | None
    batch_rows: int
    compression: str | None
    transaction_timeout_ms: int
    hands_over_objects: bool
    #: Whether a shared object's rows are transactional rows of the micro-batch (else plain rows of a batch
    #: write into one shared topic, which one commit makes visible).
    shared_transactional: bool
    client_id: str
    quota_user: str


class TaskWriter:
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
        self, sink: SinkSettings, root: LogRoot, producer_id: int, txn: int, hints: Decision | None = None
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
        #: Bytes buffered for shared topics' partitions, written together once they reach ``FLUSH_BYTES``.
        self.shared_bytes = 0
        #: The shared objects this task created, for the driver to commit (PROTOCOL.md 11.2).
        self.written: list[WrittenObject] = []

    # -------------------------------------------------------------- routing

    def add(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        # The sink's own columns match in any case, as in Spark; a typed topic's value fields keep theirs.
        names = [c.lower() if c.lower() in SINK_COLUMNS else c for c in batch.schema.names]
        table = pa.Table.from_batches([batch]).rename_columns(names)
        for ignored in IGNORED_COLUMNS.intersection(names):
            table = table.drop_columns([ignored])
        if "timestamp" in table.column_names and pa.types.is_timestamp(table.column("timestamp").type):
            # Spark's micro-second timestamps, to the log's milli-seconds (truncating, as Kafka's sink does).
            index = table.column_names.index("timestamp")
            table = table.set_column(index, "timestamp", pc.cast(table.column("timestamp"), TIMESTAMP_TYPE, safe=False))
        if self.sink.topic is not None:
            self._add_topic(self.sink.topic, table)  # the option overrides a topic column, as in Kafka's sink
            return
        if "topic" not in table.column_names:  # refused when the writer is made; here for the type checker
            raise sink_option_error("topic", "missing: set the 'topic' option or give the data a 'topic' column")
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
            error = sink_option_error if name == self.sink.topic else column_error
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
        typed = None if layout is None else (layout, typed_value(table, layout, name))
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
        if is_shared(self.meta[tp[0]].config):
            # A shared topic's partitions are written together: one object per flush, which the driver commits.
            self.shared_bytes += nbytes
            if self.shared_bytes >= FLUSH_BYTES:
                self._flush_shared()
            return
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

    def _flush_shared(self) -> None:
        """Hand every shared topic's buffered rows to the first lane, to be written as one flush."""
        work = {tp: self.buffers.pop(tp) for tp in list(self.buffers) if is_shared(self.meta[tp[0]].config)}
        for tp in work:
            self.buffered_rows.pop(tp, None)
            self.buffered_bytes.pop(tp, None)
        self.shared_bytes = 0
        if not work:
            return
        while len(self.pending) > MAX_PENDING_APPENDS:
            self.pending.pop(0).result()  # raises an append's error here, in the task
        self.pending.append(self.appenders[0].submit(self._append_shared, work))

    def _append_shared(self, work: dict[tuple[str, int], list[pa.RecordBatch]]) -> None:
        """Background thread: shared topics' buffered rows as one shared object (PROTOCOL.md 7.3), each
        partition's rows as stored batches of ``batchSize`` rows, left for the driver to commit (11.2, *The
        Spark sink on shared topics*): the task creates no commit. Under a byte quota, objects of at most its
        burst, each after its allowance (as :meth:`_append`'s steps)."""
        meta = (
            BatchMeta(self.producer_id, 0, -1, ATTR_TRANSACTIONAL, transaction=self.txn)
            if self.sink.shared_transactional
            else BatchMeta()
        )
        quota = executor_quota(self.root, "producer_byte_rate", self.sink.quota_user, self.sink.client_id)
        step_bytes = quota.step_bytes()
        chunks: list[tuple[PartitionLog, pa.RecordBatch]] = []
        for (topic, part), batches in sorted(work.items()):
            rows = pa.Table.from_batches(batches)
            log = self.root.partition(topic, part, self.meta[topic])
            chunks += [(log, chunk) for chunk in rows.to_batches(max_chunksize=self._chunk_rows(rows, step_bytes))]
        for step in quota_steps(chunks, lambda item: item[1].nbytes, step_bytes):
            quota.acquire(sum(chunk.nbytes for _log, chunk in step), 1)  # one shared object
            by_log: dict[tuple[str, int], tuple[PartitionLog, list[tuple[pa.RecordBatch, BatchMeta]]]] = {}
            for log, chunk in step:
                by_log.setdefault((log.topic, log.partition), (log, []))[1].append((chunk, meta))
            items = [(log.appender, payloads, None) for log, payloads in by_log.values()]
            shared, written = write_shared_object(items, compression=self.sink.compression)
            with self.handed_lock:
                self.written.append(written)
                size = len(shared.data)
                if (
                    self.sink.hands_over_objects
                    and size <= HANDED_OBJECT_BYTES
                    and self.handed_bytes + size <= HANDED_TASK_BYTES
                ):
                    self.objects[shared.key] = shared.data
                    self.handed_bytes += size

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
        # The worker's share of the sink's producer_byte_rate, shared by its tasks (PROTOCOL.md 11.10): each
        # append waits for its allowance before it is written, in steps of at most the quota's burst, and
        # this lane's next append waits behind it (the task's thread in turn once MAX_PENDING_APPENDS are
        # queued). A micro-batch holding more bytes than the quota passes in the transaction's timeout
        # (15 min by default) times out, as on slow storage: size micro-batches under it.
        quota = executor_quota(self.root, "producer_byte_rate", self.sink.quota_user, self.sink.client_id)
        step_bytes = quota.step_bytes()
        chunks = rows.to_batches(max_chunksize=self._chunk_rows(rows, step_bytes))
        for step in quota_steps(chunks, lambda chunk: chunk.nbytes, step_bytes):
            quota.acquire(sum(chunk.nbytes for chunk in step), 1)  # one object, one store request
            self._append_object(log, topic, part, step)

    def _chunk_rows(self, rows: pa.Table, step_bytes: int | None) -> int:
        """Rows per stored batch: ``batchSize``, fewer under a quota so that no step is larger than the burst."""
        if step_bytes is None:
            return int(self.sink.batch_rows)
        return max(1, min(self.sink.batch_rows, step_bytes * rows.num_rows // max(1, rows.nbytes)))

    def _append_object(self, log: PartitionLog, topic: str, part: int, chunks: list[pa.RecordBatch]) -> None:
        """Append ``chunks`` (stored batches) to ``log`` as one object of the task's transaction."""
        meta = BatchMeta(self.producer_id, 0, -1, ATTR_TRANSACTIONAL, transaction=self.txn)
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
        self._record(log, result, since_ms)

    def _record(self, log: PartitionLog, result: AppendResult, since_ms: int) -> None:
        """An append's range for the driver's decision, and the partition's end as a hint for the next batch."""
        self.ranges.setdefault(log.topic, {}).setdefault(str(log.partition), []).append(
            [result.base_offsets[0], result.next_offset - 1]
        )
        self.tails.setdefault(log.topic, {}).setdefault(log.topic_id, {})[str(log.partition)] = [
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
        self._flush_shared()
        for tp in list(self.buffers):
            self._flush(tp)
        for future in self.pending:
            future.result()
        self.pending.clear()
        return PlogCommitMessage(
            self.ranges,
            self.records,
            self.producer_id,
            self.txn,
            tails=self.tails,
            objects=self.objects,
            written=self.written,
        )

    def close(self, failed: bool = False) -> None:
        """Stop the append lanes; after a failure, appends not started yet are dropped."""
        for lane in self.appenders:
            lane.shutdown(wait=True, cancel_futures=failed)
