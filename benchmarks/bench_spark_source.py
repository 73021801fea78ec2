"""Spark source throughput: ``readStream.format("plog")`` with Trigger.AvailableNow into the noop sink.

Usage::

    python benchmarks/bench_spark_source.py [--records N] [--value-bytes B] [--repeat K] [--dir DIR]

One run, one local[2] SparkSession, three sources over the same records
(default 4,000,000 records of 100-byte values, no key, in 2 partitions),
each read as a stream with ``Trigger.AvailableNow`` into Spark's ``noop`` sink:

* **plog** -- ``format("plog")`` on a local plog root (lz4 segments, the
  default topic config), two Spark tasks, one per partition;
* **(a) parquet** -- Spark's own file stream source over the same records
  (every column of the plog schema) written as snappy parquet files;
* **(b) memory** -- a Python data source that yields *the same Arrow record
  batches* (the plog batches after conversion, batch for batch) from memory:
  an Arrow IPC file per partition, memory-mapped from the page cache, so its
  ``read()`` costs nothing. It is the ceiling of the Python Data Source path;
  the target is plog >= 0.9x of it.

Each source runs once untimed (Python workers, JIT, page cache), then
``--repeat`` timed runs, interleaved (plog, a, b, plog, a, b, ...) so that
changes in the machine's load hit every source alike; the table shows the
median run and, next to it, the ratio of best runs. Time is the wall clock
from ``start()`` to the end of the AvailableNow query. MB/s counts value
bytes (10**6 bytes per MB).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
from pyspark.sql.datasource import (  # noqa: E402
    DataSource,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow  # noqa: E402
from spark_common import local_spark, machine, make_values, tree_cpu_seconds

from pyspark_logsource import LogStore, Producer  # noqa: E402
from pyspark_logsource.spark.source import spark_schema, to_spark_batch  # noqa: E402
from segment_format.root import LogRoot  # noqa: E402

TOPIC = "bench"


# ---------------------------------------------------------------------------- data


def write_plog(root: str, records: int, partitions: int, size: int, compression: str = "lz4") -> None:
    rng = np.random.default_rng(1)
    with LogStore(root) as store:
        store.create_topic(TOPIC, partitions, {"compression.type": compression})
    per = records // partitions
    with Producer(root) as producer:
        for p in range(partitions):
            for lo in range(0, per, 500_000):
                n = min(500_000, per - lo)
                table = pa.table({"value": make_values(n, size, rng), "partition": pa.array(np.full(n, p, np.int32))})
                producer.send_batch(TOPIC, table)


def spark_batches(root: str, partition: int) -> Iterator[pa.RecordBatch]:
    """The plog batches of one partition, converted to the source's schema, as the source yields them."""
    r = LogRoot(root)
    plog = r.partition(TOPIC, partition)
    position, end = 0, plog.view().end_offset
    while position < end:
        batches, position = plog.read(position, max_bytes=32 << 20)
        for b in batches:
            yield to_spark_batch(b, TOPIC, partition, 0, False)
    r.close()


def write_copies(root: str, partitions: int, ipc_dir: Path, parquet_dir: Path) -> tuple[int, int]:
    """The same records as Arrow IPC files (for the memory source) and parquet files; returns batch stats."""
    ipc_dir.mkdir(parents=True)
    parquet_dir.mkdir(parents=True)
    nbatches = rows = 0
    for p in range(partitions):
        with ipc.new_file(str(ipc_dir / f"{p}.arrow"), spark_schema_arrow()) as w:
            chunk: list[pa.RecordBatch] = []
            part = 0
            for b in spark_batches(root, p):
                w.write_batch(b)
                nbatches += 1
                rows += b.num_rows
                chunk.append(b)
                if sum(c.num_rows for c in chunk) >= 250_000:
                    pq.write_table(pa.Table.from_batches(chunk), str(parquet_dir / f"p{p}-{part:04d}.parquet"))
                    chunk, part = [], part + 1
            if chunk:
                pq.write_table(pa.Table.from_batches(chunk), str(parquet_dir / f"p{p}-{part:04d}.parquet"))
    return nbatches, rows


