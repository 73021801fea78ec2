"""Hostile bytes (issue 12) for the Spark connector and for writers: right answers or a PlogError naming the object.

``tests/test_hostile_bytes.py`` holds the client readers and the CLI to the
oracle; this file does the same, on the same log plus what the Spark sink and
source leave behind, for two more families, each path called directly (no
SparkSession, no JVM):

* **The Spark source**: the driver's planning of micro-batches
  (``initialOffset``, ``latestOffset`` under row and byte limits, a starting
  timestamp, ``partitions`` with ``minPartitions``; the batch reader with
  filters pushed down to the time index) and the executors' partition reader
  on the planned ranges, planned both on the damaged log and, as a driver
  that planned before the damage would, on the pristine one (planned reads,
  PROTOCOL.md 9: keys, offset ranges and sizes handed to the task). The lag
  offsets the source records are read back as a group's offsets.
* **Writers**, which read documents no reader reads (PROTOCOL.md 11, 14):
  the Spark sink's next micro-batch (its decision walk, the previous
  decision's tail hints, a replayed micro-batch), an idempotent producer, a
  transactional producer (its id mapping, epochs, decisions, offsets sent to
  a group), a standalone group commit, a lease taken after a released one,
  the source's lag-offset writer, a topic configuration change, a
  ``delete_records`` and a merge. Each runs on its own copy of the damaged
  log and must return what it returned on the pristine log, or raise a
  PlogError naming the object. Then the damaged object is put back and the
  log read from its start: it must read exactly as after the same write to
  the pristine log, so a writer misled by damage (appending at a wrong
  offset, merging damaged bytes, committing wrong offsets) is caught even
  when it raised nothing.

Heartbeats are left alone (their handling is being changed elsewhere). The
oracle's leniency is that of ``test_hostile_bytes``: JSON documents carry no
checksum, so a document whose bytes still parse to well-typed values may
change any answer, but only PlogErrors may escape. Examples per fuzzer:
``PLOG_HOSTILE_EXAMPLES`` (divided as below), ``PLOG_HOSTILE_RANDOM=1`` for
new draws, as in ``test_hostile_bytes``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pyspark = pytest.importorskip("pyspark")

from pyspark.sql.datasource import GreaterThanOrEqual, LessThan  # noqa: E402
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxRows  # noqa: E402
from pyspark.sql.types import BinaryType, LongType, StructField, StructType  # noqa: E402

from coordinator.groups.client import GroupClient  # noqa: E402
from coordinator.keys import maintainer_lease_name, transactional_id_prefix  # noqa: E402
from coordinator.leases import Lease, LeaseEpoch, LeaseRenewal  # noqa: E402
from pyspark_logsource import Consumer, LogStore, Producer  # noqa: E402
from pyspark_logsource.spark import (  # noqa: E402
    sink_commit,
    task_writer,
    workers,  # noqa: E402
)
from pyspark_logsource.spark.batch_reader import PlogBatchReader  # noqa: E402
from pyspark_logsource.spark.options import SourceOptions, parse_options  # noqa: E402
from pyspark_logsource.spark.partition_reader import PlogInputPartition, read_partition  # noqa: E402
from pyspark_logsource.spark.planning import GroupOffsetsWriter  # noqa: E402
from pyspark_logsource.spark.sink import PlogStreamWriter  # noqa: E402
from pyspark_logsource.spark.stream_reader import PlogStreamReader  # noqa: E402
from segment_format.errors import CorruptRecordError, PlogError  # noqa: E402
from segment_format.records import now_ms  # noqa: E402
from segment_format.root import LogRoot  # noqa: E402
from segment_format.stores import open_store  # noqa: E402
from segment_format.stores.memory import _MEMORY_STORES  # noqa: E402
from tests.test_hostile_bytes import (  # noqa: E402
    DOCUMENT_KINDS,
    EXAMPLES,
    GROUP,
    PATH_DEADLINE_S,
    PRISTINE,
    SETTINGS,
    TOPIC,
    TPS,
    Row,
    _is_sibling_swap,
    _json_value_changed,
    _same_types,
    build_pristine,
    byte_mutation,
    deadline,
    drop,
    fresh_copy,
    index_parts,
    json_mutation,
    key_of,
    lying_index,
    read_records,
    reindex,
)

#: The Spark sink's transactional id (its ``transactionalId`` option) and the query id of its checkpoint.
SINK_ID = "hostile-sink"
QUERY_ID = "query-1"
#: The group whose progress the Spark source records for lag tools (``groupIdForLag``).
LAG_GROUP = "lagging"
LEASE = maintainer_lease_name(TOPIC)
#: Timestamps of the records writers add, after every record of the pristine log.
WRITE_TS = 1_700_000_100_000
SINK_SCHEMA = StructType(
    [StructField("key", BinaryType()), StructField("value", BinaryType()), StructField("timestamp", LongType())]
)


# ---------------------------------------------------------------------------------------------- the log


class FakeTaskContext:
    """Stands in for ``pyspark.TaskContext`` on an executor: the micro-batch id and query id properties."""

    def __init__(self, batch_id: int) -> None:
        self.props = {"streaming.sql.batchId": str(batch_id), "sql.streaming.queryId": QUERY_ID}

    def getLocalProperty(self, key: str) -> str | None:  # noqa: N802 - Spark's name
        return self.props.get(key)


_CONTEXT: list[FakeTaskContext | None] = [None]


@pytest.fixture(scope="module", autouse=True)
def task_context() -> Iterator[None]:
    """``TaskContext.get()`` answers with :data:`_CONTEXT` for this module's tests (a module-wide patch)."""
    mp = pytest.MonkeyPatch()
    mp.setattr(pyspark.TaskContext, "get", staticmethod(lambda: _CONTEXT[0]))
    yield
    mp.undo()


