"""Maintenance (merging, retention by time and by bytes, collection) running concurrently through faults.

Issue 12: producers append small objects (so merges happen all the time) and
maintain as they write; an in-process maintainer and ``plog maintain``-style
maintainers in real processes (the first SIGKILLed mid-run, a second one
continuing) run passes on the same partitions; readers read from the start
again and again and one tails; every request of all of them goes through the
seeded fault proxy, with maintenance's own creates (merged objects, start
markers) hit more often. An observer outside the faults watches the listings.

What is checked is what a reader relies on (PROTOCOL.md 9, 10, 13):

* every acknowledged record that retention must keep is read exactly once, at
  its acknowledged offset, offsets contiguous from the log start (no gap: there
  is no compaction yet);
* the log start only moves forward, and only as far as retention allows: no
  record younger than ``retention.ms`` is lost, and none within the newest
  ``retention.bytes`` (bounded above by the sizes the appended objects had);
* readers see no error but "offset out of range" below the start;
* faults of several kinds hit maintenance's requests, and merges and
  collections really happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from coordinator.keys import lease_prefix, maintainer_lease_name
from pyspark_logsource import Consumer, LogStore, Producer, TopicPartition
from segment_format.errors import OffsetOutOfRangeError, StorageError
from segment_format.layout import appended_name
from segment_format.records import payload_batch
from segment_format.root import LogRoot
from segment_format.segment import BatchMeta
from tests.fault_proxy import KINDS, FaultSchedule, FaultyS3

REPO = Path(__file__).resolve().parents[1]
TOPIC = "m"
PARTITIONS = 2
RETENTION_BYTES = 48_000
RETENTION_MS = 600_000
#: D and W (A4): small so that superseded objects are collected within the run. A create is retried
#: at most the writers' store deadline after its knowledge was checked, which A4 needs below D − W − ε.
DELETE_DELAY_MS = 4_000
STALENESS_MS = 500
WRITER_DEADLINE_MS = 2_000
#: Old records: retention by time retires them; the rest are young and must stay (if within the bytes).
OLD_MS = 3_600_000
#: Maintenance's own conditional creates: merged objects and start markers.
MAINTENANCE_CREATE = r"/log/\d+-\d+\.g\d+(?:\.c[0-9a-f]+)?\.arrow$|/start/\d+\.json$"
SEED = 1212

#: Merges, retention and collection of per-partition segment objects (a shared topic's: test_shared_maintenance).
PARTITIONED = {"storage.layout": "partitioned"}


@dataclass
class MaintenanceHeavySchedule(FaultSchedule):
    """The seeded schedule, with maintenance's creates hit with a higher probability than other requests."""

    boosted_pattern: str = MAINTENANCE_CREATE
    boosted_probability: float = 0.3
    _boosted: re.Pattern[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._boosted = re.compile(self.boosted_pattern)

    def decide(self, method: str, key: str) -> str | None:
        """As :meth:`FaultSchedule.decide`, with ``boosted_probability`` (and more lost answers) for PUTs
        of ``boosted_pattern`` keys."""
        if method == "PUT" and self._boosted.search(key):
            # A lost answer to a conditional create is the case that matters most: drawn three times as often.
            coin, kind = self._rng.random(), self._rng.choice([*self.kinds, "lost_put", "lost_put"])
            if coin >= self.boosted_probability:
                return None
            self._count += 1
            return kind
        return super().decide(method, key)


@dataclass
class Shared:
    """What the threads of one run record, under one lock."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    #: (partition, offset) -> (value, timestamp) of every acknowledged record
    acked: dict[tuple[int, int], tuple[bytes, int]] = field(default_factory=dict)
    #: every value sent (acknowledged or not): an unacknowledged one may still be in the log (8, 11.1)
    sent: dict[bytes, int] = field(default_factory=dict)
    send_failures: int = 0
    errors: list[str] = field(default_factory=list)
    out_of_range: int = 0
    rereads: int = 0
    tailed: Counter[int] = field(default_factory=Counter)
    #: partition -> starts observed by the observer, in order
    starts: dict[int, list[int]] = field(default_factory=dict)
    #: key -> size of every segment object the observer listed
    sizes: dict[str, int] = field(default_factory=dict)
    gone: set[str] = field(default_factory=set)
    #: the producers' self-maintenance lease epochs seen: each began a pass (PROTOCOL.md 10.1)
    epochs: set[str] = field(default_factory=set)
    passes: int = 0

    def error(self, where: str, exc: BaseException) -> None:
        with self.lock:
            self.errors.append(f"{where}: {type(exc).__name__}: {exc}")


def _options(s3: FaultyS3, deadline_ms: int) -> dict[str, Any]:
    return {**s3.options, "plog_deadline_ms": deadline_ms}


def _produce(s3: FaultyS3, shared: Shared, name: str, count: int, seed: int) -> None:
    """Send ``count`` records to each partition, the first third with old timestamps, flushing every 3."""
    rng = random.Random(seed)
    try:
        producer = Producer(s3.url, storage_options=_options(s3, WRITER_DEADLINE_MS), linger_ms=0, acks="all")
    except Exception as exc:  # noqa: BLE001 - reported by the test
        shared.error(name, exc)
        return
    pending: list[tuple[Any, bytes, int]] = []
    for i in range(count):
        for partition in range(PARTITIONS):
            ts = int(time.time() * 1000) - (OLD_MS if i < count // 3 else 0)
            value = f"{name}-{partition}-{i:04d}-".encode() + rng.randbytes(300)  # incompressible
            with shared.lock:
                shared.sent[value] = ts
            try:
                pending.append((producer.send(TOPIC, value=value, partition=partition, timestamp_ms=ts), value, ts))
            except Exception:  # noqa: BLE001 - a failed send is allowed: it was not acknowledged
                with shared.lock:
                    shared.send_failures += 1
        if i % 3 == 2 or i == count - 1:
            with contextlib.suppress(Exception):  # the futures say which records failed
                producer.flush()
            for future, value, ts in pending:
                try:
                    meta = future.get(30)
                except Exception:  # noqa: BLE001 - not acknowledged: it may or may not be in the log
                    with shared.lock:
                        shared.send_failures += 1
                    continue
                with shared.lock:
                    shared.acked[(meta.partition, meta.offset)] = (value, ts)
            pending = []
    try:
        producer.close()
    except Exception as exc:  # noqa: BLE001 - reported by the test
        shared.error(f"{name} close", exc)


def _maintain_in_process(s3: FaultyS3, shared: Shared) -> None:
    """``plog maintain``'s pass (list, merge, retain, list, collect) in a loop, through the faults."""
    with LogStore(s3.url, storage_options=_options(s3, WRITER_DEADLINE_MS)) as store:
        while not shared.stop.is_set():
            try:
                store.maintain(TOPIC)
                with shared.lock:
                    shared.passes += 1
            except Exception as exc:  # noqa: BLE001 - a failed pass is allowed (10.1); the next one continues
                if "StorageError" not in type(exc).__name__ and "Timeout" not in type(exc).__name__:
                    shared.error("maintainer", exc)
            shared.stop.wait(0.05)


def _check_read(shared: Shared, partition: int, offset: int, value: bytes, where: str) -> None:
    with shared.lock:
        acked = shared.acked.get((partition, offset))
        known = value in shared.sent
    if acked is not None and acked[0] != value or not known:
        shared.errors.append(f"{where}: partition {partition} offset {offset} holds another record")


def _reader(s3: FaultyS3, shared: Shared, tail: bool) -> None:
    """Read from the start (again and again, or tailing once): contiguous offsets, known values, no error."""
    tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
    where = "tailer" if tail else "rereader"
    consumer = Consumer(s3.url, storage_options=_options(s3, 20_000), auto_offset_reset="none")
    try:
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        expected: dict[int, int | None] = {p: None for p in range(PARTITIONS)}
        while not shared.stop.is_set():
            try:
                records = consumer.poll(timeout_ms=100, max_records=200)
            except OffsetOutOfRangeError:
                # Allowed only below the start (the start moved past our position): start again from it.
                with shared.lock:
                    shared.out_of_range += 1
                root = LogRoot(s3.url, s3.direct_options)
                below = [consumer.position(tp) < root.partition(TOPIC, tp.partition).view().start_offset for tp in tps]
                root.close()
                if not any(below):
                    shared.error(where, AssertionError(f"out of range at {[consumer.position(tp) for tp in tps]}"))
                consumer.seek_to_beginning(*tps)
                expected = {p: None for p in range(PARTITIONS)}
                continue
            caught_up = not records
            for tp, batch in records.items():
                for r in batch:
                    nxt = expected[tp.partition]
                    if nxt is not None and r.offset != nxt:
                        shared.errors.append(f"{where}: partition {tp.partition} jumped from {nxt} to {r.offset}")
                    expected[tp.partition] = r.offset + 1
                    _check_read(shared, tp.partition, r.offset, r.value or b"", where)
                    if tail:
                        with shared.lock:
                            shared.tailed[tp.partition] += 1
            if caught_up and not tail:
                with shared.lock:
                    shared.rereads += 1
                consumer.seek_to_beginning(*tps)
                expected = {p: None for p in range(PARTITIONS)}
    except Exception as exc:  # noqa: BLE001 - any other error fails the test
        shared.error(where, exc)
    finally:
        consumer.close()


def _observe(s3: FaultyS3, shared: Shared) -> None:
    """Outside the faults: every segment object's size, what disappeared, and each partition's start."""
    root = LogRoot(s3.url, s3.direct_options)
    try:
        prefixes = {p: root.partition(TOPIC, p).chain.prefix for p in range(PARTITIONS)}
        lease = lease_prefix(maintainer_lease_name(TOPIC))
        while not shared.stop.is_set():
            epochs = {i.key for i in root.store.list(lease)}
            with shared.lock:
                shared.epochs |= epochs
            for p, prefix in prefixes.items():
                listed = {i.key: i.size for i in root.store.list(prefix + "log/")}
                start = root.partition(TOPIC, p).view().start_offset
                with shared.lock:
                    shared.gone |= {k for k in shared.sizes if k.startswith(prefix) and k not in listed}
                    shared.sizes.update(listed)
                    shared.starts.setdefault(p, []).append(start)
            shared.stop.wait(0.1)
    except Exception as exc:  # noqa: BLE001 - reported by the test
        shared.error("observer", exc)
    finally:
        root.close()


_MAINTAINER = """
import json, sys, time
from pyspark_logsource import LogStore
url, options, topic = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
with LogStore(url, storage_options=options) as store:
    while True:
        print("begin", flush=True)
        try:
            counts = store.maintain(topic)
        except Exception as exc:  # a failed pass is allowed (PROTOCOL.md 10.1): the next one continues
            print("failed", type(exc).__name__, exc, flush=True)
            continue
        print("pass", json.dumps(counts), flush=True)
        time.sleep(0.1)  # the machine is shared: a pass every 0.1 s is plenty of concurrency
"""


def _spawn_maintainer(s3: FaultyS3) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    options = json.dumps(_options(s3, WRITER_DEADLINE_MS))
    return subprocess.Popen(
        [sys.executable, "-c", _MAINTAINER, s3.url, options, TOPIC],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )


def _passes(proc: subprocess.Popen[str], lines: list[str]) -> threading.Thread:
    """Collect the child's lines on a thread (its pipe must not fill up)."""

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return thread


def _wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout} s")
        time.sleep(0.05)


