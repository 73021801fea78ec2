"""Kafka clients at their default settings through ``plog serve``, and how soon a record is acknowledged and seen.

Usage::

    PYTHONPATH=. python benchmarks/bench_gateway_defaults.py [--quick] [--records N] [--samples N] [--rounds N]

A service that points its existing client at ``plog serve`` keeps its settings. Every row is measured against
librdkafka's in-process mock broker in the same run (the reference every ratio is to), and through ONE
``plog serve`` process on a local-disk root (a real process; the root in a temporary directory), 1 KiB
records into a 4-partition topic (the mock's fixed partition count). A throughput row is the best of
``--rounds`` runs against each (3; the first run in a process is the client's cold start):

* confluent-kafka (librdkafka) ``Producer({"bootstrap.servers": ...})``: ``produce()`` of N records, then
  ``flush()``: records/s;
* kafka-python ``KafkaProducer(bootstrap_servers=...)``: ``send()`` of N records, then ``flush()``: records/s;
* acks=all, one record at a time (confluent-kafka, ``produce()`` then ``flush()``): time to the
  acknowledgement, p50 and p99 over the samples;
* end to end, one record every 50 ms: from ``produce()`` to the record in a consumer's hands, p50 and p99 —
  a confluent-kafka producer to a confluent-kafka consumer through the cluster, and plog's own ``Producer``
  to plog's own ``Consumer`` on the local root (no gateway; the reference is the mock broker's Kafka row).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from bench_client import make_values  # the benchmarks' own directory (run as a script)
from bench_gateway import QUIET, TOPIC, gateways, mock_cluster, partitions_of
from spark_common import machine

RECORDS, QUICK_RECORDS = 100_000, 5_000
#: Each throughput row is run this many times against each target and its best run is reported: the first run
#: in a process pays for the client's memory (librdkafka copies every record, and fresh pages fault in), and a
#: gateway's first flushes for its pools, which a running service has paid long before.
ROUNDS = 3
SAMPLES, QUICK_SAMPLES = 200, 40
END_TO_END_GAP_S = 0.05
PARTITIONS = 4
E2E_TOPIC = "end-to-end"


def librdkafka_defaults(bootstrap: str, values: list[bytes]) -> float:
    """records/s of ``produce()`` + ``flush()`` with nothing but ``bootstrap.servers`` set."""
    import confluent_kafka

    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, **QUIET})
    partitions_of(producer)  # metadata first, as a running service has it
    failed: list[Any] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(err)

    start = time.perf_counter()
    for value in values:
        while True:
            try:
                producer.produce(TOPIC, value, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.001)
    left = producer.flush(600)
    elapsed = time.perf_counter() - start
    if left or failed:
        raise RuntimeError(f"{left} records not delivered, {len(failed)} failed: {failed[:3]}")
    return len(values) / elapsed


def kafka_python_defaults(bootstrap: str, values: list[bytes]) -> float:
    """records/s of ``send()`` + ``flush()`` with kafka-python's ``KafkaProducer(bootstrap_servers=...)``."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap.split(","))
    try:
        producer.send(TOPIC, b"warm-up").get(timeout=60)
        start = time.perf_counter()
        futures = [producer.send(TOPIC, value) for value in values]
        producer.flush(600)
        elapsed = time.perf_counter() - start
        failed = [f for f in futures if f.failed()]
        if failed:
            raise RuntimeError(f"{len(failed)} records failed: {failed[0].exception}")
        return len(values) / elapsed
    finally:
        producer.close(timeout=10)


def acknowledgement_ms(bootstrap: str, samples: int) -> list[float]:
    """ms from ``produce()`` to the end of ``flush()``, acks=all, one record at a time."""
    import confluent_kafka

    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all", **QUIET})
    producer.produce(E2E_TOPIC, b"warm-up")
    producer.flush(60)
    out = []
    for n in range(samples):
        start = time.perf_counter()
        producer.produce(E2E_TOPIC, b"x" * 1024, partition=n % PARTITIONS)
        if producer.flush(30):
            raise RuntimeError("a record was not acknowledged in 30 s")
        out.append((time.perf_counter() - start) * 1000)
    return out