def forget_workers(url: str) -> None:
    """Drop what the Python worker caches for the root at ``url`` (a new root per example)."""
    for key in [k for k in workers._ROOTS if k[0] == url]:
        workers._ROOTS.pop(key)[0].close()
    caches: list[dict[Any, Any]] = [sink_commit._PRODUCER_IDS, sink_commit._RUN_FIRST_BATCH, task_writer._HINTS]
    for cache in caches:
        for key in [k for k in cache if k[0] == url]:
            del cache[key]


def sink_batch(url: str, batch_id: int, tag: bytes) -> list[Any]:
    """One micro-batch of the Spark sink (one task, then the driver's commit); the task's commit message."""
    writer = PlogStreamWriter({"path": url, "topic": TOPIC, "transactionalId": SINK_ID}, SINK_SCHEMA)
    keys = [b"k%d" % i for i in range(4)]
    table = pa.table(
        {
            "key": pa.array(keys, pa.binary()),
            "value": pa.array([tag + b"-%d" % i for i in range(4)], pa.binary()),
            "timestamp": pa.array([WRITE_TS + 100 * batch_id + i for i in range(4)], pa.int64()),
        }
    )
    _CONTEXT[0] = FakeTaskContext(batch_id)
    try:
        message = writer.write(iter(table.to_batches()))
    finally:
        _CONTEXT[0] = None
    writer.commit([message], batch_id)
    return [message]


def build_spark_pristine() -> dict[str, bytes]:
    """The log of ``test_hostile_bytes`` plus two committed micro-batches of a Spark sink, lag offsets and a lease."""
    build_pristine()
    url = fresh_copy(dict(_MEMORY_STORES[PRISTINE]))
    try:
        for batch_id in (0, 1):
            sink_batch(url, batch_id, b"sink%d" % batch_id)
        lag = GroupOffsetsWriter(open_store(url), LAG_GROUP)
        lag.commit({TOPIC: {"0": 4, "1": 5}})
        lag.commit({TOPIC: {"0": 9, "1": 7}})
        store = open_store(url)
        # Epoch 0 expired long ago; epoch 1 renewed once and then released: the lease is free.
        for epoch, holder in enumerate(("maintainer-a", "maintainer-b")):
            assert store.put_if_absent(
                f"_coordinator/leases/{LEASE}/{epoch:020d}.json", LeaseEpoch(holder, epoch, 1_000 + epoch, 1).to_json()
            )
        renewals = f"_coordinator/leases/{LEASE}/{1:020d}/"
        assert store.put_if_absent(renewals + f"{1:020d}.json", LeaseRenewal(5_000).to_json())
        assert store.put_if_absent(renewals + f"{2:020d}.json", LeaseRenewal(0, released=True).to_json())
        return dict(_MEMORY_STORES[url[len("memory://") :]])
    finally:
        forget_workers(url)
        drop(url)


