"""Peak memory of compaction with a bounded offset map (PROTOCOL.md 11.6, *Bounded offset maps*).

One partition of unique keys (each written twice, so half the records are superseded) on the local
filesystem; it is compacted with ``log.cleaner.dedupe.buffer.size`` set to each limit, pass after pass
until nothing is left to do. Prints keys, limit, passes, peak traced memory (tracemalloc: Python and
numpy/Arrow buffers allocated through Python) and seconds.

    PYTHONPATH=. python benchmarks/bench_compaction_memory.py [--keys 200000] [--limits 1,4,128]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
import tracemalloc
from pathlib import Path

import pyarrow as pa

from segment_format.records import payload_batch
from segment_format.root import LogRoot
from segment_format.segment import BatchMeta

CONFIG = {
    "cleanup.policy": "compact",
    "compression.type": "none",
    "auto.maintenance.enable": False,
    "segment.bytes": 4 * 1024 * 1024,
    "min.cleanable.dirty.ratio": 0.01,
}
MIB = 1024 * 1024


def build(url: str, keys: int, per_append: int) -> None:
    """``keys`` distinct keys, each appended twice (100-byte values), ``per_append`` records an object."""
    root = LogRoot(url)
    root.catalog.create("t", 1, CONFIG)
    log = root.partition("t", 0)
    value = b"v" * 100
    for round_ in range(2):
        for start in range(0, keys, per_append):
            n = min(per_append, keys - start)
            batch = payload_batch([round_] * n, [b"key-%012d" % i for i in range(start, start + n)], [value] * n)
            log.append([(batch, BatchMeta())], durable=False)
    log.append([(payload_batch([2], [b"tail"], [value]), BatchMeta())], durable=False)
    log.merge_segments()


def run(url: str, limit: int) -> tuple[int, float, float]:
    root = LogRoot(url)
    root.dedupe_buffer_size = limit
    log = root.partition("t", 0)
    passes = 0
    tracemalloc.start()
    started = time.perf_counter()
    while log.compact(force=True):
        passes += 1
    seconds = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return passes, peak / MIB, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--per-append", type=int, default=20_000)
    parser.add_argument("--limits", default="0.25,1,4,128", help="limits in MiB, comma-separated")
    args = parser.parse_args()
    pa.set_memory_pool(pa.system_memory_pool())  # Arrow buffers through malloc, which tracemalloc does not see
    work = Path(tempfile.mkdtemp(prefix="plog-bench-compaction-"))
    try:
        source = work / "source"
        build(str(source), args.keys, args.per_append)
        data_mb = sum(p.stat().st_size for p in source.rglob("*.arrow")) / MIB
        print(f"{args.keys:,} keys x 2 writes, {data_mb:.1f} MiB stored, segment.bytes 4 MiB")
        print(f"{'keys':>10} {'limit MiB':>10} {'map keys':>10} {'passes':>7} {'peak MB':>8} {'seconds':>8}")
        for limit_mib in (float(x) for x in args.limits.split(",")):
            copy = work / f"run-{limit_mib}"
            shutil.copytree(source, copy)
            limit = int(limit_mib * MIB)
            passes, peak, seconds = run(str(copy), limit)
            print(f"{args.keys:>10,} {limit_mib:>10g} {limit // 24:>10,} {passes:>7} {peak:>8.1f} {seconds:>8.1f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
