"""Shared topics (PROTOCOL.md 7.3): shared objects, commits, and every reader and writer of plog's client on them."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyspark_logsource import Consumer, LogStore, Producer, TopicPartition
from segment_format.errors import (
    CorruptRecordError,
    InvalidConfigError,
    StorageError,
    UnknownTopicOrPartitionError,
)
from segment_format.records import payload_batch
from segment_format.root import LogRoot
from segment_format.segment import BatchMeta
from segment_format.shared.commit import Commit, parse_commit_name
from segment_format.shared.object import SharedRun, build_shared_object, parse_shared_index, parse_shared_key
from segment_format.shared.sequence import TopicSequence
from segment_format.stores import open_store

SHARED = {"storage.layout": "shared"}


@pytest.fixture
def url(tmp_path: Path) -> str:
    return str(tmp_path / "root")


def _payload(values: list[bytes], keys: list[bytes | None] | None = None) -> pa.RecordBatch:
    return payload_batch([1_000] * len(values), keys or [None] * len(values), values, None)


def _read_all(url: str, topic: str, isolation: str = "read_uncommitted") -> dict[int, list[tuple[int, bytes]]]:
    out: dict[int, list[tuple[int, bytes]]] = {}
    with Consumer(url, auto_offset_reset="earliest", isolation_level=isolation) as consumer:
        partitions = LogStore(url).describe_topic(topic)["partitions"]
        consumer.assign([TopicPartition(topic, p["partition"]) for p in partitions])
        while batch := consumer.poll(timeout_ms=300, max_records=100_000):
            for tp, records in batch.items():
                out.setdefault(tp.partition, []).extend((r.offset, r.value) for r in records)
    return out


# ------------------------------------------------------------------ the object


def test_a_shared_object_holds_sorted_runs_with_relative_offsets_and_a_checked_index() -> None:
    runs = [
        SharedRun("b", "1" * 32, 2, [(_payload([b"b2-0", b"b2-1"]), BatchMeta())]),
        SharedRun("a", "0" * 32, 3, [(_payload([b"a3-0"]), BatchMeta()), (_payload([b"a3-1", b"a3-2"]), BatchMeta())]),
        SharedRun("a", "0" * 32, 0, [(_payload([b"a0-0"]), BatchMeta())]),
    ]
    shared = build_shared_object(runs, "lz4", 1_795_000_000_000, "w")
    assert parse_shared_key(shared.key) == (1_795_000_000_000, shared.meta.object_id)
    assert [(r.topic, r.partition) for r in shared.runs] == [("a", 0), ("a", 3), ("b", 2)]  # topic, then partition
    a3 = shared.runs[1]
    assert [(row["base_offset"], row["last_offset"]) for row in a3.rows] == [(0, 0), (1, 2)]  # relative to the run
    positions = [row["position"] for run in shared.runs for row in run.rows]
    assert positions == sorted(positions)  # one partition's run, one topic's runs: contiguous byte ranges
    index = parse_shared_index(shared.key, shared.data)
    assert index.meta.record_count == 6 and set(index.runs()) == {("a", 0), ("a", 3), ("b", 2)}
    damaged = bytearray(shared.data)
    damaged[-30] ^= 0xFF  # inside the index
    with pytest.raises(CorruptRecordError, match="CRC32C"):
        parse_shared_index(shared.key, bytes(damaged))
    assert parse_shared_key("shared/123.arrow") is None


# ------------------------------------------------------------------ commits


def test_commits_tile_each_partition_and_carry_every_partitions_end(url: str) -> None:
    LogStore(url).create_topic("s", 3, SHARED)
    with Producer(url) as producer:
        producer.send_batch(
            "s", pa.table({"value": [b"x%d" % i for i in range(30)], "partition": [i % 3 for i in range(30)]})
        )
        producer.send_batch("s", pa.table({"value": [b"y%d" % i for i in range(5)], "partition": [1] * 5}))
    root = LogRoot(url)
    sequence = root.sequence("s")
    sequence.resolve()
    heads = [e.commit for e in sequence.elements]
    assert heads[-1].ends == [10, 15, 10]
    for before, after in zip(heads, heads[1:], strict=False):
        assert len(after.ends) >= len(before.ends)
        for entry in after.entries:
            assert entry.base_offset == before.end_of(entry.partition)
    read = _read_all(url, "s")
    assert [o for o, _ in read[1]] == list(range(15))
    assert [v for _, v in read[1]][-5:] == [b"y%d" % i for i in range(5)]


def test_a_send_batch_into_many_partitions_writes_one_object_and_one_commit(url: str) -> None:
    LogStore(url).create_topic("wide", 64, SHARED)
    with Producer(url) as producer:
        result = producer.send_batch(
            "wide", pa.table({"key": [b"k%d" % i for i in range(2000)], "value": [b"v"] * 2000})
        )
    assert len(result.offsets) == 64
    store = open_store(url)
    objects = [i.key for i in store.list("shared/")]
    commits = [i.key for i in store.list("topics/wide/") if "/commits/" in i.key]
    assert len(objects) == 1 and len(commits) == 1
    assert sum(len(v) for v in _read_all(url, "wide").values()) == 2000


def _record_shared_reads(consumer: Consumer, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every read of a shared object's bytes the consumer makes from now on: (key, bytes read)."""
    reads: list[tuple[str, int]] = []
    inner = consumer.root.store.inner
    original = inner.get_range_buffer

    def recording(key: str, start: int, end: int) -> pa.Buffer:
        if key.startswith("shared/"):
            reads.append((key, end - start))
        return original(key, start, end)

    monkeypatch.setattr(inner, "get_range_buffer", recording)
    return reads


