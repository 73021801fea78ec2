"""The Spark sink: ``df.writeStream.format("plog")`` exactly-once, and ``df.write.format("plog")``.

Three layers:

* the writers driven directly, as Spark's driver and executors call them
  (the task's micro-batch id and query id come from a stand-in TaskContext):
  option and column checks, routing as Kafka's partitioner places records,
  invisibility until commit, atomic commits across topics, replays (a
  re-run batch, a repeated commit, a failed task attempt) never visible twice;
* end to end through the shared local SparkSession (``spark`` fixture):
  readStream plog -> writeStream plog, batch writes as one transaction, errors
  that name the culprit and write nothing, a batch Spark replays;
* the headline test: a plog -> plog pipeline whose driver is killed with
  SIGKILL at random moments again and again and restarted from its
  checkpoint, on local disk and on a moto S3 server; topic B ends up holding
  exactly the expected records, each once, in per-key order.
"""

from __future__ import annotations

import collections
import datetime as dt
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from coordinator.transactions import TransactionCoordinator
from pyspark_logsource import Consumer, LogStore, Producer, TopicPartition
from pyspark_logsource.client.partitioner import kafka_partition
from segment_format.errors import InvalidConfigError, PlogError
from segment_format.log.reader import ABORTED, COMMITTED
from segment_format.root import LogRoot
from tests.fault_proxy import FAST_RETRY_OPTIONS, FaultyS3
from tests.fixtures_spark import (
    java_available,
    kill_driver,
    spark_test_env,
    start_driver,
    wait_for,
    write_driver_script,
)
from tests.soak import soak

pyspark = pytest.importorskip("pyspark")