# ---------------------------------------------------------------------------------------------- paths


def source_options(url: str, options: dict[str, str], *, streaming: bool = True) -> SourceOptions:
    """Checked source options for the root at ``url`` (a memory root, which Spark itself would refuse)."""
    given = {"url": "/placeholder", "subscribe": TOPIC, **options}
    if streaming:
        given["noticeinterval"] = "0"
    return dataclasses.replace(parse_options(given, streaming=streaming), url=url)


def plan_summary(parts: list[PlogInputPartition]) -> list[Any]:
    """What a plan decides: ranges, the start known, and the chain elements (sizes are the listing's, unchecked)."""
    return [
        (p.topic, p.partition, p.start, p.until, p.log_start, [(s.key, s.base_offset, s.end_offset) for s in segments])
        for p in parts
        for segments in [p.segments]
    ]


def spark_rows(parts: list[PlogInputPartition], into: list[Any]) -> list[Any]:
    """Run each input partition as an executor would; the rows, appended to ``into`` as they come."""
    for part in parts:
        for batch in read_partition(part):
            into.extend(tuple(row.values()) for row in batch.to_pylist())
    return into


def stream_plan(url: str, **options: str) -> tuple[list[Any], list[PlogInputPartition]]:
    """A query's first micro-batch: (the offsets answered and the plan's summary, its input partitions)."""
    reader = PlogStreamReader(source_options(url, {"startingoffsets": "earliest", **options}))
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        parts = reader.partitions(start, end)
        return [start, end, plan_summary(parts)], parts
    finally:
        reader.stop()


@dataclass
class Answers:
    """What each path returned, or the PlogError it raised; ``partial`` holds rows read before an error."""

    values: dict[str, Any]
    errors: dict[str, PlogError]
    partial: dict[str, Any]


def run(paths: Paths) -> Answers:
    """Run each path under the deadline; a path may append what it read so far to the list it is given."""
    answers = Answers({}, {}, {})
    for name, path in paths.items():
        partial: list[Any] = []
        answers.partial[name] = partial
        try:
            with deadline(PATH_DEADLINE_S):
                answers.values[name] = path(partial)
        except PlogError as exc:
            answers.errors[name] = exc
    return answers


Paths = dict[str, Callable[[list[Any]], Any]]


def source_paths(url: str, planned: dict[str, list[PlogInputPartition]] | None) -> Paths:
    """The Spark source's paths on the root at ``url``; ``planned``: input partitions planned before the damage."""

    def plan(**options: str) -> Callable[[list[Any]], Any]:
        return lambda _partial: stream_plan(url, **options)[0]

    def read(**options: str) -> Callable[[list[Any]], Any]:
        def go(partial: list[Any]) -> Any:
            return spark_rows(stream_plan(url, **options)[1], partial)

        return go

    def planned_read(name: str) -> Callable[[list[Any]], Any]:
        def go(partial: list[Any]) -> Any:
            assert planned is not None
            return spark_rows([dataclasses.replace(p, url=url) for p in planned[name]], partial)

        return go

    def limited(limit: Any, **options: str) -> Callable[[list[Any]], Any]:
        def go(_partial: list[Any]) -> Any:
            reader = PlogStreamReader(source_options(url, {"startingoffsets": "earliest", **options}))
            try:
                start = reader.initialOffset()
                ends = []
                for _ in range(40):
                    end = reader.latestOffset(start, limit)
                    if end == start:
                        break
                    ends.append((end, plan_summary(reader.partitions(start, end))))
                    start = {k: v for k, v in end.items() if not k.startswith("@")}
                return ends
            finally:
                reader.stop()

        return go

    def by_time(_partial: list[Any]) -> Any:
        every = {"startingoffsets": "earliest", "endingoffsets": "latest"}
        reader = PlogBatchReader(source_options(url, every, streaming=False))
        reader.push_filters(
            [
                GreaterThanOrEqual(("timestamp",), _utc(1_700_000_004_500)),
                LessThan(("timestamp",), _utc(1_700_000_020_000)),
            ]
        )
        ranges = plan_summary(reader.partitions())
        starting = PlogStreamReader(source_options(url, {"startingtimestamp": str(1_700_000_020_000)}))
        try:
            return ranges, starting.initialOffset()
        finally:
            starting.stop()

    def lag(_partial: list[Any]) -> Any:
        return GroupClient(open_store(url), LAG_GROUP).committed_with_source()

    paths: Paths = {
        "plan-committed": plan(),
        "plan-uncommitted": plan(isolationlevel="read_uncommitted"),
        "plan-rows": limited(ReadMaxRows(9), maxoffsetspertrigger="9"),
        "plan-time": by_time,
        "read-committed": read(minpartitions="5"),
        "read-uncommitted": read(isolationlevel="read_uncommitted"),
        "lag": lag,
    }
    if planned is not None:
        paths["planned-committed"] = planned_read("committed")
        paths["planned-uncommitted"] = planned_read("uncommitted")
    paths["plan-bytes"] = limited(ReadMaxBytes(2500), maxbytespertrigger="2500")
    return paths


