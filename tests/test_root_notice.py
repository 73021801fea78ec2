"""The root change notice (PROTOCOL.md 9.1): idle cost flat in the number of topics.

Writers replace ``_notice.json`` after the topic notices of every write; a reader waiting on
several topics reads it once per interval and reads topic notices only after it changed.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pyspark_logsource import Consumer, LogStore, Producer
from pyspark_logsource.gateway.tails import TailWatch
from segment_format import notice as notice_module
from segment_format.errors import StorageError
from segment_format.layout import ROOT_NOTICE_KEY, notice_key
from segment_format.notice import (
    CHANGE_NOTICES,
    ROOT_NOTICE,
    ChangeNotice,
    NoticeWatch,
    ParkedPartitions,
    RootNotice,
    read_notice,
    read_root_notice,
)
from segment_format.protocol import INITIAL, ProtocolVersion, protocol_key
from segment_format.records import now_ms, payload_batch
from segment_format.root import LogRoot
from segment_format.segment import BatchMeta
from segment_format.stores import open_store
from segment_format.stores.local import LocalStore
from tests.counting_store import CountingStore

TOPICS = [f"wide-{i:03d}" for i in range(60)]
PATTERN = r"wide-\d+"


def _make_root(
    path: Path, topics: list[str], protocol: ProtocolVersion | None = None, layout: str = "partitioned"
) -> str:
    """A root holding ``topics`` (one partition each); with ``protocol``, object 0 is that one, written first.

    Partitioned by default: these tests are about topic notices and the root notice after them (9.1); a
    shared topic has no notice of its own (its next commit is one), tested with ``layout="shared"``."""
    url = str(path / "root")
    if protocol is not None:
        open_store(url).put_if_absent(protocol_key(0), protocol.to_json())
    with LogStore(url) as admin:
        for topic in topics:
            admin.create_topic(topic, 1, config={"retention.ms": -1, "storage.layout": layout})
    return url


def _silent_append(url: str, topic: str, value: bytes, topic_notice_nonce: str) -> None:
    """Append as a writer that replaces the topic's notice but not the root's (one of an older version)."""
    with LogRoot(url) as root:
        root.partition(topic, 0).append([(payload_batch([now_ms()], [None], [value]), BatchMeta())], notify=False)
        key = notice_key(topic, root.topic(topic).topic_id)
        root.store.replace(key, ChangeNotice(topic_notice_nonce).to_json())


def _root_notice(url: str) -> RootNotice | None:
    data = read_root_notice(open_store(url))
    return None if data is None else RootNotice.from_json(data)


def _settled_consumer(url: str, **config: Any) -> Consumer:
    """A consumer subscribed by pattern, polled until every partition waits on a notice."""
    consumer = Consumer(url, auto_offset_reset="earliest", **config)
    consumer.subscribe(pattern=PATTERN)
    deadline = time.monotonic() + 30
    waiting = consumer._fetcher.waiting
    assert waiting is not None
    while len(waiting.parked) < len(TOPICS):
        assert time.monotonic() < deadline, f"only {len(waiting.parked)} partitions parked"
        assert consumer.poll(timeout_ms=100) == {}
    return consumer


def _requests(consumer: Consumer) -> int:
    return int(consumer.root.store.requests)  # type: ignore[attr-defined]


def _poll_until(consumer: Consumer, expected: set[bytes], timeout_s: float) -> tuple[set[bytes], float]:
    """Poll until every value of ``expected`` came (or the deadline); what came, and how long it took."""
    got: set[bytes] = set()
    started = time.monotonic()
    while not expected <= got and time.monotonic() - started < timeout_s:
        for records in consumer.poll(timeout_ms=50).values():
            got.update(r.value for r in records)
    return got, time.monotonic() - started


@pytest.fixture
def wide(tmp_path: Path) -> str:
    return _make_root(tmp_path, TOPICS)


# ---------------------------------------------------------------------------- writers


def test_every_write_replaces_the_root_notice_after_its_topic_notices(wide: str) -> None:
    created = _root_notice(wide)
    assert created is not None and created.topics == (TOPICS[-1],)  # written by the last topic's creation
    with LogRoot(wide) as root:
        assert ROOT_NOTICE in root.protocol.version.writer_features  # a new root lists the feature
    order: list[str] = []
    real = LocalStore.replace

    def recording(self: LocalStore, key: str, data: bytes) -> None:
        order.append("root" if key == ROOT_NOTICE_KEY else key.split("/")[1])
        real(self, key, data)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LocalStore, "replace", recording)
        with Producer(wide, linger_ms=0) as producer:
            producer.send(TOPICS[3], b"one").get(timeout=10)
        assert order == [TOPICS[3], "root"]
        order.clear()
        with Producer(wide, transactional_id="tx", linger_ms=0) as producer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send(TOPICS[1], b"a")
            producer.send(TOPICS[2], b"b")
            producer.flush()
            order.clear()  # the appends announced themselves; the commit announces both topics once
            producer.commit_transaction()
        assert order == [TOPICS[1], TOPICS[2], "root"]
    after = _root_notice(wide)
    assert after is not None and after.topics == (TOPICS[1], TOPICS[2]) and after.nonce != created.nonce


def test_a_write_whose_root_notice_fails_is_not_acknowledged(wide: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real = LocalStore.replace

    def refuse_root(self: LocalStore, key: str, data: bytes) -> None:
        if key == ROOT_NOTICE_KEY:
            raise StorageError(f"injected: cannot replace {key}")
        real(self, key, data)

    monkeypatch.setattr(notice_module.time, "sleep", lambda s: None)  # the retries' back-off
    monkeypatch.setattr(LocalStore, "replace", refuse_root)
    with LogRoot(wide) as root:
        before = read_notice(root.store, TOPICS[0], root.topic(TOPICS[0]).topic_id)
    with Producer(wide, linger_ms=0) as producer, pytest.raises(StorageError, match="injected"):
        producer.send(TOPICS[0], b"unannounced").get(timeout=10)
    with LogRoot(wide) as root:  # the topic notice was written all the same, before the root's failed
        assert read_notice(root.store, TOPICS[0], root.topic(TOPICS[0]).topic_id) != before


# ---------------------------------------------------------------------------- readers


@pytest.mark.parametrize("layout", ["partitioned", "shared"])
def test_an_idle_pattern_consumer_of_many_topics_makes_about_one_request_a_second(tmp_path: Path, layout: str) -> None:
    """60 topics waiting: about one GET a second (the root notice), where per-topic notices cost 60. The notice
    interval is an object store's (a local root reads it every 10 ms, where a read is free)."""
    consumer = _settled_consumer(_make_root(tmp_path, TOPICS, layout=layout), notice_interval_ms=1000)
    try:
        assert consumer._fetcher.waiting is not None and consumer._fetcher.waiting.watch.root_notice
        before = _requests(consumer)
        started = time.monotonic()
        while time.monotonic() - started < 5.0:
            assert consumer.poll(timeout_ms=250) == {}
        seconds = time.monotonic() - started
        spent = _requests(consumer) - before
        assert spent <= 1.6 * seconds, (spent, seconds)
        assert spent >= 1, "the consumer stopped reading the root notice altogether"
    finally:
        consumer.close()


