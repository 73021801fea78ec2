"""Where ``Consumer.poll_arrow()`` spends its time, part by part, against the hot-path reference.

Usage::

    python benchmarks/profile_poll.py [--records N] [--rounds K] [--dir DIR]

The topic is the one the hot-path benchmark reads (``bench_client.py --hot-paths-only``): ``N`` unique,
semi-compressible 100-byte values (default 2,000,000), written with ``send_batch`` to one lz4 partition, and
the reference file beside it (an Arrow IPC file of the values, lz4). Each group of figures runs in a fresh
process, after one untimed round, in ``K`` interleaved rounds (default 7); each figure is the median, per
record.

Two tables:

* **the parts, alone:** reading the segment files in the reader's 8 MiB ranges into Python ``bytes``
  (a fresh allocation each, which the kernel maps and zeroes page by page) and into Arrow's memory pool
  (``Store.get_range_buffer``); decoding each stored column alone, with Arrow on one thread; building
  ``poll_arrow``'s topic and partition columns for each batch, and slicing kept ones (``RepeatedColumns``);
* **``poll_arrow`` whole,** each way it has read, in turn in one fresh process: as before 2026-11-26 (bytes,
  columns built per batch, no decoding ahead), with each change added in turn, and as it is, next to the
  reference read of the values (the hot-path row's reference), in the same rounds, with the process's CPU
  per record and how many of the cores the loop keeps busy (CPU over wall).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_client import ipc_read, ipc_write, make_values  # noqa: E402

from pyspark_logsource import Consumer, LogStore, Producer, TopicPartition  # noqa: E402
from pyspark_logsource.client import fetcher  # noqa: E402
from pyspark_logsource.client.producer import PRODUCER_DEFAULTS  # noqa: E402
from segment_format.log import reader  # noqa: E402
from segment_format.records import RECORD_SCHEMA  # noqa: E402
from segment_format.segment import READ_AHEAD, read_index  # noqa: E402
from segment_format.stores.base import Store  # noqa: E402
from segment_format.stores.local import LocalStore  # noqa: E402

TOPIC = "profile-poll"


def setup(workdir: str, n: int) -> tuple[str, str]:
    """The topic (a root under ``workdir``) and the reference file, written once."""
    root, reference = os.path.join(workdir, "root"), os.path.join(workdir, "reference.arrow")
    if not os.path.exists(reference):
        values = make_values(n, 100)
        table = pa.table({"value": pa.array(values, pa.binary())})
        with LogStore(root) as admin:
            admin.create_topic(TOPIC, 1, {"compression.type": "lz4"})
        with Producer(root, compression_type="lz4", acks=1) as producer:
            producer.send_batch(TOPIC, table)
        ipc_write(table, reference, max(1, PRODUCER_DEFAULTS["batch_size"] // (table.nbytes // n)))()
    return root, reference


def rounds(k: int, runs: dict[str, Callable[[], Any]]) -> dict[str, list[tuple[float, float]]]:
    """Each run timed once per round (wall s, process CPU s), for ``k`` rounds after an untimed one."""
    for run in runs.values():
        run()
    out: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for _ in range(k):
        for name, run in runs.items():
            cpu, wall = time.process_time(), time.perf_counter()
            run()
            out[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    return out


def ns(xs: list[tuple[float, float]], n: int, which: int = 0) -> float:
    """Median wall (``which=0``) or CPU (1) nanoseconds per record."""
    return statistics.median(x[which] for x in xs) / n * 1e9


def segment_files(root: str) -> list[Path]:
    return sorted(Path(root, "topics").glob(f"{TOPIC}/**/*.arrow"))


def reads(root: str) -> dict[str, Callable[[], Any]]:
    """Reading every segment file in ``READ_AHEAD`` ranges, into bytes and into Arrow's memory."""
    store = LocalStore(root)
    keys = [str(p.relative_to(root)) for p in segment_files(root)]
    sizes = {key: store.size(key) for key in keys}

    def ranges(read: Callable[[str, int, int], Any]) -> Callable[[], None]:
        def run() -> None:
            for key in keys:
                for start in range(0, sizes[key], READ_AHEAD):
                    read(key, start, start + READ_AHEAD)

        return run

    return {
        "into Python bytes (get_range)": ranges(store.get_range),
        "into Arrow's memory pool (get_range_buffer)": ranges(store.get_range_buffer),
    }