def _utc(ms: int) -> Any:
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc)


def plan_pristine(objects: dict[str, bytes]) -> dict[str, list[PlogInputPartition]]:
    """Input partitions a driver planned before the damage (split, so tasks start inside objects)."""
    url = fresh_copy(objects)
    try:
        return {
            "committed": stream_plan(url, minpartitions="7")[1],
            "uncommitted": stream_plan(url, isolationlevel="read_uncommitted", minpartitions="3")[1],
        }
    finally:
        drop(url)


# ---------------------------------------------------------------------------------------------- writers


def read_back(url: str) -> Any:
    """The whole log as consumers read it under both isolation levels, and the groups' offsets."""
    out: dict[str, Any] = {}
    for isolation in ("read_uncommitted", "read_committed"):
        got: dict[int, list[Row]] = {}
        read_records(url, isolation)(got)
        out[isolation] = got
    store = open_store(url)
    out["groups"] = {g: GroupClient(store, g).committed() for g in (GROUP, LAG_GROUP)}
    with LogRoot(url) as root:
        meta = root.topic(TOPIC, refresh=True)
        out["metadata"] = (meta.version, dict(meta.config))
        out["starts"] = [root.partition(TOPIC, p).view().start_offset for p in (0, 1)]
    return out


def writer_paths() -> dict[str, Callable[[str], Any]]:
    """Writers, each run on its own copy of the log; what each returns must be what it returned on the pristine log."""

    def produce(url: str) -> Any:
        producer = Producer(url, linger_ms=0)
        try:
            futures = [
                producer.send(TOPIC, value=b"produced-%d" % p, partition=p, timestamp_ms=WRITE_TS + p) for p in (0, 1)
            ]
            producer.flush()
            return [(f.get().partition, f.get().offset) for f in futures]
        finally:
            producer.close()

    def transaction(url: str) -> Any:
        producer = Producer(url, transactional_id="tx", linger_ms=0)
        try:
            producer.init_transactions()
            producer.begin_transaction()
            futures = [
                producer.send(TOPIC, value=b"txn-%d" % p, partition=p, timestamp_ms=WRITE_TS + 10 + p) for p in (0, 1)
            ]
            producer.send_offsets_to_transaction({TPS[0]: 7}, GROUP)
            producer.commit_transaction()
            return [(f.get().partition, f.get().offset) for f in futures]
        finally:
            producer.close()

    def sink(url: str) -> Any:
        # A replay of micro-batch 1 (already committed: writes nothing), then micro-batch 2 at the hinted ends.
        replay = sink_batch(url, 1, b"sink1")
        fresh = sink_batch(url, 2, b"sink2")
        return [(m.batches, m.records, m.replayed) for m in replay + fresh]

    def group_commit(url: str) -> Any:
        consumer = Consumer(url, group_id=GROUP)
        try:
            consumer.assign(TPS)
            consumer.commit({TPS[0]: 8})
            return {tp: consumer.committed(tp) for tp in TPS}
        finally:
            consumer.close(autocommit=False)

    def lease(url: str) -> Any:
        candidate = Lease(open_store(url), LEASE, "maintainer-c", max_clock_skew_ms=0)
        acquired = candidate.try_acquire()
        state = candidate.last_state
        assert state is not None
        # Not ``released``: renewals do not repeat their number, so one swapped for another is undetectable.
        return acquired, candidate.epoch, state.epoch, state.holder

    def lag_writer(url: str) -> Any:
        writer = GroupOffsetsWriter(open_store(url), LAG_GROUP)
        writer.commit({TOPIC: {"0": 9, "1": 7}})  # what the newest holds: a restarted query
        writer.commit({TOPIC: {"0": 12, "1": 9}})
        return GroupClient(open_store(url), LAG_GROUP).committed()

    def alter_config(url: str) -> Any:
        with LogStore(url) as admin:
            admin.alter_config(TOPIC, {"retention.bytes": 1 << 30})
        with LogRoot(url) as root:
            meta = root.topic(TOPIC, refresh=True)
            return meta.version, dict(meta.config)

    def delete_records(url: str) -> Any:
        with LogRoot(url) as root:
            root.partition(TOPIC, 0).delete_records(3)
            return root.partition(TOPIC, 0).view().start_offset

    def merge(url: str) -> Any:
        with LogRoot(url) as root:
            return [root.partition(TOPIC, p).merge_segments() for p in (0, 1)]

    return {
        "w-produce": produce,
        "w-transaction": transaction,
        "w-sink": sink,
        "w-group-commit": group_commit,
        "w-lease": lease,
        "w-lag": lag_writer,
        "w-alter-config": alter_config,
        "w-delete-records": delete_records,
        "w-merge": merge,
    }


