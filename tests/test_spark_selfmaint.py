"""A Spark pipeline keeps its output topic bounded with nobody running ``plog maintain`` (PROTOCOL.md 10.1).

25 micro-batches into a topic with small ``segment.bytes``, a retention that the first half of the records
is past, and ``auto.maintenance.interval.ms`` = 0: the sink's driver maintains after every commit, so the
topic ends with a few merged segments per partition (not one object per micro-batch), a moved log start,
and every retained record read back exactly once.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pyspark_logsource import Consumer, LogStore, Producer, TopicPartition
from pyspark_logsource.spark.credentials import spark_storage_options
from segment_format.root import LogRoot
from tests.fixtures_s3 import REQUESTS

pytest.importorskip("pyspark")

BATCHES, PER_BATCH, PARTITIONS = 25, 400, 2
HOUR_MS = 3600 * 1000


def _objects(root: str, topic: str, partition: int) -> int:
    """Data objects stored for one partition (on the chain or not yet collected)."""
    r = LogRoot(root)
    try:
        log = r.partition(topic, partition)
        return len([i for i in r.store.list(log.prefix + "log/") if i.key.endswith(".arrow")])
    finally:
        r.close()


def run_in_to_out(
    spark: Any, url: str, options: dict[str, str], per_batch: int, columns: list[str], checkpoint: Path
) -> Any:
    """Stream topic ``in`` to topic ``out`` (``columns``), ``per_batch`` records a micro-batch, to the end."""
    query = (
        spark.readStream.format("plog")
        .options(**options)
        .option("subscribe", "in")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(per_batch))
        .load(url)
        .selectExpr(*columns)
        .writeStream.format("plog")
        .options(**options)
        .option("topic", "out")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(url)
    )
    assert query.awaitTermination(300), "the query did not finish"
    assert query.exception() is None, str(query.exception())
    return query


def run_pipeline(spark: Any, tmp_path: Path, auto: bool) -> tuple[str, int]:
    """Produce the input, run the pipeline to the end; returns the root and the input's record count."""
    root = str(tmp_path / "plog")
    total = BATCHES * PER_BATCH
    old, new = int(time.time() * 1000) - 2 * HOUR_MS, int(time.time() * 1000)
    with LogStore(root) as store:
        store.create_topic("in", 1)
        store.create_topic(
            "out",
            PARTITIONS,
            {
                "storage.layout": "partitioned",  # the tasks hand over the objects they appended
                "segment.bytes": 64 * 1024,
                "retention.ms": HOUR_MS,
                "file.delete.delay.ms": 0,
                "auto.maintenance.enable": auto,
                "auto.maintenance.interval.ms": 0,
            },
        )
    with Producer(root) as producer:
        producer.send_batch(
            "in",
            pa.table(
                {
                    "key": pa.array([f"k{i % 16}".encode() for i in range(total)], pa.binary()),
                    "value": pa.array([f"{i}:{os.urandom(40).hex()}".encode() for i in range(total)], pa.binary()),
                    # the first half is two hours old, past retention.ms; the second half is new
                    "timestamp": pa.array([old + i if i < total // 2 else new + i for i in range(total)], pa.int64()),
                }
            ),
        )
    query = run_in_to_out(spark, root, {}, PER_BATCH, ["key", "value", "timestamp"], tmp_path / "ck")
    assert len([p for p in query.recentProgress if p["numInputRows"]]) == BATCHES
    return root, total


@pytest.mark.spark
@pytest.mark.timeout(400)
def test_a_pipeline_keeps_its_output_bounded_and_retained(spark: Any, tmp_path: Path) -> None:
    root, total = run_pipeline(spark, tmp_path, auto=True)
    counts = [_objects(root, "out", p) for p in range(PARTITIONS)]
    print(f"self-maintenance: objects per partition after {BATCHES} micro-batches: {counts}")
    # Without maintenance each partition holds one object per micro-batch (25).
    assert all(c <= 10 for c in counts), counts
    with LogStore(root) as store:
        parts = store.describe_topic("out")["partitions"]
    r = LogRoot(root)
    spans = [(r.partition("out", p).view().start_offset, r.partition("out", p).view().end_offset) for p in range(2)]
    r.close()
    assert all(start > 0 for start, _ in spans), spans  # retention moved every log start
    with Consumer(root, isolation_level="read_committed", auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("out", p) for p in range(len(parts))])
        table = consumer.read_to_end()
    numbers = [int(v.split(b":")[0]) for v in table.column("value").to_pylist()]
    assert len(numbers) == len(set(numbers)), "a retained record was read twice"
    assert len(numbers) == sum(end - start for start, end in spans)
    assert set(range(total // 2, total)) <= set(numbers), "a record within retention is missing"


@pytest.mark.spark
@pytest.mark.s3
@pytest.mark.timeout(400)
def test_the_drivers_merges_read_none_of_the_objects_the_tasks_handed_over(
    spark: Any, s3_url: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    """The sink's tasks hand their small objects to the driver in their commit messages, and the driver's
    maintenance merges them without reading them back (PROTOCOL.md 10.1): on S3 that read was about one GET
    per partition and micro-batch, a third of a plog -> plog pipeline's requests."""
    url, storage = s3_url
    bucket = url.split("/")[2]
    batches, per_batch = 20, 100
    with LogStore(url, storage) as store:
        store.create_topic("in", 1)
        store.create_topic(
            "out", 2, {"auto.maintenance.interval.ms": 0, "segment.bytes": 1 << 20, "storage.layout": "partitioned"}
        )
    with Producer(url, storage) as producer:
        total = batches * per_batch
        producer.send_batch(
            "in",
            pa.table({"key": [b"k%d" % (i % 8) for i in range(total)], "value": [b"v%d" % i for i in range(total)]}),
        )
    options = spark_storage_options(storage)
    before = REQUESTS.shapes(bucket)
    run_in_to_out(spark, url, options, per_batch, ["key", "value"], tmp_path / "ck")
    spent = REQUESTS.shapes(bucket) - before
    merged = sum(
        n
        for (kind, shape), n in spent.items()
        if kind == "PUT" and shape.startswith("plog/topics/out/") and ".g" in shape
    )
    appended_reads = sum(
        n
        for (kind, shape), n in spent.items()
        if kind == "GET" and shape.startswith("plog/topics/out/") and shape.endswith("/log/#.arrow")
    )
    assert merged >= 2, spent  # each partition's first 16 appends were merged
    assert appended_reads == 0, spent
    with Consumer(url, storage_options=storage, isolation_level="read_committed", auto_offset_reset="earliest") as c:
        c.assign([TopicPartition("out", p) for p in range(2)])
        values = sorted(c.read_to_end().column("value").to_pylist())
    assert values == sorted(b"v%d" % i for i in range(total))
