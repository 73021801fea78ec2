"""Change notices (PROTOCOL.md 9.1): writers announce appends, waiting consumers read one object per topic.

The budget test runs on the moto S3 server, where every request is counted at the server's door.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from coordinator.transactions import Decision, TransactionCoordinator
from pyspark_logsource import Consumer, LogStore, Producer, TopicPartition
from pyspark_logsource.cli.app import main as plog_main
from pyspark_logsource.spark.credentials import spark_storage_options
from segment_format import notice as notice_module
from segment_format.layout import PROTOCOL_PREFIX
from segment_format.log.reader import COMMITTED
from segment_format.notice import CHANGE_NOTICES, ROOT_NOTICE, ChangeNotice, read_notice
from segment_format.protocol import INITIAL
from segment_format.records import now_ms, payload_batch
from segment_format.root import LogRoot
from segment_format.segment import ATTR_TRANSACTIONAL, BatchMeta
from segment_format.stores import open_store

TOPIC = "events"

#: Partitioned topics: topic notices (9.1): a shared topic has none, its next commit is one (test_shared_topics).
PARTITIONED = {"storage.layout": "partitioned"}


def _batch(values: list[bytes]) -> Any:
    n = len(values)
    return payload_batch([now_ms()] * n, [None] * n, values)


def _notice(url: str, options: dict[str, Any] | None = None, topic: str = TOPIC) -> bytes | None:
    with LogRoot(url, options) as root:
        return read_notice(root.store, topic, root.topic(topic).topic_id)


def _append_silently(url: str, partition: int, values: list[bytes], topic: str = TOPIC) -> None:
    """Append as a writer that writes no notice (as if it died before writing it)."""
    root = LogRoot(url)
    try:
        batch = _batch(values)
        root.partition(topic, partition).append([(batch, BatchMeta())], notify=False)
    finally:
        root.close()


@pytest.fixture
def url(tmp_path: Path) -> str:
    root = str(tmp_path / "root")
    with LogStore(root) as admin:
        admin.create_topic(TOPIC, 4, config={"retention.ms": -1, **PARTITIONED})
    return root


def test_writers_replace_the_notice_before_acknowledging(url: str) -> None:
    created = _notice(url)
    assert created is not None and ChangeNotice.from_json(created).partitions == ()  # written at creation
    seen = set()
    with Producer(url, linger_ms=0) as producer:
        producer.send(TOPIC, b"one", partition=1).get(timeout=10)
        first = _notice(url)
        assert first is not None and ChangeNotice.from_json(first).partitions == (1,)
        seen.add(first)
        producer.send_batch(
            TOPIC, pa.table({"value": [b"a", b"b", b"c", b"d"], "partition": pa.array([0, 2, 2, 3], pa.int32())})
        )
        second = _notice(url)
        assert second is not None and ChangeNotice.from_json(second).partitions == (0, 2, 3)
        seen.add(second)
    _append_silently(url, 0, [b"quiet"])
    assert _notice(url) == second  # notify=False writes nothing
    with LogRoot(url) as root:
        root.partition(TOPIC, 3).append([(_batch([b"x"]), BatchMeta())])
        seen.add(read_notice(root.store, TOPIC, root.topic(TOPIC).topic_id) or b"")
    assert len(seen) == 3  # every write changes the bytes (a fresh nonce)


def test_a_new_root_requires_the_feature(url: str) -> None:
    with LogRoot(url) as root:
        assert CHANGE_NOTICES in root.protocol.version.writer_features


def _idle_consumer(url: str, options: dict[str, Any] | None = None, **config: Any) -> Consumer:
    consumer = Consumer(url, options, auto_offset_reset="earliest", **config)
    consumer.assign([TopicPartition(TOPIC, p) for p in range(_partitions(url, options))])
    return consumer


def _partitions(url: str, options: dict[str, Any] | None) -> int:
    with LogRoot(url, options) as root:
        return root.topic(TOPIC).partitions


def _drain(consumer: Consumer, expected: int, timeout_s: float = 20.0) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < expected and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=200).values():
            got.extend(r.value for r in records)
    return got


def test_a_parked_partition_waits_for_the_notice_then_reads(url: str) -> None:
    """The wake-up is the notice: an append without one stays unseen by a waiting consumer until a notice comes."""
    consumer = _idle_consumer(url)
    try:
        assert consumer.poll(timeout_ms=300) == {}
        assert consumer._fetcher.waiting.parked  # every partition found empty after the notice's first read
        _append_silently(url, 2, [b"unannounced"])
        assert consumer.poll(timeout_ms=1500) == {}  # parked: the object is not probed for
        with Producer(url, linger_ms=0) as producer:
            producer.send(TOPIC, b"announced", partition=0).get(timeout=10)
        assert sorted(_drain(consumer, 2)) == [b"announced", b"unannounced"]  # one notice wakes the topic
    finally:
        consumer.close()


def test_a_seek_unparks(url: str) -> None:
    with Producer(url, linger_ms=0) as producer:
        producer.send(TOPIC, b"old", partition=1).get(timeout=10)
    consumer = _idle_consumer(url)
    try:
        assert _drain(consumer, 1) == [b"old"]
        assert consumer.poll(timeout_ms=300) == {}
        assert TopicPartition(TOPIC, 1) in consumer._fetcher.waiting.parked
        consumer.seek_to_beginning(TopicPartition(TOPIC, 1))
        assert _drain(consumer, 1, timeout_s=0.5) == [b"old"]  # no notice needed: the position moved
    finally:
        consumer.close()


def test_a_root_without_the_feature_probes_every_partition(url: str) -> None:
    for info in open_store(url).list(PROTOCOL_PREFIX):
        open_store(url).delete(info.key)  # a root from before the protocol object: no features
    consumer = _idle_consumer(url)
    try:
        assert consumer._fetcher.waiting is None
        assert consumer.poll(timeout_ms=200) == {}
        _append_silently(url, 2, [b"unannounced"])
        assert _drain(consumer, 1, timeout_s=5) == [b"unannounced"]
    finally:
        consumer.close()


def test_the_cli_enables_the_feature_on_an_older_root(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    store = open_store(url)
    for info in store.list(PROTOCOL_PREFIX):
        store.delete(info.key)
    assert plog_main(["protocol", "--url", url]) == 0
    assert '"writer_features": []' in capsys.readouterr().out
    assert plog_main(["protocol", "--url", url, "--enable", CHANGE_NOTICES]) == 0
    assert CHANGE_NOTICES in capsys.readouterr().out
    assert plog_main(["protocol", "--url", url, "--enable", "noSuchFeature"]) != 0
    with LogRoot(url) as root:
        assert root.protocol.version.writer_features == (CHANGE_NOTICES,)


def test_read_committed_wakes_at_the_commit_and_rechecks_a_silent_decision(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader stopped at an open transaction wakes at the decider's notice, or at the recheck if there was none."""
    monkeypatch.setattr(notice_module, "BLOCKED_RECHECK_S", 0.5)
    consumer = _idle_consumer(url, isolation_level="read_committed")
    producer = Producer(url, transactional_id="tx", linger_ms=0)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(TOPIC, b"t1", partition=0).get(timeout=10)
        producer.flush()
        assert consumer.poll(timeout_ms=1500) == {}  # woken by the append's notice, then stopped at the LSO
        assert consumer._fetcher.waiting.parked[TopicPartition(TOPIC, 0)].blocked
        producer.commit_transaction()
        assert _drain(consumer, 1, timeout_s=5) == [b"t1"]
    finally:
        producer.close()
    # A decision made without a notice (its decider died before writing it): the recheck finds it.
    with LogRoot(url) as root:
        batch = _batch([b"t2"])
        meta = BatchMeta(999, 0, 0, ATTR_TRANSACTIONAL, transaction=5)
        result = root.partition(TOPIC, 3).append([(batch, meta)], notify=False)
    try:
        assert consumer.poll(timeout_ms=300) == {}
        TransactionCoordinator(open_store(url)).decide(
            Decision(
                COMMITTED,
                999,
                5,
                batches={TOPIC: {"3": [[result.base_offsets[0], result.next_offset - 1]]}},
                created_ms=now_ms(),
            )
        )
        assert _drain(consumer, 1, timeout_s=10) == [b"t2"]
    finally:
        consumer.close()


