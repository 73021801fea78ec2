"""A simulated year and a wide root: does any object namespace or any restart cost grow with history or width?

    python benchmarks/bench_long_run.py [--scale S] [--only year|wide] [--dir DIR] [--idle-seconds S]

**A. A simulated year** on a local directory (``--dir``, default a new directory under ``/dev/shm`` when there is
one: a tmpfs, so that a year of small objects takes minutes, not hours). ``--scale 1`` is the full year:

* 200,000 transactions of one transactional ``Producer`` (``send`` of 2 records to topic ``events``, commit);
* 200,000 micro-batches of the Spark sink, driven at its own entry points without Spark: ``PlogStreamWriter.write``
  (the executor's task: its producer-id lookup, decision check, tail hints, transactional appends) and
  ``PlogStreamWriter.commit`` (the driver: the decision with ``txn`` = batch id, its notices, its maintenance),
  with ``pyspark.TaskContext.get`` patched to hand ``write`` the batch id, query id and run id Spark would;
* 5,000 rebalances of consumer group ``year-group`` (real ``Consumer`` members: one joins, a second joins,
  the second leaves, the first commits and leaves: three or more generations per cycle);
* 1,000 short-lived plain (idempotent) producers, one record each: one producer id allocated each;
* ``plog maintain`` (the CLI's ``main``, in this process) once a simulated day, and, once the project has it,
  ``coordinator.collection.collect`` once a simulated day (looked up at run time; absent today).

Everything else maintenance does is what the writers do by themselves on their normal paths (PROTOCOL.md 10.1).
The events are spread evenly over ``--days`` (365) simulated days: one tick (a transaction, a micro-batch, and
now and then a group cycle, a plain producer, a daily pass) every ``days * 86400 / ticks`` seconds (158 s at
``--scale 1``, 66 minutes at the default ``--scale 0.02``), so that every time-based setting (``file.delete.delay.ms``,
retention, transaction timeouts, maintenance intervals, any expiry a collection rule may state) passes as it
would in a year, whatever the scale.

The clock: between ticks, while nothing is in flight (no member alive, every send acknowledged), the benchmark
moves a simulated offset forward. **Patched in this process**: ``time.time``, ``time.time_ns`` and
``time.monotonic`` (the real value plus the offset), and ``pyspark_logsource.client.producer.time_ns`` (imported
by name there, for record timestamps). ``segment_format.records.now_ms`` reads ``time.time_ns``, so every
``created_ms``, lease expiry and delete delay follows the simulated clock. Threads blocked in C (locks,
``Event.wait``) still wait in real time, which only makes a wait end sooner in simulated time.

Requests are counted at the store interface: every store the code opens from the root's URL
(``segment_format.root.open_store`` and ``pyspark_logsource.client.metrics.open_store`` are patched) is wrapped
in a ``CountingStore`` (``segment_format/stores/counting.py``) that also adds to one process-wide tally. A
listing counts one LIST per 1,000 keys it returns (S3 pages a listing by 1,000; ``CountingStore`` itself
counts one per call). At 1%, 10%, 50% and 100% of the year the simulation pauses and the table gets a row:
objects per namespace, then the requests and milliseconds of each restart:

* ``init_txn``: ``init_transactions()`` of a new ``Producer`` with the same transactional id (which then
  carries on the year: a restart);
* ``plain``: a plain producer's first send (construction, producer-id allocation, one record, ``flush``);
* ``join``: a consumer's group join (``subscribe`` until it has its assignment);
* ``sink``: the sink's first micro-batch after a restart (fresh process state: the producer-id lookup, the
  decision walk, the tail hints, the write, the commit);
* ``last``: ``TransactionCoordinator.last_committed`` of the transactional producer's id.

**B. A wide root on moto** (``bench_requests.py``'s set-up: a moto S3 server behind a counting proxy): 500 topics
of 10 partitions (5,000 partitions), a record in each partition of 50 of them; requests counted by the proxy:

* an idle ``Consumer`` subscribed by pattern to all 500 topics: requests per second over ``--idle-seconds``
  (20), and how long a new record takes to come out of its ``poll``;
* a Spark query, ``readStream.format("plog")`` with ``subscribePattern`` over 100 topics (1,000 partitions) into
  the noop sink, trigger 1 s, on ``local[2]``: time to the end of the first micro-batch, requests per second
  idle (one trigger a second), and requests from a record's send to the end of the micro-batch reading it;
* ``plog topics list`` (the CLI's ``main``, in this process): requests and time;
* the notebook listings (``pyspark_logsource.views``: ``topics``, ``partitions``, ``segments`` and the root's
  card): requests and time.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import math
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from spark_common import machine  # also puts the project root on sys.path

from segment_format.stores.base import ObjectInfo, Store
from segment_format.stores.counting import CountingStore

DAY_S = 86_400
#: The full year (``--scale 1``): transactions, sink micro-batches, group rebalances, plain producers.
FULL_TICKS = 200_000
FULL_REBALANCES = 5_000
FULL_PLAIN_PRODUCERS = 1_000
#: Where the table gets a row, as fractions of the year.
CHECKPOINTS = (0.01, 0.1, 0.5, 1.0)
#: S3 answers a listing 1,000 keys a page: a LIST request each.
LIST_PAGE = 1000

TID = "year-producer"
GROUP = "year-group"
#: The group whose offsets the transactional producer commits with its transactions (consume-transform-produce).
TXN_GROUP = "year-txn-group"


# ---------------------------------------------------------------------------------------------- the clock


class SimClock:
    """The simulated clock: real time plus an offset that only moves forward (see the module docstring)."""

    def __init__(self) -> None:
        self.offset_s = 0.0
        self._real_time = time.time
        self._real_time_ns = time.time_ns
        self._real_monotonic = time.monotonic
        self._patched: list[tuple[Any, str, Any]] = []

    def install(self) -> None:
        """Patch ``time.time``, ``time.time_ns``, ``time.monotonic`` and the producer's ``time_ns``."""
        import pyspark_logsource.client.producer as producer_module

        def fake_time() -> float:
            return self._real_time() + self.offset_s

        def fake_time_ns() -> int:
            return self._real_time_ns() + int(self.offset_s * 1e9)

        def fake_monotonic() -> float:
            return self._real_monotonic() + self.offset_s

        for owner, name, value in (
            (time, "time", fake_time),
            (time, "time_ns", fake_time_ns),
            (time, "monotonic", fake_monotonic),
            (producer_module, "time_ns", fake_time_ns),
        ):
            self._patched.append((owner, name, getattr(owner, name)))
            setattr(owner, name, value)

    def uninstall(self) -> None:
        """Undo :meth:`install`."""
        for owner, name, value in reversed(self._patched):
            setattr(owner, name, value)
        self._patched.clear()

    def advance(self, seconds: float) -> None:
        """Move the simulated clock forward."""
        self.offset_s += seconds

    def real_monotonic(self) -> float:
        """The real monotonic clock, for wall times."""
        return self._real_monotonic()


