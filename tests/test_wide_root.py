"""A wide root (many topics of many partitions): a consumer's start costs requests per topic, not per
partition, and its idle cost, metadata refresh included, is about one request a second (PROTOCOL.md 9.1,
*Parking from a listing* and *Metadata under the root notice*).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from pyspark_logsource import Consumer, LogStore, Producer
from pyspark_logsource.client.types import TopicPartition
from segment_format.layout import ROOT_NOTICE_KEY
from segment_format.notice import RootNotice, read_root_notice
from segment_format.root import LogRoot
from segment_format.stores import open_store
from tests.counting_store import CountingStore

TOPICS = [f"wide-{i:03d}" for i in range(80)]
PARTITIONS = 10
PATTERN = r"wide-\d+"
#: Short, so that the tests see several refreshes: the default (5 minutes) would hide their cost.
METADATA_MAX_AGE_MS = 1000


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> str:
    """80 topics of 10 partitions (800), records in every partition of two of them."""
    url = str(tmp_path_factory.mktemp("wide") / "root")
    with LogStore(url) as admin:
        for topic in TOPICS:
            admin.create_topic(topic, PARTITIONS, config={"retention.ms": -1})
    with Producer(url, linger_ms=0) as producer:
        for topic in TOPICS[:2]:
            for p in range(PARTITIONS):
                producer.send(topic, b"old", partition=p)
        producer.flush()
    return url


def _requests(consumer: Consumer) -> dict[str, int]:
    """The consumer's requests so far, by kind (its root's store counts them)."""
    return dict(consumer.root.store.counts())  # type: ignore[attr-defined]


def _spent(before: dict[str, int], after: dict[str, int]) -> int:
    return sum(after.values()) - sum(before.values())


def _consumer(url: str, **config: Any) -> Consumer:
    return Consumer(url, auto_offset_reset="latest", metadata_max_age_ms=METADATA_MAX_AGE_MS, **config)


def _idle(consumer: Consumer, seconds: float) -> None:
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        assert consumer.poll(timeout_ms=200) == {}


def test_a_pattern_consumer_starts_with_requests_per_topic_not_per_partition(wide: str) -> None:
    consumer = _consumer(wide)
    try:
        consumer.subscribe(pattern=PATTERN)
        assert consumer.poll(timeout_ms=0) == {}
        counts = _requests(consumer)
        waiting = consumer._fetcher.waiting
        assert waiting is not None
        # Every partition was placed at its end by its topic's listing, made after the topic's notice was
        # read: each waits for a notice without a tail check of its own.
        assert len(waiting.parked) == len(TOPICS) * PARTITIONS
        # Per topic: its metadata, its notice (a shared topic's first: a listing of its commits, 9.1) and one
        # listing; per partition with records (20), the index of its last object, or for a shared topic the
        # commits its records are in (2 flushes); a few for the root (protocol, catalog listing, root notice).
        budget = 3 * len(TOPICS) + 2 * PARTITIONS + 10
        assert sum(counts.values()) <= budget, counts
        assert counts.get("LIST", 0) <= 2 * len(TOPICS) + 5, counts
    finally:
        consumer.close()


def test_an_idle_wide_consumer_refreshing_its_metadata_costs_about_a_request_a_second(wide: str) -> None:
    consumer = _consumer(wide, notice_interval_ms=1000)  # an object store's interval: a local root's is 10 ms
    try:
        consumer.subscribe(pattern=PATTERN)
        _idle(consumer, 1.5)  # past the first metadata refresh
        before, started = _requests(consumer), time.monotonic()
        _idle(consumer, 5.0)
        seconds = time.monotonic() - started
        spent = _spent(before, _requests(consumer))
        # Five metadata refreshes happened: each would cost a catalog listing and a read of every topic's
        # metadata (about 160 requests) without the root notice; with it, the GET of the root notice that
        # also serves the waiting partitions.
        assert consumer._last_metadata > started
        assert 1 <= spent <= 1.6 * seconds, (spent, seconds)
    finally:
        consumer.close()


def _wait_for(consumer: Consumer, what: str, done: Any, timeout_s: float) -> float:
    started = time.monotonic()
    while not done():
        assert time.monotonic() - started < timeout_s, f"{what} not within {timeout_s} s"
        consumer.poll(timeout_ms=100)
    return time.monotonic() - started


def test_a_topic_created_while_a_pattern_consumer_idles_is_assigned_and_read(tmp_path: Path) -> None:
    url = str(tmp_path / "root")
    with LogStore(url) as admin:
        for topic in TOPICS[:20]:
            admin.create_topic(topic, 2)
    consumer = _consumer(url)
    try:
        consumer.subscribe(pattern=PATTERN)
        _idle(consumer, 1.5)
        with LogStore(url) as admin:
            admin.create_topic("wide-900", 3)
        took = _wait_for(
            consumer,
            "the new topic's partitions",
            lambda: TopicPartition("wide-900", 2) in consumer._fetcher.assignment,
            timeout_s=10,
        )
        assert took < METADATA_MAX_AGE_MS / 1000 + 2.0, took
        with Producer(url, linger_ms=0) as producer:
            producer.send("wide-900", b"new", partition=2).get(timeout=10)
        got: list[bytes] = []
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            got.extend(_values(consumer))
        assert got == [b"new"]
    finally:
        consumer.close()


def _values(consumer: Consumer) -> list[bytes]:
    return [r.value for records in consumer.poll(timeout_ms=50).values() for r in records]


@pytest.mark.parametrize("group", [None, "wide-group"])
def test_partitions_added_to_a_subscribed_topic_are_assigned(tmp_path: Path, group: str | None) -> None:
    url = str(tmp_path / "root")
    with LogStore(url) as admin:
        for topic in TOPICS[:3]:
            admin.create_topic(topic, 2)
    consumer = _consumer(url, group_id=group, heartbeat_interval_ms=100, session_timeout_ms=3000)
    try:
        consumer.subscribe(TOPICS[:3])
        _wait_for(consumer, "the first assignment", lambda: len(consumer._fetcher.assignment) == 6, 15)
        _idle(consumer, 1.5)
        with LogStore(url) as admin:
            admin.create_partitions(TOPICS[1], 4)
        took = _wait_for(
            consumer,
            "the added partitions",
            lambda: TopicPartition(TOPICS[1], 3) in consumer._fetcher.assignment,
            timeout_s=15,
        )
        # The group's member checks counts every metadata_max_age_ms too, then rebalances.
        assert took < METADATA_MAX_AGE_MS / 1000 + (2.0 if group is None else 5.0), took
    finally:
        consumer.close()


def test_every_change_of_topic_metadata_replaces_the_root_notice(tmp_path: Path) -> None:
    url = str(tmp_path / "root")
    store = CountingStore(open_store(url))
    with LogRoot(url, store=store) as root:
        root.catalog.create("t", 1)
        created = read_root_notice(store)
        assert created is not None and RootNotice.from_json(created).topics == ("t",)
        changes: list[bytes | None] = [created]
        root.catalog.update("t", partitions=2)
        changes.append(read_root_notice(store))
        root.catalog.update("t", config={"retention.ms": 1000})
        changes.append(read_root_notice(store))
        before = store.calls[("replace", "topics")]
        root.catalog.delete("t")
        changes.append(read_root_notice(store))
        assert store.calls[("replace", "topics")] == before  # a deleted topic gets no notice of its own
        assert store.calls[("replace", ROOT_NOTICE_KEY)] == 4
    assert len({c for c in changes}) == 4, "each change replaced the root notice with new bytes"
    assert all(RootNotice.from_json(c).topics == ("t",) for c in changes if c is not None)


def test_a_root_reader_keeps_metadata_only_while_the_root_notice_is_unchanged(tmp_path: Path) -> None:
    url = str(tmp_path / "root")
    with LogStore(url) as admin:
        admin.create_topic("t", 1)
    store = CountingStore(open_store(url))
    with LogRoot(url, store=store, metadata_max_age_s=0.0) as root, LogStore(url) as admin:
        assert root.follow_root_notice()
        assert root.topic("t").partitions == 1
        meta_reads = store.calls[("get", "topics")] + store.calls[("list", "topics")]
        for _ in range(5):  # always past the metadata age: each look confirms with one root notice GET
            assert root.topic("t").partitions == 1
        assert store.calls[("get", "topics")] + store.calls[("list", "topics")] == meta_reads
        admin.create_partitions("t", 3)
        assert root.topic("t").partitions == 3  # the root notice changed: read again
