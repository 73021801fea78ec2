"""Clients that send and fetch as fast as they can keep Kafka's bound on their quota (PROTOCOL.md 11.10).

Each test runs a client flat out for at least 10 s under a byte quota and checks what it moved, observed
from outside, against ``quota × (elapsed + burst)`` from its start (a new client) and over every interval
of the run (a client already running), and that it reached the quota (give or take Kafka's 20 %), so a
client that holds the bound by crawling fails too. Without the wait before each step the producer ran at
five times its quota and a large ``send_batch`` was not slowed at all.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.quotas import DEFAULT, Entity, alter_quota
from coordinator.throttle import Throttle
from pyspark_logsource.cli.app import main as plog
from pyspark_logsource.client.admin import LogStore
from pyspark_logsource.client.consumer import Consumer
from pyspark_logsource.client.producer import Producer
from pyspark_logsource.client.types import TopicPartition
from segment_format.stores import open_store

from .quota_bound import Poller, Progress, assert_near_quota, assert_within_quota

QUOTA = 1024 * 1024
RUN_S = 10.0


@pytest.fixture
def url(tmp_path: Path) -> str:
    return str(tmp_path / "root")


def log_end_bytes(url: str, topic: str, record_bytes: int) -> Any:
    """What the topic's logs hold so far, in bytes of records of ``record_bytes``, read from the store."""
    store = LogStore(url)

    def moved() -> float:
        return record_bytes * sum(p["end_offset"] for p in store.describe_topic(topic)["partitions"])

    return moved


# ------------------------------------------------------------------ the ledger


def test_the_ledger_gives_a_burst_then_the_quota_and_clears_steps_in_the_order_asked() -> None:
    now = [100.0]
    throttle = Throttle(1000.0, clock=lambda: now[0])
    assert throttle.wait_s(throttle.reserve(1000)) == 0.0  # a new client's burst: one second of its quota
    second = throttle.reserve(500)
    third = throttle.reserve(2000)
    assert throttle.wait_s(second) == pytest.approx(0.5)
    assert throttle.wait_s(third) == pytest.approx(2.5)
    now[0] += 0.5  # the second clears; a step asked for later never delays an earlier one
    assert throttle.wait_s(second) == 0.0
    assert throttle.wait_s(third) == pytest.approx(2.0)
    now[0] = 1000.0  # idle for long: it saved one burst, no more
    assert throttle.wait_s(throttle.reserve(1000)) == 0.0
    waiting = throttle.reserve(10_000)
    assert throttle.wait_s(waiting) == pytest.approx(10.0)
    throttle.quota = 10_000.0  # raised: the waiting step clears at the new rate
    assert throttle.wait_s(waiting) == pytest.approx(1.0)
    throttle.quota = 0.0  # a quota of 0 holds every step until it changes
    assert throttle.wait_s(throttle.reserve(1)) == float("inf")
    throttle.quota = None  # removed: everything clears
    assert throttle.wait_s(throttle.reserve(10**12)) == 0.0


@settings(max_examples=300, deadline=None)
@given(
    quota=st.floats(10.0, 1e6),
    steps=st.lists(st.tuples(st.floats(0.0, 3.0), st.floats(0.0, 1.0)), min_size=1, max_size=60),
)
def test_a_client_that_takes_each_step_when_it_clears_keeps_the_bound_over_every_interval(
    quota: float, steps: list[tuple[float, float]]
) -> None:
    """Steps of at most one burst, taken as soon as they clear after pauses of any length: over any interval
    ``[a, b]`` of the run at most ``quota × (b - a + burst)``, from the start at most ``quota × (t + burst)``."""
    now = [0.0]
    throttle = Throttle(quota, clock=lambda: now[0])
    taken: list[tuple[float, float]] = []
    for pause, share in steps:
        now[0] += pause
        amount = share * quota * throttle.burst_s
        now[0] += throttle.wait_s(throttle.reserve(amount))
        taken.append((now[0], amount))
    slack = 1e-6 * quota
    for i in range(len(taken)):
        moved = 0.0
        for j in range(i, len(taken)):
            moved += taken[j][1]
            assert moved <= quota * (taken[j][0] - taken[i][0] + throttle.burst_s) + slack
    assert sum(a for _, a in taken) <= quota * (taken[-1][0] + throttle.burst_s) + slack


# ------------------------------------------------------------------ plog's clients


def test_a_producer_flat_out_keeps_its_quota_new_and_running(url: str) -> None:
    """One producer of client id ``slow``: a 5 MB ``send_batch`` as its first step, then ``send`` of 1 KB
    random values in a loop; what reaches the log is checked against the bound from the producer's start
    and over every interval, the loop's included."""
    LogStore(url).create_topic("t", partitions=2)
    assert plog(["quotas", "alter", "--url", url, "--entity-type", "clients", "--entity-name", "slow",
                 "--add-config", f"producer_byte_rate={QUOTA}"]) == 0  # fmt: skip
    value = os.urandom(1000)
    start = time.monotonic()
    with Poller(log_end_bytes(url, "t", len(value))) as progress:
        # A megabyte of buffers, so that the loop backs up at once and its flush waits a second, not 32 s.
        producer = Producer(url, client_id="slow", quota_refresh_ms=200, buffer_memory=1024 * 1024)
        producer.send_batch("t", pa.table({"value": [b"x" * 1000] * 5000}))  # compressible: bytes are Arrow's
        while time.monotonic() - start < RUN_S:
            producer.send("t", os.urandom(1000))
        producer.flush()
    throttle_avg = producer.metrics()["produce-throttle-time-avg"]
    producer.close()
    assert_within_quota(progress, QUOTA, start)
    assert_near_quota(progress, QUOTA, start)
    assert throttle_avg > 0


