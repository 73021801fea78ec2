"""Acceptance run on several executor processes: the plog sink and source on ``local-cluster[2,1,1024]``.

Usage::

    python benchmarks/bench_spark_cluster.py [--records N] [--partitions P] [--repeat K] [--master M ...]

``local[2]`` runs every task in one JVM, each with a Python worker; ``local-cluster[2,1,1024]`` starts a
standalone cluster inside the driver's JVM with two executor JVMs of one core each, so tasks run in
separate executor processes, as on a real cluster, each with its own Python workers, caches and
store connections. For each master, in one SparkSession, the same records go through:

* **sink**: parquet files -> ``writeStream.format("plog")`` (exactly-once, ``Trigger.AvailableNow``, two
  files per micro-batch), then read back read_committed: every record exactly once; next to the
  count-only Python Arrow sink of ``bench_spark_sink.py`` on the same input (the path's ceiling);
* **source**: ``readStream.format("plog")`` -> noop, every record counted; next to the memory source of
  ``bench_spark_source.py`` yielding the same Arrow batches (its ceiling).

The table gives records/s, the ratio to the ceiling measured in the same session, and the CPU of the
whole process tree (driver, executor JVMs, Python workers) per record; median of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import bench_spark_sink as sink_bench
import bench_spark_source as source_bench
from spark_common import local_spark, machine, tree_cpu_seconds

from pyspark_logsource import LogStore

#: Executor JVMs tuned like the test suite's to start fast (tests/test_spark_sink.py, LOCAL_CLUSTER_CONF).
CLUSTER_CONF = {"spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}


def measure(start: Any) -> tuple[float, float, int]:
    """Start an AvailableNow query with ``start()`` and wait for its end; (wall s, CPU s of the process
    tree, input rows)."""
    cpu0 = tree_cpu_seconds(os.getpid())
    t0 = time.perf_counter()
    query = start()
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    return time.perf_counter() - t0, tree_cpu_seconds(os.getpid()) - cpu0, rows


def bench_master(master: str, work: Path, records: int, partitions: int, repeat: int) -> list[dict[str, Any]]:
    """Every path on one master; one dict per path with its runs."""
    spark = local_spark(
        f"plog-bench-cluster-{master}", master, CLUSTER_CONF if master.startswith("local-cluster") else {}
    )
    spark.dataSource.register(sink_bench.CountOnly)
    spark.dataSource.register(source_bench.MemoryBatches)
    root = str(work / f"plog-{master}")
    counter = [0]
    ck = work / "ck"

    def parquet_input() -> Any:
        return (
            spark.readStream.schema("key string, value binary")
            .option("maxFilesPerTrigger", 2)
            .parquet(str(work / "input"))
        )

    def plog_sink() -> Any:
        counter[0] += 1
        topic = f"sink-{counter[0]}"
        with LogStore(root) as store:
            store.create_topic(topic, partitions)
        plog_sink.topic = topic  # type: ignore[attr-defined]
        return (
            parquet_input()
            .writeStream.format("plog")
            .option("topic", topic)
            .option("checkpointLocation", str(ck / f"{time.monotonic_ns()}"))
            .trigger(availableNow=True)
            .start(root)
        )

    def count_sink() -> Any:
        return (
            parquet_input()
            .writeStream.format("plog_bench_count")
            .option("checkpointLocation", str(ck / f"{time.monotonic_ns()}"))
            .trigger(availableNow=True)
            .start()
        )

    def plog_source() -> Any:
        df = (
            spark.readStream.format("plog")
            .option("subscribe", source_bench.TOPIC)
            .option("startingOffsets", "earliest")
        )
        return (
            df.load(str(work / "source-plog"))
            .writeStream.format("noop")
            .option("checkpointLocation", str(ck / f"{time.monotonic_ns()}"))
            .trigger(availableNow=True)
            .start()
        )

    def memory_source() -> Any:
        df = (
            spark.readStream.format("plog_bench_memory")
            .option("dir", str(work / "source-ipc"))
            .option("partitions", str(partitions))
            .option("rows", str(records))
            .load()
        )
        return (
            df.writeStream.format("noop")
            .option("checkpointLocation", str(ck / f"{time.monotonic_ns()}"))
            .trigger(availableNow=True)
            .start()
        )

    paths = {
        "sink: plog, exactly-once": plog_sink,
        "sink: count-only Python Arrow sink": count_sink,
        "source: plog -> noop": plog_source,
        "source: memory Python source -> noop": memory_source,
    }
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in paths}
    for attempt in range(repeat + 1):  # the first round warms up (workers, JIT, page cache) and is not counted
        for name, start in paths.items():
            wall, cpu, rows = measure(start)
            if rows != records:
                raise RuntimeError(f"{master}, {name}: {rows:,} rows processed, expected {records:,}")
            if start is plog_sink:
                seen = sink_bench.committed_records(root, plog_sink.topic, partitions)  # type: ignore[attr-defined]
                if seen != records:
                    raise RuntimeError(f"{master}, {name}: {seen:,} records committed, expected {records:,}")
            if attempt:
                runs[name].append((wall, cpu))
                print(f"  {master}, {name}: {wall:.2f} s, {cpu:.1f} CPU s", flush=True)
    spark.stop()
    out = []
    for name, rs in runs.items():
        wall = statistics.median(t for t, _ in rs)
        cpu = statistics.median(c for _, c in rs)
        out.append({"master": master, "path": name, "wall": wall, "cpu": cpu, "runs": rs})
    for ours, ceiling in ((0, 1), (2, 3)):
        out[ours]["ratio"] = out[ceiling]["wall"] / out[ours]["wall"]
        out[ceiling]["ratio"] = 1.0
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--master", action="append", help="Spark masters (default: local[2] and local-cluster[2,1,1024])"
    )
    args = parser.parse_args()
    masters = args.master or ["local[2]", "local-cluster[2,1,1024]"]
    # The reference sources and sinks live in the benchmark modules: Python workers import them from here.
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    work = Path(tempfile.mkdtemp(prefix="plog-bench-cluster-"))
    try:
        sink_bench.write_input(work / "input", args.records, 100, 8)
        source_bench.write_plog(str(work / "source-plog"), args.records, args.partitions, 100)
        source_bench.write_copies(str(work / "source-plog"), args.partitions, work / "source-ipc", work / "unused")
        results = []
        for master in masters:
            results.extend(bench_master(master, work, args.records, args.partitions, args.repeat))
        when = f"{dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}"
        print()
        print(f"{when}, {machine()}  ")
        print(
            f"{args.records:,} records x 100 B values, topics of {args.partitions} partitions (lz4), "
            f"Trigger.AvailableNow, median of {args.repeat} runs; every plog run checked: all records, once.\n"
        )
        print("| master | path | records/s | ratio to its ceiling | CPU s | CPU ns/record | runs (wall s) |")
        print("|---|---|---:|---:|---:|---:|---|")
        for r in results:
            print(
                f"| {r['master']} | {r['path']} | {args.records / r['wall']:,.0f} | {r['ratio']:.2f}x | "
                f"{r['cpu']:.1f} | {r['cpu'] / args.records * 1e9:,.0f} | "
                f"{', '.join(f'{t:.2f}' for t, _ in r['runs'])} |"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
