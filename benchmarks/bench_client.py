"""Client throughput benchmark: Producer.send / send_batch, Consumer.poll / poll_arrow on a local directory.

Usage::

    python benchmarks/bench_client.py [--records N] [--dir DIR] [--quick] [--repeat K]

Every figure is measured in the same run, next to a reference for the machine:

* writes are compared with ``dd if=/dev/zero of=FILE bs=1M count=<dd-mb> conv=fdatasync``
  (sequential write to the same filesystem, flushed to disk; the best of three runs);
* reads are compared with ``dd if=FILE of=/dev/null bs=1M`` of that same file
  right after it was written, i.e. from a warm page cache -- the state the
  segment objects are in when ``poll`` reads them back.

MB/s always counts the user's value bytes (10**6 bytes per MB), not the
compressed bytes that reach the disk, so "ratio" is "how fast plog moves user
data compared with the raw disk / page cache". The stored (lz4) size ratio and
the single-core lz4 speed of this CPU are printed under the table.

Values are JSON-like text, unique per record: a timestamp, a random id, a user,
an event, a country, then a message of words drawn from a 209-word vocabulary
filling the record to exactly 100 or 1024 bytes. That is
semi-compressible (lz4 gets 2-2.7x on it), unlike ``os.urandom`` (which lz4
cannot compress at all) or a constant (which it compresses absurdly well).

Topics have one partition and records have no key, so every row measures one
partition's path end to end without partitioner fan-out. Before the timed rows a
small warm-up runs every operation once (one-time costs such as pyarrow's lazy
import of pandas); ``os.sync()`` runs before every write row and every dd, so no
row pays for the previous one's dirty pages.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import gc
import json
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from pyspark_logsource import Consumer, LogStore, Producer, TopicPartition
from pyspark_logsource.client.producer import PRODUCER_DEFAULTS

# --------------------------------------------------------------------------- data

_WORD_TEXT = """
alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau
upsilon phi chi psi omega order cart item price total user session click view page search result
query filter sort basket checkout payment card refund shipping address city country region zone
store warehouse stock level product category brand model color size weight height width depth
material quantity discount coupon tax invoice receipt customer account login logout signup profile
settings privacy notice banner campaign email push sms open bounce unsubscribe device mobile desktop
tablet browser chrome firefox safari edge android ios linux windows macos version build release
debug info warn error fatal trace span parent child request response status latency retry timeout
backoff queue topic partition offset commit lag consumer producer broker replica leader follower
segment index batch record header key value schema field type string int long double boolean array
map struct null true false start stop pause resume create update delete read write list scan get put
head post patch ok created accepted moved found bad unauthorized forbidden missing conflict gone
invalid throttled unavailable internal gateway red green blue yellow black white small medium large
extra north south east west spring summer autumn winter monday tuesday wednesday thursday friday
"""
_WORDS = _WORD_TEXT.split()
_EVENTS = ["page_view", "click", "add_to_cart", "purchase", "search", "login", "logout", "scroll", "share", "rate"]
_COUNTRIES = ["DE", "FR", "US", "GB", "NL", "ES", "IT", "PL", "SE", "JP", "BR", "IN", "CA", "AU", "CH", "AT"]


def make_values(n: int, size: int, seed: int = 1) -> list[bytes]:
    """``n`` unique JSON-ish records of exactly ``size`` bytes (semi-compressible text)."""
    rng = random.Random(seed)
    np_rng = np.random.default_rng(seed)
    # A long random text of vocabulary words; each record takes a slice at a random place.
    text = " ".join(rng.choice(_WORDS) for _ in range(max(20_000, 2 * size)))
    span = len(text) - size
    starts = np_rng.integers(0, span, n).tolist()
    ids = np_rng.integers(0, 10**9, n).tolist()
    users = np_rng.integers(0, 10**6, n).tolist()
    events = np_rng.integers(0, len(_EVENTS), n).tolist()
    countries = np_rng.integers(0, len(_COUNTRIES), n).tolist()
    base_ts = 1_715_000_000_000
    out = []
    for i in range(n):
        head = (
            f'{{"ts":{base_ts + i},"id":{ids[i]},"user":"u{users[i]}","event":"{_EVENTS[events[i]]}",'
            f'"cc":"{_COUNTRIES[countries[i]]}","msg":"'
        )
        fill = size - len(head) - 2
        s = starts[i]
        record = head + text[s : s + fill] + '"}' if fill > 0 else (head[: size - 2] + '"}')
        out.append(record.encode())
    return out


# --------------------------------------------------------------------------- machine


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (or what platform knows)."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


_DD_SUMMARY = re.compile(r"(\d+) bytes .*? copied, ([\d.,]+) s")


def _run_dd(args: list[str]) -> tuple[int, float]:
    """Run dd; return (bytes, seconds) parsed from its summary line (LC_ALL=C)."""
    proc = subprocess.run(["dd", *args], capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"})
    if proc.returncode != 0:
        raise RuntimeError(f"dd {' '.join(args)} failed: {proc.stderr.strip()}")
    m = _DD_SUMMARY.search(proc.stderr)
    if not m:
        raise RuntimeError(f"cannot parse dd output: {proc.stderr!r}")
    return int(m.group(1)), float(m.group(2).replace(",", "."))


def dd_reference(directory: str, megabytes: int) -> tuple[tuple[int, float], tuple[int, float]]:
    """dd write (fdatasync) and warm-cache read of ``megabytes`` MiB in ``directory``, as (bytes, seconds)."""
    path = os.path.join(directory, "dd-reference.bin")
    os.sync()
    try:
        write = _run_dd(["if=/dev/zero", f"of={path}", "bs=1M", f"count={megabytes}", "conv=fdatasync"])
        read = _run_dd([f"if={path}", "of=/dev/null", "bs=1M"])
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return write, read


def codec_ceiling(values: list[bytes]) -> tuple[float, float, float]:
    """Single-thread Arrow lz4 (frame) compress and decompress MB/s, and size ratio, on ``values``.

    The values are cut into 1 MiB chunks; the best of three passes is kept, so
    memory is already mapped. It is the codec's speed on one core of this CPU:
    no client compresses or decompresses faster than this per core.
    """
    data = pa.array(values, pa.binary()).buffers()[2]
    step = 1 << 20
    chunks = [data.slice(i, min(step, data.size - i)) for i in range(0, data.size, step)]
    codec = pa.Codec("lz4")
    best_c = best_d = float("inf")
    compressed: list[pa.Buffer] = []
    for _ in range(3):
        t0 = time.perf_counter()
        compressed = [codec.compress(c) for c in chunks]
        best_c = min(best_c, time.perf_counter() - t0)
    for _ in range(3):
        t0 = time.perf_counter()
        for c, z in zip(chunks, compressed, strict=True):
            codec.decompress(z, decompressed_size=c.size)
        best_d = min(best_d, time.perf_counter() - t0)
    return data.size / best_c / 1e6, data.size / best_d / 1e6, data.size / sum(z.size for z in compressed)


# --------------------------------------------------------------------------- rows


@dataclass
class Row:
    """One line of the table."""

    operation: str
    value_size: str
    compression: str
    acks: str
    records: int
    seconds: float
    value_bytes: int
    kind: str  # "write" | "read" | "ref-write" | "ref-read"
    stored_bytes: int = 0

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds else float("inf")

    @property
    def mbps(self) -> float:
        return self.value_bytes / self.seconds / 1e6 if self.seconds else float("inf")


def _dir_bytes(path: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(dirpath, name))
    return total


def bench_send(root: str, topic: str, values: list[bytes], acks: int | str) -> float:
    """Seconds to ``send`` every value one by one and ``flush``."""
    with Producer(root, acks=acks, compression_type="lz4") as producer:
        send = producer.send
        gc.collect()
        t0 = time.perf_counter()
        for v in values:
            send(topic, v)
        producer.flush()
        return time.perf_counter() - t0


def bench_send_batch(root: str, topic: str, table: pa.Table, acks: int | str) -> float:
    """Seconds for one ``send_batch`` of the whole table."""
    with Producer(root, acks=acks, compression_type="lz4") as producer:
        gc.collect()
        t0 = time.perf_counter()
        result = producer.send_batch(topic, table)
        elapsed = time.perf_counter() - t0
    assert result.record_count == table.num_rows, result
    return elapsed


def _timed_read(root: str, topic: str, expected: int, max_records: int, read: Callable[[Consumer], int]) -> float:
    """Seconds for ``read(consumer)`` (records it returned) to bring back ``expected`` records from the beginning."""
    with Consumer(root, auto_offset_reset="earliest", max_poll_records=max_records) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        consumer.seek_to_beginning()
        gc.collect()
        got = 0
        t0 = time.perf_counter()
        while got < expected:
            got += read(consumer)
        elapsed = time.perf_counter() - t0
    assert got == expected, (got, expected)
    return elapsed


def bench_poll(root: str, topic: str, expected: int, max_records: int) -> float:
    """Seconds to ``poll`` the topic from the beginning until ``expected`` records came back."""
    return _timed_read(
        root, topic, expected, max_records, lambda consumer: sum(len(records) for records in consumer.poll().values())
    )


def bench_poll_arrow(root: str, topic: str, expected: int, max_records: int) -> float:
    """Seconds to ``poll_arrow`` the topic from the beginning until ``expected`` records came back."""
    return _timed_read(root, topic, expected, max_records, lambda consumer: consumer.poll_arrow().num_rows)


def warm_up(root: str, admin: LogStore) -> None:
    """Run every operation once on a small topic, so one-time costs stay out of the timed rows."""
    admin.create_topic("warm-up", 1, {"compression.type": "lz4"})
    values = make_values(2_000, 100, seed=99)
    bench_send(root, "warm-up", values, 1)
    bench_send_batch(root, "warm-up", pa.table({"value": pa.array(values, pa.binary())}), 1)
    bench_poll(root, "warm-up", 4_000, 500)
    bench_poll_arrow(root, "warm-up", 4_000, 100_000)


# --------------------------------------------------------------------------- output

HEADERS = [
    "operation",
    "value size",
    "compression",
    "acks",
    "records",
    "seconds",
    "records/s",
    "MB/s",
    "ratio-to-reference",
]
RIGHT = {4, 5, 6, 7, 8}


def _table_cells(rows: list[Row], ref_write: Row, ref_read: Row) -> list[list[str]]:
    cells = []
    for r in rows:
        if r.kind.startswith("ref"):
            ratio = "1.00 (reference)"
        else:
            ref = ref_write if r.kind == "write" else ref_read
            ratio = f"{r.mbps / ref.mbps:.2f}"
        cells.append(
            [
                r.operation,
                r.value_size,
                r.compression,
                r.acks,
                f"{r.records:,}" if r.records else "-",
                f"{r.seconds:.3f}",
                f"{r.rate:,.0f}" if r.records else "-",
                f"{r.mbps:,.1f}",
                ratio,
            ]
        )
    return cells


def print_table(cells: list[list[str]], caption: str) -> None:
    """A rich table if rich is installed, else plain columns."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover - rich is a dependency, but stay usable without it
        widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(HEADERS)]
        print("  ".join(h.ljust(w) for h, w in zip(HEADERS, widths, strict=True)))
        for c in cells:
            print(
                "  ".join(
                    (v.rjust(w) if i in RIGHT else v.ljust(w)) for i, (v, w) in enumerate(zip(c, widths, strict=True))
                )
            )
        print(caption)
        return
    table = Table(title="plog client throughput", caption=caption, caption_justify="left")
    for i, h in enumerate(HEADERS):
        table.add_column(h, justify="right" if i in RIGHT else "left")
    for c in cells:
        table.add_row(*c)
    Console(width=max(160, shutil.get_terminal_size().columns)).print(table)


