"""Spark sink throughput: ``writeStream.format("plog")`` against Spark's file sink and the write path's ceiling.

Usage::

    python benchmarks/bench_spark_sink.py [--records N] [--value-bytes B] [--repeat K] [--dir DIR]

One run, one local[2] SparkSession, three sinks fed the same records
(default 4,000,000 records: a ``user-<n>`` key and a 100-byte value), read as
a stream from parquet files with ``Trigger.AvailableNow`` (two files per
micro-batch, so several micro-batches and commits per run):

* **plog** -- ``writeStream.format("plog")`` into a topic of ``--partitions``
  partitions (lz4, the default topic config), records placed by Kafka's
  murmur2 of the key, exactly-once: every micro-batch is a transaction, and
  its commit (the decision object) is inside the timed run;
* **(a) parquet** -- Spark's own file sink (``format("parquet")``, snappy),
  with its ``_spark_metadata`` log: exactly-once the JVM way;
* **(b) count-only Python sink** -- a ``DataSourceStreamArrowWriter`` whose
  ``write()`` only counts the rows of the Arrow batches it receives: the
  ceiling of the Python Data Source write path (Spark's JVM -> Arrow ->
  Python worker transfer). The target is plog >= 0.9x of it;
* and, unless ``--no-uncompressed``, plog once more with the sink option
  ``compression=uncompressed``, to show what lz4 costs.

The table also shows the CPU seconds of the whole process tree (driver, JVM,
Python workers) per run: the Python write path runs on the same cores as
Spark's own work, so on a small machine the sink's CPU per record, not its
waiting, decides its speed.

Every sink runs once untimed (Python workers, JIT, page cache), then
``--repeat`` timed runs, interleaved (plog, a, b, plog, a, b, ...) so that
changes in the machine's load hit every sink alike; the table shows the
median run. Time is the wall clock from ``start()`` to the end of the
AvailableNow query. MB/s counts value bytes (10**6 bytes per MB). After each
plog run the topic is read back with read_committed: every record must be
there exactly once.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.datasource import (  # noqa: E402
    DataSource,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from spark_common import local_spark, machine, make_values, tree_cpu_seconds

from pyspark_logsource import Consumer, LogStore, TopicPartition  # noqa: E402

FILES_PER_TRIGGER = 2


# ---------------------------------------------------------------------------- data


def make_keys(n: int, users: int, rng: np.random.Generator) -> pa.Array:
    ids = rng.integers(0, users, n)
    return pa.array(np.char.add("user-", ids.astype("U7")).astype(object), pa.string())


def write_input(directory: Path, records: int, size: int, files: int) -> None:
    """``records`` rows (key string, value binary) as ``files`` snappy parquet files."""
    directory.mkdir(parents=True)
    rng = np.random.default_rng(1)
    per = -(-records // files)
    for i in range(files):
        n = min(per, records - i * per)
        if n <= 0:
            break
        table = pa.table({"key": make_keys(n, 100_000, rng), "value": make_values(n, size, rng)})
        pq.write_table(table, str(directory / f"part-{i:04d}.parquet"), row_group_size=250_000)


# ---------------------------------------------------------------------------- the ceiling: count only


@dataclass
class Counted(WriterCommitMessage):
    rows: int


class CountOnly(DataSource):
    """A streaming sink that receives Arrow batches and only counts their rows."""

    @classmethod
    def name(cls) -> str:
        return "plog_bench_count"

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamArrowWriter:
        return CountWriter()


class CountWriter(DataSourceStreamArrowWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> Counted:
        return Counted(sum(batch.num_rows for batch in iterator))

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - Spark's name
        pass

    def abort(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - Spark's name
        pass


# ---------------------------------------------------------------------------- running


def committed_records(root: str, topic: str, partitions: int) -> int:
    """Records a read_committed consumer sees in ``topic`` (all of them, read back)."""
    with Consumer(root, isolation_level="read_committed", auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        return consumer.read_to_end(timeout_ms=300_000, max_records=1_000_000).num_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=4_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=4, help="partitions of the plog topic (default 4)")
    parser.add_argument("--files", type=int, default=8, help="input parquet files (2 per micro-batch)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", help="work directory (default: a temporary one, removed afterwards)")
    parser.add_argument("--json", help="also write the results as JSON to this file")
    parser.add_argument(
        "--no-uncompressed",
        action="store_true",
        help="leave out the row of plog with the sink option compression=uncompressed",
    )
    args = parser.parse_args()

    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="plog-bench-sink-"))
    work.mkdir(parents=True, exist_ok=True)
    root = str(work / "plog")
    try:
        t0 = time.perf_counter()
        write_input(work / "input", args.records, args.value_bytes, args.files)
        print(
            f"data: {args.records:,} records x {args.value_bytes} B in {args.files} parquet files, "
            f"written in {time.perf_counter() - t0:.0f} s",
            flush=True,
        )
        with LogStore(root):
            pass

        spark = local_spark("plog-bench-sink")
        spark.dataSource.register(CountOnly)
        schema = "key string, value binary"
        runs_made = [0]

        def source() -> Any:
            return (
                spark.readStream.schema(schema)
                .option("maxFilesPerTrigger", FILES_PER_TRIGGER)
                .parquet(str(work / "input"))
            )

        def plog_sink(ck: Path, compression: str | None = None) -> Any:
            runs_made[0] += 1
            topic = f"bench-{runs_made[0]}"
            with LogStore(root) as store:
                store.create_topic(topic, args.partitions)
            plog_sink.topic = topic  # type: ignore[attr-defined]
            writer = source().writeStream.format("plog").option("topic", topic)
            if compression:
                writer = writer.option("compression", compression)
            return writer.option("checkpointLocation", str(ck)).trigger(availableNow=True).start(root)

        def plog_uncompressed(ck: Path) -> Any:
            return plog_sink(ck, "uncompressed")

        def parquet_sink(ck: Path) -> Any:
            out = work / "parquet-out" / ck.name
            return (
                source()
                .writeStream.format("parquet")
                .option("path", str(out))
                .option("checkpointLocation", str(ck))
                .trigger(availableNow=True)
                .start()
            )

        def count_sink(ck: Path) -> Any:
            return (
                source()
                .writeStream.format("plog_bench_count")
                .option("checkpointLocation", str(ck))
                .trigger(availableNow=True)
                .start()
            )

        name_b = "(b) count-only Python Arrow sink"
        sinks = {
            "plog (exactly-once, commit included)": plog_sink,
            "plog, option compression=uncompressed": plog_uncompressed,
            "(a) parquet file sink": parquet_sink,
            name_b: count_sink,
        }
        if args.no_uncompressed:
            del sinks["plog, option compression=uncompressed"]

        def timed(name: str, start: Any) -> tuple[float, float]:
            ck = work / "ck" / f"{time.monotonic_ns()}"
            cpu0 = tree_cpu_seconds(os.getpid())
            t = time.perf_counter()
            query = start(ck)
            query.awaitTermination()
            elapsed = time.perf_counter() - t
            cpu = tree_cpu_seconds(os.getpid()) - cpu0
            if query.exception() is not None:
                raise RuntimeError(f"{name}: {query.exception()}")
            rows = sum(p["numInputRows"] for p in query.recentProgress)
            if rows != args.records:
                raise RuntimeError(f"{name}: {rows:,} rows processed, expected {args.records:,}")
            if start in (plog_sink, plog_uncompressed):
                seen = committed_records(root, plog_sink.topic, args.partitions)  # type: ignore[attr-defined]
                if seen != args.records:
                    raise RuntimeError(f"plog: {seen:,} records committed, expected {args.records:,}")
                shutil.rmtree(Path(root) / "topics" / plog_sink.topic, ignore_errors=True)  # type: ignore
            shutil.rmtree(ck, ignore_errors=True)
            shutil.rmtree(work / "parquet-out", ignore_errors=True)
            return elapsed, cpu

        for name, start in sinks.items():  # warm-up
            timed(name, start)
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in sinks}
        for _ in range(args.repeat):
            for name, start in sinks.items():
                runs[name].append(timed(name, start))
                print(f"  {name}: {runs[name][-1][0]:.2f} s", flush=True)
        spark.stop()

        mb = args.records * args.value_bytes / 1e6
        wall_b = statistics.median(t for t, _ in runs[name_b])
        when = f"{dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}"
        where = machine()
        setup = (
            f"{args.records:,} records x {args.value_bytes} B values (+ ~10 B keys), local[2], parquet "
            f"stream source ({FILES_PER_TRIGGER} files per micro-batch, "
            f"{-(-args.files // FILES_PER_TRIGGER)} micro-batches), Trigger.AvailableNow; plog topic of "
            f"{args.partitions} partitions, lz4; median of {args.repeat} interleaved runs"
        )
        head = ["sink", "records/s", "MB/s", "ratio to (b)", "CPU s", "runs (wall s)"]
        rows_out = []
        results = {}
        for name, rs in runs.items():
            wall = statistics.median(t for t, _ in rs)
            cpu = statistics.median(c for _, c in rs)
            results[name] = {
                "runs_wall_s": [t for t, _ in rs],
                "runs_cpu_s": [c for _, c in rs],
                "records_per_s": args.records / wall,
                "mb_per_s": mb / wall,
                "ratio_to_b": wall_b / wall,
            }
            rows_out.append(
                [
                    name,
                    f"{args.records / wall:,.0f}",
                    f"{mb / wall:.1f}",
                    f"{wall_b / wall:.2f}x",
                    f"{cpu:.1f}",
                    ", ".join(f"{t:.2f}" for t, _ in rs),
                ]
            )
        widths = [max(len(r[i]) for r in [head, *rows_out]) for i in range(len(head))]
        print()
        print(f"Spark sink benchmark, {when}")
        print(f"machine: {where}")
        print(setup)
        print()

        def text_row(cells: list[str]) -> str:
            return "  ".join(
                c.ljust(w) if i in (0, 5) else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )

        line = text_row(head)
        print(line)
        print("-" * len(line))
        for r in rows_out:
            print(text_row(r))
        ratio = results["plog (exactly-once, commit included)"]["ratio_to_b"]
        print()
        print(f"target plog >= 0.9x of (b): {'met' if ratio >= 0.9 else 'NOT met'} ({ratio:.2f}x)")
        print()
        print("markdown:")
        print()
        print(f"{when}, {where}  ")
        print(f"{setup}.")
        print()
        print("| " + " | ".join(head) + " |")
        print("|---|" + "---:|" * 4 + "---|")
        for r in rows_out:
            print("| " + " | ".join(r) + " |")
        if args.json:
            Path(args.json).write_text(
                json.dumps({"date": when, "machine": where, "records": args.records, "results": results}, indent=2)
            )
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
