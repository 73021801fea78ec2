"""Killing a gateway loses nothing: an idempotent librdkafka producer streams through two ``plog serve``
processes, one is SIGKILLed mid-stream, and afterwards every record is in the log exactly once, in order; one
killed between a flush's shared object and its commit leaves an object no reader sees, and the producer's retry
through the other gateway lands once."""

from __future__ import annotations

import collections
import signal
import time
from pathlib import Path

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")

from confluent_kafka import Producer  # noqa: E402

from pyspark_logsource.cli.common import storage_option_args  # noqa: E402
from pyspark_logsource.client.admin import LogStore  # noqa: E402
from segment_format.stores import open_store  # noqa: E402

from .fault_proxy import FaultyS3  # noqa: E402
from .gateway_fixtures import gateway_process  # noqa: E402

#: Short registrations, so that the survivor takes the dead gateway's partitions within seconds.
FAST = ("--heartbeat-ms", "500", "--registration-ms", "2000", "--flush-interval-ms", "20")
RECORDS = 3000


class Deliveries:
    """A producer's delivery reports (its ``on_delivery``): the values delivered, and the errors."""

    def __init__(self) -> None:
        self.delivered: list[bytes] = []
        self.failed: list[object] = []

    def __call__(self, err: object, msg: confluent_kafka.Message) -> None:
        if err is not None:
            self.failed.append(err)
        else:
            self.delivered.append(msg.value())


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
        report = Deliveries()
        delivered, failed = report.delivered, report.failed
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


@pytest.mark.slow
def test_a_producer_whose_gateway_dies_between_its_shared_object_and_its_commit_lands_once(
    faulty_s3: FaultyS3,
) -> None:
    """Two gateways: one reaches S3 (moto) through the fault proxy, the other directly. The first leads the
    topic: it writes a flush's shared object, then every try of the flush's commit fails (500, never forwarded),
    and it is SIGKILLed while it retries. The idempotent librdkafka producer retries through the second: no
    commit names the first object, so the producer's state there is new, its batch is written again and
    acknowledged, and the topic holds each record once (the first object is an orphan for collection,
    PROTOCOL.md 10)."""
    url, direct = faulty_s3.url, faulty_s3.direct_options
    topics = [f"orders{n}" for n in range(8)]
    with LogStore(url, storage_options=direct) as admin:
        for topic in topics:
            admin.create_topic(topic, 2, {"storage.layout": "shared", "auto.maintenance.enable": "false"})
    store = open_store(url, storage_options=direct)
    report = Deliveries()
    delivered, failed = report.delivered, report.failed
    with (
        gateway_process(url, *FAST, *storage_option_args(faulty_s3.options)) as (victim, victim_port),
        gateway_process(url, *FAST, *storage_option_args(direct)) as (_survivor, survivor_port),
    ):
        producer = Producer(
            {
                "bootstrap.servers": f"127.0.0.1:{victim_port},127.0.0.1:{survivor_port}",
                "enable.idempotence": True,
                "message.timeout.ms": 120_000,
                "topic.metadata.refresh.interval.ms": 1000,
                "log_level": 0,
            }
        )
        deadline = time.monotonic() + 30
        metadata = producer.list_topics(timeout=30)
        while len(metadata.brokers) < 2 and time.monotonic() < deadline:  # both registered: leaders are final
            time.sleep(0.2)
            metadata = producer.list_topics(timeout=30)
        # A shared topic's leader is a rendezvous choice among the gateways: take a topic the first one leads.
        led = [t for t in topics if metadata.brokers[metadata.topics[t].partitions[0].leader].port == victim_port]
        assert led, "the proxied gateway leads none of 8 topics"
        topic = led[0]
        faulty_s3.inject(1, 1.0, kinds=("internal",), methods=frozenset({"PUT"}), key_pattern=r"/commits/")
        for i in range(20):
            producer.produce(topic, value=f"{i}".encode(), partition=i % 2, on_delivery=report)
        producer.poll(0)
        while faulty_s3.proxy.injected["internal"] < 2 and time.monotonic() < deadline + 30:
            time.sleep(0.05)  # the flush's object is written, and its commit failed (and is being retried)
        assert len(list(store.list("shared/"))) == 1 and faulty_s3.proxy.injected["internal"] >= 2
        assert delivered == [] and victim.poll() is None, "the batch was acknowledged without its commit"
        victim.send_signal(signal.SIGKILL)
        victim.wait(30)
        assert producer.flush(90) == 0
    assert failed == []
    assert sorted(delivered, key=int) == [f"{i}".encode() for i in range(20)]
    values = LogStore(url, storage_options=direct).read_topic(topic).read_all().column("value").to_pylist()
    assert sorted(values, key=int) == [f"{i}".encode() for i in range(20)]  # each once
    assert len(list(store.list("shared/"))) >= 2  # the orphan (a retry through the victim may add one), and the rewrite