def markdown(cells: list[list[str]]) -> str:
    """The table as GitHub markdown."""
    lines = [
        "| " + " | ".join(HEADERS) + " |",
        "|" + "|".join("---:" if i in RIGHT else "---" for i in range(len(HEADERS))) + "|",
    ]
    lines += ["| " + " | ".join(c) + " |" for c in cells]
    return "\n".join(lines)


#: The issue's targets: (operation, value size, acks, what, threshold).
TARGETS = [
    ("send", "100 B", "1", "records/s", 1.5e6),
    ("send_batch", "100 B", "1", "records/s", 10e6),
    ("poll", "100 B", "-", "records/s", 2e6),
    ("poll_arrow", "100 B", "-", "records/s", 20e6),
    ("send_batch", "1 KB", "all", "dd ratio", 0.80),
]


def print_targets(rows: list[Row], ref_write: Row) -> None:
    print("Targets (benchmark targets from the issue):")
    by_key = {(r.operation.split(" ")[0], r.value_size, r.acks): r for r in rows}
    for op, size, acks, what, threshold in TARGETS:
        r = by_key.get((op, size, acks))
        if r is None:
            continue
        label = f"  {op:<11} {size:>5} acks={acks:<3}"
        if what == "records/s":
            verdict = "met" if r.rate >= threshold else "MISSED"
            print(f"{label} {r.rate:>14,.0f} records/s  target >= {threshold:>12,.0f}  {verdict}")
        else:
            ratio = r.mbps / ref_write.mbps
            verdict = "met" if ratio >= threshold else "MISSED"
            print(f"{label} {ratio:>14.2f} x dd write   target >= {threshold:>12.2f}  {verdict}")


