"""The root's protocol object (PROTOCOL.md 12): written once, checked once, refused when not understood.

Readers refuse a root whose minimum reader version or reader features they do
not know; writers refuse on the writer fields too, while readers go on; a root
written before the object existed still works; concurrent first topics leave
one object; an upgrade never lowers a requirement; opening a root costs one
listing (plus one GET when the object exists) and nothing per operation.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyspark_logsource import Consumer, LogStore, Producer, TopicPartition, UnsupportedProtocolError
from segment_format import protocol
from segment_format.errors import CorruptRecordError, PlogError
from segment_format.layout import PROTOCOL_PREFIX
from segment_format.protocol import (
    FEATURES,
    INITIAL,
    LEGACY,
    Feature,
    ProtocolVersion,
    RootProtocol,
    protocol_key,
    read_protocol,
    upgrade_protocol,
)
from segment_format.records import now_ms, payload_batch
from segment_format.root import LogRoot
from segment_format.segment import BatchMeta
from segment_format.stores import LocalStore, MemoryStore
from segment_format.stores.base import Store
from tests.counting_store import CountingStore

TOPIC = "t"


@pytest.fixture(params=["local", "memory"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh root with topic ``t`` (2 partitions) holding three records in partition 0."""
    if request.param == "local":
        root = str(tmp_path / "plog")
    else:
        name = f"protocol-{uuid.uuid4().hex}"
        root = f"memory://{name}"
    with LogStore(root) as admin:
        admin.create_topic(TOPIC, 2)
    producer = Producer(root, linger_ms=0)
    for i in range(3):
        producer.send(TOPIC, value=b"v%d" % i, partition=0)
    producer.close()
    yield root
    if request.param == "memory":
        MemoryStore(root.removeprefix("memory://")).delete_prefix("")


#: INITIAL's writer features with the two made-up ones the upgrade tests ask for.
WITH_TEST_FEATURES = tuple(sorted((*INITIAL.writer_features, "testReads", "testWrites")))


def open_store(url: str) -> Store:
    return MemoryStore(url.removeprefix("memory://")) if url.startswith("memory://") else LocalStore(url)


def claim(url: str, doc: ProtocolVersion) -> None:
    """Make the root require ``doc``, as a newer plog would (the next protocol object)."""
    store = open_store(url)
    newest = read_protocol(store)
    n = 0 if newest is None else newest[0] + 1
    assert store.put_if_absent(protocol_key(n), doc.to_json())


def one_record(value: bytes) -> list[tuple[Any, BatchMeta]]:
    return [(payload_batch([now_ms()], [None], [value]), BatchMeta())]


def read_all(url: str) -> list[bytes]:
    consumer = Consumer(url, auto_offset_reset="earliest")
    try:
        consumer.assign([TopicPartition(TOPIC, 0)])
        records = consumer.poll(timeout_ms=2000).get(TopicPartition(TOPIC, 0), [])
        return [r.value for r in records]
    finally:
        consumer.close()


# --------------------------------------------------------------------------- written once


def test_first_topic_writes_object_zero_and_later_topics_leave_it(url: str) -> None:
    store = open_store(url)
    assert [i.key for i in store.list(PROTOCOL_PREFIX)] == [protocol_key(0)]
    number, doc = read_protocol(store) or (None, None)
    assert number == 0 and doc is not None and doc.requirements() == INITIAL.requirements()
    assert doc.created_ms > 0
    with LogStore(url) as admin:
        admin.create_topic("u", 1)
        admin.alter_config("u", {"retention.ms": 1000})
    assert [i.key for i in store.list(PROTOCOL_PREFIX)] == [protocol_key(0)]


def test_the_object_is_a_plain_json_document(url: str) -> None:
    body = open_store(url).get(protocol_key(0))
    assert ProtocolVersion.from_json(body) == ProtocolVersion.from_dict(
        {
            "min_reader_version": 1,
            "min_writer_version": 1,
            "reader_features": ["boundedHistory", "compaction", "sharedObjects"],
            "writer_features": ["boundedHistory", "changeNotices", "compaction", "rootNotice", "sharedObjects"],
            "created_ms": ProtocolVersion.from_json(body).created_ms,
        }
    )


