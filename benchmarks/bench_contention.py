"""Contention on a shared topic's sequence: 1, 2, 4 and 8 writer processes committing to one topic.

A shared topic (PROTOCOL.md 7.3) gives offsets in commits, one ``put_if_absent`` on the next number of the
topic's sequence: its writers take turns, one commit per (read + create) round trip at best. This measures
it where it matters, on S3's latencies: a moto S3 server on 127.0.0.1 behind the tests' fault proxy, which
holds each answer as S3 would (a PUT about 30 ms, a GET, HEAD or LIST about 15 ms). Each writer is a
process of its own running ``send_batch`` of small tables (100 rows into 8 partitions) in a loop, each
waited for: one flush, one shared object, one commit. Printed per writer count: commits per second
(all writers), lost races per commit, each writer's share against the mean (fairness: every writer within
2x of the mean), and, beside them, the same writers on a partitioned topic (an object per partition per
flush, no shared sequence) as the reference measured in the same run::

    python benchmarks/bench_contention.py             # 10 s per row
    python benchmarks/bench_contention.py --quick     # 3 s per row, 1 and 4 writers
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fault_proxy import FaultProxy  # noqa: E402
from tests.fixtures_s3 import AWS_ENV, AWS_ENV_REMOVED, s3_storage_options  # noqa: E402

#: S3's latencies as the issue states them: what the proxy holds each answer for, by method.
S3_LATENCY_S = {"PUT": 0.030, "GET": 0.015, "HEAD": 0.015, "DELETE": 0.015, "POST": 0.030}
PARTITIONS = 8

WRITER = textwrap.dedent(
    """
    import json, sys, time
    import pyarrow as pa
    from pyspark_logsource import Producer

    url, options, topic = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    start_at, seconds = float(sys.argv[4]), float(sys.argv[5])
    table = pa.table({"value": [b"x" * 100] * 100, "partition": [i % %(partitions)d for i in range(100)]})
    with Producer(url, storage_options=options) as producer:
        producer.send_batch(topic, table)  # metadata, producer id and the sequence learned before the start
        time.sleep(max(0.0, start_at - time.time()))
        flushes, started = 0, time.monotonic()
        while time.monotonic() - started < seconds:
            producer.send_batch(topic, table)
            flushes += 1
        elapsed = time.monotonic() - started
        made = lost = 0
        if topic.startswith("shared"):
            sequence = producer.root.sequence(topic)
            made, lost = sequence.commits_made - 1, sequence.races_lost
        print(json.dumps({"flushes": flushes, "seconds": elapsed, "commits": made, "lost": lost}), flush=True)
    """
).replace("%(partitions)d", str(PARTITIONS))


def start_s3() -> tuple[Any, str]:
    """A moto S3 server on 127.0.0.1; returns it and its endpoint."""
    for name, value in AWS_ENV.items():
        os.environ[name] = value
    for name in AWS_ENV_REMOVED:
        os.environ.pop(name, None)
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = "127.0.0.1,localhost"
    import moto.server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto.server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    return server, f"http://{host}:{port}"


def new_bucket(endpoint: str) -> str:
    """A fresh bucket, made directly at moto; the plog root URL in it."""
    import boto3

    name = f"contention-{uuid.uuid4().hex[:12]}"
    admin = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    admin.create_bucket(Bucket=name)
    admin.close()
    return f"s3://{name}/plog"


def run_writers(url: str, options: dict[str, Any], topic: str, writers: int, seconds: float) -> list[dict[str, Any]]:
    """``writers`` processes flushing to ``topic`` for ``seconds`` from a common start; their reports."""
    start_at = time.time() + 3.0 + 0.5 * writers  # every process imported and warmed up before it
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, url, json.dumps(options), topic, str(start_at), str(seconds)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(writers)
    ]
    reports = []
    for proc in procs:
        out, _ = proc.communicate(timeout=seconds + 300)
        if proc.returncode != 0:
            raise RuntimeError(f"a writer failed with exit status {proc.returncode}")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def row(layout: str, writers: int, reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One table row from the writers' reports."""
    seconds = max(r["seconds"] for r in reports)
    flushes = [r["flushes"] for r in reports]
    mean = statistics.mean(flushes)
    commits = sum(r["commits"] for r in reports)
    lost = sum(r["lost"] for r in reports)
    return {
        "layout": layout,
        "writers": writers,
        "flushes_per_s": sum(flushes) / seconds,
        "lost_per_commit": lost / commits if commits else 0.0,
        "share_min": min(flushes) / mean if mean else 0.0,
        "share_max": max(flushes) / mean if mean else 0.0,
        "flushes": flushes,
    }


def main(argv: list[str] | None = None) -> int:
    """Run every writer count on both layouts and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 s per row, 1 and 4 writers (a smoke run)")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long each row's writers flush")
    args = parser.parse_args(argv)
    counts = [1, 4] if args.quick else [1, 2, 4, 8]
    seconds = 3.0 if args.quick else args.seconds
    from pyspark_logsource import LogStore

    server, endpoint = start_s3()
    proxy = FaultProxy(endpoint).start()
    proxy.latency_s = dict(S3_LATENCY_S)
    options = s3_storage_options(proxy.url)
    rows = []
    try:
        for writers in counts:
            for layout in ("shared", "partitioned"):
                url = new_bucket(endpoint)
                topic = f"{layout}-t"
                with LogStore(url, storage_options=options) as store:
                    store.create_topic(
                        topic, PARTITIONS, {"storage.layout": layout, "auto.maintenance.enable": "false"}
                    )
                print(f"{writers} writer(s), {layout} ...", flush=True)
                rows.append(row(layout, writers, run_writers(url, options, topic, writers, seconds)))
    finally:
        proxy.stop()
        server.stop()
    print()
    print(
        f"Writer processes flushing 100 records into {PARTITIONS} partitions of one topic, each flush waited for; "
        f"moto S3 on 127.0.0.1 behind a proxy holding a PUT {S3_LATENCY_S['PUT'] * 1000:.0f} ms and a GET "
        f"{S3_LATENCY_S['GET'] * 1000:.0f} ms; {seconds:g} s per row; {dt.date.today()}; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; Python {platform.python_version()}."
    )
    print()
    print(
        "| writers | shared: flushes/s | lost races per commit | writers' share of the mean (min-max) "
        "| partitioned: flushes/s | ratio shared/partitioned |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for writers in counts:
        shared = next(r for r in rows if r["writers"] == writers and r["layout"] == "shared")
        partitioned = next(r for r in rows if r["writers"] == writers and r["layout"] == "partitioned")
        ratio = shared["flushes_per_s"] / partitioned["flushes_per_s"] if partitioned["flushes_per_s"] else 0.0
        print(
            f"| {writers} | {shared['flushes_per_s']:.1f} | {shared['lost_per_commit']:.2f} | "
            f"{shared['share_min']:.2f}-{shared['share_max']:.2f} | {partitioned['flushes_per_s']:.1f} | {ratio:.2f}x |"
        )
    print()
    print("Flushes per writer:", {f"{r['layout']} x{r['writers']}": r["flushes"] for r in rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
