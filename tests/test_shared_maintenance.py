"""Maintenance of shared topics (PROTOCOL.md 10.2): runs moved into segments, commits and shared objects
collected, orphans of a writer killed between its object and its commit, retention and compaction."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pytest

from coordinator.collection import collect
from coordinator.collection.shared_objects import SharedObjectsCollector
from pyspark_logsource import Consumer, LogStore, Producer, TopicPartition
from segment_format.records import now_ms
from segment_format.root import LogRoot
from segment_format.shared.sequence import COMMIT_DEADLINE_MS
from segment_format.stores import open_store

#: Runs move at the first pass; D small enough that a pass "later" is a time argument, not a sleep.
MOVE_NOW = {"storage.layout": "shared", "shared.move.ms": "0", "auto.maintenance.enable": "false"}
DELAY_MS = 20 * 60 * 1000


@pytest.fixture
def url(tmp_path: Path) -> str:
    return str(tmp_path / "root")


def _send(url: str, topic: str, start: int, count: int, partitions: int) -> None:
    with Producer(url) as producer:
        producer.send_batch(
            topic,
            pa.table(
                {
                    "key": [b"k%d" % (i % 50) for i in range(start, start + count)],
                    "value": [b"v%d" % i for i in range(start, start + count)],
                    "partition": [i % partitions for i in range(start, start + count)],
                }
            ),
        )


def _read(url: str, topic: str, partitions: int) -> dict[int, list[tuple[int, bytes, int]]]:
    out: dict[int, list[tuple[int, bytes, int]]] = {}
    with Consumer(url, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        while batch := consumer.poll(timeout_ms=300, max_records=100_000):
            for tp, records in batch.items():
                out.setdefault(tp.partition, []).extend((r.offset, r.value, r.timestamp) for r in records)
    return out


def _keys(url: str, prefix: str) -> list[str]:
    return sorted(info.key for info in open_store(url).list(prefix))


def _maintain_later(url: str, topic: str, later_ms: int) -> int:
    """One maintenance pass of every partition, then the topic's commit collection as of ``later_ms`` from now."""
    root = LogRoot(url)
    meta = root.topic(topic)
    logs = {p: root.partition(topic, p, meta) for p in range(meta.partitions)}
    for log in logs.values():
        log.maintain(now=now_ms() + later_ms)
    return root.collect_commits(topic, meta, logs, now_ms() + later_ms)


def _collect_commits_later(url: str, topic: str, later_ms: int) -> int:
    """The topic's commit collection as of ``later_ms`` from now, from fresh views of every partition."""
    root = LogRoot(url)
    meta = root.topic(topic)
    logs = {p: root.partition(topic, p, meta) for p in range(meta.partitions)}
    for log in logs.values():
        log.chain.view()
    return root.collect_commits(topic, meta, logs, now_ms() + later_ms)


def test_runs_move_into_segments_and_every_reader_sees_the_same_records(url: str) -> None:
    LogStore(url).create_topic("s", 4, MOVE_NOW)
    for n in range(3):
        _send(url, "s", n * 40, 40, 4)
    before = _read(url, "s", 4)
    stale = Consumer(url, auto_offset_reset="earliest")
    stale.assign([TopicPartition("s", p) for p in range(4)])
    first = stale.poll(timeout_ms=300, max_records=5)  # a view naming the runs, held across the move
    assert _maintain_later(url, "s", 0) == 0  # moved, but nothing is D old yet
    moved = [k for k in _keys(url, "topics/s/") if "/log/" in k]
    assert len(moved) == 4 and all(".g1.c" in k for k in moved)  # one segment per partition, named with an id
    assert _read(url, "s", 4) == before  # offsets, values and timestamps as they were
    # D later: the commits below the segments go (the head stays), then every shared object nobody names.
    assert _maintain_later(url, "s", DELAY_MS + 1) == 2
    assert [k.rsplit("/", 1)[-1] for k in _keys(url, "topics/s/") if "/commits/" in k] == [f"{2:020d}.json"]
    report = collect(open_store(url), now_ms=now_ms() + COMMIT_DEADLINE_MS + DELAY_MS + 1)
    assert report.deleted["shared"] == 2  # the head commit still names the newest object
    assert len(_keys(url, "shared/")) == 1
    seen = {tp.partition: [(r.offset, r.value, r.timestamp) for r in rs] for tp, rs in first.items()}
    while batch := stale.poll(timeout_ms=300, max_records=100_000):  # the stale reader lists again and goes on
        for tp, records in batch.items():
            seen.setdefault(tp.partition, []).extend((r.offset, r.value, r.timestamp) for r in records)
    stale.close()
    assert seen == before
    _send(url, "s", 120, 8, 4)  # the sequence goes on from the head the collection kept
    after = _read(url, "s", 4)
    assert {p: [o for o, _, _ in rs] for p, rs in after.items()} == {p: list(range(32)) for p in range(4)}


