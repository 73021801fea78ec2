"""Spark and Kafka clients on one log through plog serve: a librdkafka producer feeds an exactly-once Spark
pipeline, and a librdkafka consumer reads what the Spark sink wrote, in per-key order."""

from __future__ import annotations

import collections
import time
from pathlib import Path
from typing import Any

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

from pyspark_logsource.client.admin import LogStore  # noqa: E402
from pyspark_logsource.gateway import GatewayConfig, running_gateway  # noqa: E402

KEYS = 7


@pytest.mark.spark
def test_librdkafka_to_spark_exactly_once_to_librdkafka(spark: Any, tmp_path: Path) -> None:
    root = str(tmp_path / "plog")
    with LogStore(root) as store:
        store.create_topic("events", 3, config={"retention.ms": -1})
        store.create_topic("shouted", 2, config={"retention.ms": -1})
    with running_gateway(GatewayConfig(url=root, port=0, flush_interval_ms=20)) as gateway:
        bootstrap = f"127.0.0.1:{gateway.port}"
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
        for i in range(600):
            producer.produce(
                "events", key=f"k{i % KEYS}".encode(), value=f"e{i}".encode(), headers=[("i", str(i).encode())]
            )
        assert producer.flush(30) == 0

        # Spark reads the gateway's records from the root and writes them, transformed, exactly once.
        query = (
            spark.readStream.format("plog")
            .option("subscribe", "events")
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "200")
            .option("includeHeaders", "true")
            .load(root)
            .selectExpr("key", "upper(cast(value as string)) as value", "headers")
            .writeStream.format("plog")
            .option("topic", "shouted")
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start(root)
        )
        assert query.awaitTermination(240), "the query did not finish"
        assert query.exception() is None, query.exception()

        # A read_committed librdkafka consumer sees every record once, in per-key order, with its headers.
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "audit",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
        consumer.assign([TopicPartition("shouted", p, 0) for p in range(2)])
        seen: list[Any] = []
        deadline = time.monotonic() + 60
        while len(seen) < 600 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is None, message.error()
                seen.append(message)
        consumer.close()
    values = [m.value() for m in seen]
    assert sorted(values) == sorted(f"E{i}".encode() for i in range(600))  # each once, none lost
    by_key: dict[bytes, list[int]] = collections.defaultdict(list)
    for m in seen:
        number = int(m.value()[1:])
        assert m.key() == f"k{number % KEYS}".encode()
        assert dict(m.headers())["i"] == str(number).encode()
        by_key[m.key()].append(number)
    assert all(numbers == sorted(numbers) for numbers in by_key.values())