def test_a_root_without_the_object_still_works(url: str) -> None:
    """Roots written before the protocol object existed: reader 1, writer 1, no features."""
    store = open_store(url)
    store.delete(protocol_key(0))
    root = LogRoot(url)
    assert root.protocol.version == LEGACY and root.protocol.number is None
    assert read_all(url) == [b"v0", b"v1", b"v2"]
    producer = Producer(url, linger_ms=0)
    producer.send(TOPIC, value=b"v3", partition=0).get(timeout=10)
    producer.close()
    with LogStore(url) as admin:
        admin.maintain()
        admin.alter_config(TOPIC, {"retention.ms": 10**9})
    assert read_all(url) == [b"v0", b"v1", b"v2", b"v3"]
    assert store.list(PROTOCOL_PREFIX) == []  # only a topic creation writes the object
    with LogStore(url) as admin:
        admin.create_topic("later", 1)
    assert [i.key for i in store.list(PROTOCOL_PREFIX)] == [protocol_key(0)]


@pytest.mark.parametrize("backend", ["local", "memory"])
def test_concurrent_first_topics_write_one_object(backend: str, tmp_path: Path) -> None:
    url = str(tmp_path / "plog") if backend == "local" else f"memory://race-{uuid.uuid4().hex}"
    writers = 8
    roots = [LogRoot(url) for _ in range(writers)]  # every one saw a root without the object
    assert all(r.protocol.number is None for r in roots)
    barrier = threading.Barrier(writers)
    errors: list[BaseException] = []

    def create(i: int) -> None:
        barrier.wait()
        try:
            roots[i].catalog.create(f"topic-{i}", 1)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    store = open_store(url)
    assert [i.key for i in store.list(PROTOCOL_PREFIX)] == [protocol_key(0)]
    assert all(r.protocol.number == 0 for r in roots)
    assert LogRoot(url).catalog.names() == sorted(f"topic-{i}" for i in range(writers))
    if backend == "memory":
        store.delete_prefix("")


# --------------------------------------------------------------------------- readers refuse


@pytest.mark.parametrize(
    ("doc", "named"),
    [
        (ProtocolVersion(2, 2), "min_reader_version 2"),
        (ProtocolVersion(1, 1, ("fancyReads",), ("fancyReads",)), "fancyReads"),
        (ProtocolVersion(3, 3, ("a", "b"), ("a", "b")), "min_reader_version 3"),
    ],
)
def test_readers_refuse_what_they_do_not_know(url: str, doc: ProtocolVersion, named: str) -> None:
    claim(url, doc)
    for open_client in (
        lambda: Consumer(url),
        lambda: LogRoot(url),
        lambda: LogStore(url),
        lambda: Producer(url),  # a writer reads too
    ):
        with pytest.raises(UnsupportedProtocolError) as info:
            open_client()
        message = str(info.value)
        assert named in message and protocol_key(1) in message and "upgrade plog" in message
        assert info.value.role == "reader"
    assert isinstance(info.value, PlogError)


def test_the_error_lists_every_unknown_reader_feature(url: str) -> None:
    claim(url, ProtocolVersion(1, 1, ("zeta", "alpha"), ("alpha", "zeta")))
    with pytest.raises(UnsupportedProtocolError) as info:
        LogRoot(url)
    assert info.value.features == ("alpha", "zeta") and "alpha, zeta" in str(info.value)
    assert info.value.versions == {}


def test_a_root_opened_with_a_store_passed_in_is_checked_too(url: str) -> None:
    claim(url, ProtocolVersion(2, 2))
    with pytest.raises(UnsupportedProtocolError):
        LogRoot(url, store=open_store(url))


