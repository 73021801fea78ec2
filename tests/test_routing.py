"""One routing for the producer and the Spark sink (``pyspark_logsource/client/routing.py``).

* keyed records go where Kafka's default partitioner puts them (Kafka's own murmur2 test vectors),
  through ``Router``, ``Producer.send``, ``Producer.send_batch`` and the sink alike;
* null-key records: the same sequence, cut into the same batches, lands on the same partitions
  through ``Producer.send`` (+ ``flush`` per batch), ``Producer.send_batch`` and the sink's real
  task writer (``PlogBatchWriter.write``), and on the partitions a plain restatement of the rule
  predicts: sticky until ``batch_bytes`` bytes or the batch's end, then the next partition;
* explicit partitions: honoured, checked with a plain comparison (no metadata read when in range),
  and an out-of-range one is refused with an error naming topic and partition.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from pyspark_logsource import Consumer, LogStore, Producer, TopicPartition
from pyspark_logsource.client import routing
from pyspark_logsource.client.accumulator import RECORD_OVERHEAD
from pyspark_logsource.client.partitioner import to_positive
from pyspark_logsource.client.producer import PRODUCER_DEFAULTS
from pyspark_logsource.client.routing import DEFAULT_BATCH_BYTES, Router
from segment_format.errors import PlogError, UnknownTopicOrPartitionError
from segment_format.topic import TopicMetadata
from tests.test_partitioner import KAFKA_UTILS_TEST_VECTORS

PARTITIONS = 5


@pytest.fixture
def root(tmp_path: Path) -> str:
    url = str(tmp_path / "plog")
    with LogStore(url) as store:
        for name in ("send", "bulk", "sink"):
            store.create_topic(name, PARTITIONS)
    return url


@pytest.fixture
def fixed_start(monkeypatch: pytest.MonkeyPatch) -> int:
    """Every router's first null-key batch goes to partition 3 (instead of a random one)."""
    monkeypatch.setattr(routing, "start_partition", lambda partitions: 3 % partitions)
    return 3