def test_an_idle_consumer_stays_within_one_request_per_second_per_topic(
    s3_url: tuple[str, dict[str, Any]],
) -> None:
    """16 partitions, nothing arriving: the requests at the server over 3 s stay within 1 per second (issue #11)."""
    from tests.fixtures_s3 import REQUESTS

    url, options = s3_url
    bucket = url.split("/")[2]
    with LogStore(url, storage_options=options) as admin:
        admin.create_topic(TOPIC, 16, config={"retention.ms": -1, **PARTITIONED})
    consumer = _idle_consumer(url, options)
    try:
        assert consumer.poll(timeout_ms=500) == {}  # positions, first probes, the notices' first read
        before = REQUESTS.of(bucket)
        started = time.monotonic()
        while time.monotonic() - started < 3.0:
            assert consumer.poll(timeout_ms=500) == {}
        seconds = time.monotonic() - started
        spent = REQUESTS.of(bucket) - before
        assert sum(spent.values()) <= seconds + 1, (spent, seconds)
        with Producer(url, storage_options=options, linger_ms=0) as producer:
            producer.send(TOPIC, b"hello", partition=11).get(timeout=10)
        assert _drain(consumer, 1, timeout_s=10) == [b"hello"]
    finally:
        consumer.close()


def test_a_waiting_consumer_on_a_local_root_reads_its_notice_every_few_ms(url: str) -> None:
    """A notice on a local disk is a small file read, not a billed request: a consumer waiting at the end reads
    it every 10 ms by default (an object store's once a second would hold a new record back up to a second),
    and an explicit ``notice_interval_ms`` still rules."""

    def notice_reads(consumer: Consumer) -> int:
        assert consumer.poll(timeout_ms=200) == {}  # positions, first probes: parked
        store = consumer.root.store
        inner = getattr(store, "inner", store)
        original, reads = inner.get, []

        def counting(key: str, *args: Any, **kwargs: Any) -> bytes:
            reads.append(key)
            return original(key, *args, **kwargs)

        inner.get = counting  # type: ignore[method-assign]
        try:
            assert consumer.poll(timeout_ms=1000) == {}
        finally:
            inner.get = original  # type: ignore[method-assign]
        return len(reads)

    with _idle_consumer(url) as quick, _idle_consumer(url, notice_interval_ms=1000) as slow:
        assert notice_reads(quick) >= 10  # every 10 ms: about 100 in the second; once a second: 1
        assert notice_reads(slow) <= 3