@pytest.mark.s3
@pytest.mark.slow
def test_maintenance_through_faults_loses_nothing_retention_keeps(faulty_s3: FaultyS3) -> None:
    config = {
        "segment.bytes": 16384,
        "retention.ms": RETENTION_MS,
        "retention.bytes": RETENTION_BYTES,
        "file.delete.delay.ms": DELETE_DELAY_MS,
        "writer.max.staleness.ms": STALENESS_MS,
        "auto.maintenance.interval.ms": 200,
    }
    with LogStore(faulty_s3.url, storage_options=faulty_s3.direct_options) as admin:
        admin.create_topic(TOPIC, PARTITIONS, {**config, **PARTITIONED})
    shared = Shared()
    faulty_s3.proxy.set_schedule(MaintenanceHeavySchedule(SEED, 0.04, kinds=KINDS, delay_s=1.5))
    started = time.monotonic()
    first_lines: list[str] = []
    first = _spawn_maintainer(faulty_s3)
    first_pump = _passes(first, first_lines)
    helpers = [
        threading.Thread(target=_observe, args=(faulty_s3, shared), daemon=True),
        threading.Thread(target=_maintain_in_process, args=(faulty_s3, shared), daemon=True),
        threading.Thread(target=_reader, args=(faulty_s3, shared, True), daemon=True),
        threading.Thread(target=_reader, args=(faulty_s3, shared, False), daemon=True),
    ]
    producers = [
        threading.Thread(target=_produce, args=(faulty_s3, shared, name, 45, SEED + n), daemon=True)
        for n, name in enumerate(("p0", "p1"))
    ]
    for thread in helpers + producers:
        thread.start()
    # The first external maintainer dies by SIGKILL in the middle of its passes; a second one continues.
    _wait_for(lambda: sum(line.startswith("pass") for line in first_lines) >= 2, 40, "two passes of the first")
    begun = sum(line.startswith("begin") for line in first_lines)
    _wait_for(lambda: sum(line.startswith("begin") for line in first_lines) > begun, 10, "the next pass")
    time.sleep(random.Random(SEED).uniform(0.0, 0.02))
    first.send_signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL
    first_pump.join(5)
    assert first_lines[-1].startswith("begin"), "the first maintainer finished its pass before the SIGKILL"
    second_lines: list[str] = []
    second = _spawn_maintainer(faulty_s3)
    second_pump = _passes(second, second_lines)
    for thread in producers:
        thread.join(120)
        assert not thread.is_alive(), "a producer did not finish"
    produced = time.monotonic() - started
    _wait_for(lambda: any(line.startswith("pass") for line in second_lines), 30, "a pass of the second maintainer")
    # Let the last merges' superseded objects age past D while everything keeps running, then stop.
    time.sleep(DELETE_DELAY_MS / 1000 + 1)
    shared.stop.set()
    for thread in helpers:
        thread.join(60)
        assert not thread.is_alive(), f"{thread.name} did not stop"
    second.send_signal(signal.SIGKILL)
    second.wait(10)
    second_pump.join(5)
    faults = faulty_s3.proxy.faults
    faulty_s3.calm()
    elapsed = time.monotonic() - started

    assert not shared.errors, shared.errors[:10]
    # What is stored: contiguous offsets from the start, each acknowledged record at its offset, once.
    with LogStore(faulty_s3.url, storage_options=faulty_s3.direct_options) as store:
        # One calm pass: whatever the faults left unmerged or uncollected. W is 500 ms here, and on a loaded
        # machine a merge may find its listing older than that at its create, which it then refuses to send
        # (assumption A4): the pass is tried again, as the next self-maintenance pass would.
        for attempt in range(3):
            try:
                store.maintain(TOPIC)
                break
            except StorageError as exc:
                if "bound has passed" not in str(exc) or attempt == 2:
                    raise
        views = {p: store.root.partition(TOPIC, p).view() for p in range(PARTITIONS)}
    found: dict[int, list[tuple[int, bytes]]] = {}
    with Consumer(faulty_s3.url, storage_options=faulty_s3.direct_options, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
        while records := consumer.poll(timeout_ms=300, max_records=10_000):
            for tp, batch in records.items():
                found.setdefault(tp.partition, []).extend((r.offset, r.value or b"") for r in batch)
    values = [v for records in found.values() for _, v in records]
    assert len(values) == len(set(values)), "a record is in the log twice"
    for p in range(PARTITIONS):
        start, end = views[p].start_offset, views[p].end_offset
        offsets = [o for o, _ in found.get(p, [])]
        assert offsets == list(range(start, end)), f"partition {p}: a gap or a reordering"
        stored = dict(found.get(p, []))
        for (q, offset), (value, _) in shared.acked.items():
            if q == p and offset >= start:
                assert stored.get(offset) == value, f"partition {p}: acknowledged offset {offset} lost or changed"
        assert all(v in shared.sent for v in stored.values())
        # The start only moved forward.
        seen = shared.starts[p] + [start]
        assert seen == sorted(seen), f"partition {p}: the log start moved back"
        # Only as far as retention allows: a young record is lost only if the objects after its own
        # held at least retention.bytes; merging never makes objects larger (checked below), so the
        # sizes the appended objects after it had bound that from above.
        prefix = views[p].segments[-1].key.rsplit("/", 1)[0] + "/"
        appended = sorted(
            (int(k.rsplit("/", 1)[1][: -len(".arrow")]), size)
            for k, size in shared.sizes.items()
            if k.startswith(prefix) and re.search(r"/\d+\.arrow$", k)
        )
        young = sorted(o for (q, o), (_, ts) in shared.acked.items() if q == p and ts > time.time() * 1000 - 60_000)
        must_keep = [o for o in young if sum(size for base, size in appended if base > o) < RETENTION_BYTES]
        assert must_keep, "the run appended too little to check retention by bytes"
        assert start <= must_keep[0], f"partition {p}: start {start} is past {must_keep[0]}, which retention keeps"
        old = [o for (q, o), (_, ts) in shared.acked.items() if q == p and ts < time.time() * 1000 - RETENTION_MS]
        assert old and start > min(old), f"partition {p}: retention retired nothing"
        # The bound's premise: a merged object is no larger than the appended objects it covers.
        bases = dict(appended)
        for key, size in shared.sizes.items():
            name = re.search(r"/(\d+)-(\d+)\.g\d+(?:\.c[0-9a-f]+)?\.arrow$", key)
            if key.startswith(prefix) and name:
                covered = [s for b, s in bases.items() if int(name[1]) <= b < int(name[2])]
                if len(covered) >= 2:
                    assert size <= sum(covered), f"{key} is larger than the objects it merged"
    # Merges and collections really happened, concurrently with all of the above (how many depends on how much
    # CPU the run had: on a loaded machine the observer sees fewer merged objects before they are merged again).
    merged = [k for k in shared.sizes if re.search(r"\.g\d+(?:\.c[0-9a-f]+)?\.arrow$", k)]
    assert len(merged) >= 3 and len(shared.gone) >= 20, (len(merged), len(shared.gone))
    # Faults of several kinds hit maintenance's own requests.
    maintenance = Counter(
        kind for kind, method, key in faults if method == "PUT" and re.search(MAINTENANCE_CREATE, key)
    )
    assert maintenance["lost_put"] >= 1 and len(maintenance) >= 3, maintenance
    assert any(method == "DELETE" for _, method, _ in faults), Counter(m for _, m, _ in faults)
    kinds = Counter(kind for kind, _, _ in faults)
    assert set(kinds) == set(KINDS), kinds
    assert shared.rereads >= 3 and sum(shared.tailed.values()) > 0 and shared.passes >= 3
    assert len(shared.epochs) >= 5, "the producers' self-maintenance hardly ran"
    print(
        f"\n{elapsed:.1f} s (producers {produced:.1f} s); faults {dict(kinds)}; "
        f"on maintenance creates {dict(maintenance)}; "
        f"acked {len(shared.acked)}, send failures {shared.send_failures}; merged objects {len(merged)}, "
        f"collected {len(shared.gone)}; passes {shared.passes}+{len(first_lines)}+{len(second_lines)}; "
        f"rereads {shared.rereads}, out of range {shared.out_of_range}; "
        f"starts {[v.start_offset for v in views.values()]}; self-maintenance epochs {len(shared.epochs)}"
    )


def _values(values: list[bytes], first_ts: int) -> list[tuple[pa.RecordBatch, BatchMeta]]:
    batch = payload_batch([first_ts + i for i in range(len(values))], [None] * len(values), values)
    return [(batch, BatchMeta())]


def _assert_z1_acknowledged_after_the_others(result: Any, fired: list[str], other: LogRoot) -> None:
    """The zombie's append of ``z1`` ran into the injected failure and was acknowledged where it is stored:
    after the three records the others appended meanwhile (offsets 1 to 3), at offset 4."""
    assert fired
    offset = result.base_offsets[0]
    batches, _ = other.partition(TOPIC, 0).read(offset, max_records=1)
    assert batches[0].column("value").to_pylist() == [b"z1"], f"acknowledged offset {offset} holds another record"
    assert offset == 4


def test_regression_an_append_retried_after_a_store_error_does_not_act_on_stale_knowledge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append whose create failed (StorageError, nothing created) tried the same offsets again on the
    same knowledge, however old: with a store deadline longer than D − W − ε, others appended there
    meanwhile, a merge took those objects off the chain and collection deleted them, and the retry
    created the freed key, acknowledging offsets that hold other records (I5). Step 1 of PROTOCOL.md 8
    holds for every attempt: knowledge older than W is resolved again.
    """
    path = str(tmp_path / "root")
    other = LogRoot(path)
    config = {
        "file.delete.delay.ms": 100,
        "writer.max.staleness.ms": 50,
        "segment.ms": 100,  # the merge below closes its group before the tail, 4 s younger
        "auto.maintenance.enable": False,
    }
    other.catalog.create(TOPIC, 1, {**config, **PARTITIONED})
    zombie = LogRoot(path)
    log = zombie.partition(TOPIC, 0)
    assert log.append(_values([b"z0"], 1_000)).base_offsets == [0]  # knows the end: 1
    create = zombie.store.put_if_absent_parts  # what an append creates its object with
    prefix = log.chain.prefix
    fired: list[str] = []

    def failing(key: str, data: Any, *, durable: bool = True) -> bool:
        if key == prefix + "log/" + appended_name(1) and not fired:
            fired.append(key)
            # While this create is retried past its deadline (longer than W): others append at 1 and
            # on, a merge takes offsets 0..3 off the appended part, and after D collection deletes them.
            mine = other.partition(TOPIC, 0)
            for n in range(1, 4):
                mine.append(_values([b"other-%d" % n], 1_000 + n if n < 3 else 5_000), durable=False)
            assert mine.merge_segments() == 1
            time.sleep(0.2)
            assert mine.collect_garbage() == 3
            assert not other.store.exists(key)
            raise StorageError(f"creating object {key!r} failed: deadline exceeded")
        return create(key, data, durable=durable)

    monkeypatch.setattr(zombie.store, "put_if_absent_parts", failing)
    _assert_z1_acknowledged_after_the_others(log.append(_values([b"z1"], 9_000)), fired, other)


def test_regression_a_create_is_not_retried_by_the_store_on_knowledge_older_than_w() -> None:
    """The store retried an append's create for its whole deadline (60 s by default), whatever W:
    a try sent after others had appended at the offset, merged and collected created the freed key,
    and the append acknowledged offsets that hold other records (I5). The appender now bounds the
    store's retries by the age of its knowledge, and resolves the chain again after giving up.
    """
    import uuid

    import fsspec

    from segment_format.stores import FsspecStore
    from segment_format.stores.retrying import RetryPolicy

    url = f"memory://plog-{uuid.uuid4().hex}/root"

    def store() -> FsspecStore:
        fs = fsspec.filesystem("memory", skip_instance_cache=True)  # its own instance, the shared bytes
        retry = RetryPolicy(deadline_s=30.0, backoff_s=0.01, backoff_max_s=0.02)
        return FsspecStore(fs, url[len("memory://") :], url, create_kwargs={"mode": "create"}, retry=retry)

    other = LogRoot(url, store=store())
    config = {"file.delete.delay.ms": 100, "writer.max.staleness.ms": 50, "segment.ms": 100}
    other.catalog.create(TOPIC, 1, {**config, "auto.maintenance.enable": False, **PARTITIONED})
    zombie_store = store()
    zombie = LogRoot(url, store=zombie_store)
    log = zombie.partition(TOPIC, 0)
    assert log.append(_values([b"z0"], 1_000), durable=False).base_offsets == [0]  # knows the end: 1
    target = zombie_store._path(log.chain.prefix + "log/" + appended_name(1))
    pipe_file = zombie_store.fs.pipe_file
    fired: list[str] = []

    def flaky(path: str, data: bytes, **kwargs: Any) -> None:
        if path == target and not fired:
            fired.append(path)
            mine = other.partition(TOPIC, 0)  # meanwhile: others append at 1 and on, merge, collect
            for n in range(1, 4):
                mine.append(_values([b"other-%d" % n], 1_000 + n if n < 3 else 5_000), durable=False)
            assert mine.merge_segments() == 1
            time.sleep(0.2)
            assert mine.collect_garbage() == 3
            raise ConnectionResetError("the connection broke before the request reached the server")
        pipe_file(path, data, **kwargs)

    zombie_store.fs.pipe_file = flaky
    _assert_z1_acknowledged_after_the_others(log.append(_values([b"z1"], 9_000), durable=False), fired, other)


def test_a_store_deadline_block_bounds_the_retries_of_the_operations_inside() -> None:
    import fsspec

    from segment_format.stores import FsspecStore
    from segment_format.stores.retrying import RetryPolicy

    fs = fsspec.filesystem("memory", skip_instance_cache=True)
    retry = RetryPolicy(deadline_s=30.0, backoff_s=0.01, backoff_max_s=0.02)
    store = FsspecStore(fs, "deadline/root", "memory://deadline/root", create_kwargs={"mode": "create"}, retry=retry)

    def broken(path: str, data: bytes, **kwargs: Any) -> None:
        raise ConnectionResetError("reset")

    fs.pipe_file = broken
    started = time.monotonic()
    with store.deadline(started + 0.2), pytest.raises(StorageError, match="creating object"):
        store.put_if_absent("k", b"v")
    assert time.monotonic() - started < 2
    with store.deadline(started + 60), pytest.raises(StorageError):  # the store's own deadline, if sooner, holds
        store.retry = RetryPolicy(deadline_s=0.1, backoff_s=0.01, backoff_max_s=0.02)
        store.put_if_absent("k", b"v")
    assert time.monotonic() - started < 4


def test_a_create_past_its_callers_bound_is_not_sent_at_all() -> None:
    """A4: the bound holds for the first try too, so a create whose knowledge grew too old while
    it was being encoded sends nothing; a read under the same bound still runs."""
    import fsspec

    from segment_format.stores import FsspecStore

    fs = fsspec.filesystem("memory", skip_instance_cache=True)
    store = FsspecStore(fs, "bound/root", "memory://bound/root", create_kwargs={"mode": "create"})
    sent: list[str] = []
    pipe_file = fs.pipe_file

    def counting(path: str, data: bytes, **kwargs: Any) -> None:
        sent.append(path)
        pipe_file(path, data, **kwargs)

    fs.pipe_file = counting
    assert store.put_if_absent("read-me", b"r")
    with store.deadline(time.monotonic() - 0.001):
        with pytest.raises(StorageError, match="not sent"):
            store.put_if_absent("late", b"v")
        assert store.get("read-me") == b"r"
    assert len(sent) == 1  # the first create only
    assert not store.exists("late")
    with store.deadline(time.monotonic() + 30):
        assert store.put_if_absent("late", b"v")  # within the bound it is sent as usual