def test_a_writer_killed_between_its_object_and_its_commit_leaves_an_orphan_that_is_collected(url: str) -> None:
    LogStore(url).create_topic("s", 4, MOVE_NOW)
    _send(url, "s", 0, 8, 4)
    child = textwrap.dedent(
        f"""
        import os, signal
        import pyarrow as pa
        from pyspark_logsource import Producer
        from segment_format.shared.sequence import TopicSequence

        def killed(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)  # the shared object exists; its commit is never sent

        TopicSequence.commit = killed
        with Producer({url!r}) as producer:
            producer.send_batch("s", pa.table({{"value": [b"lost"] * 8, "partition": list(range(4)) * 2}}))
        """
    )
    done = subprocess.run([sys.executable, "-c", child], cwd=os.getcwd(), timeout=120)
    assert done.returncode == -signal.SIGKILL
    assert len(_keys(url, "shared/")) == 2
    assert all(v != b"lost" for rs in _read(url, "s", 4).values() for _, v, _ in rs)  # never read
    young = collect(open_store(url), now_ms=now_ms() + COMMIT_DEADLINE_MS, collectors=[SharedObjectsCollector()])
    assert young.deleted["shared"] == 0  # its writer could still commit it: within C + D
    old = collect(
        open_store(url), now_ms=now_ms() + COMMIT_DEADLINE_MS + DELAY_MS + 1, collectors=[SharedObjectsCollector()]
    )
    assert old.deleted["shared"] == 1  # the orphan; the committed object stays
    assert sum(len(rs) for rs in _read(url, "s", 4).values()) == 8


def test_retention_retires_moved_segments_of_a_shared_topic(url: str) -> None:
    LogStore(url).create_topic("s", 2, {**MOVE_NOW, "retention.ms": str(60 * 60 * 1000)})
    _send(url, "s", 0, 20, 2)
    _maintain_later(url, "s", 0)  # first segment of each partition
    _send(url, "s", 20, 20, 2)
    _maintain_later(url, "s", 0)  # second
    _maintain_later(url, "s", 2 * 60 * 60 * 1000)  # the first segments are past retention; the last one stays
    root = LogRoot(url)
    for p in range(2):
        view = root.partition("s", p).chain.view()
        assert (view.start_offset, view.end_offset) == (10, 20)
    assert {p: [v for _, v, _ in rs] for p, rs in _read(url, "s", 2).items()} == {
        p: [b"v%d" % i for i in range(20, 40) if i % 2 == p] for p in range(2)
    }


def test_a_compacted_shared_topic_keeps_each_keys_last_value(url: str) -> None:
    LogStore(url).create_topic("c", 2, {**MOVE_NOW, "cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0"})
    for n in range(4):
        _send(url, "c", n * 100, 100, 2)
        _maintain_later(url, "c", 0)
    LogStore(url).maintain("c")
    latest: dict[bytes, bytes] = {}
    for rs in _read(url, "c", 2).values():
        for _, value, _ in rs:
            latest[b"k%d" % (int(value[1:]) % 50)] = value
    assert latest == {b"k%d" % k: b"v%d" % (350 + k) for k in range(50)}
    records = sum(len(rs) for rs in _read(url, "c", 2).values())
    assert records < 400  # compacted: older values of the 50 keys are gone