def spark_schema_arrow() -> pa.Schema:
    from pyspark_logsource.spark.source import spark_arrow_schema

    return spark_arrow_schema(False)


# ---------------------------------------------------------------------------- the ceiling: memory


class MemoryBatches(DataSource):
    """Yields the Arrow batches of ``<dir>/<partition>.arrow`` (memory-mapped, page-cached) as a stream."""

    @classmethod
    def name(cls) -> str:
        return "plog_bench_memory"

    def schema(self) -> Any:
        return spark_schema(False)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return MemoryStream(self.options["dir"], int(self.options["partitions"]), int(self.options["rows"]))


class MemoryStream(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, directory: str, partitions: int, rows: int) -> None:
        self.directory, self.partitions_, self.rows = directory, partitions, rows

    def initialOffset(self) -> dict:
        return {"done": 0}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        return {"done": self.rows}

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        if start["done"] >= end["done"]:
            return []
        return [InputPartition(f"{self.directory}/{p}.arrow") for p in range(self.partitions_)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        reader = ipc.open_file(pa.memory_map(partition.value))
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)


def segments_decode_cpu_s(root: str) -> float:
    """CPU seconds Arrow alone takes to decode (and lz4-decompress) every record batch of plog's stored
    segment files, as plain IPC streams, one thread: work plog's source cannot skip and (b) never does."""
    options = ipc.IpcReadOptions(use_threads=False)
    started = time.process_time()
    for path in sorted(Path(root).rglob("*.arrow")):
        with pa.OSFile(str(path), "rb") as source:
            for _batch in ipc.open_stream(source, options=options):  # stops at the end-of-stream mark
                pass
    return time.process_time() - started


# ---------------------------------------------------------------------------- running