from pyspark.sql.types import (  # noqa: E402
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pyspark_logsource.spark import sink_commit, workers  # noqa: E402
from pyspark_logsource.spark.sink import (  # noqa: E402
    PlogBatchWriter,
    PlogCommitMessage,
    PlogStreamWriter,
    sink_id_for,
    transactional_id_for,
)

T0 = 1_700_000_000_000  # ms


# ---------------------------------------------------------------------------- helpers


def make_root(tmp_path: Path, topics: dict[str, int], layout: str | None = None) -> str:
    root = str(tmp_path / "plog")
    config: dict[str, Any] = {} if layout is None else {"storage.layout": layout}
    with LogStore(root) as store:
        for name, partitions in topics.items():
            # The records carry fixed timestamps from the past, which time retention (applied by the
            # writers' self-maintenance, as a Kafka broker would) retires: keep them.
            store.create_topic(name, partitions, config={"retention.ms": -1, **config})
    return root


def committed(root: str, topic: str, storage: dict[str, Any] | None = None) -> pa.Table:
    """Every record a read_committed consumer sees in ``topic``, sorted by (partition, offset)."""
    with LogStore(root, storage) as store:
        partitions = len(store.describe_topic(topic)["partitions"])
    with Consumer(root, storage, isolation_level="read_committed", auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        return consumer.read_to_end()  # read_committed: up to the last stable offsets


def stable_and_end(root: str, topic: str, storage: dict[str, Any] | None = None) -> list[tuple[int, int]]:
    """(last stable offset, log end offset) of every partition of ``topic``."""
    r = LogRoot(root, storage)
    coordinator = TransactionCoordinator(r.store)
    out = []
    for p in range(r.topic(topic).partitions):
        log = r.partition(topic, p)
        out.append((log.last_stable_offset(coordinator.resolve), log.view().end_offset))
    r.close()
    return out


def values(table: pa.Table) -> list[bytes]:
    return table.column("value").to_pylist()


class FakeTaskContext:
    """Stands in for ``pyspark.TaskContext`` on an executor: the micro-batch id and query id properties."""

    def __init__(self, batch_id: int | None, query_id: str | None = "query-1") -> None:
        self.props = {
            "streaming.sql.batchId": None if batch_id is None else str(batch_id),
            "sql.streaming.queryId": query_id,
        }

    def getLocalProperty(self, key: str) -> str | None:  # noqa: N802 - Spark's name
        return self.props.get(key)


@pytest.fixture
def task_context(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``set(batch_id, query_id)`` makes ``TaskContext.get()`` return a stand-in with those properties."""
    current: list[FakeTaskContext | None] = [None]
    monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(lambda: current[0]))
    monkeypatch.setattr(sink_commit, "_PRODUCER_IDS", {})
    monkeypatch.setattr(workers, "_ROOTS", {})

    def set_context(batch_id: int | None, query_id: str | None = "query-1") -> None:
        current[0] = FakeTaskContext(batch_id, query_id)

    return set_context


SCHEMA = StructType([StructField("key", BinaryType()), StructField("value", BinaryType())])


def batches(table: pa.Table, rows: int = 1000) -> Iterator[pa.RecordBatch]:
    return iter(table.to_batches(max_chunksize=rows))


def kv(keys: Sequence[bytes | None], vals: Sequence[bytes]) -> pa.Table:
    return pa.table({"key": pa.array(keys, pa.binary()), "value": pa.array(vals, pa.binary())})


def stream_writer(root: str, schema: StructType = SCHEMA, **options: str | None) -> PlogStreamWriter:
    opts = {"path": root, "checkpointLocation": "/ck/q1", **options}
    if "topic" not in options and "topic" not in [f.name for f in schema.fields]:
        opts["topic"] = "out"
    return PlogStreamWriter({k: v for k, v in opts.items() if v is not None}, schema)


# ---------------------------------------------------------------------------- options and columns (no JVM)

HEADERS = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))


@pytest.mark.parametrize(
    ("fields", "options", "named"),
    [
        ([("key", BinaryType())], {}, "column 'value'"),
        ([("value", IntegerType())], {}, "column 'value'"),
        ([("value", BinaryType()), ("key", LongType())], {}, "column 'key'"),
        ([("value", BinaryType()), ("partition", StringType())], {}, "column 'partition'"),
        ([("value", BinaryType()), ("topic", BinaryType())], {}, "column 'topic'"),
        ([("value", BinaryType()), ("timestamp", StringType())], {}, "column 'timestamp'"),
        ([("value", BinaryType()), ("headers", ArrayType(StringType()))], {}, "column 'headers'"),
        ([("value", BinaryType()), ("vaule", BinaryType())], {}, "column 'vaule'"),
        ([("value", BinaryType())], {"topic": None}, "option 'topic'"),
        ([("value", BinaryType())], {"topic": "nope"}, "option 'topic': topic 'nope' does not exist"),
        ([("value", BinaryType())], {"compresion": "lz4"}, "option 'compresion'"),
        ([("value", BinaryType())], {"compression": "brotli9"}, "option 'compression'"),
        ([("value", BinaryType())], {"batchSize": "many"}, "option 'batchSize'"),
        ([("value", BinaryType())], {"batchSize": "0"}, "option 'batchSize'"),
        ([("value", BinaryType())], {"path": None}, "option 'url'"),
        ([("value", BinaryType())], {"checkpointLocation": None}, "option 'checkpointLocation'"),
    ],
)
def test_bad_options_and_columns_name_the_culprit(
    tmp_path: Path, fields: list[tuple[str, Any]], options: dict[str, str | None], named: str
) -> None:
    root = make_root(tmp_path, {"out": 2})
    schema = StructType([StructField(n, t) for n, t in fields])
    opts: dict[str, str | None] = {"path": root, "topic": "out", "checkpointLocation": "/ck", **options}
    with pytest.raises(PlogError, match=re.escape(named)):
        PlogStreamWriter({k: v for k, v in opts.items() if v is not None}, schema)


def test_good_schemas_are_accepted(tmp_path: Path) -> None:
    root = make_root(tmp_path, {"out": 2})
    schema = StructType(
        [
            StructField("Key", StringType()),
            StructField("VALUE", StringType()),
            StructField("topic", StringType()),
            StructField("partition", LongType()),
            StructField("headers", HEADERS),
            StructField("timestamp", TimestampType()),
            StructField("offset", LongType()),
            StructField("timestampType", IntegerType()),  # the source's: ignored
        ]
    )
    PlogStreamWriter({"url": root, "transactionalId": "t"}, schema)  # topic column, no option: fine
    PlogBatchWriter({"url": root}, schema)  # no checkpoint needed for a batch write
    with pytest.raises(InvalidConfigError, match="option 'mode'"):
        PlogBatchWriter({"url": root}, schema, overwrite=True)


def test_sink_id_comes_from_the_checkpoint_or_the_transactional_id() -> None:
    a = sink_id_for({"checkpointLocation": "/data/ck/q1"})
    assert a == sink_id_for({"checkpointlocation": "/data/ck/q1/"})
    assert (
        a
        == sink_id_for({"checkpointLocation": "file:///data/ck/q1"})
        == sink_id_for({"checkpointLocation": "file:/data/ck/q1"})
    )
    assert a != sink_id_for({"checkpointLocation": "/data/ck/q2"})
    assert sink_id_for({"checkpointLocation": "/x", "transactionalId": "orders-sink"}) == "orders-sink"
    with pytest.raises(InvalidConfigError, match="checkpointLocation.*transactionalId.*at-least-once"):
        sink_id_for({"topic": "t"})
    # Spark keeps the query id in the checkpoint: a query re-created at the same location is another sink.
    assert transactional_id_for(a, "q-1") != transactional_id_for(a, "q-2")
    assert transactional_id_for(a, "q-1") == transactional_id_for(a, "q-1")


# ---------------------------------------------------------------------------- routing (no JVM)


def test_records_go_where_kafkas_partitioner_puts_them(tmp_path: Path, task_context: Any) -> None:
    root = make_root(tmp_path, {"out": 5})
    task_context(0)
    keys = [f"user-{i % 37}".encode() for i in range(3000)]
    vals = [f"v{i}".encode() for i in range(3000)]
    writer = stream_writer(root, batchSize="700")
    message = writer.write(batches(kv(keys, vals), 256))
    assert message.records == 3000
    writer.commit([message], 0)
    got = committed(root, "out")
    assert sorted(values(got)) == sorted(vals)
    for key, part in zip(got.column("key").to_pylist(), got.column("partition").to_pylist(), strict=True):
        assert part == kafka_partition(key, 5)
    # Per key, the order of the input.
    by_key: dict[bytes, list[int]] = collections.defaultdict(list)
    for key, value in zip(got.column("key").to_pylist(), values(got), strict=True):
        by_key[key].append(int(value[1:]))
    assert all(seq == sorted(seq) for seq in by_key.values())
    # Stored batches of at most batchSize rows.
    r = LogRoot(root)
    for p in range(5):
        for ref in r.partition("out", p).view().segments:
            idx = r.partition("out", p).index(ref)
            assert max(idx.table.column("record_count").to_pylist()) <= 700
    r.close()


def test_null_keys_are_spread_and_partition_column_wins(tmp_path: Path, task_context: Any) -> None:
    root = make_root(tmp_path, {"out": 4})
    task_context(0)
    n = 8000
    table = kv([None] * n, [f"n{i}".encode() for i in range(n)])
    writer = stream_writer(root)
    writer.commit([writer.write(batches(table, 500))], 0)
    got = committed(root, "out")
    assert got.num_rows == n
    counts = collections.Counter(got.column("partition").to_pylist())
    assert len(counts) == 4 and min(counts.values()) >= 1000, counts  # spread, a batch at a time

    schema = StructType(
        [StructField("key", StringType()), StructField("value", StringType()), StructField("partition", IntegerType())]
    )
    table = pa.table(
        {
            "key": ["a", "b", "c", None],
            "value": ["x0", "x1", "x2", "x3"],
            "partition": pa.array([3, None, 0, 2], pa.int32()),
        }
    )
    task_context(1)
    writer = stream_writer(root, schema)
    writer.commit([writer.write(batches(table))], 1)
    got = committed(root, "out")
    placed = {v: p for v, p in zip(values(got), got.column("partition").to_pylist(), strict=True) if v.startswith(b"x")}
    assert placed == {b"x0": 3, b"x1": kafka_partition(b"b", 4), b"x2": 0, b"x3": 2}


def test_topic_column_routes_and_the_topic_option_overrides_it(tmp_path: Path, task_context: Any) -> None:
    root = make_root(tmp_path, {"left": 2, "right": 3, "forced": 1})
    schema = StructType(
        [
            StructField("topic", StringType()),
            StructField("value", BinaryType()),
            StructField("headers", HEADERS),
            StructField("timestamp", TimestampType()),
            StructField("offset", LongType()),
        ]
    )
    n = 1200
    ts = pa.array(
        [dt.datetime.fromtimestamp((T0 + i) / 1000, dt.timezone.utc) for i in range(n)], pa.timestamp("us", tz="UTC")
    )
    headers = pa.array(
        [[{"key": "h", "value": str(i).encode()}] if i % 3 == 0 else None for i in range(n)],
        pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])),
    )
    table = pa.table(
        {
            "topic": ["left" if i % 2 else "right" for i in range(n)],
            "value": [f"r{i}".encode() for i in range(n)],
            "headers": headers,
            "timestamp": ts,
            "offset": pa.array(range(n), pa.int64()),
        }
    )
    task_context(0)
    writer = PlogStreamWriter({"url": root, "checkpointLocation": "/ck/routing"}, schema)
    writer.commit([writer.write(batches(table, 100))], 0)
    left, right = committed(root, "left"), committed(root, "right")
    assert sorted(values(left)) == sorted(f"r{i}".encode() for i in range(1, n, 2))
    assert sorted(values(right)) == sorted(f"r{i}".encode() for i in range(0, n, 2))
    both = pa.concat_tables([left, right])
    for value, stamp, hdrs in zip(
        values(both), both.column("timestamp").to_pylist(), both.column("headers").to_pylist(), strict=True
    ):
        i = int(value[1:])
        assert stamp == dt.datetime.fromtimestamp((T0 + i) / 1000, dt.timezone.utc)
        assert hdrs == ([{"key": "h", "value": str(i).encode()}] if i % 3 == 0 else None)

    task_context(1)
    writer = PlogStreamWriter({"url": root, "checkpointLocation": "/ck/routing", "topic": "forced"}, schema)
    writer.commit([writer.write(batches(table, 100))], 1)
    assert committed(root, "forced").num_rows == n  # the option overrides the column, as in Kafka's sink


@pytest.mark.parametrize(
    ("table", "named"),
    [
        (
            pa.table({"value": [b"a", b"b"], "partition": pa.array([0, 7], pa.int32())}),
            "column 'partition': partition 7 does not exist in topic 'out'",
        ),
        (
            pa.table({"value": [b"a", b"b"], "partition": pa.array([0, -1], pa.int32())}),
            "column 'partition': partition -1 does not exist",
        ),
        (pa.table({"value": [b"a", b"b"], "topic": ["out", "ghost"]}), "column 'topic': topic 'ghost' does not"),
        (pa.table({"value": [b"a", b"b"], "topic": ["out", None]}), "column 'topic': is null in 1 row"),
        (pa.table({"value": [b"a", b"b"], "timestamp": pa.array([5, -5], pa.int64())}), "column 'timestamp'"),
        (
            pa.table(
                {
                    "value": [b"a", b"b"],
                    "headers": pa.array(
                        [None, [{"key": None, "value": b"x"}]],
                        pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
                    ),
                }
            ),
            "column 'headers'",
        ),
    ],
)
def test_bad_rows_name_the_column_and_nothing_becomes_visible(
    tmp_path: Path, task_context: Any, table: pa.Table, named: str
) -> None:
    root = make_root(tmp_path, {"out": 2})
    fields = {
        "value": BinaryType(),
        "partition": IntegerType(),
        "topic": StringType(),
        "timestamp": LongType(),
        "headers": HEADERS,
    }
    schema = StructType([StructField(n, fields[n]) for n in table.column_names])
    task_context(0)
    good = stream_writer(root, schema, topic=None if "topic" in table.column_names else "out")
    # A first task writes good rows; the second fails on its bad row: the job fails, nothing is committed.
    first = good.write(batches(pa.Table.from_pylist(table.slice(0, 1).to_pylist(), schema=table.schema)))
    with pytest.raises(PlogError, match=re.escape(named)):
        good.write(batches(table))
    good.abort([first, None], 0)
    assert committed(root, "out").num_rows == 0


# ---------------------------------------------------------------------------- commits and replays (no JVM)


@pytest.mark.parametrize("layout", ["shared", "partitioned"])
def test_a_micro_batch_is_invisible_until_commit_then_visible_everywhere_at_once(
    tmp_path: Path, task_context: Any, layout: str
) -> None:
    root = make_root(tmp_path, {"a": 3, "b": 2}, layout=layout)
    schema = StructType(
        [StructField("topic", StringType()), StructField("key", StringType()), StructField("value", StringType())]
    )
    with Producer(root) as producer:  # earlier, non-transactional records stay readable throughout
        producer.send_batch("a", pa.table({"value": ["before"] * 6, "partition": pa.array([0, 1, 2] * 2, pa.int32())}))
    writer = PlogStreamWriter({"url": root, "checkpointLocation": str(tmp_path / "ck")}, schema)
    task_context(0)
    rows = [{"topic": "a" if i % 3 else "b", "key": f"k{i % 11}", "value": f"m{i}"} for i in range(900)]
    messages = [
        writer.write(batches(pa.Table.from_pylist(rows[:450]), 100)),
        writer.write(batches(pa.Table.from_pylist(rows[450:]), 100)),
    ]
    assert sorted(values(committed(root, "a"))) == [b"before"] * 6
    assert committed(root, "b").num_rows == 0
    if layout == "shared":
        # The tasks created objects and no commit: nothing is in the log yet, not even undecided records.
        assert [end for _, end in stable_and_end(root, "a")] == [2, 2, 2]
        assert [end for _, end in stable_and_end(root, "b")] == [0, 0]
        assert all(m.written and not m.batches for m in messages)
    else:
        assert all(stable < end for stable, end in stable_and_end(root, "b"))  # the LSO waits at the transaction
    writer.commit(messages, 0)
    a, b = committed(root, "a"), committed(root, "b")
    assert a.num_rows == 6 + 600 and b.num_rows == 300
    assert all(stable == end for stable, end in stable_and_end(root, "a") + stable_and_end(root, "b"))
    # One decision object made it visible in both topics.
    decisions = [p for p in Path(root, "_coordinator", "transactions").rglob("*.json")]
    assert len(decisions) == 1
    assert set(json.loads(decisions[0].read_text())["batches"]) == {"a", "b"}
    if layout == "shared":  # one commit per topic for the micro-batch, naming both tasks' objects
        for topic in ("a", "b"):
            commits = sorted(Path(root, "topics", topic).rglob("commits/*.json"))
            last = json.loads(commits[-1].read_text())
            assert len(commits) == (2 if topic == "a" else 1)
            assert {e["object"] for e in last["entries"]} == {w.key for m in messages for w in m.written}
            assert {e["transaction_timeout_ms"] for e in last["entries"]} == {60_000}


def test_a_driver_killed_between_its_commits_and_its_decision_stalls_readers_for_a_minute_at_most(
    tmp_path: Path, task_context: Any
) -> None:
    """A micro-batch into shared topics is committed by the driver, then decided (PROTOCOL.md 11.2): a driver
    that dies in between leaves transactional entries that hold read_committed readers back only for the
    commits' one-minute timeout, and the replay makes the batch visible once, the dead run's entries never."""
    from pyspark_logsource.spark.sink_commit import commit_shared

    root = make_root(tmp_path, {"out": 4})
    data = kv([f"k{i % 7}".encode() for i in range(400)], [f"v{i}".encode() for i in range(400)])
    writer = stream_writer(root, checkpointLocation=str(tmp_path / "ck"))
    task_context(3)
    first = [writer.write(batches(data.slice(0, 200))), writer.write(batches(data.slice(200)))]
    # The driver's commits land, and it dies before the decision.
    ranges = commit_shared(LogRoot(root), first, transaction_timeout_ms=60_000)
    assert sum(last - base + 1 for parts in ranges.values() for spans in parts.values() for base, last in spans) == 400
    assert committed(root, "out").num_rows == 0
    written = [(stable, end) for stable, end in stable_and_end(root, "out") if end]
    assert written and all(stable == 0 for stable, _end in written)  # undecided: readers wait at the start
    # Readers wait at most the commits' timeout: then anyone may abort it (here, as a reader would).
    with LogRoot(root) as r:
        logs = [r.partition("out", p) for p in range(4)]
        timeouts = {log.index(ref).meta.transaction_timeout_ms for log in logs for ref in log.view().segments}
    assert timeouts == {60_000}
    # The restarted query re-runs batch 3 under the same producer id (no decision yet): its own tasks'
    # objects are committed and decided; the dead run's entries are not listed, so never visible.
    rerun = [writer.write(batches(data.slice(0, 200))), writer.write(batches(data.slice(200)))]
    assert {m.producer_id for m in rerun} == {first[0].producer_id}
    writer.commit(rerun, 3)
    assert sorted(values(committed(root, "out"))) == sorted(values(data))
    assert all(stable == end for stable, end in stable_and_end(root, "out"))
    assert sum(end for _, end in stable_and_end(root, "out")) == 800  # the dead run's entries, aborted


def test_a_micro_batch_into_a_wide_shared_topic_is_one_object_per_task_and_one_commit(
    tmp_path: Path, task_context: Any
) -> None:
    """16 tasks into 64 partitions: 16 objects, one commit, one decision and the notices, however many
    partitions each task touches (the object and PUT counts of a micro-batch, counted at the store)."""
    from tests.counting_store import CountingStore

    root = make_root(tmp_path, {"out": 64})
    counting = CountingStore(LogRoot(root).store)
    shared_root = LogRoot(root, store=counting)
    workers._ROOTS[(root, json.dumps({}, sort_keys=True))] = (
        shared_root,
        TransactionCoordinator(counting, shared_root.protocol).for_reader(shared_root),
    )
    writer = stream_writer(root, checkpointLocation=str(tmp_path / "ck"))
    task_context(0)
    writer.commit([writer.write(batches(kv([None], [b"warm"])))], 0)  # the worker's first look at the root
    task_context(1)
    data = kv([f"key-{i}".encode() for i in range(16 * 640)], [b"x" * 100] * (16 * 640))
    before = {k: counting.calls[k] for k in counting.calls}
    messages = [writer.write(batches(data.slice(t * 640, 640))) for t in range(16)]
    assert all(len({run.partition for w in m.written for run in w.runs}) > 32 for m in messages)
    writer.commit(messages, 1)
    puts = {top: n - before.get(("put", top), 0) for (op, top), n in counting.calls.items() if op == "put"}
    creates = sum(puts.values())
    assert puts.get("shared", 0) == 16, puts
    assert puts.get("topics", 0) <= 3, puts  # the commit and the topic's notice (a tier merge may add one)
    assert creates <= 22, puts
    assert committed(root, "out").num_rows == 1 + 16 * 640


def test_streaming_tasks_hand_over_their_small_objects_within_a_bound_and_batch_writes_do_not(
    tmp_path: Path, task_context: Any
) -> None:
    """A streaming task's commit message carries the objects it created, byte for byte, up to 256 KiB each and
    512 KiB in all (PROTOCOL.md 10.1); a batch write's carries none (its tasks' results would add up against
    ``spark.driver.maxResultSize`` for one pass's worth of merging)."""
    from pyspark_logsource.spark import task_writer as sink_module

    root = make_root(tmp_path, {"out": 8}, layout="partitioned")  # a shared flush hands nothing over
    schema = StructType([StructField("value", BinaryType()), StructField("partition", IntegerType())])
    rows = pa.table(
        {
            "value": [os.urandom(1000) for _ in range(8 * 150)],
            "partition": pa.array([i % 8 for i in range(8 * 150)], pa.int32()),
        }
    )
    task_context(0)
    stream = PlogStreamWriter({"url": root, "checkpointLocation": str(tmp_path / "ck"), "topic": "out"}, schema)
    message = stream.write(batches(rows, 100))
    sizes = sorted(len(data) for data in message.objects.values())
    assert 0 < len(sizes) < 8 and sum(sizes) <= sink_module.HANDED_TASK_BYTES, sizes  # 8 objects of ~150 KB
    assert max(sizes) <= sink_module.HANDED_OBJECT_BYTES
    store = LogRoot(root).store
    assert all(store.get(key) == data for key, data in message.objects.items())
    batch_writer = PlogBatchWriter({"url": root, "topic": "out"}, schema)
    assert batch_writer.write(batches(rows, 100)).objects == {}


def test_replays_are_never_visible_twice(tmp_path: Path, task_context: Any) -> None:
    root = make_root(tmp_path, {"out": 3})
    data = kv([f"k{i % 7}".encode() for i in range(600)], [f"v{i}".encode() for i in range(600)])
    writer = stream_writer(root, checkpointLocation=str(tmp_path / "ck"))
    task_context(4)

    # Run 1 of batch 4: both tasks write, then the driver dies before commit.
    writer.write(batches(data.slice(0, 300)))
    writer.write(batches(data.slice(300)))
    # Run 2 (the restarted query re-runs batch 4): a failed attempt of task 1, its retry, and task 2.
    writer.write(batches(data.slice(0, 100)))  # failed attempt: Spark drops its message
    messages = [writer.write(batches(data.slice(0, 300))), writer.write(batches(data.slice(300)))]
    writer.commit(messages, 4)
    got = committed(root, "out")
    assert sorted(values(got)) == sorted(values(data))  # once, not three times
    assert all(stable == end for stable, end in stable_and_end(root, "out"))  # the garbage is decided: aborted

    # commit(messages, batchId) called again for the same batch: nothing changes, not even the log's end.
    ends = [end for _, end in stable_and_end(root, "out")]
    writer.commit(messages, 4)
    assert committed(root, "out").num_rows == 600
    assert [end for _, end in stable_and_end(root, "out")] == ends
    # Run 3 (Spark lost its own commit record and re-runs batch 4 once more): the tasks find the decision.
    ends_before = [end for _, end in stable_and_end(root, "out")]
    again = [writer.write(batches(data.slice(0, 300))), writer.write(batches(data.slice(300)))]
    assert all(m.replayed and m.records == 0 for m in again)
    writer.commit(again, 4)
    assert [end for _, end in stable_and_end(root, "out")] == ends_before  # not even invisible garbage
    assert committed(root, "out").num_rows == 600

    # The next batch goes on as usual; the per-batch transaction numbers are the batch ids.
    task_context(5)
    writer.commit([writer.write(batches(kv([b"k1"], [b"late"])))], 5)
    got = committed(root, "out")
    assert got.num_rows == 601 and values(got).count(b"late") == 1


@pytest.mark.parametrize(
    ("layout", "option", "expected_ms"),
    [
        ("partitioned", None, 15 * 60 * 1000),
        ("partitioned", "90s", 90_000),
        ("partitioned", "10m", 600_000),
        ("shared", None, 60_000),  # the driver commits in one step: a minute, not the micro-batch's length
        ("shared", "30s", 30_000),
    ],
)
def test_sink_appends_carry_the_sink_transaction_timeout_as_a_typed_field(
    tmp_path: Path, task_context: Any, layout: str, option: str | None, expected_ms: int
) -> None:
    root = make_root(tmp_path, {"out": 2}, layout=layout)
    writer = stream_writer(root, checkpointLocation=str(tmp_path / "ck"), transactionTimeout=option)
    task_context(0)
    writer.commit([writer.write(batches(kv([b"k1", b"k2", b"k3"], [b"a", b"b", b"c"])))], 0)
    logs = [LogRoot(root).partition("out", p) for p in range(2)]
    metas = [log.index(ref).meta for log in logs for ref in log.view().segments]
    assert metas and all(m.transaction_timeout_ms == expected_ms for m in metas)
    assert all("transaction.timeout.ms" not in m.extra for m in metas)


@pytest.mark.parametrize("bad", ["soon", "0", "500ms", "8d", "2h"])  # 2h: above the 15 min cap (PROTOCOL.md 11.2)
def test_a_bad_transaction_timeout_names_the_option(tmp_path: Path, bad: str) -> None:
    with pytest.raises(InvalidConfigError, match="transactionTimeout"):
        stream_writer(make_root(tmp_path, {"out": 1}), transactionTimeout=bad)


def test_a_micro_batch_aborted_by_its_timeout_is_re_run_under_a_new_transaction(
    tmp_path: Path, task_context: Any
) -> None:
    root = make_root(tmp_path, {"out": 2})
    data = kv([f"k{i % 5}".encode() for i in range(400)], [f"v{i}".encode() for i in range(400)])
    writer = stream_writer(root, checkpointLocation=str(tmp_path / "ck"))
    task_context(0)
    writer.commit([writer.write(batches(data.slice(0, 100)))], 0)
    # Batch 1: the tasks write, the driver dies before commit, and the query stays down past the sink's
    # transaction timeout: maintenance aborts the transaction.
    task_context(1)
    lost = [writer.write(batches(data.slice(100, 150))), writer.write(batches(data.slice(250)))]
    TransactionCoordinator(LogRoot(root).store).abort_if_undecided(lost[0].producer_id, 1)
    assert sorted(values(committed(root, "out"))) == sorted(values(data.slice(0, 100)))
    assert all(stable == end for stable, end in stable_and_end(root, "out"))  # the aborted batch holds nothing
    with pytest.raises(PlogError, match="micro-batch 1 .* was aborted .* Restart the query"):
        writer.commit(lost, 1)  # a commit that comes too late cannot make the aborted data visible
    # The restarted query re-runs batch 1: it goes to a new producer id, and commits there, once.
    rerun = [writer.write(batches(data.slice(100, 150))), writer.write(batches(data.slice(250)))]
    assert {m.producer_id for m in rerun} != {lost[0].producer_id} and len({m.producer_id for m in rerun}) == 1
    writer.commit(rerun, 1)
    assert sorted(values(committed(root, "out"))) == sorted(values(data))
    # A replay of the re-run finds its commit and writes nothing; the next batch is back on the sink's own id.
    again = [writer.write(batches(data.slice(100, 150)))]
    assert again[0].replayed and again[0].producer_id == rerun[0].producer_id
    writer.commit(again, 1)
    task_context(2)
    last = writer.write(batches(kv([b"k1"], [b"late"])))
    assert last.producer_id == lost[0].producer_id
    writer.commit([last], 2)
    assert committed(root, "out").num_rows == 401
    assert all(stable == end for stable, end in stable_and_end(root, "out"))


def test_a_query_recreated_at_the_same_checkpoint_location_is_not_mistaken_for_a_replay(
    tmp_path: Path, task_context: Any
) -> None:
    root = make_root(tmp_path, {"out": 1})
    writer = stream_writer(root, checkpointLocation=str(tmp_path / "ck"))
    task_context(0, "first-query")
    writer.commit([writer.write(batches(kv([None], [b"one"])))], 0)
    # The checkpoint was deleted and the query started again: Spark gives it a new query id, batch 0 again.
    task_context(0, "second-query")
    message = writer.write(batches(kv([None], [b"two"])))
    assert not message.replayed
    writer.commit([message], 0)
    assert values(committed(root, "out")) == [b"one", b"two"]


def test_empty_batches_create_no_decision(tmp_path: Path, task_context: Any) -> None:
    root = make_root(tmp_path, {"out": 1})
    writer = stream_writer(root)
    task_context(0)
    writer.commit([writer.write(iter([])), writer.write(batches(kv([], [])))], 0)
    writer.commit([], 1)
    assert not Path(root, "_coordinator", "transactions").exists()


def test_the_micro_batch_id_is_required(tmp_path: Path, task_context: Any) -> None:
    root = make_root(tmp_path, {"out": 1})
    task_context(None)
    with pytest.raises(PlogError, match="micro-batch id"):
        stream_writer(root).write(batches(kv([None], [b"x"])))


def test_commit_messages_survive_pickling(tmp_path: Path) -> None:
    import pickle

    message = PlogCommitMessage({"t": {"0": [[0, 9]]}}, 10, 3, 7)
    assert pickle.loads(pickle.dumps(message)) == message
    root = make_root(tmp_path, {"out": 1})
    writer = stream_writer(root)
    writer._root()  # a cached root is not pickled with the writer
    assert "_cached_root" not in pickle.loads(pickle.dumps(writer)).__dict__


# ---------------------------------------------------------------------------- through Spark


def produce_keyed(
    root: str, topic: str, n: int, start: int = 0, storage: dict[str, Any] | None = None, keys: int = 20
) -> None:
    """``n`` records keyed ``k<i % keys>`` with values ``<topic>:<i>`` and timestamps ``T0 + i``."""
    idx = range(start, start + n)
    with Producer(root, storage) as producer:
        producer.send_batch(
            topic,
            pa.table(
                {
                    "key": pa.array([f"k{i % keys}".encode() for i in idx], pa.binary()),
                    "value": pa.array([f"{topic}:{i}".encode() for i in idx], pa.binary()),
                    "timestamp": pa.array([T0 + i for i in idx], pa.int64()),
                    "headers": pa.array(
                        [[{"key": "i", "value": str(i).encode()}] for i in idx],
                        pa.list_(
                            pa.struct([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())])
                        ),
                    ),
                }
            ),
        )


def run_available_now(query: Any, timeout: float = 240) -> Any:
    assert query.awaitTermination(timeout), "the query did not finish"
    if query.exception() is not None:
        raise AssertionError(str(query.exception()))
    return query


@pytest.mark.spark
def test_stream_plog_to_plog_exactly_once(spark: Any, tmp_path: Path) -> None:
    root = make_root(tmp_path, {"in": 3, "even": 4, "odd": 2})
    produce_keyed(root, "in", 1500)
    ck = str(tmp_path / "ck")

    def start() -> Any:
        return (
            spark.readStream.format("plog")
            .option("subscribe", "in")
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "500")
            .option("includeHeaders", "true")
            .load(root)
            .selectExpr(
                "key",
                "upper(cast(value as string)) as value",
                "headers",
                "timestamp",
                "case when cast(split(cast(value as string), ':')[1] as int) % 2 = 0 "
                "then 'even' else 'odd' end as topic",
            )
            .writeStream.format("plog")
            .option("checkpointLocation", ck)
            .trigger(availableNow=True)
            .start(root)
        )

    query = run_available_now(start())
    assert len([p for p in query.recentProgress if p["numInputRows"]]) >= 3  # several micro-batches
    even, odd = committed(root, "even"), committed(root, "odd")
    assert sorted(values(even)) == sorted(f"IN:{i}".encode() for i in range(0, 1500, 2))
    assert sorted(values(odd)) == sorted(f"IN:{i}".encode() for i in range(1, 1500, 2))
    for table, parts in ((even, 4), (odd, 2)):
        for row in table.to_pylist():
            i = int(row["value"].split(b":")[1])
            assert row["partition"] == kafka_partition(row["key"], parts)
            assert row["timestamp"] == dt.datetime.fromtimestamp((T0 + i) / 1000, dt.timezone.utc)
            assert row["headers"] == [{"key": "i", "value": str(i).encode()}]
        order = collections.defaultdict(list)
        for row in table.to_pylist():
            order[row["key"]].append(int(row["value"].split(b":")[1]))
        assert all(seq == sorted(seq) for seq in order.values())  # per-key order kept

    # New records: the restarted query writes only those (its checkpoint remembers the rest).
    produce_keyed(root, "in", 500, start=1500)
    run_available_now(start())
    total = committed(root, "even").num_rows + committed(root, "odd").num_rows
    assert total == 2000
    assert all(s == e for s, e in stable_and_end(root, "even") + stable_and_end(root, "odd"))


@pytest.mark.spark
def test_format_plog_resolves_for_writes_without_registration(spark: Any, tmp_path: Path) -> None:
    root = make_root(tmp_path, {"out": 2})
    spark.createDataFrame([("a", "1")], "key string, value string").write.format("plog").option("topic", "out").mode(
        "append"
    ).save(root)
    assert values(committed(root, "out")) == [b"1"]


@pytest.mark.spark
def test_a_replayed_micro_batch_is_not_written_twice(spark: Any, tmp_path: Path) -> None:
    root = make_root(tmp_path, {"in": 2, "out": 2})
    produce_keyed(root, "in", 400)
    ck = tmp_path / "ck"

    def start() -> Any:
        return (
            spark.readStream.format("plog")
            .option("subscribe", "in")
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "150")
            .load(root)
            .selectExpr("key", "value")
            .writeStream.format("plog")
            .option("topic", "out")
            .option("checkpointLocation", str(ck))
            .trigger(availableNow=True)
            .start(root)
        )

    run_available_now(start())
    assert committed(root, "out").num_rows == 400
    # Spark lost the record of its last commit (the driver died right after the sink committed): it re-runs
    # that micro-batch from its offsets log, and the sink's commit is called again for the same batch id.
    last = max(int(p.name) for p in (ck / "commits").iterdir() if p.name.isdigit())
    (ck / "commits" / str(last)).unlink()
    (ck / "commits" / f".{last}.crc").unlink(missing_ok=True)
    ends = [end for _, end in stable_and_end(root, "out")]
    query = run_available_now(start())
    assert [p["batchId"] for p in query.recentProgress if p["numInputRows"]] == [last]
    assert sorted(values(committed(root, "out"))) == sorted(f"in:{i}".encode() for i in range(400))
    assert [end for _, end in stable_and_end(root, "out")] == ends  # its tasks saw the decision: no writes