def _s3_stream_reader(
    s3_url: tuple[str, dict[str, Any]], partitions: int, records: int = 0, **source_options: str
) -> Any:
    """A Spark source's reader (no Spark session: its driver-side calls) on a new S3 topic holding ``records``."""
    pytest.importorskip("pyspark")
    from pyspark_logsource.spark.options import parse_options
    from pyspark_logsource.spark.stream_reader import PlogStreamReader

    url, options = s3_url
    with LogStore(url, storage_options=options) as admin:
        admin.create_topic(TOPIC, partitions, config={"retention.ms": -1, **PARTITIONED})
    if records:
        with Producer(url, storage_options=options) as producer:
            producer.send_batch(TOPIC, pa.table({"value": [b"%d" % i for i in range(records)]}))
    storage = spark_storage_options({k: v for k, v in options.items() if k in ("endpoint_url", "key", "secret")})
    given = {"path": url, "subscribe": TOPIC, "startingOffsets": "earliest", **source_options, **storage}
    return PlogStreamReader(parse_options(given, streaming=True))


def test_an_idle_spark_source_reads_notices_not_partitions(s3_url: tuple[str, dict[str, Any]]) -> None:
    """Spark asks for the latest offsets every few ms on an idle stream: with notices that costs ~1 GET/s."""
    reader = _s3_stream_reader(s3_url, 16)
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from tests.fixtures_s3 import REQUESTS

    url, options = s3_url
    bucket = url.split("/")[2]
    start = reader.initialOffset()
    assert reader.latestOffset(start, ReadAllAvailable()) == start  # first probes, first read of the notice
    assert reader.latestOffset(start, ReadAllAvailable()) == start  # parks every partition
    before = REQUESTS.of(bucket)
    started = time.monotonic()
    calls = 0
    while time.monotonic() - started < 3.0:
        assert reader.latestOffset(start, ReadAllAvailable()) == start
        calls += 1
        time.sleep(0.01)  # Spark's pollingDelay
    seconds = time.monotonic() - started
    spent = REQUESTS.of(bucket) - before
    # one notice GET per second, plus the topic metadata the source re-reads every 5 s (a LIST and a GET)
    assert sum(spent.values()) <= seconds + 3, (spent, calls)
    with Producer(url, storage_options=options, linger_ms=0) as producer:
        producer.send(TOPIC, b"hello", partition=7).get(timeout=10)
    deadline = time.monotonic() + 10
    end = start
    while end == start and time.monotonic() < deadline:
        end = reader.latestOffset(start, ReadAllAvailable())
        time.sleep(0.05)
    assert end[TOPIC]["7"] == 1