def run_writers(objects: dict[str, bytes], repair: tuple[str, bytes] | None) -> tuple[Answers, dict[str, Any]]:
    """Run each writer on a copy of ``objects``; (answers, the log read back after putting ``repair`` back)."""
    answers = Answers({}, {}, {})
    back: dict[str, Any] = {}
    for name, writer in writer_paths().items():
        url = fresh_copy(objects)
        try:
            try:
                with deadline(PATH_DEADLINE_S):
                    answers.values[name] = writer(url)
            except PlogError as exc:
                answers.errors[name] = exc
            if repair is not None:
                key, original = repair
                store = open_store(url)
                for k, v in objects.items():
                    if k != key and not k.endswith("notice.json") and "/leases/" not in k:
                        assert store.get(k) == v, f"{name} changed {k!r}"  # nothing stored is ever rewritten
                store.replace(key, original)
            try:
                with deadline(PATH_DEADLINE_S):
                    back[name] = read_back(url)
            except PlogError as exc:
                back[name] = exc
        finally:
            forget_workers(url)
            drop(url)
    return answers, back


# ---------------------------------------------------------------------------------------------- the baseline


class SparkBaseline:
    """The pristine log, a plan made on it, and what every path (and every writer) answered.

    Not a dataclass: hypothesis prints a failing example's dataclass arguments field by field.
    """

    def __init__(
        self,
        objects: dict[str, bytes],
        planned: dict[str, list[PlogInputPartition]],
        source: Answers,
        writers: Answers,
        back: dict[str, Any],
    ) -> None:
        self.objects = objects
        self.planned = planned
        self.source = source
        self.writers = writers
        self.back = back

    def __repr__(self) -> str:
        return f"SparkBaseline({len(self.objects)} objects)"