def _drain(consumer: Consumer) -> int:
    """Poll until a poll returns nothing; how many records came."""
    got = 0
    while batch := consumer.poll(timeout_ms=300, max_records=100_000):
        got += sum(len(records) for records in batch.values())
    return got


def test_a_consumer_of_many_partitions_reads_a_shared_object_once(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    LogStore(url).create_topic("fan", 8, {**SHARED, "shared.move.ms": "3600000"})
    with Producer(url) as producer:
        for flush in range(5):
            values = [b"f%d-%d-" % (flush, i) + b"x" * 2000 for i in range(400)]
            producer.send_batch("fan", pa.table({"value": values, "partition": [i % 8 for i in range(400)]}))
    objects = {i.key: i.size for i in open_store(url).list("shared/")}
    assert len(objects) == 5

    with Consumer(url, auto_offset_reset="earliest") as everything:
        reads = _record_shared_reads(everything, monkeypatch)
        everything.assign([TopicPartition("fan", p) for p in range(8)])
        assert _drain(everything) == 2000
    # One range per shared object for all eight partitions, not one per partition and object.
    assert sorted(key for key, _ in reads) == sorted(objects)

    with Consumer(url, group_id="all", auto_offset_reset="earliest") as member:  # assigned by its group
        reads = _record_shared_reads(member, monkeypatch)
        member.subscribe(["fan"])
        got = 0
        while got < 2000:
            got += sum(len(records) for records in member.poll(timeout_ms=1000, max_records=100_000).values())
    assert sorted(key for key, _ in reads) == sorted(objects)

    with Consumer(url, auto_offset_reset="earliest") as one:
        reads = _record_shared_reads(one, monkeypatch)
        one.assign([TopicPartition("fan", 3)])
        values = []
        while batch := one.poll(timeout_ms=300, max_records=100_000):
            values += [r.value for records in batch.values() for r in records]
    assert len(values) == 250 and all(v.split(b"-")[1] in {b"%d" % i for i in range(3, 400, 8)} for v in values)
    # A consumer of one partition reads its runs only: about an eighth of each object.
    assert sorted(key for key, _ in reads) == sorted(objects)
    assert all(size < objects[key] / 4 for key, size in reads)


def test_a_backlog_larger_than_the_kept_spans_is_still_read_one_range_per_object(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer of eight partitions catching up on twelve 1 MiB shared objects while it keeps at most 3 MiB of
    spans: its rounds share their bytes (at most a third of the kept spans) out over the partitions, which so move
    through the objects side by side, and each object's span serves all eight before it is evicted."""
    LogStore(url).create_topic("lag", 8, {**SHARED, "shared.move.ms": "3600000"})
    with Producer(url) as producer:
        for flush in range(12):
            values = [b"%d-%d-" % (flush, i) + os.urandom(2000) for i in range(512)]
            producer.send_batch("lag", pa.table({"value": values, "partition": [i % 8 for i in range(512)]}))
    objects = sorted(i.key for i in open_store(url).list("shared/"))
    assert len(objects) == 12
    with Consumer(url, auto_offset_reset="earliest", fetch_max_bytes=2 * 2**20) as consumer:
        consumer.root.index_cache.spans.capacity_bytes = 3 * 2**20
        reads = _record_shared_reads(consumer, monkeypatch)
        consumer.assign([TopicPartition("lag", p) for p in range(8)])
        got = 0
        while batch := consumer.poll(timeout_ms=300, max_records=100_000):
            got += sum(len(records) for records in batch.values())
    assert got == 12 * 512
    assert sorted(key for key, _ in reads) == objects


def test_a_shared_object_larger_than_a_window_is_read_in_windows_not_per_partition(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flush can outgrow the longest span read at once (a slow store lets buffers pile up behind a flush): its
    runs are then read in windows packed from the lowest run on, each once for every partition it holds, not
    one range per partition."""
    from segment_format.log import shared_spans

    monkeypatch.setattr(shared_spans, "MAX_SPAN_BYTES", 256 * 1024)
    LogStore(url).create_topic("big", 16, {**SHARED, "shared.move.ms": "3600000"})
    with Producer(url) as producer:
        for _flush in range(2):
            values = [os.urandom(1000) for _ in range(1024)]
            producer.send_batch("big", pa.table({"value": values, "partition": [i % 16 for i in range(1024)]}))
    objects = {i.key: i.size for i in open_store(url).list("shared/")}
    assert len(objects) == 2 and all(size > 4 * 256 * 1024 for size in objects.values())
    with Consumer(url, auto_offset_reset="earliest") as consumer:
        reads = _record_shared_reads(consumer, monkeypatch)
        consumer.assign([TopicPartition("big", p) for p in range(16)])
        assert _drain(consumer) == 2048
    for key, size in objects.items():
        windows = [n for k, n in reads if k == key]
        assert sum(windows) <= size and all(n <= 256 * 1024 for n in windows)
        assert len(windows) <= size // (192 * 1024) + 1  # windows packed near full, far fewer than 16 partitions


def test_a_span_wanted_by_many_threads_at_once_is_read_once_and_a_failed_read_fails_them_all() -> None:
    """Readers that reach one span of a shared object together (a gateway's fetches, woken by one notice) share
    one read of it; when that read fails, each of them gets the error, and a later read tries again."""
    from segment_format.log.shared_spans import SharedSpans

    spans = SharedSpans()
    calls: list[int] = []
    gate = threading.Event()

    def slow_read() -> pa.Buffer:
        calls.append(1)
        gate.wait(5)
        return pa.py_buffer(b"x" * 100)

    results: list[Any] = [None] * 8
    arrived = threading.Barrier(9)

    def reader(i: int, read: Any) -> None:
        arrived.wait(5)
        try:
            results[i] = spans.read("shared/a", 0, read).to_pybytes()
        except OSError as exc:
            results[i] = exc

    threads = [threading.Thread(target=reader, args=(i, slow_read)) for i in range(8)]
    for thread in threads:
        thread.start()
    arrived.wait(5)
    time.sleep(0.2)  # from the barrier to the span: microseconds; its read returns only after this
    gate.set()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and results == [b"x" * 100] * 8
    assert spans.covering("shared/a", 10, 20) is not None

    gate.clear()

    def failing_read() -> pa.Buffer:
        calls.append(1)
        gate.wait(5)
        raise OSError("the store failed")

    threads = [threading.Thread(target=reader, args=(i, failing_read)) for i in range(8)]
    for thread in threads:
        thread.start()
    arrived.wait(5)
    time.sleep(0.2)
    gate.set()
    for thread in threads:
        thread.join()
    assert len(calls) == 2 and all(isinstance(r, OSError) for r in results)
    assert spans.read("shared/a", 0, lambda: pa.py_buffer(b"y")).to_pybytes() == b"y"  # nothing left pending


def test_a_consumer_following_many_partitions_probes_the_head_once_per_round(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight partitions followed at their end (PROTOCOL.md 9.1): a round probes the topic's next commit once for
    all of them, not once per partition; a new flush is still read by the next polls."""
    from segment_format.shared.sequence import TopicSequence

    LogStore(url).create_topic("tail", 8, SHARED)
    with Producer(url) as producer:
        producer.send_batch("tail", pa.table({"value": [b"a"] * 8, "partition": list(range(8))}))
    probes: list[str] = []
    original = TopicSequence._read

    def recording(self: TopicSequence, key: str, first: int, end: int) -> Any:
        probes.append(key)
        return original(self, key, first, end)

    with Consumer(url, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("tail", p) for p in range(8)])
        got = 0
        while got < 8:
            got += sum(len(r) for r in consumer.poll(timeout_ms=2000, max_records=100).values())
        consumer.root.index_cache.round_started = time.monotonic()  # a round begins, as a fetch begins one
        monkeypatch.setattr(TopicSequence, "_read", recording)
        for log in [consumer.root.partition("tail", p) for p in range(8)]:
            log.chain.follow_runs()  # a round's tail checks, as the fetcher makes them
        assert len(probes) == 1, probes
        with Producer(url) as producer:
            producer.send_batch("tail", pa.table({"value": [b"b"] * 8, "partition": list(range(8))}))
        got = 0
        deadline = time.monotonic() + 10
        while got < 8 and time.monotonic() < deadline:
            got += sum(len(r) for r in consumer.poll(timeout_ms=200).values())
        assert got == 8


def test_racing_committers_never_claim_an_offset_twice(url: str) -> None:
    """Threads of separate roots (as separate processes) commit to one topic at once: each lost race is retried
    on the winner's state, and every partition's offsets are claimed once, contiguously."""
    LogStore(url).create_topic("race", 4, SHARED)
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            with Producer(url, linger_ms=0) as producer:
                for i in range(15):
                    producer.send_batch("race", pa.table({"value": [b"w%d-%d" % (n, i)] * 3, "partition": [i % 4] * 3}))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    read = _read_all(url, "race")
    assert sum(len(v) for v in read.values()) == 4 * 15 * 3
    for records in read.values():
        assert [o for o, _ in records] == list(range(len(records)))


def test_a_writer_knows_its_share_of_the_recent_commits(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Commits name their writer process; a writer weighs its courtesy wait by its share of the last 10 s of
    commits against an equal share of the writers seen (PROTOCOL.md 7.3, *Contention*): five commits of eight
    make one writer of two 1.25 times its due, the other 0.75."""
    from segment_format.log import partition_log
    from segment_format.records import now_ms

    LogStore(url).create_topic("turns", 2, SHARED)
    producers = []
    for n in range(2):  # two writer processes, as their ids tell them apart
        monkeypatch.setitem(partition_log._WRITER_IDS, os.getpid(), f"writer-{n}")  # noqa: SLF001
        producer = Producer(url, linger_ms=0)
        producer.send_batch("turns", pa.table({"value": [b"first"], "partition": [0]}))
        producers.append(producer)
    for n in (0, 0, 1, 0, 0, 1):
        producers[n].send_batch("turns", pa.table({"value": [b"v%d" % n], "partition": [n]}))
    shares = []
    for producer in producers:
        sequence = producer.root.sequence("turns")
        sequence.resolve()
        assert {e.commit.writer for e in sequence.elements} == {"writer-0", "writer-1"}
        shares.append(sequence._share(now_ms()))  # noqa: SLF001
        producer.close()
    assert shares == [pytest.approx(1.25), pytest.approx(0.75)]  # 5 of 8 commits, and 3 of 8, of two writers


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 5), st.integers(1, 4)), min_size=1, max_size=12))
def test_interleaved_writers_with_stale_views_tile_every_partition(tmp_path_factory: Any, plan: list[Any]) -> None:
    """Writers (each its own root, so its own view of the head) commit in any interleaving: a writer behind the
    head loses, reads the winner's commit, and retries on its state; no offset is claimed twice, none skipped."""
    url = str(tmp_path_factory.mktemp("shared") / "root")
    LogStore(url).create_topic("t", 6, SHARED)
    roots = [LogRoot(url) for _ in range(3)]
    sent: dict[int, int] = {}
    for writer, partition, count in plan:
        log = roots[writer].partition("t", partition)
        log.append([(_payload([b"v"] * count), BatchMeta())], notify=False)
        sent[partition] = sent.get(partition, 0) + count
    fresh = LogRoot(url)
    for partition, count in sent.items():
        view = fresh.partition("t", partition).view()
        assert view.end_offset == count
        batches, _ = fresh.partition("t", partition).read(0)
        assert [o for b in batches for o in b.column(0).to_pylist()] == list(range(count))


class _LoseAnswerOnce:
    """A store whose first ``put_if_absent`` of a commit takes effect, then raises: an answer lost on the way."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.lost = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def put_if_absent(self, key: str, data: bytes, **kwargs: Any) -> bool:
        created = self._store.put_if_absent(key, data, **kwargs)
        if "/commits/" in key and not self.lost:
            self.lost += 1
            raise StorageError(f"connection reset after the create of {key}")
        return created


def test_a_partitions_commit_part_is_found_from_the_head_back(url: str) -> None:
    """A writer that nothing maintains yet keeps a long chain in memory: finding a partition's runs past an
    offset reads the commits from the head back to that offset, not the whole chain, and finds what a walk of
    the whole chain finds (each commit's runs start where the one before left the partition)."""
    LogStore(url).create_topic("s", 2, SHARED)
    with Producer(url) as producer:
        for n in range(12):
            producer.send_batch("s", pa.table({"value": [b"v%d" % n] * 2, "partition": [0, 1]}))
            producer.flush()
    sequence = LogRoot(url).sequence("s")
    sequence.resolve()
    whole = {p: sequence.entries_for(p, 0) for p in (0, 1)}
    assert [entry.base_offset for _, entry in whole[0]] == list(range(12))

    class Unread:
        @property
        def entries(self) -> list[Any]:
            raise AssertionError("a commit behind the chain end was read")

    tail = sequence.elements[-3:]
    # The commit ending at offset 9 is read (it shows where to stop); none before it is.
    sequence.elements[:-4] = [type(e)(e.first, e.end, e.generation, e.key, Unread()) for e in sequence.elements[:-4]]
    for partition in (0, 1):
        found = sequence.entries_for(partition, 9)
        assert [entry.base_offset for _, entry in found] == [9, 10, 11]
        assert [element for element, _ in found] == tail
        assert found == whole[partition][-3:]


def test_a_commit_whose_answer_was_lost_is_recognised_as_its_own(url: str) -> None:
    LogStore(url).create_topic("s", 2, SHARED)
    root = LogRoot(url)
    store = _LoseAnswerOnce(root.data_store)
    sequence = TopicSequence(store, root.sequence("s").incarnation, dict(root.topic("s").config), "s")  # type: ignore[arg-type]
    shared = build_shared_object(
        [SharedRun("s", root.topic("s").topic_id, 1, [(_payload([b"a", b"b"]), BatchMeta())])], "lz4", 1, "w"
    )
    root.data_store.put_if_absent(shared.key, shared.data)
    from segment_format.records import now_ms

    commit = sequence.commit(shared.runs, shared.key, now_ms(), partitions=2)
    assert store.lost == 1 and commit.sequence == 0
    keys = [i.key for i in root.store.list("topics/s/") if "/commits/" in i.key]
    assert len(keys) == 1  # the retry found its own commit: nothing was claimed twice
    assert _read_all(url, "s")[1] == [(0, b"a"), (1, b"b")]


def test_a_commit_with_fewer_partitions_than_the_one_before_is_corrupt(url: str) -> None:
    LogStore(url).create_topic("s", 2, SHARED)
    with Producer(url) as producer:
        producer.send_batch("s", pa.table({"value": [b"a", b"b"], "partition": [0, 1]}))
    root = LogRoot(url)
    prefix = root.sequence("s").incarnation + "commits/"
    first = Commit.from_json(root.store.get(prefix + "00000000000000000000.json"))
    shrunk = Commit(1, "f" * 32, 1, 1, [], first.ends[:1], first.max_timestamps[:1])
    root.store.put_if_absent(prefix + "00000000000000000001.json", shrunk.to_json())
    with pytest.raises(CorruptRecordError, match="fewer than"):
        LogRoot(url).sequence("s").resolve()
    assert parse_commit_name("00000000000000000001.json") == (1, 2, 0)


def test_partitions_added_while_a_writer_with_old_metadata_commits_keep_their_ends(url: str) -> None:
    store = LogStore(url)
    store.create_topic("s", 2, SHARED)
    stale = LogRoot(url)
    stale_log = stale.partition("s", 0)  # holds the 2-partition metadata
    store.create_partitions("s", 3)
    fresh = LogRoot(url)
    fresh.partition("s", 2).append([(_payload([b"new"] * 4), BatchMeta())])
    stale_log.append([(_payload([b"old"]), BatchMeta())])  # loses the race, retries on the winner's state
    head = LogRoot(url).sequence("s")
    head.resolve()
    assert head.head is not None and head.head.ends == [1, 0, 4]
    assert [len(v) for _, v in sorted(_read_all(url, "s").items())] == [1, 4]


# ------------------------------------------------------------------ topics, configs, old and new


def test_the_layout_is_fixed_at_creation_and_partitioned_topics_live_beside_shared_ones(url: str) -> None:
    store = LogStore(url)
    store.create_topic("new", 2, SHARED)  # the root's first topic: its protocol object 0 lists the feature
    store.create_topic("old", 2, {"storage.layout": "partitioned"})
    store.create_topic("default", 1)
    assert store.describe_topic("old")["config"]["storage.layout"] == "partitioned"
    assert store.describe_topic("default")["config"]["storage.layout"] == "shared"  # where the root offers it
    with pytest.raises(InvalidConfigError, match="fixed when the topic is created"):
        store.alter_config("new", {"storage.layout": "partitioned"})
    with pytest.raises(InvalidConfigError, match="did you mean 'shared'"):
        store.create_topic("typo", 1, {"storage.layout": "shard"})
    with Producer(url) as producer:
        for topic in ("old", "new"):
            producer.send_batch(topic, pa.table({"value": [b"%s-%d" % (topic.encode(), i) for i in range(6)]}))
    for topic in ("old", "new"):
        assert sorted(v for recs in _read_all(url, topic).values() for _, v in recs) == sorted(
            b"%s-%d" % (topic.encode(), i) for i in range(6)
        )
    protocol = json.loads(open_store(url).get("_protocol/00000000000000000000.json"))
    assert "sharedObjects" in protocol["reader_features"] and "boundedHistory" in protocol["writer_features"]


def test_log_append_time_is_the_commits_and_never_goes_back(url: str) -> None:
    LogStore(url).create_topic("t", 1, {**SHARED, "message.timestamp.type": "LogAppendTime"})
    with Producer(url, linger_ms=0) as producer:
        for i in range(5):
            producer.send("t", b"%d" % i, timestamp_ms=1_000).get(10)
    root = LogRoot(url)
    batches, _ = root.partition("t", 0).read(0)
    stamps = [t for b in batches for t in b.column(1).cast(pa.int64()).to_pylist()]
    assert stamps == sorted(stamps) and min(stamps) > 1_000  # the commits' times, not the producer's
    commits = root.sequence("t")
    commits.resolve()
    assert stamps[-1] == commits.head.append_ms  # type: ignore[union-attr]


def test_transactions_on_a_shared_topic_are_all_or_nothing(url: str) -> None:
    LogStore(url).create_topic("t", 3, SHARED)
    with Producer(url, transactional_id="tx") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send_batch("t", pa.table({"value": [b"aborted"] * 6, "partition": [0, 1, 2] * 2}))
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send_batch("t", pa.table({"value": [b"committed"] * 6, "partition": [0, 1, 2] * 2}))
        producer.commit_transaction()
    committed = _read_all(url, "t", "read_committed")
    assert sorted(v for recs in committed.values() for _, v in recs) == [b"committed"] * 6
    everything = _read_all(url, "t")
    assert sum(len(v) for v in everything.values()) == 12


def test_a_typed_shared_topic_round_trips(url: str) -> None:
    schema = pa.schema([pa.field("user", pa.string()), pa.field("clicks", pa.int64())])
    LogStore(url).create_topic("typed", 2, SHARED, value_schema=schema)
    rows = pa.table({"user": ["a", "b", "c"], "clicks": [1, 2, 3]})
    with Producer(url) as producer:
        producer.send_batch("typed", rows)
    with Consumer(url, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("typed", 0), TopicPartition("typed", 1)])
        table = consumer.poll_arrow(timeout_ms=1000)
    assert sorted(v["user"] for v in table.column("value").to_pylist()) == ["a", "b", "c"]


def test_sends_into_many_partitions_flush_as_one_object_and_one_commit(url: str) -> None:
    LogStore(url).create_topic("wide", 64, SHARED)
    with Producer(url, linger_ms=50) as producer:
        futures = [producer.send("wide", b"v%d" % i, key=b"k%d" % i) for i in range(3000)]
        producer.flush()
        offsets = {(f.get(10).partition, f.get(10).offset) for f in futures}
    assert len(offsets) == 3000
    store = open_store(url)
    objects = [i.key for i in store.list("shared/")]
    commits = [i.key for i in store.list("topics/wide/") if "/commits/" in i.key]
    assert len(objects) == len(commits) <= 8  # a flush per linger, whatever the number of partitions it touches
    assert sum(len(v) for v in _read_all(url, "wide").values()) == 3000


def test_a_waiting_reader_of_a_shared_topic_is_woken_by_its_next_commit_not_a_notice(url: str) -> None:
    """A shared topic's writer writes no topic notice (its commits are its notice, PROTOCOL.md 9.1): readers
    parked on it, alone or beside another topic, are woken by the next commit and the root notice."""
    store = LogStore(url)
    store.create_topic("s", 4, SHARED)
    store.create_topic("p", 1, {"storage.layout": "partitioned"})
    with Producer(url) as producer:
        producer.send_batch("s", pa.table({"value": [b"a"] * 4, "partition": [0, 1, 2, 3]}))
    for topics in (["s"], ["s", "p"]):
        with Consumer(url, auto_offset_reset="earliest", notice_interval_ms=50) as consumer:
            consumer.assign([TopicPartition(t, p) for t in topics for p in range(4 if t == "s" else 1)])
            while consumer.poll(timeout_ms=200):
                pass
            assert consumer._fetcher.waiting is not None and consumer._fetcher.waiting.parked  # parked at the end
            with Producer(url) as producer:
                producer.send_batch("s", pa.table({"value": [b"b"] * 4, "partition": [0, 1, 2, 3]}))
            got: list[bytes] = []
            while len(got) < 4 and (batch := consumer.poll(timeout_ms=5_000)):
                got.extend(r.value for rs in batch.values() for r in rs)
            assert got == [b"b"] * 4
    names = [i.key for i in open_store(url).list("topics/s/")]
    assert not any(k.endswith("notice.json") for k in names)  # no topic notice was ever written


def test_consecutive_send_batch_calls_share_flushes_and_keep_their_order_with_sends(url: str) -> None:
    """``send_batch(wait=False)`` tables linger with the topic's records (``linger_ms``, ``batch_size``): many
    small tables into 16 partitions are a few objects and commits, written after the records sent before
    them and before those sent after; ``get()`` gives each table's offsets."""
    LogStore(url).create_topic("s", 16, SHARED)
    with Producer(url, linger_ms=60_000, batch_size=64 * 1024) as producer:
        before = producer.send("s", b"first", partition=3)
        futures = [
            producer.send_batch(
                "s",
                pa.table({"value": [b"t%d-%d" % (t, i) for i in range(16)], "partition": list(range(16))}),
                wait=False,
            )
            for t in range(20)
        ]
        after = producer.send("s", b"last", partition=3)
        assert not any(f.is_done() for f in futures)  # lingering: 20 small tables, far below batch_size
        producer.flush()
        results = [f.get(timeout=10) for f in futures]
    assert before.get().offset == 0 and after.get().offset == 21
    assert [r.offsets[3] for r in results] == [(t + 1, t + 1) for t in range(20)]
    store = open_store(url)
    assert len(store.list("shared/")) <= 2  # one flush (two if the first send's buffer went alone)
    read = _read_all(url, "s")
    assert [v for _, v in read[3]] == [b"first", *[b"t%d-3" % t for t in range(20)], b"last"]
    assert all(len(read[p]) == 20 for p in range(16) if p != 3)


def test_send_batch_refuses_bad_rows_at_once_in_either_mode(url: str) -> None:
    store = LogStore(url)
    store.create_topic("s", 2, SHARED)
    with Producer(url, linger_ms=60_000) as producer:
        for wait in (True, False):  # routing refuses before anything is queued, whichever the mode
            with pytest.raises(UnknownTopicOrPartitionError, match="partition 7 does not exist"):
                producer.send_batch("s", pa.table({"value": [b"x"], "partition": [7]}), wait=wait)


def test_a_pipelined_tables_write_error_reaches_its_get(faulty_s3: Any) -> None:
    """A store that refuses every shared object (injected by the fault proxy): a waiting ``send_batch`` raises
    the store's error, a pipelined one's ``get()`` does, and neither claimed an offset (the next table's is 0)."""
    options = {**faulty_s3.options, "plog_deadline_ms": 1_500}
    LogStore(faulty_s3.url, storage_options=options).create_topic("s", 4, SHARED)
    faulty_s3.inject(seed=3, probability=1.0, kinds=["internal"], methods=frozenset({"PUT"}), key_pattern="shared/")
    with Producer(faulty_s3.url, storage_options=options, linger_ms=60_000) as producer:
        with pytest.raises(StorageError):
            producer.send_batch("s", pa.table({"value": [b"a"] * 4, "partition": [0, 1, 2, 3]}))
        future = producer.send_batch("s", pa.table({"value": [b"b"] * 4, "partition": [0, 1, 2, 3]}), wait=False)
        producer.flush()
        with pytest.raises(StorageError):
            future.get(timeout=30)
        faulty_s3.calm()
        assert producer.send_batch("s", pa.table({"value": [b"c"], "partition": [2]})).offsets == {2: (0, 0)}


def test_verify_names_a_damaged_commit_and_a_damaged_shared_object(url: str) -> None:
    from segment_format.inspect.verify import verify

    LogStore(url).create_topic("s", 4, SHARED)
    with Producer(url) as producer:
        for n in range(2):
            producer.send_batch("s", pa.table({"value": [b"r%d" % n] * 8, "partition": [0, 1, 2, 3] * 2}))
    clean = verify(url, "s")
    assert clean.ok and clean.objects == 2 and clean.records == 16
    root = Path(url)
    first, second = sorted((root / "topics" / "s").rglob("commits/*.json"))
    first.write_bytes(first.read_bytes().replace(b'"ends"', b'"endz"'))
    entry = json.loads(second.read_bytes())["entries"][0]  # the second flush's partition 0
    shared = root / entry["object"]
    data = bytearray(shared.read_bytes())
    data[entry["rows"][0][0] + 100] ^= 0xFF  # inside its run's first batch
    shared.write_bytes(bytes(data))
    problems = verify(url, "s").problems
    by_kind = {row.problem: row for row in problems.itertuples()}
    assert by_kind["commit"].object.endswith(first.name)  # the commit is named
    damaged = by_kind["batch checksum"]
    assert damaged.object == f"shared/{shared.name}" and damaged.partition == 0 and damaged.offset == 2


def test_verify_names_a_damaged_section_schema_message_and_end_of_stream(url: str) -> None:
    """The bytes of a shared object no batch CRC covers (PROTOCOL.md 7.3): a section's schema message and its
    end-of-stream marker, which a plain Arrow stream reader of the object depends on."""
    from segment_format.inspect.verify import verify

    LogStore(url).create_topic("s", 2, SHARED)
    with Producer(url) as producer:
        producer.send_batch("s", pa.table({"value": [b"v"] * 4, "partition": [0, 1] * 2}))
    (shared,) = (Path(url) / "shared").iterdir()
    entry = json.loads(next((Path(url) / "topics" / "s").rglob("commits/*.json")).read_bytes())["entries"][0]
    pristine = shared.read_bytes()
    data = bytearray(pristine)
    data[entry["rows"][0][0] // 2] ^= 0xFF  # inside the schema message that opens the section
    shared.write_bytes(bytes(data))
    problems = verify(url, "s").problems
    assert "schema message" in set(problems["problem"]) and set(problems["object"]) == {f"shared/{shared.name}"}
    data = bytearray(pristine)
    last = max(
        e["rows"][-1][0] + e["rows"][-1][1]
        for e in json.loads(next((Path(url) / "topics" / "s").rglob("commits/*.json")).read_bytes())["entries"]
    )
    data[last] ^= 0xFF  # the end-of-stream marker after the section's last batch
    shared.write_bytes(bytes(data))
    assert set(verify(url, "s").problems["problem"]) == {"framing"}
    shared.write_bytes(pristine)
    assert verify(url, "s").ok


def test_a_shared_object_is_listed_once_with_its_partitions(url: str) -> None:
    from pyspark_logsource.views.cards import TopicView
    from segment_format.inspect.listings import shared_objects

    LogStore(url).create_topic("s", 4, SHARED)
    LogStore(url).create_topic("p", 2, {"storage.layout": "partitioned"})
    with Producer(url) as producer:
        producer.send_batch("s", pa.table({"value": [b"a"] * 8, "partition": [0, 1, 2, 3] * 2}))
        producer.send_batch("s", pa.table({"value": [b"b"] * 2, "partition": [2, 2]}))
    frame = shared_objects(url, "s")
    assert [(row.commits, row.partitions, row.records) for row in frame.itertuples()] == [
        ([0], [0, 1, 2, 3], 8),
        ([1], [2], 2),
    ]
    assert set(frame["object"]) == {info.key for info in open_store(url).list("shared/")}
    assert TopicView(url, "s").shared_objects().equals(frame)
    assert shared_objects(url, "p").empty  # a partitioned topic has none