def test_a_writer_paused_past_w_never_reuses_a_collected_commit_number(url: str) -> None:
    """A real writer process commits, then waits (its knowledge of the head ages past W) while others commit,
    runs move and the commits below them are collected; its next flush lists the commits again and takes the
    number after the head, never a collected one (PROTOCOL.md 7.3, 10.2): every partition stays contiguous."""
    config = {**MOVE_NOW, "writer.max.staleness.ms": "200", "file.delete.delay.ms": "1000"}
    LogStore(url).create_topic("z", 2, config)
    child = textwrap.dedent(
        f"""
        import sys
        import pyarrow as pa
        from pyspark_logsource import Producer

        with Producer({url!r}) as producer:
            producer.send_batch("z", pa.table({{"value": [b"zombie-0"] * 2, "partition": [0, 1]}}))
            print("ready", flush=True)
            sys.stdin.readline()  # paused here while the others commit and collect
            result = producer.send_batch("z", pa.table({{"value": [b"zombie-1"] * 2, "partition": [0, 1]}}))
            print(sorted(result.offsets.items()), flush=True)
        """
    )
    zombie = subprocess.Popen(
        [sys.executable, "-c", child], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    try:
        assert zombie.stdout is not None and zombie.stdin is not None
        assert zombie.stdout.readline().strip() == "ready"
        for n in range(3):
            _send(url, "z", n * 4, 4, 2)  # commits 1, 2, 3
        assert _maintain_later(url, "z", 0) == 0  # moved
        # Collection acts D after the move on the real clock (a process that probed the head less than D/2 ago
        # may trust a probe, 7.3): wait D out rather than pass a later time, so that the rule is what is tested.
        time.sleep(1.05)
        assert _maintain_later(url, "z", 0) == 3  # commits 0, 1, 2 collected; 3 (the head) stays
        zombie.stdin.write("go\n")
        zombie.stdin.flush()
        answer = zombie.stdout.readline().strip()
        assert zombie.wait(timeout=60) == 0
    finally:
        zombie.kill()
    assert answer == "[(0, (7, 7)), (1, (7, 7))]"  # after the 1 + 6 records before it in each partition
    commits = [k.rsplit("/", 1)[-1] for k in _keys(url, "topics/z/") if "/commits/" in k]
    assert commits == [f"{3:020d}.json", f"{4:020d}.json"]
    read = _read(url, "z", 2)
    assert {p: [o for o, _, _ in rs] for p, rs in read.items()} == {0: list(range(8)), 1: list(range(8))}


@pytest.mark.parametrize("moved", [False, True], ids=["in-shared-objects", "moved-first"])
def test_commits_merge_into_ranges_that_readers_resolve_with_few_documents(url: str, moved: bool) -> None:
    """Forty flushes, merged (PROTOCOL.md 10.2, *Merging commits*): two ranges of sixteen, the rest plain; a
    new reader reads a handful of documents, not forty, and every record as before; D later the merged plain
    commits are collected, and the chain still resolves. Runs moved into segments first are left out of the
    ranges (which then name no shared object)."""
    from coordinator.collection import CountingView

    config = {"storage.layout": "shared", "auto.maintenance.enable": "false"}
    LogStore(url).create_topic("m", 4, {**config, "shared.move.ms": "0"} if moved else config)
    for n in range(40):
        _send(url, "m", n * 4, 4, 4)
    before = _read(url, "m", 4)
    assert LogStore(url).maintain("m")["merged"] == (4 + 2 if moved else 2)  # the moves, then the two ranges
    names = [k.rsplit("/", 1)[-1] for k in _keys(url, "topics/m/") if "/commits/" in k]
    assert f"{0:020d}-{16:020d}.g1.json" in names and f"{16:020d}-{32:020d}.g1.json" in names
    first_range = json.loads(open_store(url).get(next(k for k in _keys(url, "topics/m/") if k.endswith(".g1.json"))))
    assert len(first_range["entries"]) == (0 if moved else 16 * 4)
    counted = CountingView(open_store(url))
    sequence = LogRoot(url, store=counted).sequence("m")
    counted.requests = 0
    sequence.resolve()
    assert [(e.first, e.end, e.generation) for e in sequence.elements[:3]] == [(0, 16, 1), (16, 32, 1), (32, 33, 0)]
    assert counted.requests <= 1 + 2 + 8  # one listing, two ranges, eight plain commits
    assert _read(url, "m", 4) == before
    # The plain commits the ranges cover; when moved, also the ranges and every plain commit but the head.
    assert _collect_commits_later(url, "m", DELAY_MS + 1) == (32 + 2 + 7 if moved else 32)
    assert len([k for k in _keys(url, "topics/m/") if "/commits/" in k]) == (1 if moved else 2 + 8)
    assert _read(url, "m", 4) == before
    _send(url, "m", 160, 4, 4)  # and the sequence goes on after its head
    assert {p: len(rs) for p, rs in _read(url, "m", 4).items()} == {p: 41 for p in range(4)}


def test_small_shared_objects_merge_into_one_that_a_stale_reader_finds(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sixteen small flushes, merged as their commits are (PROTOCOL.md 10.2, *Merging shared objects*): the range
    names one new shared object holding every run, each partition's runs next to each other; a reader holding
    a view from before the merge goes on after the old commits and objects are collected, and sees the same
    records; the merged object verifies, and a catch-up reader reads it once, not sixteen objects."""
    from segment_format.inspect.verify import verify
    from tests.test_shared_topics import _record_shared_reads

    LogStore(url).create_topic("m", 4, {"storage.layout": "shared", "auto.maintenance.enable": "false"})
    for n in range(17):
        _send(url, "m", n * 8, 8, 4)
    originals = set(_keys(url, "shared/"))
    assert len(originals) == 17
    before = _read(url, "m", 4)
    stale = Consumer(url, auto_offset_reset="earliest")
    stale.assign([TopicPartition("m", p) for p in range(4)])
    first = stale.poll(timeout_ms=300, max_records=3)  # a view naming the small objects, held across the merge
    assert LogStore(url).maintain("m")["merged"] == 1
    merged = set(_keys(url, "shared/")) - originals
    assert len(merged) == 1
    range_key = next(k for k in _keys(url, "topics/m/") if k.endswith(".g1.json"))
    entries = json.loads(open_store(url).get(range_key))["entries"]
    assert len(entries) == 16 * 4 and {e["object"] for e in entries} == merged
    spans: dict[int, list[tuple[int, int]]] = {}
    for e in entries:  # in the merged object a partition's runs are contiguous, in commit order
        spans.setdefault(e["partition"], []).append((e["rows"][0][0], e["rows"][-1][0] + e["rows"][-1][1]))
    assert all(runs[i][1] == runs[i + 1][0] for runs in spans.values() for i in range(len(runs) - 1))
    assert _read(url, "m", 4) == before
    # D later the covered commits go, then every shared object no commit names: the 16 copied ones.
    assert _collect_commits_later(url, "m", DELAY_MS + 1) == 16
    report = collect(open_store(url), now_ms=now_ms() + COMMIT_DEADLINE_MS + DELAY_MS + 1)
    assert report.deleted["shared"] == 16
    assert len(_keys(url, "shared/")) == 2  # the merged object, and the head commit's own
    seen = {tp.partition: [(r.offset, r.value, r.timestamp) for r in rs] for tp, rs in first.items()}
    while batch := stale.poll(timeout_ms=300, max_records=100_000):  # its objects are gone: it resolves again
        for tp, records in batch.items():
            seen.setdefault(tp.partition, []).extend((r.offset, r.value, r.timestamp) for r in records)
    stale.close()
    assert seen == before
    assert verify(LogRoot(url), "m").ok
    with Consumer(url, auto_offset_reset="earliest") as consumer:
        reads = _record_shared_reads(consumer, monkeypatch)
        consumer.assign([TopicPartition("m", p) for p in range(4)])
        while consumer.poll(timeout_ms=300, max_records=100_000):
            pass
    assert sorted(key for key, _ in reads) == sorted(_keys(url, "shared/"))  # each object read once


@pytest.mark.parametrize("how", ["explicit", "self-maintenance"])
def test_a_pass_moving_many_partitions_reads_each_shared_object_once(url: str, how: str) -> None:
    """Eight partitions due at once (PROTOCOL.md 10.2): their moves take their runs from one range read of each
    shared object, not one read per partition and object; every record reads back as before."""
    from coordinator.maintainer import maybe_maintain

    config = {**MOVE_NOW, "auto.maintenance.interval.ms": "0"}
    LogStore(url).create_topic("w", 8, config)
    for n in range(6):
        _send(url, "w", n * 64, 64, 8)
    before = _read(url, "w", 8)
    if how == "self-maintenance":  # enabled once written, so that no producer's pass moved anything first
        LogStore(url).alter_config("w", {"auto.maintenance.enable": "true"})
    root = LogRoot(url)
    reads = _recording_shared_reads(root)
    if how == "explicit":
        assert root.maintain("w")["merged"] == 8
    else:
        report = maybe_maintain(root, "w", owner="test")
        assert report.outcome == "done" and report.merged == 8
    assert sorted(reads) == _keys(url, "shared/")  # six objects, six reads
    assert len([k for k in _keys(url, "topics/w/") if "/log/" in k]) == 8
    assert _read(url, "w", 8) == before


def _send_sizes(url: str, topic: str, sizes: list[int], flushes: int) -> None:
    """``flushes`` flushes, each giving partition p about ``sizes[p]`` / ``flushes`` bytes of random values."""
    with Producer(url) as producer:
        for _ in range(flushes):
            values = [os.urandom(1000) for p, size in enumerate(sizes) for _ in range(size // 1000 // flushes)]
            partitions = [p for p, size in enumerate(sizes) for _ in range(size // 1000 // flushes)]
            producer.send_batch(topic, pa.table({"value": values, "partition": partitions}))


def _recording_shared_reads(root: LogRoot) -> list[str]:
    reads: list[str] = []
    inner = getattr(root.store, "inner", root.store)
    original = inner.get_range

    def recording(key: str, start: int, end: int) -> bytes:
        if key.startswith("shared/"):
            reads.append(key)
        return original(key, start, end)

    inner.get_range = recording  # type: ignore[method-assign]
    return reads


def _moved(url: str, topic: str) -> set[int]:
    return {int(k.split("/")[3]) for k in _keys(url, f"topics/{topic}/") if "/log/" in k}


@pytest.mark.parametrize("how", ["explicit", "self-maintenance"])
def test_partitions_near_their_bound_move_with_one_that_reached_it(url: str, how: str) -> None:
    """A flush writes most partitions, so they near the move's bound together (PROTOCOL.md 10.2): once one is
    due, a pass moves with it every partition past half the bound, in the same round, rather than reading every
    shared object again for each as it crosses; a partition below half stays in the shared objects."""
    from coordinator.maintainer import maybe_maintain

    # segment.bytes / 8 = 64 KiB: partition 0 is due, 1-6 past half of it, 7 below half.
    config = {**MOVE_NOW, "shared.move.ms": "3600000", "segment.bytes": str(512 * 1024)}
    LogStore(url).create_topic("near", 8, {**config, "auto.maintenance.interval.ms": "0"})
    _send_sizes(url, "near", [80_000] + [40_000] * 6 + [16_000], 4)
    before = _read(url, "near", 8)
    root = LogRoot(url)
    reads = _recording_shared_reads(root)
    if how == "explicit":
        assert root.maintain("near")["merged"] == 7
    else:
        LogStore(url).alter_config("near", {"auto.maintenance.enable": "true"})
        report = maybe_maintain(root, "near", owner="test")
        assert report.outcome == "done" and report.merged == 7
    assert _moved(url, "near") == set(range(7))
    assert sorted(reads) == _keys(url, "shared/")  # four objects, four reads for seven partitions
    assert _read(url, "near", 8) == before


def test_nothing_moves_early_while_no_partition_is_due(url: str) -> None:
    config = {**MOVE_NOW, "shared.move.ms": "3600000", "segment.bytes": str(512 * 1024)}
    LogStore(url).create_topic("early", 4, config)
    _send_sizes(url, "early", [60_000] * 4, 2)  # every partition past half of 64 KiB, none at it
    LogRoot(url).maintain("early")
    assert _moved(url, "early") == set()


def test_a_self_maintenance_pass_past_its_budget_finishes_the_round_it_read(url: str) -> None:
    """The budget cuts a pass between rounds of moves, never inside one: the partitions left would read every
    shared object again at the next pass."""
    from coordinator.maintainer import maybe_maintain

    config = {**MOVE_NOW, "auto.maintenance.interval.ms": "0"}
    LogStore(url).create_topic("budget", 8, config)
    for n in range(3):
        _send(url, "budget", n * 64, 64, 8)
    LogStore(url).alter_config("budget", {"auto.maintenance.enable": "true"})
    root = LogRoot(url)
    reads = _recording_shared_reads(root)
    report = maybe_maintain(root, "budget", owner="test", budget_s=0.0)
    assert report.merged == 8 and _moved(url, "budget") == set(range(8))
    assert sorted(reads) == _keys(url, "shared/")


def _one_partition_appends(producer: Producer, topic: str, count: int, first: int = 0, rows: int = 20) -> None:
    """``count`` small flushes, each into one partition (round robin over 4), waited for one by one."""
    for n in range(first, first + count):
        values = [b"v%d-%d" % (n, i) for i in range(rows)]
        producer.send_batch(topic, pa.table({"value": values, "partition": [n % 4] * rows}))


def _ranges(url: str, topic: str) -> list[str]:
    return [k.rsplit("/", 1)[-1] for k in _keys(url, f"topics/{topic}/") if k.endswith(".g1.json")]


def test_a_writer_merges_the_tier_of_small_commits_it_completes(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seventeen small one-partition flushes by a self-maintaining producer (PROTOCOL.md 10.2, *A writer merges its
    small tier*): its seventeenth commit completes the tier [0, 16), which it merges at once into a range naming
    one copied object, built from the bytes it wrote (no read of them); a consumer catching up then reads two
    shared objects, not seventeen, and every record."""
    from tests.test_shared_topics import _record_shared_reads

    LogStore(url).create_topic("tier", 4, {"storage.layout": "shared"})
    with Producer(url) as producer:
        writer_reads = _recording_shared_reads(producer.root)
        _one_partition_appends(producer, "tier", 16)
        assert _ranges(url, "tier") == []  # sixteen commits: the tier's last is the head
        _one_partition_appends(producer, "tier", 1, first=16)
    assert _ranges(url, "tier") == [f"{0:020d}-{16:020d}.g1.json"]
    assert writer_reads == []
    range_key = next(k for k in _keys(url, "topics/tier/") if k.endswith(".g1.json"))
    copied = {e["object"] for e in json.loads(open_store(url).get(range_key))["entries"]}
    assert len(copied) == 1 and len(_keys(url, "shared/")) == 17 + 1
    with Consumer(url, auto_offset_reset="earliest") as consumer:
        reads = _record_shared_reads(consumer, monkeypatch)
        consumer.assign([TopicPartition("tier", p) for p in range(4)])
        got = sorted(
            r.value for batch in iter(lambda: consumer.poll(timeout_ms=300), {}) for rs in batch.values() for r in rs
        )
    assert got == sorted(b"v%d-%d" % (n, i) for n in range(17) for i in range(20))
    assert len({key for key, _ in reads}) == 2  # the copy, and commit 16's own object


def test_only_the_writer_that_completes_a_tier_merges_it(url: str) -> None:
    """Two producers taking turns on one topic: the tier is merged once, by the one that made commit 16, so its
    runs are copied once (the other does not copy them again)."""
    LogStore(url).create_topic("turns", 4, {"storage.layout": "shared"})
    with Producer(url) as first, Producer(url) as second:
        for n in range(17):
            _one_partition_appends(first if n % 2 else second, "turns", 1, first=n)
    assert _ranges(url, "turns") == [f"{0:020d}-{16:020d}.g1.json"]
    assert len(_keys(url, "shared/")) == 17 + 1


@pytest.mark.parametrize("why", ["large-runs", "maintenance-off"])
def test_a_writer_leaves_a_tier_of_large_runs_or_an_unmaintained_topic_to_passes(url: str, why: str) -> None:
    """A tier holding more than ``segment.bytes`` / 8 (what a move would make a segment of) is left to passes,
    as is every tier of a topic whose ``auto.maintenance.enable`` is false."""
    config = {"storage.layout": "shared", "segment.bytes": str(64 * 1024)}  # a bound of 8 KiB
    if why == "maintenance-off":
        config = {"storage.layout": "shared", "auto.maintenance.enable": "false"}
    LogStore(url).create_topic("left", 4, config)
    with Producer(url) as producer:
        _one_partition_appends(producer, "left", 17, rows=100)  # about 1 KiB stored per flush: 16 KiB a tier
    assert _ranges(url, "left") == []
    assert len(_keys(url, "shared/")) == 17
