"""Compaction throughput (PROTOCOL.md 11.6) against what pyarrow alone needs for the same result.

Usage::

    python benchmarks/bench_compaction.py [--records N] [--keys K] [--appends A] [--repeat R] [--quick]
                                          [--dedupe-buffer-mib M]

A compacted topic of one partition gets ``N`` records of 100-byte values over ``K`` distinct keys,
written as ``A`` appends, on a local directory; then one compaction pass (forced) rewrites every
element but the last. Rows, each the best of ``R`` runs on a fresh copy of the same objects:

* **plog compaction**: the pass, end to end (index reads, decoding, the offset map, filtering,
  re-encoding or copying, assembling and writing the compacted objects with fsync);
* **pyarrow, in memory**: the floor of the work itself, on the records already decoded in one
  table: a group-by on the key keeping the greatest offset, then the filter of the rows kept;
* **pyarrow, files to files**: the same floor plus reading the segments' batches as plain Arrow IPC
  and writing the kept rows as one lz4 IPC file (what any compactor of these files must do).

records/s and MB/s count the records and value bytes going *into* the pass; "ratio" is plog's time
over the row's. Under the table: the stored bytes and records before and after (space saved).

By default the pass's offset map holds every record (Kafka's 128 MiB ``log.cleaner.dedupe.buffer.size``),
so it keys the map by the keys themselves; ``--dedupe-buffer-mib`` below the records' 24 bytes each (say 8)
makes it the bounded map of key hashes (PROTOCOL.md 11.6, *Bounded offset maps*), still one pass while the
distinct keys fit.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
from spark_common import machine  # also puts the project root on sys.path

from segment_format.records import payload_batch
from segment_format.root import LogRoot
from segment_format.segment import BatchMeta, raw_messages

VALUE_BYTES = 100


def build(directory: Path, records: int, keys: int, appends: int, seed: int = 11) -> None:
    """The topic ``c``: ``records`` records over ``keys`` keys, as ``appends`` appends."""
    root = LogRoot(str(directory))
    root.catalog.create(
        "c",
        1,
        {
            "cleanup.policy": "compact",
            "auto.maintenance.enable": False,
            "retention.ms": -1,
            "segment.bytes": 1 << 30,  # one compacted object: the pass, not object count, is measured
        },
    )
    log = root.partition("c", 0)
    rng = np.random.default_rng(seed)
    per = records // appends
    for a in range(appends):
        key_ids = rng.integers(0, keys, per)
        keys_col = [b"key-%08d" % k for k in key_ids]
        values = rng.integers(32, 127, per * VALUE_BYTES, dtype=np.uint8).tobytes()
        vals = [values[i * VALUE_BYTES : (i + 1) * VALUE_BYTES] for i in range(per)]
        batch = payload_batch([1_700_000_000_000 + a] * per, keys_col, vals)
        log.append([(batch, BatchMeta())], durable=False)
    log.append([(payload_batch([1_800_000_000_000], [b"tail"], [b"x"]), BatchMeta())], durable=False)
    os.sync()


def stored(directory: Path) -> tuple[int, int]:
    """(bytes, records) of the partition's chain."""
    log = LogRoot(str(directory)).partition("c", 0)
    view = log.view()
    return sum(ref.size for ref in view.segments), sum(log.index(ref).meta.record_count for ref in view.segments)


def time_plog(directory: Path, dedupe_buffer_size: int | None = None) -> float:
    root = LogRoot(str(directory))
    if dedupe_buffer_size is not None:
        root.dedupe_buffer_size = dedupe_buffer_size
    log = root.partition("c", 0)
    view = log.view()
    for ref in view.segments:  # indexes in memory first: a maintainer keeps them cached between passes
        log.index(ref)
    started = time.perf_counter()
    written = log.compact(force=True)
    elapsed = time.perf_counter() - started
    assert written >= 1, "nothing was compacted"
    report = log.cleaner.compactor.last_pass if log.cleaner.compactor is not None else None
    assert report is not None and not report.partial, "the map did not hold every key: raise --dedupe-buffer-mib"
    return elapsed