def test_a_record_sent_to_one_of_many_waiting_topics_comes_within_about_a_second(wide: str) -> None:
    consumer = _settled_consumer(wide)
    try:
        with Producer(wide, linger_ms=0) as producer:
            for i, topic in enumerate((TOPICS[17], TOPICS[44])):
                time.sleep(0.4)  # acknowledgements at different moments of the notice interval
                producer.send(topic, b"ping-%d" % i).get(timeout=10)
                got, took = _poll_until(consumer, {b"ping-%d" % i}, timeout_s=10)
                assert got == {b"ping-%d" % i}, got
                assert took < 2.5, took  # one interval (1 s) plus a round of reads, with room for a busy machine
    finally:
        consumer.close()


def test_concurrent_writers_to_two_topics_wake_both_whatever_the_root_notice_names(tmp_path: Path) -> None:
    """The root notice names the last write's topics only: a reader must read every waiting topic's notice."""
    url = _make_root(tmp_path, ["a", "b", "c"])
    store = CountingStore(open_store(url))
    features = (CHANGE_NOTICES, ROOT_NOTICE)
    parked = ParkedPartitions.if_promised(store, features, interval_s=3600)
    assert parked is not None
    with LogRoot(url) as root:
        ids = {t: root.topic(t).topic_id for t in "abc"}
    parked.wake("abc", ids.__getitem__)  # first reads: the root notice and each topic's
    for t in "abc":
        assert parked.park((t, 0), 0, ids[t])
    before = store.total()
    parked.wake("abc", ids.__getitem__)
    assert store.total() == before  # nothing due: an interval has not passed
    parked.watch.interval_s = 0.0
    parked.wake("abc", ids.__getitem__)
    assert store.total() == before + 1  # idle: the root notice only
    with LogRoot(url) as first, LogRoot(url) as second:
        threads = [
            threading.Thread(target=first.notify, args=("a", [0])),
            threading.Thread(target=second.notify, args=("b", [0])),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    named = _root_notice(url)
    assert named is not None and len(named.topics) == 1  # one of the two, overwritten by the other
    parked.wake("abc", ids.__getitem__)
    parked.wake("abc", ids.__getitem__)  # the topic the notice named may go first, the other next
    assert set(parked.parked) == {("c", 0)}, parked.parked  # both woke; the unchanged topic still waits


def test_a_root_without_the_feature_falls_back_to_topic_notices(tmp_path: Path) -> None:
    """Object 0 lists changeNotices only (an older root): every topic notice is read, and records come."""
    older = ProtocolVersion(1, 1, (), (CHANGE_NOTICES,))
    assert ROOT_NOTICE in INITIAL.writer_features and ROOT_NOTICE not in older.writer_features
    url = _make_root(tmp_path, TOPICS, protocol=older)
    with LogRoot(url) as root:
        assert root.protocol.version.writer_features == (CHANGE_NOTICES,)
    consumer = _settled_consumer(url)
    try:
        waiting = consumer._fetcher.waiting
        assert waiting is not None and not waiting.watch.root_notice
        before = _requests(consumer)
        started = time.monotonic()
        while time.monotonic() - started < 2.0:
            assert consumer.poll(timeout_ms=250) == {}
        per_second = (_requests(consumer) - before) / (time.monotonic() - started)
        assert per_second >= len(TOPICS) / 2, per_second  # one notice per topic per interval, as before
        # A writer that replaces only the topic's notice (as one of an older version would) still wakes it.
        _silent_append(url, TOPICS[5], b"older", "0" * 32)
        got, _ = _poll_until(consumer, {b"older"}, timeout_s=10)
        assert got == {b"older"}
    finally:
        consumer.close()


def test_a_root_notice_root_relies_on_the_root_notice(wide: str) -> None:
    """The converse, which shows the reader above did fall back: here a topic-notice-only write is not seen
    while the root notice is unchanged (which is why an older root needs ``--enable rootNotice``)."""
    consumer = _settled_consumer(wide)
    try:
        _silent_append(wide, TOPICS[5], b"quiet", "1" * 32)
        got, _ = _poll_until(consumer, {b"quiet"}, timeout_s=2.5)
        assert got == set()  # parked, and the root notice did not change
        with Producer(wide, linger_ms=0) as producer:
            producer.send(TOPICS[9], b"loud").get(timeout=10)
        got, _ = _poll_until(consumer, {b"quiet", b"loud"}, timeout_s=10)
        assert got == {b"quiet", b"loud"}  # the root notice changed: every topic's notice is read again
    finally:
        consumer.close()


def test_the_gateway_tail_watch_reads_the_root_notice_for_many_topics(wide: str) -> None:
    store = CountingStore(open_store(wide))
    with LogRoot(wide) as root:
        ids = {t: root.topic(t).topic_id for t in TOPICS}
        features = root.protocol.version.writer_features
    tails = TailWatch(store, interval_s=0.0, features=lambda: features)
    tails.refresh(ids)  # first reads
    generations = {t: tails.generation(t) for t in TOPICS}
    before = store.total()
    for _ in range(5):
        tails.refresh(ids)
    assert store.total() - before == 5  # the root notice, once a refresh
    assert {t: tails.generation(t) for t in TOPICS} == generations
    with LogRoot(wide) as root:
        root.notify(TOPICS[30], [0])
    tails.refresh(ids)
    changed = [t for t in TOPICS if tails.generation(t) != generations[t]]
    assert changed == [TOPICS[30]]


def test_one_watch_polled_by_many_threads_loses_no_wake_up(wide: str) -> None:
    """The gateway's case: several threads poll one watch while writers write; every write is seen."""
    store = open_store(wide)
    with LogRoot(wide) as root:
        ids = {t: root.topic(t).topic_id for t in TOPICS[:8]}
    watch = NoticeWatch(store, 0.0, root_notice=True)
    watch.poll(ids)
    seen: dict[str, int] = dict.fromkeys(ids, 0)
    lock = threading.Lock()
    stop = threading.Event()

    def poller() -> None:
        while not stop.is_set():
            _, changed = watch.poll(ids)
            with lock:
                for topic in changed:
                    seen[topic] += 1

    threads = [threading.Thread(target=poller) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        with LogRoot(wide) as root:
            for topic in ids:
                with lock:
                    had = seen[topic]
                root.notify(topic, [0])
                deadline = time.monotonic() + 10
                while True:
                    with lock:
                        if seen[topic] > had:
                            break
                    assert time.monotonic() < deadline, f"{topic}: its notice changed and no poll saw it"
                    time.sleep(0.005)
    finally:
        stop.set()
        for t in threads:
            t.join()
