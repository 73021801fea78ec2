"""plog end to end on GCS (fake-gcs-server) and Azure Blob (Azurite): racing writer processes, and Spark.

The storage conformance suite checks each store's operations; these tests check
that the log built on them holds: two real processes appending to one partition
at once leave no gap and no duplicate, in each writer's order, and an
exactly-once plog -> plog stream, stopped and restarted, writes every record once.
Kept small (CI time): a few hundred records, one pipeline per backend.
"""

from __future__ import annotations

import collections
import multiprocessing
import time
from typing import Any

import pyarrow as pa
import pytest

from pyspark_logsource import Consumer, LogStore, Producer, TopicPartition
from pyspark_logsource.spark.credentials import spark_storage_options

BACKENDS = [pytest.param("gcs", marks=pytest.mark.gcs), pytest.param("azure", marks=pytest.mark.azure)]
#: Records per racing writer, written in batches of 1 to 4.
PER_WRITER = 150


@pytest.fixture(params=BACKENDS)
def cloud(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """``(root URL, storage options)`` of a fresh bucket or container on the backend's emulator."""
    url, options = request.getfixturevalue(f"{request.param}_url")
    return str(url), dict(options)


def _racing_writer(url: str, options: dict[str, Any], name: str, barrier: Any, results: Any) -> None:
    """Append ``PER_WRITER`` records keyed ``name`` to partition 0 once both writers are ready."""
    try:
        with Producer(url, storage_options=options, acks="all", linger_ms=0) as producer:
            barrier.wait(timeout=120)
            seq = 0
            while seq < PER_WRITER:
                n = min(PER_WRITER - seq, 1 + seq % 4)
                rows = [f"{name}-{i}".encode() for i in range(seq, seq + n)]
                producer.send_batch("race", pa.table({"key": [name.encode()] * n, "value": rows, "partition": [0] * n}))
                producer.flush()
                seq += n
                # Paced, so that one writer cannot finish its burst before the other is scheduled
                # (two cores shared with the emulator): the appends interleave, and race for offsets.
                time.sleep(0.01)
        results.put((name, "done"))
    except BaseException as e:  # reported by the parent's assertions
        results.put((name, f"{type(e).__name__}: {e}"))
        raise


def test_racing_writer_processes_then_a_consumer(cloud: tuple[str, dict[str, Any]]) -> None:
    """Two processes append to one partition at once; a consumer then reads each record once, in writer order."""
    url, options = cloud
    with LogStore(url, storage_options=options) as store:
        store.create_topic("race", 1)
        assert store.root.store.billed_per_request  # a producer's flushes gather records for longer here
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    barrier = ctx.Barrier(2)  # released when both producers are open: their appends overlap
    names = ["w0", "w1"]
    procs = [ctx.Process(target=_racing_writer, args=(url, options, n, barrier, results)) for n in names]
    for p in procs:
        p.start()
    try:
        outcomes = dict(results.get(timeout=120) for _ in names)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert outcomes == {n: "done" for n in names}

    consumer = Consumer(url, storage_options=options, auto_offset_reset="earliest")
    try:
        consumer.assign([TopicPartition("race", 0)])
        table = consumer.read_to_end()
    finally:
        consumer.close()
    log = [v.decode() for v in table.column("value").to_pylist()]
    offsets = table.column("offset").to_pylist()
    assert offsets == list(range(len(log)))  # no gap
    assert len(log) == len(set(log)) == 2 * PER_WRITER  # no duplicate, nothing lost
    by_writer = collections.defaultdict(list)
    for value in log:
        name, seq = value.rsplit("-", 1)
        by_writer[name].append(int(seq))
    assert by_writer == {n: list(range(PER_WRITER)) for n in names}  # each writer's (key's) order
    owners = [v.rsplit("-", 1)[0] for v in log]
    switches = sum(1 for a, b in zip(owners, owners[1:], strict=False) if a != b)
    print(f"{url}: {len(log)} records, writer changes along the log: {switches}")
    # The writers really ran at once: their time spans (each record's create time) overlap.
    spans = {
        n: [t for o, t in zip(owners, table.column("timestamp").to_pylist(), strict=True) if o == n] for n in names
    }
    assert max(min(t) for t in spans.values()) <= min(max(t) for t in spans.values())


def _committed_values(url: str, options: dict[str, Any], topic: str, partitions: int) -> list[bytes]:
    consumer = Consumer(url, storage_options=options, auto_offset_reset="earliest", isolation_level="read_committed")
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        return [bytes(v) for v in consumer.read_to_end().column("value").to_pylist()]
    finally:
        consumer.close()


def _produce(url: str, options: dict[str, Any], start: int, n: int) -> None:
    keys = [f"k{i % 13}".encode() for i in range(start, start + n)]
    vals = [f"in:{i}".encode() for i in range(start, start + n)]
    with Producer(url, storage_options=options) as producer:
        producer.send_batch("in", pa.table({"key": keys, "value": vals}))


@pytest.mark.spark
def test_exactly_once_pipeline_stopped_and_restarted(
    spark: Any, cloud: tuple[str, dict[str, Any]], tmp_path: Any
) -> None:
    """plog -> plog with availableNow and the exactly-once sink on the backend, run, then restarted with new
    input: the output holds every input record once, in per-key order."""
    url, options = cloud
    with LogStore(url, storage_options=options) as store:
        store.create_topic("in", 2)
        store.create_topic("out", 2)
    _produce(url, options, 0, 300)
    storage = spark_storage_options(options)  # Azure's connection_string as storage.secret.connection_string
    ck = str(tmp_path / "ck")

    def run() -> Any:
        query = (
            spark.readStream.format("plog")
            .options(**storage)
            .option("subscribe", "in")
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "120")
            .load(url)
            .selectExpr("key", "upper(cast(value as string)) as value")
            .writeStream.format("plog")
            .options(**storage)
            .option("topic", "out")
            .option("checkpointLocation", ck)
            .trigger(availableNow=True)
            .start(url)
        )
        assert query.awaitTermination(240), "the query did not finish"
        assert query.exception() is None, str(query.exception())
        return query

    first = run()
    assert len([p for p in first.recentProgress if p["numInputRows"]]) >= 2  # several micro-batches
    assert sorted(_committed_values(url, options, "out", 2)) == sorted(f"IN:{i}".encode() for i in range(300))
    _produce(url, options, 300, 100)
    run()  # the restarted query writes only the new records: its checkpoint remembers the rest
    out = _committed_values(url, options, "out", 2)
    assert sorted(out) == sorted(f"IN:{i}".encode() for i in range(400))  # each once
    consumer = Consumer(url, storage_options=options, auto_offset_reset="earliest", isolation_level="read_committed")
    try:
        consumer.assign([TopicPartition("out", p) for p in range(2)])
        table = consumer.read_to_end()
    finally:
        consumer.close()
    order = collections.defaultdict(list)
    for row in table.to_pylist():
        order[row["key"]].append(int(row["value"].split(b":")[1]))
    assert all(seq == sorted(seq) for seq in order.values())  # per-key order kept