def segment_tables(directory: Path) -> list[pa.Table]:
    """The records of every element but the last, read with plain pyarrow IPC (one table per object)."""
    log = LogRoot(str(directory)).partition("c", 0)
    out = []
    for ref in log.view().segments[:-1]:
        with open(os.path.join(str(directory), ref.key), "rb") as f:
            out.append(ipc.open_stream(f).read_all())
    return out


def floor(table: pa.Table) -> pa.Table:
    """What compaction computes: every key's record with the greatest offset."""
    last = table.group_by("key").aggregate([("offset", "max")]).column("offset_max")
    return table.filter(pc.is_in(table.column("offset"), value_set=last))


def time_in_memory(directory: Path) -> tuple[float, int]:
    table = pa.concat_tables(segment_tables(directory)).combine_chunks()
    started = time.perf_counter()
    kept = floor(table)
    return time.perf_counter() - started, kept.num_rows


def time_files(directory: Path, out: Path) -> float:
    started = time.perf_counter()
    table = pa.concat_tables(segment_tables(directory))
    kept = floor(table)
    with open(out, "wb") as f:
        with ipc.new_stream(f, kept.schema, options=ipc.IpcWriteOptions(compression="lz4")) as writer:
            writer.write_table(kept)
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--appends", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="200,000 records, one run")
    parser.add_argument("--dedupe-buffer-mib", type=float, default=None, help="the offset map's limit (MiB)")
    args = parser.parse_args(argv)
    if args.quick:
        args.records, args.keys, args.appends, args.repeat = 200_000, 10_000, 20, 1
    work = Path(tempfile.mkdtemp(prefix="bench-compaction-"))
    try:
        pristine = work / "pristine"
        print(f"writing {args.records:,} records over {args.keys:,} keys in {args.appends} appends ...", flush=True)
        build(pristine, args.records, args.keys, args.appends)
        before_bytes, before_records = stored(pristine)
        log = LogRoot(str(pristine)).partition("c", 0)
        sample = raw_messages(log.store, log.index(log.view().segments[0]))
        assert sample, "the topic is empty"
        value_mb = (before_records - 1) * VALUE_BYTES / 1e6
        plog_s, memory_s, files_s = [], [], []
        kept_rows = 0
        for r in range(args.repeat):
            copy = work / f"run{r}"
            shutil.copytree(pristine, copy)
            os.sync()
            limit = None if args.dedupe_buffer_mib is None else int(args.dedupe_buffer_mib * 1024 * 1024)
            plog_s.append(time_plog(copy, limit))
            after_bytes, after_records = stored(copy)
            shutil.rmtree(copy)
            seconds, kept_rows = time_in_memory(pristine)
            memory_s.append(seconds)
            files_s.append(time_files(pristine, work / "kept.arrow"))
        assert after_records - 1 == kept_rows, (after_records, kept_rows)  # plog kept what the floor keeps
        best = {
            "plog compaction": min(plog_s),
            "pyarrow, in memory": min(memory_s),
            "pyarrow, files to files": min(files_s),
        }
        n = before_records - 1
        print()
        print(
            f"Compaction of {n:,} records ({value_mb:,.0f} MB of values) over {args.keys:,} keys, "
            f"{args.appends} appends; best of {args.repeat}; offset map "
            f"{'128 MiB' if args.dedupe_buffer_mib is None else f'{args.dedupe_buffer_mib:g} MiB'}; "
            f"{dt.date.today()}; {machine()}"
        )
        print()
        print("| path | seconds | records/s | MB/s | plog's time / this row's |")
        print("|---|---:|---:|---:|---:|")
        for name, seconds in best.items():
            print(
                f"| {name} | {seconds:.3f} | {n / seconds:,.0f} | {value_mb / seconds:,.1f} | "
                f"{best['plog compaction'] / seconds:.2f}x |"
            )
        print()
        print(
            f"Stored: {before_bytes / 1e6:,.1f} MB and {before_records:,} records before, "
            f"{after_bytes / 1e6:,.1f} MB and {after_records:,} after "
            f"({100 * (1 - after_bytes / before_bytes):.0f} % of the bytes saved)."
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