def column_decodes(root: str) -> dict[str, Callable[[], Any]]:
    """Decoding the stored batches one column at a time, Arrow alone on one thread."""
    store = LocalStore(root)
    streams = []
    for path in segment_files(root):
        key = str(path.relative_to(root))
        index = read_index(store, key)
        data = store.get_range_buffer(key, 0, index.size)
        schema = data.slice(0, int(index.positions[0]))
        for i in range(index.batch_count):
            message = data.slice(int(index.positions[i]), int(index.lengths[i]))
            stream = pa.allocate_buffer(len(schema) + len(message))
            memoryview(stream)[: len(schema)] = memoryview(schema)
            memoryview(stream)[len(schema) :] = memoryview(message)
            streams.append(stream)

    def decode(fields: list[int]) -> Callable[[], None]:
        options = ipc.IpcReadOptions(use_threads=False, included_fields=fields)

        def run() -> None:
            for stream in streams:
                ipc.open_stream(stream, options=options).read_next_batch()

        return run

    runs = {f"column {f.name}": decode([i]) for i, f in enumerate(RECORD_SCHEMA)}
    runs["all five columns"] = decode(list(range(len(RECORD_SCHEMA))))
    return runs


def topic_columns(n_batches: int, rows: int) -> dict[str, Callable[[], Any]]:
    """``poll_arrow``'s topic and partition columns for ``n_batches`` batches of ``rows``."""

    def built() -> None:
        for _ in range(n_batches):
            _BuiltColumns().topic(TOPIC, rows)
            _BuiltColumns().partition(0, rows)

    kept = fetcher.RepeatedColumns()

    def sliced() -> None:
        for _ in range(n_batches):
            kept.topic(TOPIC, rows)
            kept.partition(0, rows)

    return {"built per batch (pa.repeat, np.full)": built, "sliced from kept ones (RepeatedColumns)": sliced}


class Variant:
    """``poll_arrow`` as it read at one point: reads into bytes or Arrow's memory, columns built or kept,
    decoding ahead or not. ``apply`` patches this process's classes to it (the real ones are saved on the
    first call, so any variant can follow any other)."""

    saved: dict[str, Any] = {}

    def __init__(self, arrow_memory: bool, kept_columns: bool, decode_ahead: bool) -> None:
        self.arrow_memory, self.kept_columns, self.decode_ahead = arrow_memory, kept_columns, decode_ahead

    def apply(self) -> None:
        saved = Variant.saved
        if not saved:
            saved.update(
                buffer=LocalStore.get_range_buffer, read=reader.LogReader.read, columns=fetcher.RepeatedColumns
            )
        LocalStore.get_range_buffer = saved["buffer"] if self.arrow_memory else Store.get_range_buffer  # type: ignore[method-assign]
        real_read, ahead = saved["read"], self.decode_ahead

        def read(self: reader.LogReader, *args: Any, **kwargs: Any) -> Any:
            kwargs["decode_ahead"] = ahead
            return real_read(self, *args[:6], **kwargs)

        reader.LogReader.read = read  # type: ignore[method-assign]
        fetcher.RepeatedColumns = saved["columns"] if self.kept_columns else _BuiltColumns  # type: ignore[misc]


class _BuiltColumns(fetcher.RepeatedColumns):
    """The columns as ``to_arrow`` built them before it kept them: afresh for every batch."""

    def topic(self, name: str, n: int) -> pa.Array:
        return pa.repeat(pa.scalar(name, pa.string()), n)

    def partition(self, number: int, n: int) -> pa.Array:
        return pa.array(np.full(n, number, np.int32))


def poll_arrow(root: str, n: int, variant: Variant) -> Callable[[], None]:
    """Reading the topic from the start with ``poll_arrow()`` (default arguments), as ``variant``."""

    def run() -> None:
        variant.apply()
        with Consumer(root, auto_offset_reset="earliest") as consumer:
            consumer.assign([TopicPartition(TOPIC, 0)])
            got = 0
            while got < n:
                got += consumer.poll_arrow().num_rows

    return run