@pytest.mark.spark
def test_batch_write_is_one_transaction(spark: Any, tmp_path: Path) -> None:
    root = make_root(tmp_path, {"x": 3, "y": 1})
    df = spark.range(0, 3000, 1, 4).selectExpr(
        "case when id % 3 = 0 then 'y' else 'x' end as topic",
        "cast(id % 17 as string) as key",
        "cast(id as string) as value",
    )
    df.write.format("plog").mode("append").save(root)
    assert committed(root, "x").num_rows == 2000 and committed(root, "y").num_rows == 1000
    decisions = list(Path(root, "_coordinator", "transactions").rglob("*.json"))
    assert len(decisions) == 1  # four tasks, two topics, one transaction
    assert set(json.loads(decisions[0].read_text())["batches"]) == {"x", "y"}

    # A failed job: most tasks write, one row names a partition that does not exist; nothing is visible,
    # and the job's transaction is aborted, so records written after it are not held back.
    bad = spark.range(0, 3000, 1, 4).selectExpr(
        "cast(id as string) as value", "cast(case when id = 2999 then 9 else id % 3 end as int) as partition"
    )
    with pytest.raises(Exception, match=r"column 'partition': partition 9 does not exist in topic 'x'"):
        bad.selectExpr("'x' as topic", "*").write.format("plog").mode("append").save(root)
    assert committed(root, "x").num_rows == 2000
    states = [json.loads(p.read_text())["state"] for p in Path(root, "_coordinator", "transactions").rglob("*.json")]
    assert sorted(states) == sorted([COMMITTED, ABORTED])
    # A job into one shared topic commits once or not at all: no transaction, so no decision even to abort.
    with pytest.raises(Exception, match=r"column 'partition': partition 9 does not exist in topic 'x'"):
        bad.write.format("plog").option("topic", "x").mode("append").save(root)
    assert committed(root, "x").num_rows == 2000
    assert len(list(Path(root, "_coordinator", "transactions").rglob("*.json"))) == 2
    assert all(stable == end for stable, end in stable_and_end(root, "x"))
    with Producer(root) as producer:
        producer.send_batch("x", pa.table({"value": [b"after"] * 3, "partition": pa.array([0, 1, 2], pa.int32())}))
    assert values(committed(root, "x")).count(b"after") == 3

    # A good job into one shared topic: one commit makes its four tasks' objects visible, with no decision.
    commits_before = len(list(Path(root, "topics", "x").rglob("commits/*.json")))
    df.selectExpr("key", "value").write.format("plog").option("topic", "x").mode("append").save(root)
    assert committed(root, "x").num_rows == 2000 + 3 + 3000
    assert len(list(Path(root, "topics", "x").rglob("commits/*.json"))) == commits_before + 1
    assert len(list(Path(root, "_coordinator", "transactions").rglob("*.json"))) == 2

    with pytest.raises(Exception, match="option 'mode'"):
        df.write.format("plog").mode("overwrite").save(root)