@pytest.fixture(scope="module")
def spark_baseline() -> SparkBaseline:
    objects = build_spark_pristine()
    ranges: dict[tuple[str, str, int, int], str] = {}
    for key in objects:
        if key.endswith(".arrow") and not key.startswith("shared/"):  # shared objects name no range of their own
            rows, meta = index_parts(key, objects[key])
            span = (key.split("/")[1], key.split("/")[3], meta["base_offset"], meta["next_offset"])
            assert span not in ranges, f"{key} and {ranges[span]} hold the same range: a swap would be undetectable"
            ranges[span] = key
    planned = plan_pristine(objects)
    url = fresh_copy(objects)
    try:
        source = run(source_paths(url, planned))
    finally:
        forget_workers(url)
        drop(url)
    assert not source.errors, source.errors
    writers, back = run_writers(objects, None)
    assert not writers.errors, writers.errors
    assert not any(isinstance(v, PlogError) for v in back.values()), back
    values = source.values
    committed = [r[1] for r in values["read-committed"]]
    assert b"sink1-0" in committed and b"aborted-0" not in committed and b"committed-1" in committed
    assert values["read-uncommitted"] == values["planned-uncommitted"]
    assert values["read-committed"] == values["planned-committed"]
    assert values["lag"] == ({TPS[0]: 9, TPS[1]: 7}, "spark-lag")
    assert len(values["plan-bytes"]) > 2 and len(values["plan-rows"]) > 2
    assert writers.values["w-lease"][0] and writers.values["w-lease"][1] == 2
    assert writers.values["w-sink"][0][2] and not writers.values["w-sink"][1][2]  # a replay, then a write
    assert any(writers.values["w-merge"]), writers.values["w-merge"]
    return SparkBaseline(objects, planned, source, writers, back)


# ---------------------------------------------------------------------------------------------- the oracle


def _names(exc: PlogError, key: str) -> bool:
    message = str(exc)
    if isinstance(exc, CorruptRecordError) and exc.offset is not None:
        assert f"offset {exc.offset}" in message
    return key in message


#: Paths that go by the sizes a listing gives, an estimate no reader checks (byte limits, merge groups):
#: compared only when the damage kept the object's size.
SIZED = {"plan-bytes", "w-merge"}


def check(base: SparkBaseline, key: str, mutated: bytes, answers: Answers, *, lenient: bool, writers: bool) -> None:
    """Every path answered as on the pristine log, or raised a PlogError naming ``key``.

    ``lenient``: a change no reader can detect; only PlogErrors may escape then.
    """
    original = base.writers if writers else base.source
    for name, exc in answers.errors.items():
        if not lenient:
            assert _names(exc, key), f"{name}: {type(exc).__name__} does not name {key!r}: {exc}"
    if lenient:
        return
    same_size = len(mutated) == len(base.objects[key])
    for name, value in answers.values.items():
        if name in SIZED and not same_size:
            continue
        assert value == original.values[name], f"{name} answered otherwise after mutating {key!r}"
    # Rows read before an error are pristine rows: never a damaged record.
    for name in answers.errors:
        rows = answers.partial.get(name)
        if rows and name in original.values:
            truth = {row[2:5]: row for row in original.values[name]}  # by (topic, partition, offset)
            assert all(truth.get(row[2:5]) == row for row in rows), f"{name}: other rows before the error"


def check_back(base: SparkBaseline, key: str, answers: Answers, back: dict[str, Any], *, lenient: bool) -> None:
    """With the damaged object put back, the log written to reads as after the same write to the pristine log.

    A writer that raised may have written part of its work (a transaction's appends, undecided): then
    the log must read as the pristine log did before the write, or as after it, never otherwise; a
    writer that answered must have done exactly what it did on the pristine log.
    """
    for name, got in back.items():
        if isinstance(got, PlogError):
            raise AssertionError(f"{name}: the repaired log does not read after the write: {got}")
        if lenient:
            continue
        if name in answers.values:
            assert got == base.back[name], f"{name}: another log after the write to the damaged log"


# ---------------------------------------------------------------------------------------------- fuzzers


def run_and_check(base: SparkBaseline, key: str, mutated: bytes, *, lenient: bool = False) -> tuple[Answers, Answers]:
    """Put ``mutated`` at ``key``; run the source's paths and the writers; hold them to the oracle."""
    objects = dict(base.objects)
    objects[key] = mutated
    url = fresh_copy(objects)
    try:
        source = run(source_paths(url, base.planned))
    finally:
        forget_workers(url)
        drop(url)
    check(base, key, mutated, source, lenient=lenient, writers=False)
    writers, back = run_writers(objects, (key, base.objects[key]))
    check(base, key, mutated, writers, lenient=lenient, writers=True)
    check_back(base, key, writers, back, lenient=lenient)
    return source, writers