# ---------------------------------------------------------------------------------------------- the tally


class Tally:
    """Requests by kind, process-wide, from every :class:`TallyStore`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    def add(self, kind: str, n: int) -> None:
        """Count ``n`` requests of ``kind``."""
        with self._lock:
            self.counts[kind] += n

    def total(self) -> int:
        """Every request so far."""
        with self._lock:
            return sum(self.counts.values())


TALLY = Tally()


class TallyStore(CountingStore):
    """A ``CountingStore`` that also adds to :data:`TALLY`, and counts a LIST per 1,000 keys listed."""

    def _count(self, kind: str, n: int = 1) -> None:
        super()._count(kind, n)
        TALLY.add(kind, n)

    def _pages(self, listed: Sequence[ObjectInfo]) -> None:
        extra = max(1, math.ceil(len(listed) / LIST_PAGE)) - 1
        if extra:
            self._count("LIST", extra)

    def list(self, prefix: str) -> list[ObjectInfo]:
        """``inner.list``: a LIST per 1,000 keys."""
        out = super().list(prefix)
        self._pages(out)
        return out

    def list_after(self, prefix: str, start_after: str) -> Sequence[ObjectInfo]:
        """``inner.list_after``: a LIST per 1,000 keys."""
        out = super().list_after(prefix, start_after)
        self._pages(out)
        return out


def install_tally() -> None:
    """Wrap every store opened from a URL in a :class:`TallyStore` (patches the two places that open them)."""
    import pyspark_logsource.client.metrics as metrics_module
    import segment_format.root as root_module
    from segment_format.stores import open_store

    def counted(url: str, storage_options: dict[str, Any] | None = None) -> Store:
        return TallyStore(open_store(url, storage_options))

    root_module.open_store = counted  # type: ignore[assignment]
    metrics_module.open_store = counted  # type: ignore[assignment]


@contextlib.contextmanager
def measured(out: dict[str, tuple[int, float]], name: str, clock: SimClock) -> Iterator[None]:
    """Count the requests and the wall milliseconds of the block into ``out[name]``."""
    before, started = TALLY.total(), clock.real_monotonic()
    yield
    out[name] = (TALLY.total() - before, (clock.real_monotonic() - started) * 1000)


# ---------------------------------------------------------------------------------------------- namespaces


def namespace_of(key: str) -> str:
    """The namespace a key belongs to, as the year's table shows it (unknown prefixes: their first two parts)."""
    parts = key.split("/")
    if key.startswith("_coordinator/transactions/"):
        return "txn .materialized" if key.endswith(".materialized") else "txn decisions"
    if key.startswith("_coordinator/transactional-ids/"):
        return "tid epochs" if len(parts) > 3 and parts[3] == "epochs" else "tid other"
    if key.startswith("_coordinator/producer-ids/"):
        return "producer-ids"
    if key.startswith("_coordinator/leases/"):
        return "leases"
    if key.startswith("groups/") and len(parts) > 3:
        return f"{parts[1]} {parts[2]}"
    if key.startswith("topics/") and len(parts) > 3:
        if parts[-1] == "notice.json" or "notice" in parts[-1]:
            return "topic notices"
        if len(parts) > 4 and parts[4] == "log":
            return "topic segments"
        if len(parts) > 4 and parts[4] == "start":
            return "topic start markers"
        if parts[2] == "meta":
            return "topic meta"
        return "topic other"
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def namespaces(store: Store) -> Counter[str]:
    """Objects per namespace, listed on the raw store (not counted)."""
    return Counter(namespace_of(info.key) for info in store.list(""))