def timed_run(spark: Any, df: Any, checkpoints: Path, name: str) -> tuple[float, float]:
    """Run one AvailableNow query into noop; return (wall seconds, CPU seconds of the whole process tree)."""
    ck = checkpoints / f"{name}-{time.monotonic_ns()}"
    cpu0 = tree_cpu_seconds(os.getpid())
    t0 = time.perf_counter()
    q = df.writeStream.format("noop").option("checkpointLocation", str(ck)).trigger(availableNow=True).start()
    q.awaitTermination()
    elapsed = time.perf_counter() - t0
    cpu = tree_cpu_seconds(os.getpid()) - cpu0
    if q.exception() is not None:
        raise RuntimeError(f"{name}: {q.exception()}")
    rows = sum(p["numInputRows"] for p in q.recentProgress)
    shutil.rmtree(ck, ignore_errors=True)
    return (elapsed, cpu) if rows else (float("nan"), float("nan"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=4_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--compression", default="lz4", help="the topic's compression.type (default lz4)")
    parser.add_argument("--dir", help="work directory (default: a temporary one, removed afterwards)")
    parser.add_argument("--json", help="also write the results as JSON to this file")
    args = parser.parse_args()

    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="plog-bench-spark-"))
    work.mkdir(parents=True, exist_ok=True)
    root = str(work / "plog")
    try:
        t0 = time.perf_counter()
        write_plog(root, args.records, args.partitions, args.value_bytes, args.compression)
        nbatches, rows = write_copies(root, args.partitions, work / "ipc", work / "parquet")
        stored = sum(f.stat().st_size for f in Path(root).rglob("*.arrow"))
        print(
            f"data: {rows:,} records in {nbatches} batches, plog {stored / 1e6:.0f} MB stored, "
            f"written in {time.perf_counter() - t0:.0f} s",
            flush=True,
        )

        spark = local_spark("plog-bench")
        spark.dataSource.register(MemoryBatches)

        sources = {
            "plog": lambda: (
                spark.readStream.format("plog")
                .option("subscribe", TOPIC)
                .option("startingOffsets", "earliest")
                .load(root)
            ),
            "(a) parquet file source": lambda: spark.readStream.schema(spark_schema(False)).parquet(
                str(work / "parquet")
            ),
            "(b) Python source, batches from memory": lambda: (
                spark.readStream.format("plog_bench_memory")
                .option("dir", str(work / "ipc"))
                .option("partitions", str(args.partitions))
                .option("rows", str(rows))
                .load()
            ),
        }
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in sources}
        for make in sources.values():  # warm-up
            timed_run(spark, make(), work / "ck", "warmup")
        for _ in range(args.repeat):  # interleaved, so drift in machine load hits every source alike
            for name, make in sources.items():
                runs[name].append(timed_run(spark, make(), work / "ck", name))
        spark.stop()

        mb = rows * args.value_bytes / 1e6
        name_b = "(b) Python source, batches from memory"
        wall_b = statistics.median(t for t, _ in runs[name_b])
        cpu_b = statistics.median(c for _, c in runs[name_b])
        print()
        print(f"Spark source benchmark, {dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}")
        print(f"machine: {machine()}")
        print(
            f"{rows:,} records x {args.value_bytes} B values, {args.partitions} partitions, local[2], "
            f"topic compression {args.compression}; Trigger.AvailableNow -> noop; "
            f"median of {args.repeat} interleaved runs per source"
        )
        print()
        head = ["source", "records/s", "MB/s", "vs (b)", "CPU s", "CPU ns/record", "CPU vs (b)", "runs: wall s / CPU s"]
        widths = [40, 11, 6, 6, 6, 13, 10, 0]
        print(
            "| "
            + " | ".join(
                h.ljust(w) if i in (0, 7) else h.rjust(w) for i, (h, w) in enumerate(zip(head, widths, strict=True))
            )
            + " |"
        )
        print("|" + "|".join("-" * (max(w, len(h)) + 2) for h, w in zip(head, widths, strict=True)) + "|")
        results = {}
        for name, rs in runs.items():
            wall = statistics.median(t for t, _ in rs)
            cpu = statistics.median(c for _, c in rs)
            results[name] = {
                "runs_wall_s": [t for t, _ in rs],
                "runs_cpu_s": [c for _, c in rs],
                "records_per_s": rows / wall,
                "mb_per_s": mb / wall,
                "ratio_to_b": wall_b / wall,
                "cpu_ratio_to_b": cpu_b / cpu,
            }
            cells = [
                name.ljust(40),
                f"{rows / wall:>11,.0f}",
                f"{mb / wall:>6.1f}",
                f"{wall_b / wall:>5.2f}x",
                f"{cpu:>6.1f}",
                f"{cpu / rows * 1e9:>13,.0f}",
                f"{cpu_b / cpu:>9.2f}x",
                ", ".join(f"{t:.1f}/{c:.1f}" for t, c in rs),
            ]
            print("| " + " | ".join(cells) + " |")
        print()
        print(
            "records/s, MB/s (value bytes, 10**6 B) and 'vs (b)' from the median wall time; 'CPU s' is\n"
            "the median CPU time of the whole process tree (driver, JVM, Python workers) per run, and\n"
            "'CPU vs (b)' compares it, which holds even when other work shares the machine."
        )
        cpu_plog = statistics.median(c for _, c in runs["plog"])
        notes = [
            f"CPU plog adds to (b): {(cpu_plog - cpu_b) / rows * 1e9:,.0f} ns/record",
            f"Arrow alone decoding plog's stored segments (IPC, {args.compression}, one thread): "
            f"{segments_decode_cpu_s(root) / rows * 1e9:,.0f} ns/record",
            # At 0.95x the run may last wall_b / 0.95; at (b)'s CPU use per wall second, that much more CPU.
            f"CPU the 0.95x target leaves for plog's work: about {(cpu_b / 0.95 - cpu_b) / rows * 1e9:,.0f} ns/record",
        ]
        print()
        for note in notes:
            print(f"* {note}")
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    {
                        "date": dt.datetime.now().isoformat(),
                        "machine": machine(),
                        "records": rows,
                        "results": results,
                    },
                    indent=1,
                )
            )
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