# --------------------------------------------------------------------------- writers refuse, readers go on


@pytest.mark.parametrize(
    ("doc", "named"),
    [
        (ProtocolVersion(1, 2), "min_writer_version 2"),
        (ProtocolVersion(1, 1, (), ("fancyWrites",)), "fancyWrites"),
    ],
)
def test_writers_refuse_what_readers_may_ignore(url: str, doc: ProtocolVersion, named: str) -> None:
    claim(url, doc)
    store = open_store(url)
    before = store.list("topics/") + store.list(PROTOCOL_PREFIX)
    assert read_all(url) == [b"v0", b"v1", b"v2"]  # readers are not concerned

    def refused(call: Any) -> None:
        with pytest.raises(UnsupportedProtocolError) as info:
            call()
        assert named in str(info.value) and info.value.role == "writer"

    producer = Producer(url, linger_ms=0)
    refused(lambda: producer.send(TOPIC, value=b"no", partition=0).get(timeout=10))
    producer.close()
    root = LogRoot(url)
    refused(lambda: root.partition(TOPIC, 1).append(one_record(b"no")))
    with LogStore(url) as admin:
        refused(lambda: admin.create_topic("other", 1))
        refused(lambda: admin.alter_config(TOPIC, {"retention.ms": 1}))
        refused(lambda: admin.create_partitions(TOPIC, 3))
        refused(lambda: admin.delete_records(TOPIC, {0: 1}))
        refused(admin.maintain)
        refused(lambda: admin.delete_topic(TOPIC))
    # No topic data, metadata or protocol object was written (the producer did allocate its producer id:
    # coordinator objects are not governed by the writer requirements).
    assert store.list("topics/") + store.list(PROTOCOL_PREFIX) == before
    assert read_all(url) == [b"v0", b"v1", b"v2"]


def test_readers_in_a_group_may_still_commit_on_a_root_only_writers_cannot_handle(url: str) -> None:
    """Group objects are not the topics' data: a consumer's commit is not a write in the protocol's sense."""
    claim(url, ProtocolVersion(1, 1, (), ("fancyWrites",)))
    consumer = Consumer(url, group_id="g", auto_offset_reset="earliest")
    try:
        consumer.assign([TopicPartition(TOPIC, 0)])
        assert len(consumer.poll(timeout_ms=2000)[TopicPartition(TOPIC, 0)]) == 3
        consumer.commit()
        assert consumer.committed(TopicPartition(TOPIC, 0)) == 3
    finally:
        consumer.close()


# --------------------------------------------------------------------------- upgrades