@pytest.mark.spark
def test_spark_errors_name_the_culprit_and_write_nothing(spark: Any, tmp_path: Path) -> None:
    root = make_root(tmp_path, {"in": 2, "out": 2})
    produce_keyed(root, "in", 100)

    def source() -> Any:
        return (
            spark.readStream.format("plog").option("subscribe", "in").option("startingOffsets", "earliest").load(root)
        )

    def run(df: Any, name: str, **options: str) -> str:
        writer = df.writeStream.format("plog").option("checkpointLocation", str(tmp_path / name))
        for key, value in options.items():
            writer = writer.option(key, value)
        try:
            query = writer.trigger(availableNow=True).start(root)
            query.awaitTermination(120)
            error = query.exception()
        except Exception as exc:  # noqa: BLE001 - some errors surface from start() itself
            error = exc
        assert error is not None, f"{name}: the query did not fail"
        return str(error)

    assert "column 'value'" in run(source().selectExpr("key"), "novalue", topic="out")
    assert "column 'value'" in run(source().selectExpr("key", "offset as value"), "intvalue", topic="out")
    assert "column 'key'" in run(source().selectExpr("partition as key", "value"), "intkey", topic="out")
    assert "option 'topic': topic 'nope' does not exist" in run(source().selectExpr("value"), "notopic", topic="nope")
    assert "option 'topic'" in run(source().selectExpr("value"), "topicless")
    assert "column 'partition': partition 5 does not exist in topic 'out'" in run(
        source().selectExpr("value", "cast(if(offset = 40, 5, offset % 2) as int) as partition"),
        "badpartition",
        topic="out",
    )
    assert "column 'topic': topic 'ghost' does not exist" in run(
        source().selectExpr("value", "case when offset = 7 then 'ghost' else 'out' end as topic"), "ghost"
    )
    assert committed(root, "out").num_rows == 0

    # Without a checkpointLocation option (the checkpoint comes from the session's default location) the sink
    # cannot tell its id: the query fails at start instead of writing at-least-once.
    spark.conf.set("spark.sql.streaming.checkpointLocation", str(tmp_path / "default-ck"))
    try:
        query = (
            source()
            .selectExpr("value")
            .writeStream.format("plog")
            .option("topic", "out")
            .trigger(availableNow=True)
            .start(root)
        )
        query.awaitTermination(120)
        error = str(query.exception())
    except Exception as exc:  # noqa: BLE001
        error = str(exc)
    finally:
        spark.conf.unset("spark.sql.streaming.checkpointLocation")
    assert "option 'checkpointLocation'" in error and "at-least-once" in error
    assert committed(root, "out").num_rows == 0


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_plog_demo_runs_the_spark_pipeline_and_goes_on_from_its_checkpoint(tmp_path: Path) -> None:
    """``plog demo`` twice in a row: the second run's streaming query counts only the new events."""
    if not java_available():
        pytest.skip("Java is not installed: Spark tests need a JVM")
    env = {**{k: v for k, v in os.environ.items() if k not in ("PLOG_URL", "COLUMNS")}, **spark_test_env()}

    def demo(records: int) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "pyspark_logsource.cli", "demo", "--records", str(records)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            timeout=300,
            check=False,
        )
        out = done.stdout.decode()
        assert done.returncode == 0, done.stderr.decode()[-5000:] + out
        err = done.stderr.decode()
        for noise in ("log4j", "incubator", "NativeCodeLoader", "Setting default log level"):
            assert noise not in err, f"the JVM's start-up line {noise!r} in plog demo's stderr:\n{err[-3000:]}"
        return out

    first = demo(1500)
    assert "every event counted once" in first
    assert "add up to 1,500; 'clicks' holds 1,500 events" in first
    assert "1,500 new event(s) in" in first and "✗" not in first
    second = demo(1200)
    assert "1,200 new event(s) in" in second  # only the new events: the query went on from its checkpoint
    assert "add up to 2,700; 'clicks' holds 2,700 events" in second and "✗" not in second
    assert (tmp_path / "plog-data" / "_spark" / "checkpoints" / "clicks-per-user" / "commits").is_dir()
    counts = committed(str(tmp_path / "plog-data"), "clicks-per-user")
    newest: dict[bytes, int] = {}
    for key, value in zip(counts.column("key").to_pylist(), values(counts), strict=True):
        newest[key] = json.loads(value)["events"]
    assert sum(newest.values()) == 2700


