"""Throughput of ``plog serve`` (the Kafka-protocol gateway) with librdkafka, next to librdkafka's mock broker.

Usage::

    PYTHONPATH=. python benchmarks/bench_gateway.py [--records N] [--quick] [--sizes 100,1024]
                                                     [--linger-ms MS] [--gateway-flush-interval-ms MS] [--profile DIR]
                                                     [--rounds N]

One confluent-kafka (librdkafka) client produces N records to a 6-partition
topic, then a consumer reads them back, against three clusters in the same run:

* librdkafka's mock broker (``"test.mock.num.brokers": 1``: an in-process
  cluster, as ``bench_client.py`` uses it) -- the reference every ratio is to.
  Its topic has 4 partitions (the mock names no controller, so it cannot be
  asked for 6) and it keeps only the newest few MB of a partition, so its fetch
  rows read what it kept;
* ONE ``plog serve`` process (started as a real process, local-disk root in a
  temporary directory);
* TWO ``plog serve`` processes on the same root (the client bootstraps with
  both; the gateways spread the partitions' leadership over themselves).

Produce: ``linger.ms`` 5, ``acks=all``, idempotence on, lz4; timed from the
first ``produce()`` to ``flush()`` returning (a warm-up record per partition
first, so producer ids and metadata are out of the figure), the best of ``--rounds`` runs (3: the first
run in a process pays for the client's fresh memory, and a gateway's first flushes for its pools, which a
running service paid long before). Fetch: a consumer
that ``assign``s the 6 partitions at offset 0 and reads until all N records
came. MB/s counts value bytes (10**6 bytes per MB). Values are
``bench_client.make_values``: unique semi-compressible JSON-ish text.

``--profile DIR`` runs the one-gateway rows with that gateway under
``python -m cProfile -o DIR/gateway-<size>.prof`` (stopped with SIGINT, so the
profile is written) and prints its top functions by cumulative and own time.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from bench_client import make_values  # the benchmarks' own directory (run as a script)
from spark_common import PROJECT, machine  # also puts the project root on sys.path

from tests.gateway_fixtures import free_port, wait_listening

TOPIC = "bench"
PARTITIONS = 6
#: Records per row, by value size: about 5-15 s a row through one gateway on 2 shared cores.
RECORDS = {100: 400_000, 1024: 100_000}
QUICK_RECORDS = {100: 10_000, 1024: 5_000}
#: The targets of the issue for 1 KiB records through one gateway (ratio to the mock broker).
TARGETS = {"produce": 0.3, "fetch": 0.5}
QUIET = {"log_level": 0, "logger": lambda *a: None}


@dataclass
class Row:
    """One measured row."""

    cluster: str
    size: int
    op: str
    records: int
    seconds: float

    @property
    def rate(self) -> float:
        """Records per second."""
        return self.records / self.seconds

    @property
    def mb_s(self) -> float:
        """Value megabytes (10**6 bytes) per second."""
        return self.records * self.size / self.seconds / 1e6


# --------------------------------------------------------------------------- clusters


@contextlib.contextmanager
def mock_cluster() -> Iterator[str]:
    """librdkafka's in-process mock cluster (one broker), kept alive by a client; its bootstrap address."""
    import confluent_kafka

    holder = confluent_kafka.Producer({"test.mock.num.brokers": 1, **QUIET})
    # The mock creates a topic when it is first named, with its fixed default of partitions (4): it names
    # no controller (broker 1, controller 0), so CreateTopics and CreatePartitions never reach it.
    brokers = holder.list_topics(TOPIC, timeout=10).brokers
    bootstrap = ",".join(f"{b.host}:{b.port}" for b in brokers.values())
    try:
        yield bootstrap
    finally:
        holder.flush(1)


