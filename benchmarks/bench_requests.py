"""What plog costs on S3 in requests: counted at the server, priced at S3 Standard's list prices.

    python benchmarks/bench_requests.py [--quick] [--idle-seconds S] [--no-spark] [--by-key N] [--only SCENARIO]

Every figure is counted by a moto S3 server on 127.0.0.1 started here (the
same counting server the tests use, ``tests/fixtures_s3.py``): one count per
HTTP request the server answered, by S3's billing kind. Nothing is estimated.

Scenarios (each in its own bucket):

* a producer: requests per MiB written, with ``send`` (one record at a time) and ``send_batch``;
* a consumer catching up on a backlog: requests per MiB read, from small appended objects
  and from merged segments;
* an idle consumer (nothing arriving) and an idle group member: requests per second,
  at 1, 8 and 64 partitions; then how long a record sent to the idle consumer's topic
  takes, from the send's acknowledgement, to come out of its poll;
* a plog -> plog Spark pipeline (source, exactly-once sink): requests per micro-batch
  at 8 and 64 partitions (30 micro-batches of 4,000 records, ``maxOffsetsPerTrigger``).

$/day: PUT, COPY, POST and LIST at $0.005 per 1,000, GET and HEAD at $0.0004 per
1,000 (S3 Standard list prices; DELETE is free). Producer and consumer rows are
priced at a steady 1 MiB/s, idle rows as they are, pipeline rows at one
micro-batch per second.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
from spark_common import machine  # also puts the project root on sys.path

from tests.fixtures_s3 import AWS_ENV, AWS_ENV_REMOVED, REQUESTS, counting_moto_server, s3_storage_options

#: $ per request by S3 billing kind (S3 Standard, us-east-1 list prices).
PRICE = {"PUT": 0.005e-3, "POST": 0.005e-3, "COPY": 0.005e-3, "LIST": 0.005e-3, "GET": 0.0004e-3, "HEAD": 0.0004e-3}
KINDS = ("PUT", "LIST", "GET", "HEAD", "DELETE", "POST")
DAY_S = 86_400


class Bench:
    """The moto server, a bucket per scenario, and the table rows collected."""

    def __init__(self) -> None:
        for name, value in AWS_ENV.items():
            os.environ[name] = value
        for name in AWS_ENV_REMOVED:
            os.environ.pop(name, None)
        os.environ["NO_PROXY"] = os.environ["no_proxy"] = "127.0.0.1,localhost"
        import boto3
        import moto.server

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise

        self.server = counting_moto_server(moto.server)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.options = s3_storage_options(self.endpoint)
        self.admin = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        self.rows: list[tuple[str, str, float, Counter[str], float]] = []
        #: (partitions, ms from acknowledgement to an idle consumer's poll returning the record, per trial).
        self.latencies: list[tuple[int, list[float]]] = []
        #: Print this many of each scenario's most requested key shapes (0: none).
        self.by_key = 0

    def bucket(self) -> tuple[str, str]:
        """A fresh bucket; returns (its name, the plog root URL in it)."""
        name = f"bench-{uuid.uuid4().hex[:12]}"
        self.admin.create_bucket(Bucket=name)
        return name, f"s3://{name}/plog"

    def count(self, bucket: str, work: Callable[[], float]) -> tuple[Counter[str], float]:
        """Run ``work`` (which returns its unit count) and return the requests it made, and the units."""
        before, shapes_before = REQUESTS.of(bucket), REQUESTS.shapes(bucket)
        units = work()
        self.print_shapes(REQUESTS.shapes(bucket) - shapes_before, units)
        return REQUESTS.of(bucket) - before, units

    def print_shapes(self, shapes: Counter[tuple[str, str]], units: float, note: str = "") -> None:
        """With ``--by-key``: the most requested key shapes, per unit."""
        for (kind, shape), n in shapes.most_common(self.by_key):
            print(f"      {n / max(units, 1e-9):9.2f} {kind:6} {shape}{note}", flush=True)

    def row(self, scenario: str, unit: str, units: float, spent: Counter[str], units_per_day: float) -> None:
        """Record one table row: requests per unit, and $ per day at ``units_per_day``."""
        per = Counter({k: v / units for k, v in spent.items()}) if units else Counter()
        self.rows.append((scenario, unit, units, per, units_per_day))
        total = sum(per.values())
        print(f"  {scenario}: {total:,.2f} requests per {unit}", flush=True)

    def stop(self) -> None:
        """Stop the server."""
        self.admin.close()
        self.server.stop()


def values(n: int, size: int, seed: int = 7) -> pa.Array:
    """``n`` random ``size``-byte binary values."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, n * size, dtype=np.uint8).tobytes()
    offsets = np.arange(0, (n + 1) * size, size, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def producer_rows(bench: Bench, mib: float) -> None:
    """Requests per MiB written, with send and with send_batch (8 partitions, 100 B values)."""
    from pyspark_logsource import LogStore, Producer

    n = int(mib * 2**20 / 100)
    vals = values(n, 100)
    for mode in ("send", "send_batch"):
        bucket, url = bench.bucket()
        with LogStore(url, storage_options=bench.options) as store:
            store.create_topic("t", 8)

        def work(mode: str = mode, url: str = url) -> float:
            with Producer(url, storage_options=bench.options, linger_ms=50) as producer:
                if mode == "send":
                    for i, v in enumerate(vals.to_pylist()):
                        producer.send("t", v, key=str(i % 1000).encode())
                else:
                    keys = pa.array([str(i % 1000).encode() for i in range(n)], pa.binary())
                    producer.send_batch("t", pa.table({"key": keys, "value": vals}))
                producer.flush()
            return n * 100 / 2**20

        spent, units = bench.count(bucket, work)
        bench.row(f"producer `{mode}`, 8 partitions, 100 B records", "MiB written", units, spent, DAY_S)


def catch_up(url: str, options: dict[str, Any], topic: str, partitions: int, n: int) -> float:
    """Read every partition of ``topic`` from the start to its end, checking ``n`` records came; MiB read."""
    from pyspark_logsource import Consumer, TopicPartition

    consumer = Consumer(url, storage_options=options, auto_offset_reset="earliest")
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        table = consumer.read_to_end()
    finally:
        consumer.close()
    assert table.num_rows == n, (table.num_rows, n)
    return n * 210 / 2**20


def consumer_row(bench: Bench, mib: float) -> None:
    """Requests per MiB read by a consumer catching up on a backlog written as many small appends."""
    from pyspark_logsource import LogStore, Producer

    bucket, url = bench.bucket()
    with LogStore(url, storage_options=bench.options) as store:
        store.create_topic("t", 8)
    n = int(mib * 2**20 / 210)
    vals = values(n, 210)
    with Producer(url, storage_options=bench.options) as producer:
        step = max(1, n // 200)  # about 200 appends, as in issue #11's measurement
        for lo in range(0, n, step):
            producer.send_batch("t", pa.table({"value": vals[lo : lo + step]}))

    spent, units = bench.count(bucket, lambda: catch_up(url, bench.options, "t", 8, n))
    bench.row("consumer catching up, 8 partitions, ~200 appends", "MiB read", units, spent, DAY_S)


def merged_consumer_row(bench: Bench, segment_mib: int) -> None:
    """Requests per MiB read by a consumer catching up on merged segments of ``segment_mib`` (issue #11: at
    most 1 GET per 4 MiB). 17 appends of a 16th of a segment each: 16 merged into one segment, and the tail."""
    from pyspark_logsource import LogStore, Producer
    from segment_format.root import LogRoot

    bucket, url = bench.bucket()
    segment_bytes = segment_mib * 2**20
    with LogStore(url, storage_options=bench.options) as store:
        # Merged by the explicit pass below, not by the producer as it writes.
        store.create_topic("m", 1, {"auto.maintenance.enable": False, "segment.bytes": segment_bytes})
    per_append = segment_bytes // 16 // 210
    n = 17 * per_append
    vals = values(n, 210)
    with Producer(url, storage_options=bench.options) as producer:
        for lo in range(0, n, per_append):
            producer.send_batch("m", pa.table({"value": vals[lo : lo + per_append]}))
    root = LogRoot(url, bench.options)
    try:
        root.maintain("m")
        merged = [ref.size for ref in root.partition("m", 0).view().segments if ref.generation > 0]
    finally:
        root.close()
    assert len(merged) == 1, merged

    spent, units = bench.count(bucket, lambda: catch_up(url, bench.options, "m", 1, n))
    name = f"consumer catching up on a merged segment of {merged[0] / 2**20:.0f} MiB and its tail"
    bench.row(name, "MiB read", units, spent, DAY_S)


def idle_rows(bench: Bench, seconds: float, partition_counts: list[int]) -> None:
    """Requests per second of an idle consumer and an idle group member, by partition count."""
    from pyspark_logsource import Consumer, LogStore

    for partitions in partition_counts:
        for group in (None, "g"):
            bucket, url = bench.bucket()
            with LogStore(url, storage_options=bench.options) as store:
                store.create_topic("t", partitions)
            consumer = Consumer(url, storage_options=bench.options, group_id=group, auto_offset_reset="latest")
            consumer.subscribe(["t"])
            # Settle first (joining a group, first positions), then count a steady idle stretch.
            settle = time.monotonic() + 5
            while time.monotonic() < settle:
                consumer.poll(timeout_ms=500)

            def work(consumer: Any = consumer) -> float:
                start = time.monotonic()
                while time.monotonic() - start < seconds:
                    consumer.poll(timeout_ms=500)
                return time.monotonic() - start

            spent, units = bench.count(bucket, work)
            if group is None:
                bench.latencies.append((partitions, visibility_ms(url, bench.options, consumer, partitions)))
            consumer.close()
            who = "idle group member" if group else "idle consumer"
            bench.row(f"{who}, {partitions} partitions", "second", units, spent, DAY_S)


def visibility_ms(url: str, options: dict[str, Any], consumer: Any, partitions: int, trials: int = 7) -> list[float]:
    """Milliseconds from a send's acknowledgement until an idle consumer's poll returns the record."""
    from pyspark_logsource import Producer

    out = []
    with Producer(url, storage_options=options, linger_ms=0) as producer:
        for i in range(trials):
            time.sleep((0.37 * (i + 1)) % 1.0)  # acknowledgements land at different moments of the notice interval
            producer.send("t", b"ping-%d" % i, partition=i % partitions).get(timeout=30)
            acked = time.monotonic()
            while not consumer.poll(timeout_ms=50):
                if time.monotonic() - acked > 30:
                    raise RuntimeError("an idle consumer did not see a new record within 30 s")
            out.append((time.monotonic() - acked) * 1000)
    return out


#: Micro-batches of a pipeline run counted apart as its start (the steady-state row leaves them out).
WARMUP_BATCHES = 5


def pipeline_rows(bench: Bench, partition_counts: list[int], batches: int, per_batch: int) -> None:
    """Requests per micro-batch of a plog -> plog Spark pipeline (source + exactly-once sink)."""
    from spark_common import local_spark

    from pyspark_logsource import LogStore, Producer

    spark = local_spark("bench-requests")
    storage = {f"storage.{k}": v for k, v in bench.options.items() if k in ("endpoint_url", "key", "secret")}
    try:
        for partitions in partition_counts:
            bucket, url = bench.bucket()
            with LogStore(url, storage_options=bench.options) as store:
                store.create_topic("a", partitions)
                store.create_topic("b", partitions)
            n = batches * per_batch
            with Producer(url, storage_options=bench.options) as producer:
                keys = pa.array([f"k{i % 997}".encode() for i in range(n)], pa.binary())
                producer.send_batch("a", pa.table({"key": keys, "value": values(n, 100)}))
            checkpoint = f"/tmp/bench-requests-{uuid.uuid4().hex}"

            warm: dict[str, Any] = {}

            def work(
                url: str = url, checkpoint: str = checkpoint, bucket: str = bucket, warm: dict[str, Any] = warm
            ) -> float:
                source = (
                    spark.readStream.format("plog")
                    .options(**storage)
                    .option("subscribe", "a")
                    .option("startingOffsets", "earliest")
                    .option("maxOffsetsPerTrigger", str(per_batch))
                    .load(url)
                )
                query = (
                    source.selectExpr("key", "value")
                    .writeStream.format("plog")
                    .options(**storage)
                    .option("topic", "b")
                    .option("checkpointLocation", checkpoint)
                    .trigger(availableNow=True)
                    .start(url)
                )
                # The counts once the first WARMUP_BATCHES micro-batches are done: what follows is the
                # steady state, without the query's start (every partition listed, Python workers
                # opening the root). The next micro-batch may have begun: a request or two of it
                # then counts as warm-up, which only lowers the steady figure by as much.
                while query.isActive and not warm:
                    progress = query.lastProgress
                    if progress is not None and progress["batchId"] >= WARMUP_BATCHES - 1:
                        warm.update(counts=REQUESTS.of(bucket), shapes=REQUESTS.shapes(bucket))
                        warm["batches"] = sum(p["numInputRows"] > 0 for p in query.recentProgress)
                    time.sleep(0.005)
                query.awaitTermination()
                done = [p for p in query.recentProgress if p["numInputRows"] > 0]
                return float(len(done))

            spent, units = bench.count(bucket, work)
            name = f"Spark plog -> plog, {partitions} partitions, {per_batch:,} records per micro-batch"
            bench.row(name, "micro-batch", units, spent, DAY_S)
            if warm:
                steady_units = units - warm["batches"]
                steady = REQUESTS.of(bucket) - warm["counts"]
                bench.print_shapes(REQUESTS.shapes(bucket) - warm["shapes"], steady_units, "  (steady)")
                bench.row(f"{name}, after the first {WARMUP_BATCHES}", "micro-batch", steady_units, steady, DAY_S)
    finally:
        spark.stop()


def render(bench: Bench, started: dt.datetime) -> str:
    """The Markdown table of every row."""
    lines = [
        f"Requests counted at a moto S3 server on 127.0.0.1, {started:%Y-%m-%d}; {machine()}.",
        "",
        "| scenario | per | requests | PUT | LIST | GET | HEAD | DELETE | $ per day |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for scenario, unit, _units, per, units_per_day in bench.rows:
        dollars = sum(PRICE.get(k, 0.0) * v for k, v in per.items()) * units_per_day
        cells = " | ".join(f"{per.get(k, 0):,.2f}" for k in KINDS[:5])
        lines.append(f"| {scenario} | {unit} | {sum(per.values()):,.2f} | {cells} | ${dollars:,.2f} |")
    if bench.latencies:
        lines += [
            "",
            "| idle consumer, partitions | new record visible after (ms): median | max | trials |",
            "|---:|---:|---:|---:|",
        ]
        for partitions, ms in bench.latencies:
            lines.append(f"| {partitions} | {statistics.median(ms):,.0f} | {max(ms):,.0f} | {len(ms)} |")
    lines.append("")
    lines.append(
        "$ per day: producer and consumer rows at 1 MiB/s, idle rows per idle day, pipeline rows at one "
        "micro-batch per second; PUT/POST/LIST $0.005 and GET/HEAD $0.0004 per 1,000."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the scenarios and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and 1, 8 partitions only (a smoke run)")
    parser.add_argument("--idle-seconds", type=float, default=10.0, help="how long each idle scenario is counted")
    parser.add_argument("--no-spark", action="store_true", help="skip the Spark pipeline rows")
    parser.add_argument(
        "--by-key", type=int, default=0, metavar="N", help="print each scenario's N most requested key shapes"
    )
    parser.add_argument(
        "--only",
        choices=("producer", "consumer", "idle", "spark"),
        action="append",
        help="run only these scenarios (repeatable; default: all)",
    )
    args = parser.parse_args(argv)
    only = set(args.only or ("producer", "consumer", "idle", "spark"))
    started = dt.datetime.now(dt.timezone.utc)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    bench = Bench()
    bench.by_key = args.by_key
    try:
        if "producer" in only:
            print("producers", flush=True)
            producer_rows(bench, 0.25 if args.quick else 4.0)
        if "consumer" in only:
            print("consumer", flush=True)
            consumer_row(bench, 1.0 if args.quick else 16.0)
            merged_consumer_row(bench, 4 if args.quick else 64)
        if "idle" in only:
            print("idle", flush=True)
            idle_rows(bench, 3.0 if args.quick else args.idle_seconds, [1, 8] if args.quick else [1, 8, 64])
        if "spark" in only and not args.no_spark:
            print("spark", flush=True)
            pipeline_rows(bench, [8] if args.quick else [8, 64], 5 if args.quick else 30, 4_000)
    finally:
        bench.stop()
    print()
    print(render(bench, started))
    return 0


if __name__ == "__main__":
    sys.exit(main())