def placed(url: str, topic: str) -> dict[bytes, int]:
    """Value -> partition of every committed record of ``topic``."""
    with Consumer(url, isolation_level="read_committed", auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        table = consumer.read_to_end()
    return dict(zip(table.column("value").to_pylist(), table.column("partition").to_pylist(), strict=True))


def sink_write(url: str, topic: str, chunks: list[pa.Table]) -> None:
    """Write ``chunks`` (one Arrow batch each) through the Spark sink's own task writer, and commit."""
    pytest.importorskip("pyspark")
    from pyspark.sql.types import BinaryType, IntegerType, StructField, StructType

    from pyspark_logsource.spark.sink import PlogBatchWriter

    fields = [StructField("key", BinaryType()), StructField("value", BinaryType())]
    if "partition" in chunks[0].column_names:
        fields.append(StructField("partition", IntegerType()))
    writer = PlogBatchWriter({"path": url, "topic": topic}, StructType(fields))
    batches: Iterator[pa.RecordBatch] = (chunk.combine_chunks().to_batches()[0] for chunk in chunks)
    writer.commit([writer.write(batches)])


def meta_of(url: str, topic: str) -> TopicMetadata:
    with LogStore(url) as store:
        return store.root.topic(topic)


# --------------------------------------------------------------------------- keyed records


def test_keyed_records_go_where_kafka_puts_them(root: str) -> None:
    keys = list(KAFKA_UTILS_TEST_VECTORS)
    kafka = [to_positive(h) % PARTITIONS for h in KAFKA_UTILS_TEST_VECTORS.values()]  # Java's own hashes
    values = [b"v-" + k for k in keys]
    meta = meta_of(root, "send")
    router = Router("send", lambda: meta)
    assert router.route(meta, pa.array(keys, pa.binary()), pa.array(values)).tolist() == kafka

    with Producer(root) as producer:
        futures = [producer.send("send", value=v, key=k) for k, v in zip(keys, values, strict=True)]
        assert [f.get(10).partition for f in futures] == kafka
        producer.send_batch("bulk", pa.table({"key": keys, "value": values}))
    sink_write(root, "sink", [pa.table({"key": pa.array(keys, pa.binary()), "value": values})])
    for topic in ("send", "bulk", "sink"):
        where = placed(root, topic)
        assert [where[v] for v in values] == kafka, topic


# --------------------------------------------------------------------------- null keys


def expected_sticky(chunks: list[list[bytes]], start: int, partitions: int, batch_bytes: int) -> list[int]:
    """The rule restated record by record: stay until ``batch_bytes`` bytes or the chunk's end, then move on."""
    out, current = [], start
    for chunk in chunks:
        used = 0
        for value in chunk:
            out.append(current)
            used += len(value) + RECORD_OVERHEAD
            if used >= batch_bytes:
                current, used = (current + 1) % partitions, 0
        if used:
            current = (current + 1) % partitions
    return out


def test_null_keys_land_alike_from_send_send_batch_and_the_sink(root: str, fixed_start: int) -> None:
    assert PRODUCER_DEFAULTS["batch_size"] == DEFAULT_BATCH_BYTES  # the sink routes as a default producer does
    rng = random.Random(10)
    sizes = [2500, 100, 3400, 7]  # records per chunk: runs cross batch_bytes inside chunks, and chunks end early
    chunks, counter = [], 0
    for size in sizes:
        chunk = []
        for _ in range(size):
            chunk.append(b"%08d" % counter + bytes(rng.randrange(400, 1600)))  # unique and of varied length
            counter += 1
        chunks.append(chunk)
    expected = expected_sticky(chunks, fixed_start, PARTITIONS, DEFAULT_BATCH_BYTES)
    assert len(set(expected)) == PARTITIONS and len(set(expected[:2500])) >= 3  # the rule is exercised

    with Producer(root, linger_ms=60_000) as producer:  # only batch_size and flush() seal a buffer
        sent = []
        for chunk in chunks:
            futures = [producer.send("send", value=v) for v in chunk]
            producer.flush()
            sent.extend(f.get(10).partition for f in futures)
        for chunk in chunks:
            producer.send_batch("bulk", pa.table({"value": pa.array(chunk, pa.binary())}))
    sink_write(root, "sink", [pa.table({"key": pa.nulls(len(c), pa.binary()), "value": c}) for c in chunks])

    values = [v for chunk in chunks for v in chunk]
    assert sent == expected
    for topic in ("bulk", "sink"):
        where = placed(root, topic)
        assert [where[v] for v in values] == expected, topic


def test_mixed_rows_land_alike_from_send_batch_and_the_sink(root: str, fixed_start: int) -> None:
    """Keys, null keys, explicit and null partitions in one table: ``send_batch`` and the sink agree."""
    rng = random.Random(11)
    chunks = []
    for c in range(3):
        n = 900
        keys = [None if rng.random() < 0.6 else b"k%d" % rng.randrange(50) for _ in range(n)]
        parts = [rng.randrange(PARTITIONS) if rng.random() < 0.2 else None for _ in range(n)]
        values = [b"%d-%d" % (c, i) + bytes(rng.randrange(500, 3000)) for i in range(n)]
        chunks.append(
            pa.table(
                {
                    "key": pa.array(keys, pa.binary()),
                    "value": pa.array(values, pa.binary()),
                    "partition": pa.array(parts, pa.int32()),
                }
            )
        )
    with Producer(root) as producer:
        for chunk in chunks:
            producer.send_batch("bulk", chunk)
    sink_write(root, "sink", chunks)
    bulk, sink = placed(root, "bulk"), placed(root, "sink")
    assert bulk == sink and len(bulk) == 2700
    for chunk in chunks:
        for p, v in zip(chunk.column("partition").to_pylist(), chunk.column("value").to_pylist(), strict=True):
            if p is not None:
                assert bulk[v] == p


def test_null_key_batches_move_round_the_partitions(tmp_path: Path, fixed_start: int) -> None:
    with LogStore(str(tmp_path)) as store:
        meta = store.create_topic("three", 3)
    router = Router("three", lambda: pytest.fail("no explicit partition here"), batch_bytes=10_000)
    seen = []
    for _ in range(7):  # small batches: each is sealed by its end, never by size
        parts = router.route(meta, pa.array([None, None, b"key"], pa.binary()), pa.array([b"a", b"b", b"c"]))
        assert parts[0] == parts[1]  # sticky within the batch
        seen.append(int(parts[0]))
    assert seen == [0, 1, 2, 0, 1, 2, 0]  # from fixed_start (3 % 3), never the same twice in a row


# --------------------------------------------------------------------------- explicit partitions


def test_explicit_partitions_are_checked_cheaply_and_refused_by_name(root: str) -> None:
    meta = meta_of(root, "send")
    refreshes = []

    def refresh() -> TopicMetadata:
        refreshes.append(1)
        return meta

    router = Router("send", refresh)
    assert [router.check(p, meta) for p in range(PARTITIONS)] == list(range(PARTITIONS))
    assert not refreshes  # in range: a plain int comparison, no metadata read
    with pytest.raises(UnknownTopicOrPartitionError, match=re.escape("partition 5 does not exist in topic 'send'")):
        router.check(5, meta)
    assert refreshes == [1]  # beyond the partitions known: read again once before refusing
    with pytest.raises(UnknownTopicOrPartitionError, match=re.escape("partition -1 does not exist in topic 'send'")):
        router.check(-1, meta)
    with pytest.raises(UnknownTopicOrPartitionError, match=re.escape("partition 7 does not exist in topic 'send'")):
        router.route(meta, pa.nulls(3, pa.binary()), pa.array([b"a", b"b", b"c"]), given=np.array([0, 7, 1]))

    with Producer(root) as producer:
        with pytest.raises(UnknownTopicOrPartitionError, match=r"partition 9 does not exist in topic 'send'"):
            producer.send("send", value=b"x", partition=9)
        with pytest.raises(UnknownTopicOrPartitionError, match=r"partition 9 does not exist in topic 'bulk'"):
            producer.send_batch("bulk", pa.table({"value": [b"a", b"b"], "partition": [1, 9]}))
        # A partition added after the producer read the topic: found by reading the metadata again.
        with LogStore(root) as store:
            store.create_partitions("send", PARTITIONS + 1)
        assert producer.send("send", value=b"new", partition=PARTITIONS).get(10).partition == PARTITIONS
    table = pa.table(
        {"key": pa.nulls(2, pa.binary()), "value": [b"a", b"b"], "partition": pa.array([0, 8], pa.int32())}
    )
    with pytest.raises(PlogError, match=r"column 'partition': partition 8 does not exist in topic 'sink'"):
        sink_write(root, "sink", [table])


def test_a_partitioner_callable_decides_for_send_and_send_batch(root: str) -> None:
    calls: list[Any] = []

    def last_partition(key: bytes | None, everyone: list[int], available: list[int]) -> int:
        calls.append(key)
        return everyone[-1]

    with Producer(root, partitioner=last_partition) as producer:
        assert producer.send("send", value=b"a", key=b"k").get(10).partition == PARTITIONS - 1
        assert producer.send("send", value=b"b", partition=0).get(10).partition == 0  # explicit: not asked
        result = producer.send_batch("bulk", pa.table({"key": [b"x", None], "value": [b"c", b"d"]}))
    assert result.offsets.keys() == {PARTITIONS - 1}
    assert calls == [b"k", b"x", None]