@contextlib.contextmanager
def gateways(root: str, count: int, extra: list[str], profile: str | None = None) -> Iterator[str]:
    """``count`` ``plog serve`` processes on ``root``; their bootstrap list. With ``profile`` (one gateway),
    it runs under cProfile and is stopped with SIGINT so the profile is written."""
    from pyspark_logsource import LogStore

    with LogStore(root) as store:
        if TOPIC not in store.list_topics():
            store.create_topic(TOPIC, PARTITIONS)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")])))
    procs: list[subprocess.Popen[bytes]] = []
    ports: list[int] = []
    try:
        for _ in range(count):
            port = free_port()
            head = [sys.executable] + (["-m", "cProfile", "-o", profile] if profile else [])
            serve = ["-m", "pyspark_logsource.cli", "serve", "--url", root, "--listen", f"127.0.0.1:{port}", *extra]
            procs.append(subprocess.Popen(head + serve, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_listening(port, proc=procs[-1])
            ports.append(port)
        bootstrap = ",".join(f"127.0.0.1:{p}" for p in ports)
        wait_for_brokers(bootstrap, count)
        yield bootstrap
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # a clean stop: the gateway deregisters, cProfile writes
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_for_brokers(bootstrap: str, count: int, timeout_s: float = 60.0) -> None:
    """Wait until the gateways' Metadata names ``count`` brokers: a gateway learns of the others from their
    registrations in the root, read again every heartbeat, and a client keeps the leaders it was first told
    (for minutes), so rows started earlier would run through one gateway only."""
    import confluent_kafka

    client = confluent_kafka.Producer({"bootstrap.servers": bootstrap, **QUIET})
    deadline = time.monotonic() + timeout_s
    while True:
        leaders = {p.leader for p in client.list_topics(TOPIC, timeout=30).topics[TOPIC].partitions.values()}
        if len(leaders) >= count:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the partitions' leaders are {sorted(leaders)} after {timeout_s} s, not {count} gateways"
            )
        time.sleep(0.5)


# --------------------------------------------------------------------------- the client


def partitions_of(client: Any) -> int:
    """How many partitions the benchmark topic has on the client's cluster."""
    return len(client.list_topics(TOPIC, timeout=30).topics[TOPIC].partitions)


def produce(bootstrap: str, values: list[bytes], linger_ms: int, request_bytes: int | None = None) -> tuple[float, int]:
    """Seconds from the first produce() of ``values`` to flush() returning (acks=all, idempotent, lz4), and
    the warm-up records produced before (one per partition)."""
    import confluent_kafka

    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": linger_ms,
            "acks": "all",
            "enable.idempotence": True,
            "compression.type": "lz4",
            # Larger requests (the diskless Kafkas' advice for their produce windows): batch.size per partition,
            # message.max.bytes per request; the same for the mock broker and the gateways.
            **({} if request_bytes is None else {"batch.size": request_bytes, "message.max.bytes": 2 * request_bytes}),
            **QUIET,
        }
    )
    failed: list[Any] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(err)

    partitions = partitions_of(producer)
    for p in range(partitions):  # warm-up: metadata, the producer id, a connection to every leader
        producer.produce(TOPIC, b"warm-up", partition=p, on_delivery=on_delivery)
    if producer.flush(60) or failed:
        raise RuntimeError(f"warm-up produce failed: {failed[:3]}")
    put, poll = producer.produce, producer.poll
    start = time.perf_counter()
    for value in values:
        while True:
            try:
                put(TOPIC, value, on_delivery=on_delivery)
                break
            except BufferError:  # its queue is full: serve deliveries, as its documentation says
                poll(0.001)
    left = producer.flush(600)
    elapsed = time.perf_counter() - start
    if left or failed:
        raise RuntimeError(f"{left} records not delivered, {len(failed)} failed: {failed[:3]}")
    return elapsed, partitions


def fetch(bootstrap: str) -> tuple[float, int]:
    """Seconds for a consumer assigned to every partition at its first offset to read up to the end, and the
    records read. A gateway keeps every record (offset 0 on); librdkafka's mock broker keeps only the newest
    few MB of each partition, so its rows read what it kept."""
    import confluent_kafka

    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-fetch",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **QUIET,
        }
    )
    try:
        partitions = partitions_of(consumer)
        marks = [
            consumer.get_watermark_offsets(confluent_kafka.TopicPartition(TOPIC, p), 30) for p in range(partitions)
        ]
        expected = sum(high - low for low, high in marks)
        got = 0
        start = time.perf_counter()  # from the assignment to the last record
        consumer.assign([confluent_kafka.TopicPartition(TOPIC, p, low) for p, (low, _) in enumerate(marks)])
        deadline = start + 600
        while got < expected:
            for msg in consumer.consume(num_messages=10_000, timeout=1.0):
                if msg.error() is None:
                    got += 1
                else:
                    raise RuntimeError(f"fetch failed: {msg.error()}")
            if time.perf_counter() > deadline:
                raise RuntimeError(f"only {got} of {expected} records read in 600 s")
        return time.perf_counter() - start, expected
    finally:
        consumer.close()


# --------------------------------------------------------------------------- the run


