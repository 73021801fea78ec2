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
  ``compression=uncompressed``, to show what lz4 costs;
* unless ``--no-stages``, two cut-down plog sinks that run the same task code
  and stop early, to show where plog's CPU goes: **plog, routing only**
  (Kafka's partitioner, grouping by partition, buffering; nothing encoded)
  and **plog, routing + encoding** (also the Arrow IPC encoding with lz4 and
  the CRCs of every stored batch; nothing written, nothing committed).

Under the table: the CPU per record each sink adds to (b), split into
routing, encoding and writing (the differences between the stage sinks),
next to **lz4 alone** compressing the same keys and values (one thread, the
codec Arrow's IPC writer uses, in stored batches of the sink's size) and to
the CPU the 0.9x target leaves for plog's work on this machine.

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
from pyspark_logsource.spark.sink import PlogCommitMessage, PlogStreamWriter  # noqa: E402
from pyspark_logsource.spark.source import DefaultSource as PlogDataSource  # noqa: E402
from pyspark_logsource.spark.task_writer import TaskWriter as _TaskWriter  # noqa: E402
from segment_format.records import with_offsets  # noqa: E402
from segment_format.segment import BatchMeta, encode_batch, ipc_options  # noqa: E402

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


# ---------------------------------------------------------------------------- plog cut short: where its CPU goes


class _StageTaskWriter(_TaskWriter):
    """The sink's task writer, stopping after routing (``encode`` False) or after encoding (True)."""

    encode = False

    def _append(self, tp: tuple[str, int], batches: list[pa.RecordBatch]) -> None:
        if not self.encode:
            return
        rows = pa.Table.from_batches(batches).combine_chunks()
        options = ipc_options(self.sink.compression or "lz4")
        for chunk in rows.to_batches(max_chunksize=self.sink.batch_rows):
            encode_batch(with_offsets(chunk, 0), BatchMeta(self.producer_id, 0, -1, 0), options)


class _EncodingTaskWriter(_StageTaskWriter):
    encode = True


class _StageWriter(PlogStreamWriter):
    task_writer: type[_TaskWriter] = _StageTaskWriter

    def _write(
        self, iterator: Iterator[pa.RecordBatch], root: Any, producer_id: int, txn: int, hints: Any = None
    ) -> Any:
        writer = self.task_writer(self, root, producer_id, txn, hints)
        for batch in iterator:
            writer.add(batch)
        writer.finish()
        writer.close()
        return PlogCommitMessage({}, writer.records, producer_id, txn)  # nothing written: nothing to commit


class _EncodingWriter(_StageWriter):
    task_writer = _EncodingTaskWriter


class RoutingOnly(PlogDataSource):
    @classmethod
    def name(cls) -> str:
        return "plog_bench_route"

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        return _StageWriter(dict(self.options), schema)


class RoutingAndEncoding(PlogDataSource):
    @classmethod
    def name(cls) -> str:
        return "plog_bench_encode"

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        return _EncodingWriter(dict(self.options), schema)


def _data(column: pa.Array) -> pa.Buffer:
    """The bytes of a (sliced) string or binary array's values."""
    offsets = np.frombuffer(column.buffers()[1], np.int32)[column.offset : column.offset + len(column) + 1]
    return column.buffers()[2].slice(int(offsets[0]), int(offsets[-1] - offsets[0]))


def lz4_alone_cpu_s(directory: Path, rows_per_batch: int) -> float:
    """CPU seconds lz4 alone takes to compress the input's keys and values, one thread, in batches of the
    sink's stored size, with the codec Arrow's IPC writer uses (LZ4 frame, each buffer on its own)."""
    table = pq.read_table(str(directory)).combine_chunks()
    batches = [(_data(b.column(0)), _data(b.column(1))) for b in table.to_batches(rows_per_batch)]
    codec = pa.Codec("lz4")
    started = time.process_time()
    for keys, values in batches:
        codec.compress(keys)
        codec.compress(values)
    return time.process_time() - started


# ---------------------------------------------------------------------------- running


def committed_records(root: str, topic: str, partitions: int) -> int:
    """Records a read_committed consumer sees in ``topic`` (all of them, read back)."""
    with Consumer(root, isolation_level="read_committed", auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        return consumer.read_to_end(timeout_ms=300_000, max_records=1_000_000).num_rows


def cpu_breakdown(
    results: dict[str, dict[str, Any]], records: int, name_b: str, name_plog: str, name_route: str, name_encode: str
) -> list[str]:
    """Lines: the CPU per record plog adds to (b), split by the stage sinks into routing, encoding, writing."""

    def ns(name: str) -> float:
        return float(results[name]["cpu_s"]) / records * 1e9

    added = ns(name_plog) - ns(name_b)
    lines = [f"CPU plog adds to (b): {added:,.0f} ns/record"]
    if name_route in results and name_encode in results:
        routing, encoding = ns(name_route) - ns(name_b), ns(name_encode) - ns(name_route)
        writing = ns(name_plog) - ns(name_encode)
        for part, value in (
            ("routing", routing),
            ("encoding (IPC, lz4, CRC)", encoding),
            ("writing and committing", writing),
        ):
            lines.append(
                f"  {part}: {value:,.0f} ns/record ({value / added:.0%})" if added > 0 else f"  {part}: {value:,.0f}"
            )
    return lines


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
        "--no-stages",
        action="store_true",
        help="leave out the two cut-down plog sinks (routing only; routing + encoding)",
    )
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
        spark.dataSource.register(RoutingOnly)
        spark.dataSource.register(RoutingAndEncoding)
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

        def stage_sink(fmt: str) -> Any:
            def start(ck: Path) -> Any:
                runs_made[0] += 1
                topic = f"bench-{runs_made[0]}"
                with LogStore(root) as store:
                    store.create_topic(topic, args.partitions)
                writer = source().writeStream.format(fmt).option("topic", topic)
                return writer.option("checkpointLocation", str(ck)).trigger(availableNow=True).start(root)

            return start

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
        name_plog = "plog (exactly-once, commit included)"
        name_route, name_encode = "plog, routing only", "plog, routing + encoding"
        sinks = {
            name_plog: plog_sink,
            "plog, option compression=uncompressed": plog_uncompressed,
            name_route: stage_sink("plog_bench_route"),
            name_encode: stage_sink("plog_bench_encode"),
            "(a) parquet file sink": parquet_sink,
            name_b: count_sink,
        }
        if args.no_uncompressed:
            del sinks["plog, option compression=uncompressed"]
        if args.no_stages:
            del sinks[name_route], sinks[name_encode]

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
        head = ["sink", "records/s", "MB/s", "ratio to (b)", "CPU s", "CPU ns/record", "runs (wall s)"]
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
                "cpu_s": cpu,
            }
            rows_out.append(
                [
                    name,
                    f"{args.records / wall:,.0f}",
                    f"{mb / wall:.1f}",
                    f"{wall_b / wall:.2f}x",
                    f"{cpu:.1f}",
                    f"{cpu / args.records * 1e9:,.0f}",
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
                c.ljust(w) if i in (0, 6) else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )

        line = text_row(head)
        print(line)
        print("-" * len(line))
        for r in rows_out:
            print(text_row(r))
        ratio = results[name_plog]["ratio_to_b"]
        print()
        print(f"target plog >= 0.9x of (b): {'met' if ratio >= 0.9 else 'NOT met'} ({ratio:.2f}x)")
        breakdown = cpu_breakdown(results, args.records, name_b, name_plog, name_route, name_encode)
        breakdown.append(
            f"lz4 alone on the same keys and values (one thread): "
            f"{lz4_alone_cpu_s(work / 'input', 10_000) / args.records * 1e9:,.0f} ns/record"
        )
        cpu_b = results[name_b]["cpu_s"]
        # At 0.9x the run may last wall_b / 0.9; at (b)'s CPU use per wall second, that is this much more CPU.
        budget = cpu_b / 0.9 - cpu_b
        breakdown.append(
            f"CPU the 0.9x target leaves for plog's work: about {budget / args.records * 1e9:,.0f} ns/record"
        )
        print()
        for line_ in breakdown:
            print(line_)
        print()
        print("markdown:")
        print()
        print(f"{when}, {where}  ")
        print(f"{setup}.")
        print()
        print("| " + " | ".join(head) + " |")
        print("|---|" + "---:|" * 5 + "---|")
        for r in rows_out:
            print("| " + " | ".join(r) + " |")
        print()
        for line_ in breakdown:
            print(f"* {line_}")
        if args.json:
            Path(args.json).write_text(
                json.dumps({"date": when, "machine": where, "records": args.records, "results": results}, indent=2)
            )
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