# ---------------------------------------------------------------------------------------------- the year


class _FakeTaskContext:
    """What ``PlogStreamWriter.write`` reads of Spark's ``TaskContext``: the local properties Spark sets."""

    def __init__(self) -> None:
        self.properties: dict[str, str] = {}

    def getLocalProperty(self, key: str) -> str | None:  # noqa: N802 - Spark's name
        return self.properties.get(key)


@dataclass
class Checkpoint:
    """One row of the year's table."""

    fraction: float
    ticks: int
    sim_days: float
    wall_s: float
    tick_ms: float
    objects: Counter[str]
    costs: dict[str, tuple[int, float]] = field(default_factory=dict)


class Year:
    """The simulated year on one root (see the module docstring)."""

    def __init__(self, directory: str, scale: float, days: float, clock: SimClock) -> None:
        from pyspark_logsource import LogStore

        self.url = directory
        self.clock = clock
        self.ticks = max(100, int(FULL_TICKS * scale))
        self.cycles = max(4, int(FULL_REBALANCES * scale / 3))
        self.plain = max(4, int(FULL_PLAIN_PRODUCERS * scale))
        self.step_s = days * DAY_S / self.ticks
        from segment_format.stores import open_store

        self.store = open_store(directory)  # the raw store: namespaces are listed on it, uncounted
        with LogStore(self.url) as admin:
            admin.create_topic("events", 4)
            admin.create_topic("sink-out", 4)
            admin.create_topic("group-in", 4)
        self.producer = self._transactional()
        self.producer_restarts = 0
        self.batch = 0
        self.sink_run = uuid.uuid4().hex
        self.context = _FakeTaskContext()
        self._install_task_context()
        self.writer = self._sink_writer()
        self.collect = _collection()
        self.rows: list[Checkpoint] = []
        self.maintain_passes = 0
        self.collections = 0

    # ------------------------------------------------------------------ the writers

    def _transactional(self) -> Any:
        from pyspark_logsource import Producer

        producer = Producer(self.url, transactional_id=TID, linger_ms=0)
        producer.init_transactions()
        return producer

    def _install_task_context(self) -> None:
        import pyspark

        context = self.context
        pyspark.TaskContext.get = staticmethod(lambda: context)  # type: ignore[method-assign, assignment]

    def _sink_writer(self) -> Any:
        from pyspark.sql.types import BinaryType, StructField, StructType

        from pyspark_logsource.spark.sink import PlogStreamWriter

        schema = StructType([StructField("key", BinaryType()), StructField("value", BinaryType())])
        options = {"url": self.url, "topic": "sink-out", "transactionalId": "year-sink"}
        return PlogStreamWriter(options, schema)

    def _micro_batch(self) -> None:
        """One micro-batch of the sink: the task's write, then the driver's commit, as Spark calls them."""
        import pyarrow as pa

        from pyspark_logsource.spark.sink import BATCH_ID_PROPERTY, QUERY_ID_PROPERTY, RUN_ID_PROPERTY

        self.context.properties = {
            BATCH_ID_PROPERTY: str(self.batch),
            QUERY_ID_PROPERTY: "year-query",
            RUN_ID_PROPERTY: self.sink_run,
        }
        keys = pa.array([b"k%d" % (self.batch % 97), b"k%d" % (self.batch % 89)], pa.binary())
        values = pa.array([b"batch-%d" % self.batch] * 2, pa.binary())
        message = self.writer.write(iter([pa.record_batch([keys, values], names=["key", "value"])]))
        self.writer.commit([message], self.batch)
        self.batch += 1

    def _sink_restart(self) -> None:
        """Forget what a sink process keeps (a new driver and new Python workers): the next batch starts a run."""
        from pyspark_logsource.spark import sink_commit, task_writer, workers

        sink_commit._PRODUCER_IDS.clear()
        sink_commit._RUN_FIRST_BATCH.clear()
        task_writer._HINTS.clear()
        with workers._ROOTS_LOCK:
            workers._ROOTS.clear()
        self.sink_run = uuid.uuid4().hex
        self.writer = self._sink_writer()

    def _transaction(self, i: int) -> None:
        """Consume-transform-produce: two records and the input's offsets, committed together (11.2, 11.4)."""
        from pyspark_logsource import TopicPartition

        self.producer.begin_transaction()
        self.producer.send("events", b"value-%d" % i, key=b"key-%d" % (i % 1000))
        self.producer.send("events", b"other-%d" % i, key=b"key-%d" % ((i * 7) % 1000))
        self.producer.send_offsets_to_transaction({TopicPartition("group-in", i % 4): i + 1}, TXN_GROUP)
        self.producer.commit_transaction()

    def _plain_producer(self, i: int) -> None:
        from pyspark_logsource import Producer

        with Producer(self.url, linger_ms=0) as producer:
            producer.send("events", b"plain-%d" % i).get(timeout=60)

    def _member(self, name: str) -> Any:
        from pyspark_logsource import Consumer

        consumer = Consumer(
            self.url,
            group_id=GROUP,
            client_id=name,
            auto_offset_reset="latest",
            enable_auto_commit=False,
            heartbeat_interval_ms=10,
            session_timeout_ms=3000,
        )
        consumer.subscribe(["group-in"])
        return consumer

    @staticmethod
    def _poll_until(what: str, members: list[Any], done: Callable[[], bool], timeout_s: float = 60.0) -> None:
        deadline = time.perf_counter() + timeout_s
        while not done():
            if time.perf_counter() > deadline:
                raise RuntimeError(f"group {GROUP}: timed out waiting for {what}")
            for member in members:
                member.poll(timeout_ms=2)

    def _group_cycle(self, i: int) -> None:
        """A joins, B joins (a rebalance), B leaves (another), A commits and leaves (another)."""
        from pyspark_logsource import TopicPartition

        a = self._member(f"a{i}")
        try:
            self._poll_until("the first member's assignment", [a], lambda: len(a.assignment()) == 4)
            b = self._member(f"b{i}")
            try:
                self._poll_until(
                    "the second member's assignment",
                    [a, b],
                    lambda: bool(b.assignment()) and len(a.assignment()) + len(b.assignment()) == 4,
                )
                b.commit({tp: i for tp in b.assignment()})
            finally:
                b.close()
            self._poll_until("the first member to get everything back", [a], lambda: len(a.assignment()) == 4)
            a.commit({TopicPartition("group-in", p): i for p in range(4)})
        finally:
            a.close()

    def _daily(self) -> None:
        from pyspark_logsource.cli import main as plog

        with contextlib.redirect_stdout(io.StringIO()):
            if plog(["maintain", "--url", self.url]) != 0:
                raise RuntimeError("plog maintain failed")
        self.maintain_passes += 1
        if self.collect is not None:
            self.collect(self.url)
            self.collections += 1

    # ------------------------------------------------------------------ the run

    def run(self, checkpoints: Sequence[float]) -> list[Checkpoint]:
        """Run the year, pausing at each checkpoint for a row of the table."""
        stops = sorted({max(1, round(f * self.ticks)) for f in checkpoints})
        cycle_every = max(1, self.ticks // self.cycles)
        plain_every = max(1, self.ticks // self.plain)
        day = 0
        started = slice_start = self.clock.real_monotonic()
        slice_ticks = 0
        for tick in range(self.ticks):
            self._transaction(tick)
            self._micro_batch()
            if tick % cycle_every == cycle_every - 1:
                self._group_cycle(tick)
            if tick % plain_every == plain_every - 1:
                self._plain_producer(tick)
            self.clock.advance(self.step_s)
            slice_ticks += 1
            if int(self.clock.offset_s // DAY_S) > day:
                day = int(self.clock.offset_s // DAY_S)
                self._daily()
            if tick + 1 in stops:
                now = self.clock.real_monotonic()
                row = Checkpoint(
                    (tick + 1) / self.ticks,
                    tick + 1,
                    self.clock.offset_s / DAY_S,
                    now - started,
                    (now - slice_start) * 1000 / slice_ticks,
                    namespaces(self.store),
                )
                self._restarts(row)
                self.rows.append(row)
                print(render_year_row(row), flush=True)
                slice_start, slice_ticks = self.clock.real_monotonic(), 0
        self.producer.close()
        return self.rows

    def _restarts(self, row: Checkpoint) -> None:
        """The restart costs of this point of the year (see the module docstring)."""
        from coordinator.transactions import TransactionCoordinator
        from pyspark_logsource import Producer

        costs = row.costs
        self.producer.close()
        restarted = Producer(self.url, transactional_id=TID, linger_ms=0)
        with measured(costs, "init_txn", self.clock):
            restarted.init_transactions()
        self.producer = restarted
        with measured(costs, "plain", self.clock), Producer(self.url, linger_ms=0) as plain:
            plain.send("events", b"restart").get(timeout=60)
        consumer = self._member("restart")
        try:
            with measured(costs, "join", self.clock):
                self._poll_until("a restarted member's assignment", [consumer], lambda: len(consumer.assignment()) == 4)
        finally:
            consumer.close()
        self._sink_restart()
        with measured(costs, "sink", self.clock):
            self._micro_batch()
        with measured(costs, "sink next", self.clock):
            self._micro_batch()
        coordinator = TransactionCoordinator(TallyStore(self.store))
        producer_id = TransactionCoordinator(self.store).producer_id_for(TID)
        with measured(costs, "last", self.clock):
            coordinator.last_committed(producer_id)


def _collection() -> Callable[[str], None] | None:
    """``coordinator.collection.collect`` if the project has it (called with the root, or else its store)."""
    try:
        from coordinator.collection import collect  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    from segment_format.root import LogRoot

    def run(url: str) -> None:
        with LogRoot(url) as root:
            try:
                collect(root)
            except TypeError:
                collect(root.store)

    return run


YEAR_COLUMNS = (
    "producer-ids",
    "txn decisions",
    "txn .materialized",
    "tid epochs",
    "leases",
    "topic segments",
    "topic start markers",
    "topic notices",
)
COST_COLUMNS = ("init_txn", "plain", "join", "sink", "sink next", "last")


def render_year_row(row: Checkpoint) -> str:
    """One checkpoint as a line of progress."""
    objects = ", ".join(f"{k} {v:,}" for k, v in sorted(row.objects.items()))
    costs = ", ".join(f"{k} {n:,} req / {ms:,.0f} ms" for k, (n, ms) in row.costs.items())
    return (
        f"  {row.fraction:.0%} ({row.ticks:,} ticks, day {row.sim_days:,.0f}, {row.wall_s:,.0f} s, "
        f"{row.tick_ms:.1f} ms/tick): {objects}\n    restarts: {costs}"
    )


def render_year(rows: Sequence[Checkpoint], year: Year) -> str:
    """The year's two Markdown tables: objects per namespace, and restart costs."""
    known = set(YEAR_COLUMNS)
    extra = sorted({k for row in rows for k in row.objects} - known)
    columns = [*YEAR_COLUMNS, *extra]
    collected = f"called {year.collections:,} times" if year.collect else "absent"
    lines = [
        f"Simulated year: {year.ticks:,} transactions and {year.ticks:,} sink micro-batches, "
        f"{year.cycles:,} group cycles, {year.plain:,} plain producers over {year.step_s * year.ticks / DAY_S:,.0f} "
        f"days (a tick every {year.step_s:,.0f} s); `plog maintain` passes: {year.maintain_passes:,}; "
        f"coordinator.collection.collect: {collected}.",
        "",
        "Objects per namespace:",
        "",
        "| year | ticks | day | " + " | ".join(columns) + " | total |",
        "|---:|---:|---:|" + "---:|" * (len(columns) + 1),
    ]
    for row in rows:
        cells = " | ".join(f"{row.objects.get(c, 0):,}" for c in columns)
        lines.append(
            f"| {row.fraction:.0%} | {row.ticks:,} | {row.sim_days:,.0f} | {cells} | {sum(row.objects.values()):,} |"
        )
    lines += [
        "",
        "Restart costs: requests (LIST counted per 1,000 keys) / wall ms on the local store; "
        "ms per tick = wall time of the year's ticks since the previous row:",
        "",
        "| year | ms per tick | " + " | ".join(COST_COLUMNS) + " |",
        "|---:|---:|" + "---:|" * len(COST_COLUMNS),
    ]
    for row in rows:
        cells = " | ".join(
            f"{row.costs[c][0]:,} / {row.costs[c][1]:,.0f}" if c in row.costs else "-" for c in COST_COLUMNS
        )
        lines.append(f"| {row.fraction:.0%} | {row.tick_ms:.1f} | {cells} |")
    return "\n".join(lines)


def run_year(args: argparse.Namespace) -> str:
    """Section A: the simulated year; its tables."""
    base = args.dir or ("/dev/shm" if os.path.isdir("/dev/shm") else None)
    directory = tempfile.mkdtemp(prefix="plog-long-run-", dir=base)
    clock = SimClock()
    clock.install()
    try:
        year = Year(directory, args.scale, args.days, clock)
        print(
            f"== the year: {year.ticks:,} ticks of {year.step_s:,.0f} simulated s in {directory}",
            flush=True,
        )
        rows = year.run(CHECKPOINTS)
        return render_year(rows, year)
    finally:
        clock.uninstall()
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- the wide root

WIDE_TOPICS = 500
WIDE_PARTITIONS = 10
WIDE_WITH_RECORDS = 50
SPARK_TOPICS_PATTERN = "w0[0-9][0-9]"  # w000 .. w099: 100 topics, 1,000 partitions


@dataclass
class WideRow:
    """One row of the wide root's table."""

    scenario: str
    requests: float
    unit: str
    seconds: float | None = None
    note: str = ""


def run_wide(args: argparse.Namespace) -> str:
    """Section B: the wide root on moto; its table."""
    import bench_requests as br

    bench = br.Bench("s3")
    rows: list[WideRow] = []
    try:
        bucket, url = bench.bucket()
        print(f"== the wide root: {WIDE_TOPICS} topics x {WIDE_PARTITIONS} partitions at {url}", flush=True)
        _wide_setup(url, bench.direct_options)

        def count(work: Callable[[], Any]) -> tuple[int, float, Any]:
            before = bench.counts.of(bucket)
            started = time.perf_counter()
            out = work()
            return sum((bench.counts.of(bucket) - before).values()), time.perf_counter() - started, out

        # The one-shot listings first: they end whatever their cost, the consumer's start may take minutes.
        _wide_cli(url, bench.options, count, rows)
        _wide_notebook(url, bench.options, count, rows)
        _wide_consumer(url, bench.options, args.idle_seconds, count, rows)
        if not args.no_spark:
            _wide_spark(bench, url, args.idle_seconds, count, rows)
    finally:
        bench.stop()
    lines = [
        f"Wide root on moto: {WIDE_TOPICS} topics x {WIDE_PARTITIONS} partitions "
        f"({WIDE_TOPICS * WIDE_PARTITIONS:,}), a record in each partition of {WIDE_WITH_RECORDS} topics; "
        "requests counted by the proxy in front of moto.",
        "",
        "| scenario | requests | per | seconds | note |",
        "|---|---:|---|---:|---|",
    ]
    for row in rows:
        seconds = "" if row.seconds is None else f"{row.seconds:,.2f}"
        lines.append(f"| {row.scenario} | {row.requests:,.1f} | {row.unit} | {seconds} | {row.note} |")
    return "\n".join(lines)


def _wide_setup(url: str, options: dict[str, Any]) -> None:
    """500 topics of 10 partitions, straight to moto (not counted); a record in every partition of 50."""
    from pyspark_logsource import LogStore, Producer

    started = time.perf_counter()
    with LogStore(url, storage_options=options) as store:
        for t in range(WIDE_TOPICS):
            store.create_topic(f"w{t:03d}", WIDE_PARTITIONS)
    with Producer(url, storage_options=options, linger_ms=20) as producer:
        for t in range(WIDE_WITH_RECORDS):
            for p in range(WIDE_PARTITIONS):
                producer.send(f"w{t * (WIDE_TOPICS // WIDE_WITH_RECORDS):03d}", b"x", partition=p)
        producer.flush()
    print(f"  set up in {time.perf_counter() - started:,.0f} s", flush=True)


def _wide_consumer(
    url: str, options: dict[str, Any], seconds: float, count: Callable[..., Any], rows: list[WideRow]
) -> None:
    """An idle consumer subscribed by pattern to every topic: its start, its idle rate, a new record's latency."""
    from pyspark_logsource import Consumer, Producer

    consumer = Consumer(url, storage_options=options, auto_offset_reset="latest")
    try:

        def start() -> None:
            consumer.subscribe(pattern="w.*")
            deadline = time.perf_counter() + 5
            while time.perf_counter() < deadline:
                consumer.poll(timeout_ms=200)

        n, took, _ = count(start)
        rows.append(WideRow("idle consumer, pattern over 500 topics: subscribe + 5 s of polls", n, "start", took))

        def idle() -> float:
            began = time.perf_counter()
            while time.perf_counter() - began < seconds:
                consumer.poll(timeout_ms=500)
            return time.perf_counter() - began

        n, took, _ = count(idle)
        rows.append(WideRow("idle consumer, pattern over 500 topics", n / took, "second", took))
        latencies = []
        with Producer(url, storage_options=options, linger_ms=0) as producer:
            for i in range(3):
                time.sleep(0.3 * (i + 1))
                producer.send(f"w{(i * 37) % WIDE_TOPICS:03d}", b"ping", partition=i).get(timeout=60)
                acked = time.perf_counter()
                while not consumer.poll(timeout_ms=50):
                    if time.perf_counter() - acked > 60:
                        raise RuntimeError("the idle consumer did not see a new record within 60 s")
                latencies.append(time.perf_counter() - acked)
        rows.append(
            WideRow(
                "idle consumer: a new record visible after",
                0,
                "-",
                max(latencies),
                "max of 3; median " + f"{sorted(latencies)[1]:.2f} s",
            )
        )
        print(f"  idle consumer: {rows[-2].requests:,.1f} requests/s", flush=True)
    finally:
        consumer.close()


def _wide_cli(url: str, options: dict[str, Any], count: Callable[..., Any], rows: list[WideRow]) -> None:
    """``plog topics list``, through the CLI's ``main`` in this process."""
    from pyspark_logsource.cli import main as plog
    from pyspark_logsource.cli.common import storage_option_args

    def listing() -> int:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            code = plog(["topics", "list", "--url", url, *storage_option_args(options)])
        if code != 0:
            raise RuntimeError(f"plog topics list failed: {out.getvalue()[-2000:]}")
        return out.getvalue().count("\n")

    n, took, lines = count(listing)
    rows.append(WideRow("`plog topics list`", n, "call", took, f"{lines} lines printed"))
    print(f"  plog topics list: {n:,} requests, {took:.1f} s", flush=True)


def _wide_notebook(url: str, options: dict[str, Any], count: Callable[..., Any], rows: list[WideRow]) -> None:
    """The notebook listings of ``pyspark_logsource.views``: each on a fresh root, as a notebook cell would."""
    from pyspark_logsource import views

    cases: list[tuple[str, Callable[[], Any]]] = [
        ("notebook: `views.topics(root)`", lambda: views.topics(views.as_root(url, options))),
        ("notebook: `views.inspect_root(root)` card", lambda: views.inspect_root(url, options)._repr_html_()),
        ("notebook: `views.partitions(root, topic)`", lambda: views.partitions(views.as_root(url, options), "w000")),
        ("notebook: `views.segments(root, topic, 0)`", lambda: views.segments(views.as_root(url, options), "w000", 0)),
    ]
    for name, work in cases:
        n, took, _ = count(work)
        rows.append(WideRow(name, n, "call", took))
        print(f"  {name}: {n:,} requests, {took:.1f} s", flush=True)


def _wide_spark(bench: Any, url: str, seconds: float, count: Callable[..., Any], rows: list[WideRow]) -> None:
    """A streaming query over 1,000 partitions into the noop sink: its start, its idle rate, one record."""
    from spark_common import local_spark

    from pyspark_logsource import Producer

    spark = local_spark("bench-long-run")
    checkpoint = tempfile.mkdtemp(prefix="bench-long-run-ckpt-")
    query = None
    try:
        stream = (
            spark.readStream.format("plog")
            .options(**bench.spark_options())
            .option("subscribePattern", SPARK_TOPICS_PATTERN)
            .option("startingOffsets", "earliest")
            .load(url)
        )

        def first_batch() -> dict[str, Any]:
            nonlocal query
            query = (
                stream.writeStream.format("noop")
                .option("checkpointLocation", checkpoint)
                .trigger(processingTime="1 second")
                .start()
            )
            deadline = time.perf_counter() + 600
            while not query.recentProgress:
                if time.perf_counter() > deadline or not query.isActive:
                    raise RuntimeError(f"the query's first micro-batch did not finish: {query.exception()}")
                time.sleep(0.05)
            return dict(query.recentProgress[0])

        n, took, progress = count(first_batch)
        durations = progress.get("durationMs", {})
        rows.append(
            WideRow(
                "Spark readStream, 100 topics / 1,000 partitions: start to the end of the first micro-batch",
                n,
                "start",
                took,
                f"{progress.get('numInputRows', 0)} rows; latestOffset {durations.get('latestOffset', 0):,} ms, "
                f"planning {durations.get('queryPlanning', 0):,} ms, "
                f"trigger {durations.get('triggerExecution', 0):,} ms",
            )
        )
        print(f"  Spark first micro-batch: {n:,} requests, {took:.1f} s", flush=True)
        assert query is not None
        running = query
        time.sleep(3)  # settle: the batches right after the first

        def idle() -> float:
            time.sleep(seconds)
            return seconds

        n, took, _ = count(idle)
        rows.append(
            WideRow("Spark readStream, 1,000 partitions, idle (trigger 1 s)", n / took, "second (= trigger)", took)
        )
        print(f"  Spark idle: {n / took:,.1f} requests/s", flush=True)
        with Producer(url, storage_options=bench.direct_options, linger_ms=0) as producer:
            before = len(running.recentProgress)

            def one_record() -> int:
                producer.send("w005", b"one", partition=3).get(timeout=60)
                deadline = time.perf_counter() + 120
                while True:
                    fresh = running.recentProgress[before:] if len(running.recentProgress) > before else []
                    if any(p["numInputRows"] > 0 for p in fresh):
                        return len(fresh)
                    if time.perf_counter() > deadline:
                        raise RuntimeError("the query did not read the new record within 120 s")
                    time.sleep(0.05)

            n, took, batches = count(one_record)
        rows.append(
            WideRow(
                "Spark readStream, 1,000 partitions: one record, send to the end of its micro-batch",
                n,
                "record",
                took,
                f"{batches} progress reports; the send itself went straight to moto (not counted)",
            )
        )
        print(f"  Spark one record: {n:,} requests, {took:.1f} s", flush=True)
    finally:
        if query is not None:
            query.stop()
        spark.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    """Run the chosen sections and print their tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scale",
        type=float,
        default=0.02,
        help="fraction of the full year's events (1: 200,000 transactions; default 0.02; 0.005 for a quick look)",
    )
    parser.add_argument("--days", type=float, default=365.0, help="simulated days the year's events span")
    parser.add_argument("--only", choices=("year", "wide"), help="run one section (default: both)")
    parser.add_argument("--dir", help="where the year's root goes (default: a new directory under /dev/shm)")
    parser.add_argument("--keep", action="store_true", help="keep the year's root directory")
    parser.add_argument("--idle-seconds", type=float, default=20.0, help="how long the wide root's idle rows count")
    parser.add_argument("--no-spark", action="store_true", help="skip the wide root's Spark rows")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    started = dt.datetime.now(dt.timezone.utc)
    header = f"bench_long_run.py --scale {args.scale:g}, {started:%Y-%m-%d %H:%M} UTC; {machine()}"
    print(header, flush=True)
    tables = [header]
    if args.only in (None, "year"):
        install_tally()
        began = time.perf_counter()
        tables.append(run_year(args))
        tables.append(f"(the year took {time.perf_counter() - began:,.0f} s)")
    if args.only in (None, "wide"):
        began = time.perf_counter()
        tables.append(run_wide(args))
        tables.append(f"(the wide root took {time.perf_counter() - began:,.0f} s)")
    print()
    print("\n\n".join(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