def test_a_consumer_flat_out_keeps_its_quota_new_and_running(url: str) -> None:
    LogStore(url).create_topic("t", partitions=2)
    alter_quota(open_store(url), Entity(None, "reader"), {"consumer_byte_rate": QUOTA})
    value = os.urandom(1000)
    with Producer(url) as producer:  # no quota for this client id
        producer.send_batch("t", pa.table({"value": [value] * 16_000}))  # 16 MB: more than 10 s of the quota
    consumer = Consumer(url, client_id="reader", quota_refresh_ms=200, auto_offset_reset="earliest")
    consumer.assign([TopicPartition("t", 0), TopicPartition("t", 1)])
    progress = Progress()
    start = time.monotonic()
    while time.monotonic() - start < RUN_S:
        table = consumer.poll_arrow(timeout_ms=500)
        progress.add(table.num_rows * len(value))
    throttle_avg = consumer.metrics()["fetch-throttle-time-avg"]
    consumer.close()
    assert_within_quota(progress, QUOTA, start)
    assert_near_quota(progress, QUOTA, start)
    assert throttle_avg > 0


# ------------------------------------------------------------------ Kafka clients through plog serve


def _throttle_stats(throttles: list[float]) -> Any:
    def stats(text: str) -> None:
        for broker in json.loads(text).get("brokers", {}).values():
            avg = broker.get("throttle", {}).get("avg", 0)
            if avg:
                throttles.append(avg)

    return stats


def test_a_kafka_producer_flat_out_through_the_gateway_keeps_its_quota(url: str) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    from pyspark_logsource.gateway import GatewayConfig, running_gateway

    LogStore(url).create_topic("t", partitions=2)
    # The gateway's connection is (User:ANONYMOUS, "quota-test"): the <default> user's entity for the client.
    alter_quota(open_store(url), Entity(DEFAULT, "quota-test"), {"producer_byte_rate": QUOTA})
    throttles: list[float] = []
    progress = Progress()

    def on_delivery(err: Any, msg: Any) -> None:
        assert err is None, err
        progress.add(len(msg.value()))

    with running_gateway(GatewayConfig(url=url, port=0)) as gateway:
        producer = confluent_kafka.Producer(
            {
                "bootstrap.servers": f"127.0.0.1:{gateway.port}",
                "client.id": "quota-test",
                # A request is at most a burst of the quota: the gateway holds a request whole (Kafka's own
                # bound assumes requests of at most max.request.size).
                "batch.size": 256 * 1024,
                "queue.buffering.max.kbytes": 1024,  # backs up at once: the flush waits a second, not minutes
                "statistics.interval.ms": 500,
                "stats_cb": _throttle_stats(throttles),
            }
        )
        start = time.monotonic()
        while time.monotonic() - start < RUN_S:
            try:
                producer.produce("t", os.urandom(1000), on_delivery=on_delivery)
            except BufferError:  # its queue is full: the gateway is holding it back
                producer.poll(0.005)
            producer.poll(0)
        producer.flush(60)
        deadline = time.monotonic() + 5
        while not throttles and time.monotonic() < deadline:
            producer.poll(0.1)
    assert_within_quota(progress, QUOTA, start)
    assert_near_quota(progress, QUOTA, start)
    assert throttles, "librdkafka never reported a throttle time"


def test_a_kafka_consumer_flat_out_through_the_gateway_keeps_its_quota(url: str) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    from pyspark_logsource.gateway import GatewayConfig, running_gateway

    LogStore(url).create_topic("t", partitions=1)
    alter_quota(open_store(url), Entity("ANONYMOUS", None), {"consumer_byte_rate": QUOTA})
    value = os.urandom(1000)
    with Producer(url, client_id="filler") as producer:
        producer.send_batch("t", pa.table({"value": [value] * 16_000}))  # 16 MB
    throttles: list[float] = []
    progress = Progress()
    with running_gateway(GatewayConfig(url=url, port=0)) as gateway:
        consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": f"127.0.0.1:{gateway.port}",
                "group.id": "unused",
                "client.id": "quota-reader",
                "enable.auto.commit": False,
                # what the client holds ahead of the application stays well inside the observation's allowance
                "queued.max.messages.kbytes": 64,
                "statistics.interval.ms": 500,
                "stats_cb": _throttle_stats(throttles),
            }
        )
        consumer.assign([confluent_kafka.TopicPartition("t", 0, 0)])
        start = time.monotonic()
        while time.monotonic() - start < RUN_S:
            msg = consumer.poll(0.1)
            if msg is not None:
                assert msg.error() is None, msg.error()
                progress.add(len(msg.value()))
        deadline = time.monotonic() + 5
        while not throttles and time.monotonic() < deadline:
            consumer.poll(0.1)
        consumer.close()
    assert_within_quota(progress, QUOTA, start)
    assert_near_quota(progress, QUOTA, start)
    assert throttles, "librdkafka never reported a throttle time"