def test_a_topic_deleted_and_created_again_wakes_its_waiting_consumer(url: str) -> None:
    """The notice is per topic id: a waiting consumer must not keep reading the old incarnation's (second reader)."""
    consumer = _idle_consumer(url)
    try:
        assert consumer.poll(timeout_ms=300) == {}
        assert consumer._fetcher.waiting is not None and consumer._fetcher.waiting.parked
        with LogStore(url) as admin:
            admin.delete_topic(TOPIC)
            admin.create_topic(TOPIC, 4, config={"retention.ms": -1, **PARTITIONED})
        with Producer(url, linger_ms=0) as producer:
            producer.send(TOPIC, b"second life", partition=0).get(timeout=10)
        assert _drain(consumer, 1, timeout_s=20) == [b"second life"]
    finally:
        consumer.close()


def test_a_write_whose_notice_fails_is_not_acknowledged(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A waiting reader would not look for records announced by no notice, so the writer reports a failure."""
    from segment_format.errors import StorageError
    from segment_format.stores.local import LocalStore

    def refuse(self: LocalStore, key: str, data: bytes) -> None:
        raise StorageError(f"injected: cannot replace {key}")

    monkeypatch.setattr(notice_module.time, "sleep", lambda s: None)  # the retries' back-off
    monkeypatch.setattr(LocalStore, "replace", refuse)
    with Producer(url, linger_ms=0) as producer, pytest.raises(StorageError, match="injected"):
        producer.send(TOPIC, b"unannounced", partition=1).get(timeout=10)
    with pytest.raises(StorageError, match="injected"), LogRoot(url) as root:
        root.partition(TOPIC, 2).append([(_batch([b"x"]), BatchMeta())])
    monkeypatch.undo()
    consumer = _idle_consumer(url)
    try:  # the records are in the log all the same, as after any ambiguous failure
        assert sorted(_drain(consumer, 2)) == [b"unannounced", b"x"]
    finally:
        consumer.close()


def test_a_replayed_sink_commit_writes_the_notices_again(url: str) -> None:
    """The driver died between the decision and its notice: the replay's commit writes the notice (second reader)."""
    pytest.importorskip("pyspark")
    from pyspark.sql.types import BinaryType, StructField, StructType

    from pyspark_logsource.spark.sink import PlogCommitMessage, PlogStreamWriter

    with LogRoot(url) as root:
        result = root.partition(TOPIC, 0).append(
            [(_batch([b"sunk"]), BatchMeta(7, 0, 0, ATTR_TRANSACTIONAL, transaction=3))], notify=False
        )
        TransactionCoordinator(root.store).decide(
            Decision(COMMITTED, 7, 3, batches={TOPIC: {"0": [[result.base_offsets[0], result.next_offset - 1]]}})
        )
    before = _notice(url)
    options = {"path": url, "topic": TOPIC, "checkpointLocation": url + "-checkpoint"}
    writer = PlogStreamWriter(options, StructType([StructField("value", BinaryType())]))
    writer.commit([PlogCommitMessage({}, 0, 7, 3, replayed=True)], 3)
    after = _notice(url)
    assert after is not None and after != before
    assert ChangeNotice.from_json(after).partitions == (0,)


def test_a_spark_source_with_a_backlog_does_not_probe_an_unchanged_topic(s3_url: tuple[str, dict[str, Any]]) -> None:
    """Batches cut from a backlog take their latest offsets from the probe its unchanged notice still vouches for."""
    reader = _s3_stream_reader(s3_url, 4, records=400, maxOffsetsPerTrigger="40")
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from tests.fixtures_s3 import REQUESTS

    bucket = s3_url[0].split("/")[2]
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(40))  # probes every partition once
    before = REQUESTS.shapes(bucket)
    for _ in range(5):
        start, end = end, reader.latestOffset(end, ReadMaxRows(40))
        assert sum(end[TOPIC].values()) == sum(start[TOPIC].values()) + 40  # the backlog, 40 records a batch
    spent = REQUESTS.shapes(bucket) - before
    assert not [shape for (_kind, shape) in spent if "/log/" in shape], spent  # no tail probe


def test_the_cli_gives_a_new_root_the_initial_features_with_those_it_enables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``plog protocol --enable X`` on an empty root writes object 0 as a topic's creation would, plus X."""
    url = str(tmp_path / "fresh")
    assert plog_main(["protocol", "--url", url, "--enable", "typedTopics"]) == 0
    capsys.readouterr()
    with LogRoot(url) as root:
        assert root.protocol.number == 0
        assert set(root.protocol.version.writer_features) == set(INITIAL.writer_features) | {"typedTopics"}
        assert {CHANGE_NOTICES, ROOT_NOTICE} <= set(INITIAL.writer_features)