def kafka_end_to_end_ms(bootstrap: str, samples: int) -> list[float]:
    """ms from ``produce()`` to the consumer's ``poll()`` returning the record, one record every 50 ms."""
    import confluent_kafka

    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"e2e-{time.time_ns()}", "auto.offset.reset": "latest", **QUIET}
    )
    ends = [
        consumer.get_watermark_offsets(confluent_kafka.TopicPartition(E2E_TOPIC, p), 30)[1] for p in range(PARTITIONS)
    ]
    consumer.assign([confluent_kafka.TopicPartition(E2E_TOPIC, p, end) for p, end in enumerate(ends)])
    consumer.consume(100, timeout=0.5)  # the assignment in place before the first record is sent
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, **QUIET})
    producer.produce(E2E_TOPIC, b"warm-up")  # connections and metadata in place, as in a running service
    producer.flush(30)
    while consumer.poll(0.5) is None:
        pass
    try:
        return _end_to_end(
            lambda n: producer.produce(E2E_TOPIC, str(n).encode(), partition=n % PARTITIONS) or producer.poll(0),
            lambda: [m.value() for m in [consumer.poll(0.5)] if m is not None and m.error() is None],
            samples,
        )
    finally:
        producer.flush(10)
        consumer.close()


def plog_end_to_end_ms(root: str, samples: int) -> list[float]:
    """The same with plog's own ``Producer`` and ``Consumer`` on the local root, at their defaults."""
    from pyspark_logsource import Consumer, Producer, TopicPartition

    consumer = Consumer(root, auto_offset_reset="latest")
    consumer.assign([TopicPartition(E2E_TOPIC, p) for p in range(PARTITIONS)])
    consumer.poll(timeout_ms=100)
    producer = Producer(root)
    producer.send(E2E_TOPIC, b"warm-up").get(timeout=30)  # a running service: its first pass and lease are behind it
    while not consumer.poll(timeout_ms=500):
        pass
    try:
        return _end_to_end(
            lambda n: producer.send(E2E_TOPIC, str(n).encode(), partition=n % PARTITIONS),
            lambda: [r.value for rs in consumer.poll(timeout_ms=500).values() for r in rs],
            samples,
        )
    finally:
        producer.close()
        consumer.close()


def _end_to_end(send: Callable[[int], object], receive: Callable[[], list[bytes]], samples: int) -> list[float]:
    """Send sample n every 50 ms from a thread; the consumer notes when each arrives."""
    sent: dict[int, float] = {}
    arrived: dict[int, float] = {}

    def sender() -> None:
        for n in range(samples):
            sent[n] = time.perf_counter()
            send(n)
            time.sleep(END_TO_END_GAP_S)

    thread = threading.Thread(target=sender, daemon=True)
    thread.start()
    deadline = time.monotonic() + samples * END_TO_END_GAP_S + 60
    while len(arrived) < samples and time.monotonic() < deadline:
        for value in receive():
            if value.isdigit():  # records of the earlier rows are not samples
                arrived.setdefault(int(value), time.perf_counter())
    thread.join(10)
    if len(arrived) < samples:
        raise RuntimeError(f"only {len(arrived)} of {samples} records arrived")
    return [(arrived[n] - sent[n]) * 1000 for n in range(samples)]


def best_of(rounds: int, run: Callable[[], float]) -> float:
    """The highest of ``rounds`` runs' records/s (each printed as it ends)."""
    rates = []
    for _ in range(rounds):
        rates.append(run())
        print(f"  {rates[-1]:,.0f} records/s", flush=True)
    return max(rates)