# ---------------------------------------------------------------------------- the headline: SIGKILL, restart

KILL_DRIVER = """
root, checkpoint, trigger, storage = ARGS[:4]
sink_options = json.loads(ARGS[4]) if len(ARGS) > 4 else {}
# Nested options (config_kwargs) travel as JSON, which the plog options decode.
# Credentials become storage.secret.<name>, which Spark redacts (plog refuses a plain storage.key).
from pyspark_logsource.spark.credentials import spark_storage_options
options = spark_storage_options(json.loads(storage))
source = (spark.readStream.format("plog").options(**options)
          .option("subscribe", "A").option("startingOffsets", "earliest")
          .option("maxOffsetsPerTrigger", "300").load(root))
out = source.selectExpr(
    "key",
    "concat(upper(cast(value as string)), '|', cast(partition as string), ':', cast(offset as string)) as value")
writer = (out.writeStream.format("plog").options(**options, **sink_options).option("topic", "B")
          .option("checkpointLocation", checkpoint))
if trigger == "available-now":
    writer = writer.trigger(availableNow=True)
else:
    writer = writer.trigger(processingTime="500 milliseconds")
query = writer.start(root)
print("STARTED", flush=True)
tracker = spark.sparkContext.statusTracker()
seen, tasks = None, 0
while query.isActive:
    progress = query.lastProgress
    if progress is not None and progress["batchId"] != seen:
        seen = progress["batchId"]
        print(f"PROGRESS {seen} {progress['numInputRows']} {time.time():.3f}", flush=True)
    # Tasks running on executors, so that the test can kill an executor while it works on a batch.
    stages = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
    active = sum(info.numActiveTasks for info in stages if info is not None)
    if active != tasks:
        tasks = active
        print(f"TASKS {tasks} {time.time():.3f}", flush=True)
    time.sleep(0.05)
query.awaitTermination()
print("DONE", flush=True)
spark.stop()  # executors stopped in order, not lost at the JVM's exit (local-cluster)
"""