def fuzz_keys(base: SparkBaseline, suffix: str) -> list[str]:
    """Keys of the pristine objects ending in ``suffix``, heartbeats left out (see the module docstring)."""
    return sorted(k for k in base.objects if k.endswith(suffix) and "/members/" not in k)


#: Each example runs every source path and nine writers (about 0.3 s): fewer examples than test_hostile_bytes.
SPARK_SETTINGS = settings(SETTINGS, max_examples=max(EXAMPLES // 6, 4))


@SPARK_SETTINGS
@given(data=st.data())
def test_spark_and_writers_on_damaged_segment_objects(spark_baseline: SparkBaseline, data: st.DataObject) -> None:
    """Byte damage to a segment object: the source plans and reads the original records, writers do their
    write, or each raises a PlogError naming the object."""
    keys = fuzz_keys(spark_baseline, ".arrow")
    key = data.draw(st.sampled_from(keys), label="key")
    original = spark_baseline.objects[key]
    others = [v for k, v in sorted(spark_baseline.objects.items()) if k != key]
    run_and_check(spark_baseline, key, data.draw(byte_mutation(original, others), label="mutation"))


@SPARK_SETTINGS
@given(data=st.data())
def test_spark_and_writers_on_damaged_documents(spark_baseline: SparkBaseline, data: st.DataObject) -> None:
    """Byte damage to a JSON document (decisions and their tail hints, id mappings, epochs, leases, lag
    offsets, commit logs, metadata, notices): the original answers, or a PlogError naming it."""
    keys = fuzz_keys(spark_baseline, ".json")
    key = data.draw(st.sampled_from(keys), label="key")
    original = spark_baseline.objects[key]
    others = [v for k, v in sorted(spark_baseline.objects.items()) if k != key]
    mutated = data.draw(byte_mutation(original, others), label="mutation")
    lenient = _json_value_changed(original, mutated) and not _is_sibling_swap(key, mutated, spark_baseline)  # type: ignore[arg-type]
    run_and_check(spark_baseline, key, mutated, lenient=lenient)


#: Document kinds ``test_hostile_bytes`` does not know, by a fragment of their key.
MORE_KINDS: list[tuple[str, type]] = [(f"/{LEASE}/00000000000000000001/", LeaseRenewal), (f"/{LEASE}/", LeaseEpoch)]


def _required(key: str, name: str) -> bool:
    """Whether field ``name`` of the document at ``key`` is required (else it has a default, 3.1)."""
    for fragment, kind in MORE_KINDS + list(DOCUMENT_KINDS):
        if fragment in key:
            for f in dataclasses.fields(kind):
                if f.metadata.get("json", f.name) == name:
                    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            return False
    return name in ("offset", "created_ms")  # a start marker (7.1)


@SPARK_SETTINGS
@given(data=st.data())
def test_spark_and_writers_on_documents_with_wrong_types(spark_baseline: SparkBaseline, data: st.DataObject) -> None:
    """Valid JSON with a field missing or wrongly typed, at any depth (a tail hint's triple too)."""
    keys = [k for k in fuzz_keys(spark_baseline, ".json") if not k.endswith("notice.json")]
    key = data.draw(st.sampled_from(keys), label="key")
    doc = json.loads(spark_baseline.objects[key])
    mutated = data.draw(json_mutation(doc), label="document")
    missing = set(doc) - set(mutated) if isinstance(mutated, dict) else set()
    lenient = _fewer_entries(doc, mutated) or (
        bool(missing)
        and not any(_required(key, name) for name in missing)
        and _same_types({k: v for k, v in doc.items() if k not in missing}, mutated)
    )
    run_and_check(spark_baseline, key, json.dumps(mutated).encode(), lenient=lenient)


def _fewer_entries(doc: Any, mutated: Any) -> bool:
    """Whether ``mutated`` has ``doc``'s shape but for entries missing from maps inside it.

    A map inside a document (offsets by partition, a decision's batches or tail hints, a configuration)
    left with fewer entries, ``{}`` even, is another value of the right type: as undetectable as a
    changed digit. Top-level fields are the document's own, required or not (``_required``).
    """

    def inner(a: Any, b: Any) -> bool:
        if isinstance(a, dict) and isinstance(b, dict):
            return b.keys() <= a.keys() and all(inner(a[k], b[k]) for k in b)
        return _same_types(a, b)

    if isinstance(doc, dict) and isinstance(mutated, dict):
        return doc.keys() == mutated.keys() and all(inner(doc[k], mutated[k]) for k in doc)
    return _same_types(doc, mutated)


@SPARK_SETTINGS
@given(data=st.data())
def test_spark_and_writers_on_lying_indexes(spark_baseline: SparkBaseline, data: st.DataObject) -> None:
    """An index re-encoded with a valid CRC that lies about its batches (planned reads check each element)."""
    segments = [k for k in fuzz_keys(spark_baseline, ".arrow") if not k.startswith("shared/")]  # an index to lie in
    key = data.draw(st.sampled_from(segments), label="key")
    rows, meta = index_parts(key, spark_baseline.objects[key])
    new_rows, new_meta = data.draw(lying_index(rows, meta), label="index")
    if new_rows == rows and new_meta == meta:
        return
    run_and_check(spark_baseline, key, reindex(spark_baseline.objects[key], new_rows, new_meta))


# ---------------------------------------------------------------------------------------------- regressions


def test_regression_lease_epoch_of_another_epoch(spark_baseline: SparkBaseline) -> None:
    """Epoch 0's bytes at epoch 1's key were read as epoch 1, held by epoch 0's holder (PROTOCOL.md 3.1)."""
    newest = key_of(spark_baseline, f"/leases/{LEASE}/00000000000000000001.json")
    older = key_of(spark_baseline, f"/leases/{LEASE}/00000000000000000000.json")
    _, writers = run_and_check(spark_baseline, newest, spark_baseline.objects[older])
    assert "'epoch'" in str(writers.errors["w-lease"])


def test_regression_integer_past_int64_in_a_document(spark_baseline: SparkBaseline) -> None:
    """A sink's id mapping saying producer id 2**70 was taken: its appends leaked pyarrow's OverflowError."""
    key = transactional_id_prefix(f"{SINK_ID}/query:{QUERY_ID}") + "producer-id.json"
    doc = json.loads(spark_baseline.objects[key])
    doc["producer_id"] = 2**70
    _, writers = run_and_check(spark_baseline, key, json.dumps(doc).encode())
    assert "int64" in str(writers.errors["w-sink"])


@pytest.mark.parametrize(
    ("hint", "was"),
    [
        ([2**70, 0], "OverflowError from the append"),
        ([19, 2**70], "an object whose segment JSON no reader parses"),
        ([-1, 0], "an object named log/-0000000000000000001.arrow, off the chain: records acknowledged, never read"),
        ([40, 0], "an append at 40, leaving the gap [19, 40) in the chain"),
    ],
)
def test_regression_damaged_tail_hint_is_not_used(spark_baseline: SparkBaseline, hint: list[int], was: str) -> None:
    """A well-typed but damaged tail hint of partition 0 in the sink's last decision was used as the end: ``was``.

    Hints may not be past int64 or negative, and must end one past the last offset the same decision
    lists for the partition; otherwise the next micro-batch lists the partition, as without a hint.
    """
    key = key_of(spark_baseline, "_coordinator/transactions/", -1)
    doc = json.loads(spark_baseline.objects[key])
    (hints,) = doc["tails"][TOPIC].values()
    assert hints["0"][0] == 19  # what the decision's batches say: [[18, 18]]
    hints["0"] = [*hint, now_ms()]
    objects = {**spark_baseline.objects, key: json.dumps(doc).encode()}
    url = fresh_copy(objects)
    try:
        assert writer_paths()["w-sink"](url) == spark_baseline.writers.values["w-sink"]
        assert read_back(url) == spark_baseline.back["w-sink"]
        assert not [k for k in _MEMORY_STORES[url[len("memory://") :]] if "/log/-" in k]
    finally:
        forget_workers(url)
        drop(url)