def percentiles(values: list[float]) -> tuple[float, float]:
    """(p50, p99) of ``values``."""
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return cuts[49], cuts[98]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer records and samples (a smoke run)")
    parser.add_argument("--records", type=int, default=None, help="records per throughput row")
    parser.add_argument("--samples", type=int, default=None, help="samples per latency row")
    parser.add_argument("--rounds", type=int, default=None, help=f"runs per throughput row (default {ROUNDS})")
    parser.add_argument("--extra", default="", help="extra arguments for plog serve, space-separated")
    args = parser.parse_args(argv)
    n = args.records or (QUICK_RECORDS if args.quick else RECORDS)
    samples = args.samples or (QUICK_SAMPLES if args.quick else SAMPLES)
    rounds = args.rounds or (1 if args.quick else ROUNDS)
    values = make_values(n, 1024)
    started = dt.datetime.now(dt.timezone.utc)
    results: dict[str, dict[str, Any]] = {"mock": {}, "gateway": {}}
    with tempfile.TemporaryDirectory(prefix="plog-bench-defaults-") as workdir:
        root = f"{workdir}/root"
        from pyspark_logsource import LogStore

        with LogStore(root) as store:
            store.create_topic(TOPIC, PARTITIONS)
            # The latency rows' own topic: the throughput rows leave the first with a backlog of runs that no
            # maintenance pass has moved yet (the gateway runs none), and each producer's first pass would.
            store.create_topic(E2E_TOPIC, PARTITIONS)
        with mock_cluster() as mock, gateways(root, 1, args.extra.split()) as gateway:
            for name, bootstrap in (("mock", mock), ("gateway", gateway)):
                print(f"{name}: librdkafka at defaults", flush=True)
                results[name]["librdkafka"] = best_of(rounds, lambda b=bootstrap: librdkafka_defaults(b, values))
                print(f"{name}: kafka-python at defaults", flush=True)
                try:
                    results[name]["kafka-python"] = best_of(
                        rounds, lambda b=bootstrap: kafka_python_defaults(b, values)
                    )
                except Exception as exc:  # noqa: BLE001 - the mock broker does not serve every client
                    print(f"  {name}: kafka-python failed: {exc}", flush=True)
                print(f"{name}: acks=all, one record at a time", flush=True)
                results[name]["ack"] = percentiles(acknowledgement_ms(bootstrap, samples))
                print(f"{name}: end to end", flush=True)
                results[name]["e2e"] = percentiles(kafka_end_to_end_ms(bootstrap, samples))
        # The throughput rows left this process holding millions of objects (values, futures): a collection of
        # them would pause the latency rows, which a service running only the clients would not see.
        gc.collect()
        gc.freeze()
        print("plog's own clients: end to end", flush=True)
        results["gateway"]["plog-e2e"] = percentiles(plog_end_to_end_ms(root, samples))
    mock, gateway = results["mock"], results["gateway"]

    def rate(row: dict[str, Any], key: str) -> str:
        return f"{row[key]:,.0f}" if key in row else "—"

    def ratio(key: str) -> str:
        return f"{gateway[key] / mock[key]:.2f}x" if key in mock and key in gateway else "—"

    lines = [
        f"Kafka clients at their defaults, 1 KiB records, {PARTITIONS} partitions, local-disk root; "
        f"{started:%Y-%m-%d}; {machine()}; {n:,} records per throughput row, "
        f"the best of {rounds} runs; {samples} samples per latency row.",
        "",
        "| row | librdkafka's mock broker | one `plog serve` | ratio |",
        "|---|---:|---:|---:|",
        f"| confluent-kafka `produce()` + `flush()`, records/s | {rate(mock, 'librdkafka')} | "
        f"{rate(gateway, 'librdkafka')} | {ratio('librdkafka')} |",
        f"| kafka-python `send()` + `flush()`, records/s | {rate(mock, 'kafka-python')} | "
        f"{rate(gateway, 'kafka-python')} | {ratio('kafka-python')} |",
        f"| acks=all, one record at a time, ms to the acknowledgement: p50 / p99 | {mock['ack'][0]:.1f} / "
        f"{mock['ack'][1]:.1f} | {gateway['ack'][0]:.1f} / {gateway['ack'][1]:.1f} | |",
        f"| end to end, Kafka producer to Kafka consumer, a record every 50 ms, ms: p50 / p99 | {mock['e2e'][0]:.1f} / "
        f"{mock['e2e'][1]:.1f} | {gateway['e2e'][0]:.1f} / {gateway['e2e'][1]:.1f} | |",
        f"| end to end, plog's `Producer` to plog's `Consumer` on the root (no gateway), ms: p50 / p99 | | "
        f"{gateway['plog-e2e'][0]:.1f} / {gateway['plog-e2e'][1]:.1f} | |",
    ]
    print()
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