@pytest.fixture
def known_features(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend this code implements a reader-writer feature and a writer-only feature."""
    monkeypatch.setitem(FEATURES, "testReads", Feature("testReads", reader=True, section="test"))
    monkeypatch.setitem(FEATURES, "testWrites", Feature("testWrites", reader=False, section="test"))


@pytest.mark.usefixtures("known_features")
def test_upgrades_add_and_never_lower(url: str) -> None:
    store = open_store(url)
    number, doc = upgrade_protocol(store, ProtocolVersion(1, 1, ("testReads",)))
    assert number == 1
    assert (doc.reader_features, doc.writer_features) == (
        ("boundedHistory", "compaction", "sharedObjects", "testReads"),
        ("boundedHistory", "changeNotices", "compaction", "rootNotice", "sharedObjects", "testReads"),
    )
    # Asking for less, or for the same, writes nothing.
    assert upgrade_protocol(store, INITIAL)[0] == 1
    assert upgrade_protocol(store, ProtocolVersion(1, 1, ("testReads",)))[0] == 1
    number, doc = upgrade_protocol(store, ProtocolVersion(1, 1, (), ("testWrites",)))
    assert number == 2 and doc.reader_features == ("boundedHistory", "compaction", "sharedObjects", "testReads")
    assert doc.writer_features == WITH_TEST_FEATURES
    assert [i.key for i in store.list(PROTOCOL_PREFIX)] == [protocol_key(n) for n in range(3)]
    assert read_all(url) == [b"v0", b"v1", b"v2"]  # features this code knows do not stop it


def test_an_upgrade_to_something_unknown_writes_nothing(url: str) -> None:
    store = open_store(url)
    with pytest.raises(UnsupportedProtocolError, match="mystery"):
        upgrade_protocol(store, ProtocolVersion(1, 1, ("mystery",)))
    with pytest.raises(UnsupportedProtocolError, match="min_writer_version 9"):
        upgrade_protocol(store, ProtocolVersion(1, 9))
    assert [i.key for i in store.list(PROTOCOL_PREFIX)] == [protocol_key(0)]


@pytest.mark.usefixtures("known_features")
def test_an_upgrade_of_a_root_this_code_cannot_write_is_refused(url: str) -> None:
    claim(url, ProtocolVersion(1, 1, (), ("fancyWrites",)))
    store = open_store(url)
    with pytest.raises(UnsupportedProtocolError, match="fancyWrites"):
        upgrade_protocol(store, ProtocolVersion(1, 1, ("testReads",)))
    assert len(store.list(PROTOCOL_PREFIX)) == 2


@pytest.mark.usefixtures("known_features")
def test_concurrent_upgrades_merge(url: str) -> None:
    store = open_store(url)
    wanted = [ProtocolVersion(1, 1, ("testReads",)), ProtocolVersion(1, 1, (), ("testWrites",))] * 4
    barrier = threading.Barrier(len(wanted))
    results: list[ProtocolVersion] = []

    def upgrade(doc: ProtocolVersion) -> None:
        barrier.wait()
        results.append(upgrade_protocol(store, doc)[1])

    threads = [threading.Thread(target=upgrade, args=(w,)) for w in wanted]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    newest = read_protocol(store)
    assert newest is not None
    assert newest[1].writer_features == WITH_TEST_FEATURES
    assert newest[1].reader_features == ("boundedHistory", "compaction", "sharedObjects", "testReads")
    assert all(newest[1].covers(r) for r in results)
    assert newest[0] <= 2  # object 0, then at most one upgrade per distinct request


# --------------------------------------------------------------------------- damage and cost


def test_a_damaged_protocol_object_is_corruption(url: str) -> None:
    store = open_store(url)
    assert store.put_if_absent(protocol_key(1), b'{"min_reader_version": "two"}')
    with pytest.raises(CorruptRecordError, match="min_reader_version"):
        LogRoot(url)
    assert store.put_if_absent(protocol_key(2), b'{"min_reader_version": 0, "min_writer_version": 1}')
    with pytest.raises(CorruptRecordError, match="start at 1"):
        LogRoot(url)


def test_the_check_costs_one_listing_and_one_get_per_opened_root(url: str) -> None:
    store = CountingStore(open_store(url))
    root = LogRoot(url, store=store)
    assert store.calls == {("list", "_protocol"): 1, ("get", "_protocol"): 1}
    for _ in range(3):
        root.topic(TOPIC, refresh=True)
        log = root.partition(TOPIC, 0)
        log.read(0, max_records=10)
        log.append(one_record(b"x"))
        root.catalog.names()
        root.maintain(TOPIC)
    protocol_calls = {k: v for k, v in store.calls.items() if k[1] == "_protocol"}
    assert protocol_calls == {("list", "_protocol"): 1, ("get", "_protocol"): 1}


def test_a_root_without_the_object_costs_one_listing(url: str) -> None:
    open_store(url).delete(protocol_key(0))
    store = CountingStore(open_store(url))
    RootProtocol(store).require_reader()
    assert store.calls == {("list", "_protocol"): 1}


def test_feature_registry_entries_are_named_after_themselves() -> None:
    """The registry is keyed by name; adding a feature is one entry (and one row in PROTOCOL.md 12.2)."""
    assert all(name == feature.name for name, feature in protocol.FEATURES.items())