# --------------------------------------------------------------------------- hot paths against same-run references
#
# Each group of rows runs in a fresh process, so that no row inherits the memory state an earlier one left
# (Arrow's memory pool, the heap): poll_arrow read in the process that had just written 2 M records swung
# between 0.38x and 0.58x. Within a group, a plog row and its references run in turn, round after round,
# and a row's ratio is the median of its per-round ratios: a drift of the machine's speed touches both alike.

HOT_GROUPS = ("floor", "send", "send(partition=0)", "send_batch", "poll_arrow")
#: The topic the send_batch group writes and the poll_arrow group reads, and the reference file beside it.
HOT_TOPIC, HOT_REFERENCE = "hot-batch", "reference.arrow"


@dataclass
class HotPath:
    """One row of the hot-path table: plog's rate and CPU per record next to a reference run alike.

    ``rate``, ``cpu_ns`` and ``reference_rate`` are medians over the rounds; ``ratio`` is the median of
    the per-round ratios, ``low`` and ``high`` their extremes."""

    path: str
    rate: float
    cpu_ns: float
    reference: str
    reference_rate: float
    target: float
    ratio: float = float("nan")
    low: float = float("nan")
    high: float = float("nan")


def _timed(fn: Callable[[], Any]) -> tuple[float, float]:
    """(wall s, CPU s of this process, all threads) of ``fn()``."""
    gc.collect()
    cpu0, t0 = time.process_time(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, time.process_time() - cpu0


def _rounds(runs: int, fns: list[Callable[[], Any] | None]) -> list[list[tuple[float, float]]]:
    """Every one of ``fns`` (None: skipped) timed once per round, in turn, for ``runs`` rounds, after a
    round that is not counted (a fresh process's first touches of memory fall on whichever runs first)."""
    for fn in fns:
        if fn is not None:
            fn()
    out: list[list[tuple[float, float]]] = [[] for _ in fns]
    for _ in range(runs):
        for timings, fn in zip(out, fns, strict=True):
            if fn is not None:
                timings.append(_timed(fn))
    return out


def _median(xs: list[float]) -> float:
    return float(np.median(xs)) if xs else float("nan")


def _paired_row(
    path: str,
    n: int,
    mine: list[tuple[float, float]],
    reference: str,
    theirs: list[tuple[float, float]],
    target: float,
) -> HotPath:
    """A row from the rounds of plog (``mine``) and of its reference (``theirs``; empty: not installed)."""
    rate = n / _median([w for w, _ in mine])
    cpu_ns = _median([c for _, c in mine]) / n * 1e9
    if not theirs:
        return HotPath(path, rate, cpu_ns, reference, 0.0, target)
    ratios = [their_wall / my_wall for (my_wall, _), (their_wall, _) in zip(mine, theirs, strict=True)]
    reference_rate = n / _median([w for w, _ in theirs])
    return HotPath(path, rate, cpu_ns, reference, reference_rate, target, _median(ratios), min(ratios), max(ratios))


def confluent_produce(values: list[bytes], partition: int | None, callbacks: bool) -> Callable[[], None] | None:
    """A run of confluent-kafka's ``produce()`` of every value into librdkafka's mock broker, then
    ``flush()`` (lz4, as plog's rows); with ``callbacks``, one delivery callback per record, which is what
    plog's per-record futures give. None when confluent-kafka is not installed (``pip install .[bench]``)."""
    try:
        import confluent_kafka
    except ImportError:
        return None
    producer = confluent_kafka.Producer(
        {"test.mock.num.brokers": 1, "compression.type": "lz4", "log_level": 0, "logger": lambda *a: None}
    )
    producer.produce("bench", b"warm-up")
    producer.flush()
    delivered = [0]

    def on_delivery(err: Any, msg: Any) -> None:
        delivered[0] += 1

    options: dict[str, Any] = {} if partition is None else {"partition": partition}
    if callbacks:
        options["on_delivery"] = on_delivery

    def run() -> None:
        produce, poll = producer.produce, producer.poll
        for value in values:
            while True:
                try:
                    produce("bench", value, **options)
                    break
                except BufferError:  # its queue is full: serve deliveries, as its documentation says
                    poll(0.001)
        producer.flush()

    return run


def ipc_write(table: pa.Table, path: str, rows_per_batch: int) -> Callable[[], None]:
    """A run writing ``table`` as an Arrow IPC file, lz4, in batches of ``rows_per_batch``, one thread."""
    options = pa.ipc.IpcWriteOptions(compression="lz4", use_threads=False)
    tries = iter(range(1_000_000))

    def run() -> None:  # a new file each time, as plog's appends create new objects (fresh page-cache pages)
        target = f"{path}.{next(tries)}"
        with pa.OSFile(target, "wb") as sink, pa.ipc.new_file(sink, table.schema, options=options) as writer:
            for batch in table.to_batches(max_chunksize=rows_per_batch):
                writer.write_batch(batch)
        os.replace(target, path)

    return run


def ipc_read(path: str) -> Callable[[], None]:
    """A run reading an Arrow IPC file back whole (decompressing it), from the page cache, one thread."""
    options = pa.ipc.IpcReadOptions(use_threads=False)

    def run() -> None:
        with pa.OSFile(path, "rb") as source:
            pa.ipc.open_file(source, options=options).read_all()

    return run


class _Future:
    __slots__ = ("buffer", "index")

    def __init__(self, buffer: list[bytes], index: int) -> None:
        self.buffer, self.index = buffer, index


class _FloorProducer:
    """The least a Python ``send`` with Kafka's contract does per record: a method call, a lock (a
    background thread writes), an append, and a new future object; nothing else."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.values: list[bytes] = []

    def send(self, topic: str, value: bytes, key: bytes | None = None, partition: int | None = None) -> _Future:
        with self.lock:
            self.values.append(value)
            return _Future(self.values, len(self.values) - 1)


def python_floor(values: list[bytes]) -> Callable[[], None]:
    """A run of ``_FloorProducer.send`` of every value: what no Python producer API can beat here."""

    def run() -> None:
        send = _FloorProducer().send
        for value in values:
            send("bench", value)

    return run


def segments_read(paths: list[Path]) -> Callable[[], None]:
    """A run reading the record batches of plog segment files as plain Arrow IPC streams, one thread:
    the same stored messages ``poll_arrow`` decodes (offsets, timestamps, keys, values, headers), without
    plog's reader (index, CRC, checks, positions)."""
    options = pa.ipc.IpcReadOptions(use_threads=False)

    def run() -> None:
        for path in paths:
            with pa.OSFile(str(path), "rb") as source:
                for _batch in pa.ipc.open_stream(source, options=options):  # stops at the end-of-stream mark
                    pass

    return run


def hot_path_group(group: str, workdir: str, values: list[bytes], runs: int) -> list[HotPath]:
    """The rows of one group (``HOT_GROUPS``), each plog path next to the reference issue 13 names, on
    one partition. Producers use ``acks=1`` (written, not fsynced), as the references do not sync either.
    The send_batch group leaves its topic and the reference file for the poll_arrow group."""
    root = os.path.join(workdir, "hot")
    admin = LogStore(root)
    table = pa.table({"value": pa.array(values, pa.binary())})
    counter = iter(range(1_000_000))

    def topic() -> str:
        name = f"hot-{group.replace('(', '-').replace(')', '').replace('=', '')}-{os.getpid()}-{next(counter)}"
        admin.create_topic(name, 1, {"compression.type": "lz4"})
        return name

    warm = topic()  # one-time costs (pyarrow imports pandas on its first conversion) stay out of the rows
    with Producer(root, compression_type="lz4", acks=1) as producer:
        for v in values[:20_000]:
            producer.send(warm, v)
        producer.send_batch(warm, table.slice(0, 20_000))
    try:
        return _group_rows(group, root, admin, workdir, values, table, topic, runs)
    finally:
        admin.close()


def _group_rows(
    group: str,
    root: str,
    admin: LogStore,
    workdir: str,
    values: list[bytes],
    table: pa.Table,
    topic: Callable[[], str],
    runs: int,
) -> list[HotPath]:
    n = len(values)
    if group == "floor":
        (floor,) = _rounds(runs, [python_floor(values)])
        rate = n / min(w for w, _ in floor)  # a bound, not a comparison: its best round
        return [HotPath("(the Python floor: lock, append, future; no write)", rate, 0.0, "-", 0.0, 1.5)]
    if group in ("send", "send(partition=0)"):
        partition = None if group == "send" else 0

        def sends() -> None:
            name = topic()
            with Producer(root, compression_type="lz4", acks=1) as producer:
                send = producer.send
                if partition is None:
                    for v in values:
                        send(name, v)
                else:
                    for v in values:
                        send(name, v, partition=partition)
                producer.flush()

        with_cb, without_cb = confluent_produce(values, partition, True), confluent_produce(values, partition, False)
        mine, theirs_cb, theirs = _rounds(runs, [sends, with_cb, without_cb])
        produce = "confluent-kafka produce" + ("" if partition is None else "(partition=0)")
        label = f"{group} + flush"
        return [
            _paired_row(label, n, mine, f"{produce}, delivery callback per record, mock broker", theirs_cb, 1.5),
            _paired_row(label, n, mine, f"{produce}, no callback, mock broker", theirs, 1.5),
        ]
    if group == "send_batch":
        written: list[str] = []

        def send_batch() -> None:
            written.append(topic())
            with Producer(root, compression_type="lz4", acks=1) as producer:
                producer.send_batch(written[-1], table)

        rows_per_stored_batch = max(1, PRODUCER_DEFAULTS["batch_size"] // (table.nbytes // n))
        reference = os.path.join(workdir, HOT_REFERENCE)
        mine, theirs = _rounds(runs, [send_batch, ipc_write(table, reference, rows_per_stored_batch)])
        admin.create_topic(HOT_TOPIC, 1, {"compression.type": "lz4"})
        with Producer(root, compression_type="lz4", acks=1) as producer:  # what the poll_arrow group reads
            producer.send_batch(HOT_TOPIC, table)
        label = f"Arrow IPC file write, lz4, one thread, batches of {rows_per_stored_batch:,} rows"
        return [_paired_row("send_batch", n, mine, label, theirs, 0.9)]
    if group == "poll_arrow":

        def poll_arrow() -> None:
            with Consumer(root, auto_offset_reset="earliest") as consumer:
                consumer.assign([TopicPartition(HOT_TOPIC, 0)])
                got = 0
                while got < n:
                    got += consumer.poll_arrow().num_rows  # default arguments

        segments = sorted(Path(root, "topics").glob(f"{HOT_TOPIC}/**/*.arrow"))
        reference = os.path.join(workdir, HOT_REFERENCE)
        mine, theirs_file, theirs_segments = _rounds(runs, [poll_arrow, ipc_read(reference), segments_read(segments)])
        label = "poll_arrow() (default arguments)"
        return [
            _paired_row(
                label, n, mine, "Arrow IPC file read of the same values, lz4, page cache, one thread", theirs_file, 0.5
            ),
            _paired_row(
                label,
                n,
                mine,
                "Arrow IPC stream read of plog's own segment files (all their columns), one thread",
                theirs_segments,
                0.5,
            ),
        ]
    raise ValueError(f"unknown hot-path group {group!r}")


def hot_paths(workdir: str, n: int, runs: int) -> list[HotPath]:
    """Every hot-path row, each group in a fresh process of this script (``--hot-path-group``)."""
    rows: list[HotPath] = []
    for group in HOT_GROUPS:
        print(f"hot paths: {group} ({runs} rounds, a fresh process) ...", flush=True)
        command = [sys.executable, os.path.abspath(__file__), "--hot-path-group", group]
        command += ["--dir", workdir, "--records", str(n), "--repeat", str(runs)]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        rows += [HotPath(**row) for row in json.loads(out.strip().splitlines()[-1])]
    return rows


def print_hot_paths(rows: list[HotPath]) -> None:
    """The hot-path table, markdown."""
    print(
        "| path | records/s | CPU ns/record | reference, same rounds | reference records/s | ratio (median) "
        "| rounds' range | target |"
    )
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    for r in rows:
        if r.reference == "-":  # the floor row: a figure to compare the send rows with, no reference of its own
            print(f"| {r.path} | {r.rate:,.0f} | - | - | - | - | - | - |")
            continue
        reference_rate = f"{r.reference_rate:,.0f}" if r.reference_rate else "not installed"
        ratio = f"{r.ratio:.2f}x" if r.reference_rate else "-"
        spread = f"{r.low:.2f}-{r.high:.2f}x" if r.reference_rate else "-"
        print(
            f"| {r.path} | {r.rate:,.0f} | {r.cpu_ns:,.0f} | {r.reference} | {reference_rate} | {ratio} | {spread} | "
            f"≥ {r.target:g}x |"
        )


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--records",
        type=int,
        default=None,
        help="records per 100-byte row (default 2,000,000; 1 KB rows use a fifth of it)",
    )
    parser.add_argument("--dir", default=None, help="directory to work in (default: a new one under /tmp)")
    parser.add_argument("--quick", action="store_true", help="a fast smoke run (100k records, 128 MiB dd)")
    parser.add_argument("--dd-mb", type=int, default=None, help="MiB written by the dd reference (default 1024)")
    parser.add_argument("--repeat", type=int, default=1, help="run every row this many times, keep the fastest")
    parser.add_argument(
        "--poll-max-records",
        type=int,
        default=500,
        help="max_poll_records of the poll consumers (default 500, Kafka's default)",
    )
    parser.add_argument(
        "--poll-arrow-max-records",
        type=int,
        default=100_000,
        help="max_poll_records of the poll_arrow consumers (default 100,000)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the data directory afterwards")
    parser.add_argument(
        "--hot-paths-only",
        action="store_true",
        help="only the hot-path table (send, send_batch, poll_arrow against same-run references)",
    )
    parser.add_argument("--hot-path-group", choices=HOT_GROUPS, help=argparse.SUPPRESS)  # hot_paths' child
    args = parser.parse_args(argv)

    if args.hot_path_group:  # one group of hot-path rows, in this fresh process; JSON on the last line
        values = make_values(args.records, 100, seed=1)
        group_rows = hot_path_group(args.hot_path_group, args.dir, values, max(1, args.repeat))
        print(json.dumps([dataclasses.asdict(r) for r in group_rows]))
        return 0

    n_small = args.records or (100_000 if args.quick else 2_000_000)
    n_large = max(1, n_small // 5)
    dd_mb = args.dd_mb or (128 if args.quick else 1024)
    repeat = max(1, args.repeat)
    poll_max, arrow_max = args.poll_max_records, args.poll_arrow_max_records

    base = args.dir or "/tmp"
    os.makedirs(base, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="plog-bench-", dir=base)
    root = os.path.join(workdir, "root")

    print(f"date      {_dt.datetime.now().astimezone().isoformat(timespec='seconds')}")
    print(f"cpu       {cpu_model()}  ({os.cpu_count()} cores)")
    print(
        f"python    {platform.python_version()} ({platform.python_implementation()})  "
        f"pyarrow {pa.__version__}  numpy {np.__version__}"
    )
    print(f"platform  {platform.platform()}")
    with contextlib.suppress(OSError):
        print(f"load      {' '.join(f'{x:.2f}' for x in os.getloadavg())} (1/5/15 min, at the start)")
    print(f"directory {workdir}")
    print(f"records   {n_small:,} at 100 B, {n_large:,} at 1 KB; best of {repeat} run(s) per row")
    print()

    if args.hot_paths_only:
        try:
            print_hot_paths(hot_paths(workdir, n_small, repeat))
        finally:
            if not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)
        return 0

    rows: list[Row] = []
    hot: list[HotPath] = []
    try:
        dd_runs = max(3, repeat)
        print(f"dd reference: {dd_runs} x {dd_mb} MiB ...", flush=True)
        refs = [dd_reference(workdir, dd_mb) for _ in range(dd_runs)]
        writes = sorted((w for w, _ in refs), key=lambda x: x[1])
        reads = sorted((r for _, r in refs), key=lambda x: x[1])
        ref_write = Row(
            "dd write (conv=fdatasync)",
            "1 MiB blocks",
            "-",
            "-",
            0,
            writes[0][1],
            writes[0][0],
            "ref-write",
            writes[0][0],
        )
        ref_read = Row("dd read (warm page cache)", "1 MiB blocks", "-", "-", 0, reads[0][1], reads[0][0], "ref-read")
        dd_spread = ", ".join(f"{b / s / 1e6:,.0f}" for b, s in writes)
        rows += [ref_write, ref_read]

        print("generating values ...", flush=True)
        data = {"100 B": make_values(n_small, 100, seed=1), "1 KB": make_values(n_large, 1024, seed=2)}
        tables = {size: pa.table({"value": pa.array(vals, pa.binary())}) for size, vals in data.items()}
        ceiling = codec_ceiling(data["100 B"][:200_000])

        admin = LogStore(root)
        print("warm-up ...", flush=True)
        warm_up(root, admin)
        counter = iter(range(1_000_000))

        def new_topic(operation: str, size: str, acks: int | str) -> str:
            name = f"{operation.split(' ')[0].replace('_', '-')}-{size.replace(' ', '').lower()}-{acks}"
            name = f"{name}-{next(counter)}"
            admin.create_topic(name, 1, {"compression.type": "lz4"})
            return name

        def write_row(operation: str, size: str, acks: int | str, fn: Callable[..., float]) -> str:
            values = data[size]
            best, kept = float("inf"), ""
            for _ in range(repeat):
                topic = new_topic(operation, size, acks)
                os.sync()
                secs = fn(root, topic, values if operation.startswith("send +") else tables[size], acks)
                if secs < best:
                    best, kept = secs, topic
            stored = _dir_bytes(os.path.join(root, "topics", kept))
            rows.append(
                Row(operation, size, "lz4", str(acks), len(values), best, sum(map(len, values)), "write", stored)
            )
            return kept

        def read_row(operation: str, size: str, topic: str, fn: Callable[..., float], max_records: int) -> None:
            values = data[size]
            best = min(fn(root, topic, len(values), max_records) for _ in range(repeat))
            rows.append(Row(operation, size, "lz4", "-", len(values), best, sum(map(len, values)), "read"))

        read_topic: dict[str, str] = {}
        for size in data:
            print(f"send {size} ...", flush=True)
            write_row("send + flush", size, 1, bench_send)
            print(f"send_batch {size} ...", flush=True)
            read_topic[size] = write_row("send_batch", size, 1, bench_send_batch)
        print("send_batch 1 KB acks=all ...", flush=True)
        write_row("send_batch", "1 KB", "all", bench_send_batch)
        for size in data:
            print(f"poll {size} ...", flush=True)
            read_row("poll", size, read_topic[size], bench_poll, poll_max)
        for size in data:
            print(f"poll_arrow {size} ...", flush=True)
            read_row("poll_arrow", size, read_topic[size], bench_poll_arrow, arrow_max)
        admin.close()
        print("hot paths against same-run references ...", flush=True)
        hot = hot_paths(workdir, n_small, repeat)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    cells = _table_cells(rows, ref_write, ref_read)
    ratios = [
        f"{r.operation} {r.value_size} acks={r.acks}: {r.value_bytes / r.stored_bytes:.2f}x"
        for r in rows
        if r.kind == "write" and r.stored_bytes
    ]
    caption = (
        "Values: unique JSON-like text records (timestamp, random id, user, event, country, then a message "
        f"of words from a {len(_WORDS)}-word vocabulary) of exactly 100 or 1024 bytes; no key; one partition;"
        " local directory.\n"
        "MB/s = user value bytes / s (1 MB = 10^6 B). Write rows are compared with the dd write row "
        f"(dd if=/dev/zero bs=1M count={dd_mb} conv=fdatasync, best of {dd_runs}: {dd_spread} MB/s), read "
        "rows with the dd read row (dd of=/dev/null of that file, from the warm page cache, where poll finds "
        "the segment objects too).\n"
        f"send: Producer.send per record, timed up to flush(). poll: max_poll_records={poll_max:,}; "
        f"poll_arrow: max_poll_records={arrow_max:,}. Best of {repeat} run(s) per row.\n"
        f"lz4 on one core of this CPU (Arrow codec, 1 MiB chunks of the 100 B values): compress "
        f"{ceiling[0]:,.0f} MB/s, decompress {ceiling[1]:,.0f} MB/s, {ceiling[2]:.2f}x.\n"
        "Stored size ratio (value bytes / bytes on disk): " + "; ".join(ratios)
    )
    print()
    print_table(cells, caption)
    print()
    print_targets(rows, ref_write)
    print()
    print("Markdown:")
    print()
    print(markdown(cells))
    print()
    print(caption.replace("\n", "  \n"))
    print()
    print(f"Hot paths against same-round references (100 B values, one partition, lz4; {repeat} rounds):")
    print()
    print_hot_paths(hot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
