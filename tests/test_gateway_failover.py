"""Killing a gateway loses nothing: an idempotent librdkafka producer streams through two ``plog serve``
processes, one is SIGKILLed mid-stream, and afterwards every record is in the log exactly once, in order."""

from __future__ import annotations

import collections
import signal
import time
from pathlib import Path

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")

from confluent_kafka import Producer  # noqa: E402

from pyspark_logsource.client.admin import LogStore  # noqa: E402

from .gateway_fixtures import gateway_process  # noqa: E402

#: Short registrations, so that the survivor takes the dead gateway's partitions within seconds.
FAST = ("--heartbeat-ms", "500", "--registration-ms", "2000", "--flush-interval-ms", "20")
RECORDS = 3000


@pytest.mark.slow
def test_idempotent_producer_survives_a_sigkilled_gateway(tmp_path: Path) -> None:
    root = str(tmp_path / "plog")
    with LogStore(root) as store:
        store.create_topic("stream", 3, config={"retention.ms": -1})
    with gateway_process(root, *FAST) as (first, first_port), gateway_process(root, *FAST) as (second, second_port):
        producer = Producer(
            {
                "bootstrap.servers": f"127.0.0.1:{first_port},127.0.0.1:{second_port}",
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": 120_000,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        delivered: list[bytes] = []
        failed: list[object] = []

        def report(err: object, msg: confluent_kafka.Message) -> None:
            if err is not None:
                failed.append(err)
            else:
                delivered.append(msg.value())

        # The topic's leader is killed: every partition of a shared topic has one (PROTOCOL.md 11.9).
        metadata = producer.list_topics("stream", timeout=30)
        deadline = time.monotonic() + 30
        while len(metadata.brokers) < 2 and time.monotonic() < deadline:  # both registered: the leader is final
            time.sleep(0.2)
            metadata = producer.list_topics("stream", timeout=30)
        assert len(metadata.brokers) == 2
        leader = metadata.topics["stream"].partitions[0].leader
        victim = {first_port: first, second_port: second}[metadata.brokers[leader].port]
        killed_at = None
        for i in range(RECORDS):
            producer.produce("stream", key=f"k{i % 11}".encode(), value=f"{i}".encode(), on_delivery=report)
            if i % 50 == 0:
                producer.poll(0.05)  # a stream, not one burst: records are in flight when the gateway dies
            if killed_at is None and len(delivered) >= RECORDS // 3:
                victim.send_signal(signal.SIGKILL)
                killed_at = i
        assert killed_at is not None, "the gateway was never killed mid-stream"
        assert producer.flush(150) == 0
    assert failed == []
    assert len(delivered) == RECORDS
    table = LogStore(root).read_topic("stream").read_all()
    values = [int(v) for v in table.column("value").to_pylist()]
    counts = collections.Counter(values)
    assert sorted(counts) == list(range(RECORDS)), "a record is missing"
    assert max(counts.values()) == 1, f"written twice: {[v for v, c in counts.items() if c > 1][:10]}"
    # per key (one partition each), the order the producer sent them in
    by_key: dict[bytes, list[int]] = collections.defaultdict(list)
    for row in (
        table.select(["key", "value", "partition", "offset"])
        .sort_by([("partition", "ascending"), ("offset", "ascending")])
        .to_pylist()
    ):
        by_key[row["key"]].append(int(row["value"]))
    assert all(seq == sorted(seq) for seq in by_key.values())