class KeyedWaves(threading.Thread):
    """Produces keyed records into topic A until stopped: values ``a-<key>-<n>``, ``n`` counting per key.

    A backlog of ``initial`` records first, then small waves (about ``rate`` records a second), so that the
    pipeline always has new data while it is killed and restarted.
    """

    def __init__(self, root: str, storage: dict[str, Any] | None, keys: int, initial: int, rate: int) -> None:
        super().__init__(daemon=True)
        self.root, self.storage, self.keys, self.initial, self.rate = root, storage, keys, initial, rate
        self.stop_event = threading.Event()
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.sent = 0

    def run(self) -> None:
        rnd = random.Random(11)
        counters = [0] * self.keys
        try:
            with Producer(self.root, self.storage, linger_ms=2) as producer:

                def send(n: int) -> None:
                    for _ in range(n):
                        k = rnd.randrange(self.keys)
                        producer.send("A", key=f"key-{k}".encode(), value=f"a-{k}-{counters[k]}".encode())
                        counters[k] += 1
                    producer.flush()
                    self.sent += n

                send(self.initial)
                self.ready.set()
                while not self.stop_event.is_set():
                    pause = rnd.uniform(0.2, 0.8)
                    send(max(1, int(self.rate * pause * rnd.uniform(0.5, 1.5))))
                    self.stop_event.wait(pause)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            self.ready.set()


def _driver(
    script: Path,
    root: str,
    checkpoint: Path,
    trigger: str,
    storage: dict[str, Any],
    log: Path,
    conf: dict[str, str],
    sink_options: dict[str, str] | None = None,
) -> subprocess.Popen:
    return start_driver(
        script,
        [root, str(checkpoint), trigger, json.dumps(storage), json.dumps(sink_options or {})],
        log,
        {"spark.sql.streaming.minBatchesToRetain": "1000", **conf},
    )


#: The conf of child drivers on ``local-cluster[2,1,1024]``: two executor JVMs, each started by a standalone
#: worker inside the driver's JVM (and relaunched by it when one dies), tuned like the driver's to start fast.
LOCAL_CLUSTER_CONF: dict[str, str] = {
    "spark.master": "local-cluster[2,1,1024]",
}


def _progress(log: Path, since: int) -> list[tuple[int, int, float]]:
    """(batch id, input rows, time) of the PROGRESS lines written after byte ``since`` of the driver's log."""
    text = log.read_bytes()[since:].decode(errors="replace").replace("\r", "\n")
    return [(int(b), int(n), float(t)) for b, n, t in re.findall(r"^PROGRESS (\d+) (\d+) ([\d.]+)$", text, re.M)]


def _active_tasks(log: Path, since: int) -> int:
    """Tasks running on executors by the newest TASKS line after byte ``since`` of the driver's log (0: none)."""
    text = log.read_bytes()[since:].decode(errors="replace").replace("\r", "\n")
    found = re.findall(r"^TASKS (\d+) [\d.]+$", text, re.M)
    return int(found[-1]) if found else 0