VARIANTS = {
    "as before 2026-11-26 (bytes, columns built, no decoding ahead)": Variant(False, False, False),
    "+ reads into Arrow's memory": Variant(True, False, False),
    "+ kept topic and partition columns": Variant(True, True, False),
    "+ decoding ahead (as it is)": Variant(True, True, True),
}


def entries(root: str, reference: str, n: int, batches: int) -> dict[str, Callable[[], dict[str, Callable[[], Any]]]]:
    """What each fresh process times: a group of parts, or every way of ``poll_arrow`` and the reference,
    in turn in the same rounds (the small differences between ways show only when paired so).

    Each runs in a process of its own, as a consumer's would: how large allocations are served depends on
    what the C heap went through before (glibc maps a multi-MiB block afresh, page by page, until a free
    teaches it otherwise), so a part measured after others may look cheaper than it is in a new process.
    """
    store = reads(root)
    out: dict[str, Callable[[], dict[str, Callable[[], Any]]]] = {
        name: (lambda name=name: {name: store[name]}) for name in store
    }
    out["columns"] = lambda: column_decodes(root)
    out["topic and partition"] = lambda: topic_columns(batches, n // batches)
    out["poll_arrow"] = lambda: {
        **{name: poll_arrow(root, n, variant) for name, variant in VARIANTS.items()},
        "reference": ipc_read(reference),
    }
    return out


def print_table(title: str, header: str, rows: list[str]) -> None:
    print(f"\n{title}\n")
    print(header)
    print("|" + "|".join(["---"] + ["---:"] * (header.count("|") - 2)) + "|")
    for row in rows:
        print(row)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000, help="records in the topic (default 2,000,000)")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds, after one untimed (default 7)")
    parser.add_argument("--dir", default=None, help="directory to work in (default: a new one under /tmp)")
    parser.add_argument("--entry", help=argparse.SUPPRESS)  # one entry, in a child process
    args = parser.parse_args(argv)
    n, k = args.records, args.rounds
    workdir = args.dir or tempfile.mkdtemp(prefix="plog-profile-poll-")
    root, reference = setup(workdir, n)
    batches = sum(read_index(LocalStore(root), str(p.relative_to(root))).batch_count for p in segment_files(root))
    table = entries(root, reference, n, batches)
    if args.entry:
        print(json.dumps(rounds(k, table[args.entry]())))
        return 0
    print(f"profile of poll_arrow: {n:,} records of 100 B, {batches} stored batches, lz4; {k} rounds, medians")
    print("every entry below in a fresh process")
    timed: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for entry in table:
        command = [sys.executable, os.path.abspath(__file__), "--entry", entry, "--dir", workdir]
        command += ["--records", str(n), "--rounds", str(k)]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        timed[entry] = json.loads(out.strip().splitlines()[-1])
    parts = {name: xs for entry in table if entry != "poll_arrow" for name, xs in timed[entry].items()}
    print_table(
        "The parts, alone (one thread)",
        "| part | ns/record, wall | CPU ns/record |",
        [f"| {name} | {ns(xs, n):.1f} | {ns(xs, n, 1):.1f} |" for name, xs in parts.items()],
    )
    rows = []
    theirs = timed["poll_arrow"]["reference"]
    for name in VARIANTS:
        mine = timed["poll_arrow"][name]
        ratios = [t[0] / m[0] for m, t in zip(mine, theirs, strict=True)]
        rows.append(
            f"| {name} | {ns(mine, n):.1f} | {ns(mine, n, 1):.1f} | {ns(mine, n, 1) / ns(mine, n):.2f} | "
            f"{ns(theirs, n):.1f} | {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) |"
        )
    print_table(
        "poll_arrow whole, each way in turn in one fresh process, in the same rounds as the reference",
        "| poll_arrow | ns/record, wall | CPU ns/record | cores busy | reference ns/record | ratio (rounds' range) |",
        rows,
    )
    print(f"\nworkdir: {workdir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
