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

Into a *shared* topic (PROTOCOL.md 7.3, the default layout) tasks append nothing: each writes its rows
into one shared object and hands its coordinates over, and the driver commits every task's runs with one
commit per topic before its decision (PROTOCOL.md 11.2, *The Spark sink on shared topics*): a micro-batch
is T objects, a commit per topic and a decision, whatever the number of partitions, and a query killed
between its commits and its decision holds read_committed readers back for a minute at most.

A batch write (``df.write``) is one transaction of a fresh producer id; into one shared topic named by
the ``topic`` option it is one commit, with no transaction.

Executors never make a Python object per row: routing (``topic`` column, then
the client's ``Router``: ``partition`` column, Kafka's murmur2 of the key, null
keys sticky exactly as the producer places them) is done with pyarrow and
NumPy on whole Arrow batches, rows are buffered per partition and appended as
stored batches of ``batchSize`` rows by background threads, while the task
goes on receiving data.

The code: ``sink_checks`` (option and column checks), ``sink_commit`` (the exactly-once logic: producer ids,
replays, what a decision lists), ``task_writer`` (the executor's routing, buffering and append lanes), and
this module, the DataSource writer classes that compose them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.types import (
    StructType,
)

from coordinator.maintainer import maintain_written
from coordinator.transactions import Decision, allocate_producer_id, check_transaction_timeout
from pyspark_logsource.spark.compat import (  # the classes differ by PySpark version
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
)
from segment_format.errors import (
    InvalidConfigError,
    PlogError,
    UnknownTopicOrPartitionError,
)
from segment_format.log.reader import COMMITTED
from segment_format.records import now_ms
from segment_format.root import LogRoot
from segment_format.topic import is_shared

from .option_schema import SINK_OPTIONS, sink_option_error
from .options import split_options
from .sink_checks import check_sink_columns
from .sink_commit import (
    SHARED_TRANSACTION_TIMEOUT_MS,
    PlogCommitMessage,
    commit_shared,
    merge,
    merge_ranges,
    merge_tails,
    run_producer,
    sink_id_for,
    transactional_id_for,
)
from .task_writer import TaskWriter, hints
from .workers import executor_root

__all__ = ["PlogBatchWriter", "PlogCommitMessage", "PlogStreamWriter", "sink_id_for"]


BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"
#: Spark runs the jobs of a query run in a job group named by the run's id (a restart is a new run).
RUN_ID_PROPERTY = "spark.jobGroup.id"


class _SinkBase:
    """Shared by the streaming and the batch writer: options, routing and transactional appends."""

    #: Whether tasks put the small objects they created in their commit messages (HANDED_OBJECT_BYTES).
    hands_over_objects = False
    #: Whether the rows of the tasks' shared objects are transactional (decided by the driver's decision), or
    #: plain rows that the driver's one commit makes visible (a batch write into one shared topic).
    shared_transactional = True

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        lowered = {str(k).lower(): str(v) for k, v in options.items()}
        plain, storage = split_options(lowered, sink_option_error)
        values = SINK_OPTIONS.validate(plain)
        url = values["url"] or values["path"]
        if not url:
            raise sink_option_error(
                "url", "missing: give the plog root as the 'url' option (or .save(url) / .start(url))"
            )
        self.url = url
        self.storage_options = storage
        self.topic = values["topic"] or None
        self.compression = values["compression"] or None
        self.batch_rows = values["batchSize"]
        self.transaction_timeout_ms: int = values["transactionTimeout"]
        self.client_id: str = values["clientId"]
        self.quota_user: str = values["quotaUser"]
        meta = None
        if self.topic is not None:
            try:
                meta = self._root().topic(self.topic)  # an unknown topic fails the query at start
            except UnknownTopicOrPartitionError:
                raise sink_option_error(
                    "topic", f"topic {self.topic!r} does not exist (create it first: plog topics create {self.topic})"
                ) from None
        check_sink_columns(schema, self.topic is not None, meta)
        try:
            check_transaction_timeout(self.transaction_timeout_ms, self._root().protocol, "transactionTimeout")
        except InvalidConfigError as exc:
            raise sink_option_error("transactionTimeout", str(exc)) from None

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
        writer = TaskWriter(self, root, producer_id, txn, hints)
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
        root, coordinator = executor_root(self.url, self.storage_options)
        if any(getattr(m, "written", None) for m in messages):
            standing = coordinator.decision(producer_id, txn)
            if standing is not None:  # decided already (a commit called again): commit nothing more
                self._notify(standing)
                return standing
        # The tasks' shared objects first: one commit per topic, transactional entries that this decision
        # decides (PROTOCOL.md 11.2, *The Spark sink on shared topics*).
        timeout_ms = min(self.transaction_timeout_ms, SHARED_TRANSACTION_TIMEOUT_MS)
        batches = merge_ranges(merge(messages), commit_shared(root, messages, transaction_timeout_ms=timeout_ms))
        decision = Decision(
            COMMITTED, producer_id, txn, batches=batches, created_ms=now_ms(), tails=merge_tails(messages)
        )
        stands = coordinator.decide(decision)
        self._notify(stands)
        return stands

    def _notify(self, decision: Decision) -> None:
        """The change notices of the topics a decision lists; an error fails the commit (PROTOCOL.md 9.1).

        Spark then runs the micro-batch again; its tasks find the decision, and the replay's
        commit writes the notices again (``PlogStreamWriter.commit``).
        """
        self._notify_written(decision.batches)

    def _notify_written(self, batches: dict[str, dict[str, list[list[int]]]]) -> None:
        root, _ = executor_root(self.url, self.storage_options)
        # Every topic's notice, then one root notice; topics deleted meanwhile are left out (nobody waits on them).
        root.notify_topics({topic: [int(p) for p in partitions] for topic, partitions in batches.items()})

    def _maintain(self, decision: Decision, owner: str, messages: list[Any]) -> None:
        """After a commit: maintain the partitions it wrote, if due (PROTOCOL.md 10.1); never fails the commit.

        The objects the tasks handed over are kept for it first (``IndexCache.offer``): this process runs
        every commit of the query, so the merge of a later pass finds them without reading them back.
        """
        root = self._root()
        for message in messages:
            for key, data in (getattr(message, "objects", None) or {}).items():
                root.index_cache.offer(key, data)
            for written in getattr(message, "written", None) or []:
                data = (message.objects or {}).get(written.key)
                if data is not None and written.runs:
                    # This process committed it: the copy of its tier's merge (PROTOCOL.md 10.2) needs no read.
                    keeper = root.sequence(written.runs[0].topic).own_objects
                    if keeper is not None:
                        keeper.put(written.key, data)
        written = {topic: [int(p) for p in parts] for topic, parts in decision.batches.items()}
        maintain_written(root, written, owner=owner, writer="sink", decisions=[decision])


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
        producer_id, decided = run_producer(self.url, storage_key, coordinator, tid, txn, run_id)
        if decided is not None:  # committed: a replay of a batch whose records are visible already
            for _ in iterator:  # a replay of a batch already committed: its records are visible, write nothing
                pass
            return PlogCommitMessage({}, 0, producer_id, txn, replayed=True)
        previous = hints(self.url, storage_key, coordinator, producer_id, txn)
        return self._write(iterator, root, producer_id, txn, previous)

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - Spark's name
        """Driver side: create the decision for ``batchId``; a replay finds it there and changes nothing."""
        written = [m for m in messages if m is not None and m.producer_id >= 0]
        if not any(m.batches or m.written for m in written):
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
    """``df.write.format("plog")``: one Spark job is one transaction; into one shared topic, one commit."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool = False) -> None:
        if overwrite:
            raise sink_option_error(
                "mode", "'overwrite' is not supported: a log is only appended to; use mode('append')"
            )
        super().__init__(options, schema)
        root = self._root()
        # Every row goes to the one shared topic the option names: the driver's one commit makes the whole job
        # visible at once, with no producer id, transaction or decision (PROTOCOL.md 11.2).
        self.shared_transactional = self.topic is None or not is_shared(root.topic(self.topic).config)
        self.producer_id = (
            allocate_producer_id(root.store, owner="spark-batch-write", protocol=root.protocol)
            if self.shared_transactional
            else -1
        )
        self.txn = 0

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PlogCommitMessage:
        """Executor side: write this task's rows (transactional batches, or a shared object to commit)."""
        root, _ = executor_root(self.url, self.storage_options)
        return self._write(iterator, root, self.producer_id, self.txn)

    def commit(self, messages: list[Any]) -> None:
        """Make the whole job visible at once."""
        if not any(m is not None and (m.batches or m.written) for m in messages):
            return
        if self.shared_transactional:
            stands = self._decide(messages, self.producer_id, self.txn)
            self._maintain(stands, owner=f"spark-batch-write:{self.producer_id}", messages=messages)
            return
        committed = commit_shared(self._root(), messages, transaction_timeout_ms=None)
        self._notify_written(committed)
        written = {topic: [int(p) for p in parts] for topic, parts in committed.items()}
        maintain_written(self._root(), written, owner="spark-batch-write", writer="sink")

    def abort(self, messages: list[Any]) -> None:
        """A failed job: abort, so nothing it wrote is ever visible (a job into one shared topic committed
        nothing: its objects are orphans, PROTOCOL.md 10.2)."""
        if self.shared_transactional:
            executor_root(self.url, self.storage_options)[1].abort_if_undecided(self.producer_id, self.txn)