def _executors(driver: subprocess.Popen) -> list[int]:
    """The pids of the live executor JVMs (``CoarseGrainedExecutorBackend``) in ``driver``'s process group."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            cmdline = Path(entry.path, "cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        # Fields after the command name: state, ppid, pgrp. A zombie has an empty cmdline and is left out.
        state, _, pgrp = stat.rsplit(")", 1)[1].split()[:3]
        if int(pgrp) == driver.pid and state != "Z" and b"CoarseGrainedExecutorBackend" in cmdline:
            pids.append(int(entry.name))
    return sorted(pids)


def _checkpoint_state(checkpoint: Path) -> tuple[int, int]:
    """(newest batch in the offsets log, newest batch in the commit log), -1 for none."""

    def newest(d: Path) -> int:
        return max((int(p.name) for p in d.iterdir() if p.name.isdigit()), default=-1) if d.exists() else -1

    return newest(checkpoint / "offsets"), newest(checkpoint / "commits")


def _undecided_sink_batches(root: str, storage: dict[str, Any] | None) -> int:
    """Transactional batches in B whose transaction has no decision: written by tasks, not (yet) committed."""
    r = LogRoot(root, storage)
    coordinator = TransactionCoordinator(r.store)
    n = 0
    for p in range(r.topic("B").partitions):
        log = r.partition("B", p)
        for ref in log.view().segments:
            idx = log.index(ref).table
            for pid, txn, attrs in zip(
                idx.column("producer_id").to_pylist(),
                idx.column("transaction").to_pylist(),
                idx.column("attributes").to_pylist(),
                strict=True,
            ):
                if attrs & 16 and coordinator.decision(pid, txn) is None:
                    n += 1
    r.close()
    return n


def _kill_executor(
    proc: subprocess.Popen, log: Path, since: int, checkpoint: Path, rnd: random.Random, interval: float
) -> str:
    """SIGKILL one of ``proc``'s executor JVMs while it runs tasks of a batch, if that can be caught.

    Its Python workers exit with it (their daemon reads the JVM's end of a pipe). The driver lives on:
    Spark retries the lost tasks (``spark.task.maxFailures``, 4 outside ``local[N]``) on the other
    executor or on the one the standalone worker relaunches. Waits until the batch is committed and
    a new executor runs, and returns what happened, for the report.
    """
    wait_for(lambda: len(_executors(proc)) == 2, 120, "two executors", proc=proc, log=log, poll_s=0.1)
    # A random pause, then the first moment tasks run; after a while without any, a batch in flight will do.
    time.sleep(rnd.uniform(0.0, 2 * interval))
    deadline = time.monotonic() + 20
    while _active_tasks(log, since) == 0 and time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-6000:]
        time.sleep(0.02)
    if _active_tasks(log, since) == 0:

        def in_flight() -> bool:
            planned, done = _checkpoint_state(checkpoint)
            return planned > done

        wait_for(in_flight, 60, "a batch in flight", proc=proc, log=log, poll_s=0.05)
    victims = _executors(proc)
    victim = rnd.choice(victims)
    tasks = _active_tasks(log, since)
    planned, done = _checkpoint_state(checkpoint)
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(
        lambda: _checkpoint_state(checkpoint)[1] >= planned,
        120,
        f"batch {planned} to be committed after an executor was killed",
        proc=proc,
        log=log,
        poll_s=0.1,
    )
    committed_after = time.monotonic() - killed_at
    wait_for(
        lambda: len(_executors(proc)) == 2 and victim not in _executors(proc),
        120,
        "the killed executor to be relaunched",
        proc=proc,
        log=log,
        poll_s=0.1,
    )
    where = f"{tasks} task(s) running" if tasks else "no task seen running"
    state = f"mid-batch {planned}" if planned > done else f"between batches (last committed {done})"
    return f"{state}, {where}; batch {planned} committed {committed_after:.1f} s later"


def assert_b_holds_a_once(root: str, storage: dict[str, Any] | None, sent: int, others: int = 0) -> None:
    """B holds every record of A, transformed by KILL_DRIVER, once, in per-key order and Kafka's partition.

    ``sent`` is how many records A must hold; ``others`` how many records B holds that no query wrote
    (values without KILL_DRIVER's ``|partition:offset`` suffix), left out of the comparison.
    """
    a = committed(root, "A", storage)
    b = committed(root, "B", storage)
    expected = collections.Counter(
        (k, v.upper() + f"|{p}:{o}".encode())
        for k, v, p, o in zip(
            a.column("key").to_pylist(),
            values(a),
            a.column("partition").to_pylist(),
            a.column("offset").to_pylist(),
            strict=True,
        )
    )
    got = collections.Counter((k, v) for k, v in zip(b.column("key").to_pylist(), values(b), strict=True) if b"|" in v)
    assert sum(1 for v in values(b) if b"|" not in v) == others
    assert a.num_rows == sent
    duplicates = sum(n - 1 for n in got.values() if n > 1)
    assert duplicates == 0, f"{duplicates} duplicates in B"
    assert got == expected, f"missing {sum((expected - got).values())}, unexpected {sum((got - expected).values())}"
    per_key: dict[bytes, list[int]] = collections.defaultdict(list)
    partition_of: dict[bytes, set[int]] = collections.defaultdict(set)
    for k, v, p in zip(b.column("key").to_pylist(), values(b), b.column("partition").to_pylist(), strict=True):
        if b"|" in v:
            per_key[k].append(int(v.split(b"|")[0].rsplit(b"-", 1)[1]))
            partition_of[k].add(p)
    for k, seq in per_key.items():
        assert seq == list(range(len(seq))), f"{k!r}: B holds its records out of order"
        assert partition_of[k] == {kafka_partition(k, 4)}
    assert all(s == e for s, e in stable_and_end(root, "B", storage)), "a transaction was left undecided"


def run_kill_test(
    tmp_path: Path,
    root: str,
    storage: dict[str, Any],
    *,
    kills: int,
    initial: int,
    rate: int,
    seed: int,
    spark_storage: dict[str, Any] | None = None,
    spark_conf: dict[str, str] | None = None,
    executor_kills: int = 0,
    mid_batch_kills: int = 2,
) -> dict[str, Any]:
    """The headline scenario; returns what happened (kills and their moments) for the report.

    ``storage`` reaches the root directly: the producer of A and the final check use it. The Spark
    drivers use ``spark_storage`` (default: ``storage``), e.g. a faulty endpoint. ``spark_conf`` goes to
    every driver (``LOCAL_CLUSTER_CONF`` for executor processes); with ``executor_kills``, the first
    drivers each also lose an executor while they live, one per driver, until that many were killed; at
    least ``mid_batch_kills`` of the driver kills land mid-batch.
    """
    rnd = random.Random(seed)
    with LogStore(root, storage or None) as store:
        store.create_topic("A", 3)
        store.create_topic("B", 4)
    script = write_driver_script(tmp_path / "driver.py", KILL_DRIVER)
    checkpoint, log = tmp_path / "checkpoint", tmp_path / "driver.log"
    spark_storage = storage if spark_storage is None else spark_storage
    conf = spark_conf or {}
    waves = KeyedWaves(root, storage or None, keys=25, initial=initial, rate=rate)
    waves.start()
    waves.ready.wait(120)
    moments: list[str] = []
    executor_moments: list[str] = []
    try:
        while (
            len(moments) < kills
            or sum(m.startswith("mid-batch") for m in moments) < mid_batch_kills
            or len(executor_moments) < executor_kills
        ):
            assert len(moments) < kills + 6, f"could not kill mid-batch often enough: {moments}"
            since = log.stat().st_size if log.exists() else 0
            proc = _driver(script, root, checkpoint, "processing-time", spark_storage, log, conf)
            try:
                wait_for(
                    lambda since=since: b"STARTED" in log.read_bytes()[since:],
                    180,
                    "the driver to start",
                    proc=proc,  # noqa: B023 - called now, in this iteration
                    log=log,
                    poll_s=0.05,
                )
                # Wait for the driver to report progress, then kill at a random moment of a later batch,
                # using the batch interval measured so far so kills land anywhere in a batch, from planning
                # to commit.
                wait_for(lambda: len(_progress(log, since)) >= 1, 180, "progress", proc=proc, log=log, poll_s=0.05)  # noqa: B023
                seen = _progress(log, 0)
                gaps = [
                    b[2] - a[2] for a, b in zip(seen, seen[1:], strict=False) if b[0] == a[0] + 1 and b[2] - a[2] < 5
                ]
                interval = min(2.0, max(0.3, statistics.median(gaps))) if gaps else 0.7
                if len(executor_moments) < executor_kills:
                    executor_moments.append(_kill_executor(proc, log, since, checkpoint, rnd, interval))
                time.sleep(rnd.uniform(0.0, 3 * interval))
                if len(moments) % 2 == 1:  # every other kill waits for a batch to be planned and not committed

                    def in_flight() -> bool:
                        planned, done = _checkpoint_state(checkpoint)
                        return planned > done

                    wait_for(in_flight, 60, "a batch in flight", proc=proc, log=log, poll_s=0.05)
                    time.sleep(rnd.uniform(0.0, interval))
                    if not in_flight():
                        # The batch committed meanwhile (batches take less than a trigger interval once the
                        # workers are warm): kill the next one as soon as it is planned.
                        wait_for(in_flight, 60, "a batch in flight", proc=proc, log=log, poll_s=0.01)
                assert proc.poll() is None, log.read_text()[-6000:]
            finally:
                kill_driver(proc)
            planned, done = _checkpoint_state(checkpoint)
            undecided = _undecided_sink_batches(root, storage or None)
            if planned > done:
                moments.append(f"mid-batch {planned} ({undecided} uncommitted sink batches in B)")
            else:
                moments.append(f"between batches (last committed {done})")
        waves.stop_event.set()
        waves.join(60)
        assert waves.error is None, waves.error
        final_since = log.stat().st_size
        proc = _driver(script, root, checkpoint, "available-now", spark_storage, log, conf)
        try:
            assert proc.wait(300) == 0, log.read_text()[-6000:]
        finally:
            kill_driver(proc)
        assert b"DONE" in log.read_bytes()[final_since:]
    finally:
        waves.stop_event.set()

    assert_b_holds_a_once(root, storage or None, sent=waves.sent)
    b = committed(root, "B", storage or None)
    return {
        "kills": len(moments),
        "moments": moments,
        "executor_kills": len(executor_moments),
        "executor_moments": executor_moments,
        # Spark's own account of each executor it lost (an ERROR line, so the drivers' log level keeps it).
        "executors_lost": len(re.findall(rb"Lost executor \d+ .* code 137", log.read_bytes())),
        "records": b.num_rows,
        "batches": _checkpoint_state(checkpoint)[1] + 1,
    }


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sigkilled_pipeline_writes_topic_b_exactly_once(spark: Any, tmp_path: Path) -> None:
    # CI's form: two kills, one of them mid-batch and one between batches (each driver restart costs ~30 s);
    # the long form (PLOG_LONG=1, benchmarks/soak) kills three times, two of them mid-batch, and
    # PLOG_SINK_KILLS asks for any number.
    kills = int(os.environ.get("PLOG_SINK_KILLS") or soak(ci=2, long=3))
    seed = int(os.environ.get("PLOG_SINK_KILL_SEED") or time.time_ns() % 1_000_000)
    root = make_root(tmp_path, {})
    mid_batch = soak(ci=1, long=2)
    report = run_kill_test(tmp_path, root, {}, kills=kills, initial=1000, rate=30, seed=seed, mid_batch_kills=mid_batch)
    print(f"seed={seed} {report}")
    assert report["kills"] >= kills
    assert sum(m.startswith("mid-batch") for m in report["moments"]) >= mid_batch


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.s3
@pytest.mark.timeout(600)
def test_sigkilled_cluster_through_a_faulty_endpoint_writes_topic_b_exactly_once(
    spark: Any, faulty_s3: FaultyS3, tmp_path: Path
) -> None:
    """Two executor processes, every request of driver and executors through the fault proxy.

    In CI's form a driver is SIGKILLed mid-batch once and an executor once while its driver lives; the long
    form (PLOG_LONG=1, benchmarks/soak) kills drivers three times (two of them mid-batch) and executors twice.
    The producer of A and the check of B reach moto directly, so every fault counted was injected into a
    request of a Spark process and the check itself is not in doubt.
    """
    kills = int(os.environ.get("PLOG_SINK_KILLS_S3") or soak(ci=1, long=3))
    mid_batch = soak(ci=1, long=2)
    executor_kills = soak(ci=1, long=2)
    seed = int(os.environ.get("PLOG_SINK_KILL_SEED") or 12)
    # All kinds; a delay holds the answer past FAST_RETRY_OPTIONS' read timeout (1 s). A micro-batch into a shared
    # topic is a few dozen requests (an object per task, one commit, the decision), so 6% of them, not 3%, still
    # inject a dozen faults or more over the run.
    schedule = faulty_s3.inject(seed, 0.06, delay_s=2.0)
    assert schedule.delay_s > FAST_RETRY_OPTIONS["config_kwargs"]["read_timeout"]
    report = run_kill_test(
        tmp_path,
        faulty_s3.url,
        faulty_s3.direct_options,
        kills=kills,
        initial=300,
        rate=15,
        seed=seed,
        spark_storage=faulty_s3.options,
        spark_conf=LOCAL_CLUSTER_CONF,
        executor_kills=executor_kills,
        mid_batch_kills=mid_batch,
    )
    injected = faulty_s3.proxy.injected
    faulty_s3.calm()
    print(f"seed={seed} faults={dict(injected)} forwarded={faulty_s3.proxy.forwarded} {report}")
    assert report["kills"] >= kills
    assert sum(m.startswith("mid-batch") for m in report["moments"]) >= mid_batch
    assert report["executor_kills"] >= executor_kills and report["executors_lost"] >= report["executor_kills"]
    assert len(injected) >= 4 and sum(injected.values()) >= 10, injected


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_query_killed_mid_batch_stalls_its_readers_only_until_the_transaction_timeout(
    spark: Any, tmp_path: Path
) -> None:
    """Issue 12: a dead pipeline must not stall its readers for long. The query is SIGKILLed with a
    micro-batch written to B and not committed, and stays down: a read_committed consumer of B is
    stopped at that batch, then, once the sink's ``transactionTimeout`` passed on its own clock, aborts
    it and reads on. The restarted query re-runs the batch under a new transaction: B ends with every
    record of A once.

    B is a partitioned topic, whose tasks append transactional objects before the driver decides: into a
    shared topic the driver commits and decides in one step, and the window a kill must land in is a few
    requests wide (``test_a_driver_killed_between_its_commits_and_its_decision_stalls_readers_...``)."""
    root = make_root(tmp_path, {})
    with LogStore(root) as store:
        store.create_topic("A", 3)
        store.create_topic("B", 4, {"storage.layout": "partitioned"})
    waves = KeyedWaves(root, None, keys=25, initial=900, rate=0)
    waves.stop_event.set()
    waves.run()  # the backlog only, in this thread
    assert waves.error is None and waves.sent == 900
    script = write_driver_script(tmp_path / "driver.py", KILL_DRIVER)
    checkpoint, log = tmp_path / "checkpoint", tmp_path / "driver.log"
    timeout = {"transactionTimeout": "4s"}
    for _attempt in range(6):  # until a kill lands between a batch's writes and its commit
        proc = _driver(script, root, checkpoint, "processing-time", {}, log, {}, timeout)
        try:
            wait_for(
                lambda: _undecided_sink_batches(root, None) > 0, 180, "sink batches", proc=proc, log=log, poll_s=0.02
            )
        finally:
            kill_driver(proc)
        if _undecided_sink_batches(root, None) > 0:
            break
    else:
        raise AssertionError("no kill landed between a micro-batch's writes and its commit")
    undecided = [p for p in range(4) if stable_and_end(root, "B")[p][0] < stable_and_end(root, "B")[p][1]]
    assert undecided
    part = undecided[0]
    with Producer(root) as plain:
        plain.send("B", b"after the dead batch", partition=part).get(30)
    with Consumer(root, isolation_level="read_committed", auto_offset_reset="latest") as consumer:
        tp = TopicPartition("B", part)
        consumer.assign([tp])
        consumer.seek(tp, stable_and_end(root, "B")[part][0])
        started = time.monotonic()
        assert not consumer.poll(timeout_ms=1000)  # stopped at the undecided batch, under its 4 s timeout
        assert time.monotonic() - started < 4
        seen: list[bytes] = []
        while b"after the dead batch" not in seen and time.monotonic() - started < 60:
            seen += [r.value for batch in consumer.poll(timeout_ms=500).values() for r in batch]
        assert seen == [b"after the dead batch"], seen  # the aborted batch's records stay invisible
        assert time.monotonic() - started >= 4, "aborted before its timeout"
    proc = _driver(script, root, checkpoint, "available-now", {}, log, {}, timeout)
    try:
        assert proc.wait(300) == 0, log.read_text()[-6000:]
    finally:
        kill_driver(proc)
    assert_b_holds_a_once(root, None, sent=900, others=1)


def test_a_compacted_topic_refuses_rows_without_a_key_before_writing_any(tmp_path: Path, task_context: Any) -> None:
    root = str(tmp_path / "plog")
    with LogStore(root) as store:
        store.create_topic("latest", 2, config={"cleanup.policy": "compact"})
    schema = StructType([StructField("key", BinaryType()), StructField("value", BinaryType())])
    task_context(0)
    writer = stream_writer(root, schema, topic="latest")
    table = pa.table({"key": [b"a", None, b"c"], "value": [b"1", b"2", b"3"]})
    with pytest.raises(PlogError, match=r"column 'key': 1 row\(s\) have a null key, and topic 'latest' is compacted"):
        writer.write(batches(table))
    writer.abort([None], 0)
    assert LogRoot(root).partition("latest", 0).view().end_offset == 0
    assert LogRoot(root).partition("latest", 1).view().end_offset == 0