def run_size(size: int, n: int, workdir: str, args: argparse.Namespace) -> list[Row]:
    """The rows of one value size: mock broker, one gateway, two gateways."""
    values = make_values(n, size)
    extra = (
        [] if args.gateway_flush_interval_ms is None else ["--flush-interval-ms", str(args.gateway_flush_interval_ms)]
    )
    rows: list[Row] = []

    def measure(cluster: str, bootstrap: str) -> None:
        times = []
        for _ in range(args.rounds):
            os.sync()
            times.append(produce(bootstrap, values, args.linger_ms, args.client_request_bytes)[0])
        produced = min(times)
        rows.append(Row(cluster, size, "produce", n, produced))
        print(f"  {cluster}, {size} B: produce {n / produced:,.0f} records/s", flush=True)
        fetched, count = fetch(bootstrap)
        rows.append(Row(cluster, size, "fetch", count, fetched))
        print(f"  {cluster}, {size} B: fetch {count / fetched:,.0f} records/s", flush=True)

    with mock_cluster() as bootstrap:
        measure("mock broker", bootstrap)
    profile = os.path.join(args.profile, f"gateway-{size}.prof") if args.profile else None
    root = os.path.join(workdir, f"one-{size}")
    with gateways(root, 1, extra, profile) as bootstrap:
        measure("1 gateway", bootstrap)
    if profile:
        print_profile(profile)
    if not args.one_gateway_only:
        root = os.path.join(workdir, f"two-{size}")
        with gateways(root, 2, extra) as bootstrap:
            measure("2 gateways", bootstrap)
    return rows


def print_profile(path: str, top: int = 25) -> None:
    """The profile's top functions by cumulative and by own time."""
    for key in ("cumulative", "tottime"):
        print(f"\n--- {path}: top {top} by {key}")
        pstats.Stats(path).sort_stats(key).print_stats(top)


def render(rows: list[Row], started: dt.datetime, args: argparse.Namespace) -> str:
    """The table per scenario (value size), Markdown."""
    lines = [
        f"plog serve vs librdkafka's mock broker, confluent-kafka {client_version()}, {started:%Y-%m-%d}; {machine()}.",
        f"Client: linger.ms {args.linger_ms}, acks=all, idempotence on, lz4; a {PARTITIONS}-partition topic "
        "(the mock broker's: 4); "
        f"gateway flush interval (ms) {args.gateway_flush_interval_ms or 'default'}; "
        f"client batch.size {args.client_request_bytes or 'default'}.",
    ]
    mock = {(r.size, r.op): r for r in rows if r.cluster == "mock broker"}
    for size in sorted({r.size for r in rows}):
        lines += [
            "",
            f"{size} B records",
            "",
            "| cluster | operation | records | records/s | MB/s | ratio to the mock broker | target |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for r in (r for r in rows if r.size == size):
            ratio = r.rate / mock[(size, r.op)].rate if (size, r.op) in mock else float("nan")
            target = f"≥ {TARGETS[r.op]}x" if size == 1024 and r.cluster == "1 gateway" else ""
            lines.append(
                f"| {r.cluster} | {r.op} | {r.records:,} | {r.rate:,.0f} | {r.mb_s:,.1f} | {ratio:.2f}x | {target} |"
            )
    return "\n".join(lines)


def client_version() -> str:
    """confluent-kafka's and librdkafka's versions."""
    import confluent_kafka

    return f"{confluent_kafka.version()} (librdkafka {confluent_kafka.libversion()[0]})"


def main(argv: list[str] | None = None) -> int:
    """Run the rows and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=None, help="records per row (default: by size)")
    parser.add_argument("--quick", action="store_true", help="fewer records (a smoke run)")
    parser.add_argument("--sizes", default="100,1024", help="value sizes in bytes, comma-separated")
    parser.add_argument("--linger-ms", type=int, default=5, help="the client's linger.ms")
    parser.add_argument(
        "--gateway-flush-interval-ms",
        type=int,
        default=None,
        help="the gateways' --flush-interval-ms (default: theirs)",
    )
    parser.add_argument(
        "--client-request-bytes",
        type=int,
        default=None,
        help="the client's batch.size (and twice it as message.max.bytes), for mock broker and gateways alike",
    )
    parser.add_argument("--rounds", type=int, default=3, help="produce runs per row, the best reported (default 3)")
    parser.add_argument("--one-gateway-only", action="store_true", help="skip the two-gateway rows")
    parser.add_argument("--profile", metavar="DIR", help="run the one-gateway rows under cProfile, into DIR")
    parser.add_argument("--dir", default=None, help="where the roots go (default: a temporary directory)")
    args = parser.parse_args(argv)
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
        args.profile = os.path.abspath(args.profile)
    started = dt.datetime.now(dt.timezone.utc)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-gateway-", dir=args.dir) as workdir:
        for size in (int(s) for s in args.sizes.split(",")):
            n = args.records or (QUICK_RECORDS if args.quick else RECORDS).get(size, 100_000)
            print(f"{size} B records, {n:,} per row", flush=True)
            rows += run_size(size, n, workdir, args)
    print()
    print(render(rows, started, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
