"""The Kafka-style client: Producer, Consumer and LogStore on a local directory and on ``memory://``.

Every test runs on both backends. Expected answers are exact: offsets,
partitions, timestamps and byte counts are computed independently of the code
under test (Kafka's partitioner from ``pyspark_logsource.client.partitioner``, a
brute-force scan for ``offsets_for_times``, the store's own listing for sizes).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from pyspark_logsource import (
    Consumer,
    ConsumerRecord,
    LogStore,
    OffsetAndTimestamp,
    OffsetOutOfRangeError,
    Producer,
    RecordMetadata,
    TopicPartition,
)
from pyspark_logsource.client.fetcher import ARROW_SCHEMA
from pyspark_logsource.client.partitioner import kafka_partition
from segment_format.records import HEADERS_TYPE
from segment_format.stores import MemoryStore

MB = 1024 * 1024

#: For the tests that count, merge and retire per-partition segment objects (a shared topic's records
#: reach segments by moves, tested in test_shared_maintenance).
PARTITIONED = {"storage.layout": "partitioned"}


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(params=["local", "memory"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty plog root: a local directory or a uniquely named ``memory://`` store."""
    if request.param == "local":
        yield str(tmp_path / "plog")
        return
    name = f"client-{uuid.uuid4().hex}"
    yield f"memory://{name}"
    MemoryStore(name).delete_prefix("")


class Clients:
    """Opens clients on one root and closes them all at the end of the test."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._open: list[Any] = []
        self.admin = self.track(LogStore(url))

    def track(self, client: Any) -> Any:
        self._open.append(client)
        return client

    def producer(self, **config: Any) -> Producer:
        return self.track(Producer(self.url, **config))

    def consumer(self, **config: Any) -> Consumer:
        config.setdefault("auto_offset_reset", "earliest")
        return self.track(Consumer(self.url, **config))

    def close(self) -> None:
        for client in reversed(self._open):
            client.close()


@pytest.fixture
def clients(url: str) -> Iterator[Clients]:
    c = Clients(url)
    yield c
    c.close()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def drain(consumer: Consumer, expected: int, timeout_s: float = 20.0) -> list[ConsumerRecord]:
    """Poll until ``expected`` records arrived (fails on more, or on none within the timeout)."""
    out: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < expected:
        assert time.monotonic() < deadline, f"got {len(out)} of {expected} records"
        for records in consumer.poll(timeout_ms=200).values():
            out.extend(records)
    assert consumer.poll(timeout_ms=0) == {}, "more records than expected"
    return out


def drain_arrow(consumer: Consumer, expected: int, timeout_s: float = 20.0) -> pa.Table:
    tables = []
    got = 0
    deadline = time.monotonic() + timeout_s
    while got < expected:
        assert time.monotonic() < deadline, f"got {got} of {expected} records"
        table = consumer.poll_arrow(timeout_ms=200)
        assert table.schema == ARROW_SCHEMA
        tables.append(table)
        got += table.num_rows
    assert consumer.poll_arrow(timeout_ms=0).num_rows == 0
    return pa.concat_tables(tables)


def by_partition(records: list[ConsumerRecord]) -> dict[int, list[ConsumerRecord]]:
    out: dict[int, list[ConsumerRecord]] = defaultdict(list)
    for r in records:
        out[r.partition].append(r)
    for rs in out.values():
        assert [r.offset for r in rs] == sorted(r.offset for r in rs)
    return dict(out)


def read_partition(clients: Clients, topic: str, partition: int, start: int = 0) -> list[ConsumerRecord]:
    """Every record of one partition from ``start`` to its current end."""
    c = clients.consumer()
    tp = TopicPartition(topic, partition)
    c.assign([tp])
    c.seek(tp, start)
    end = c.end_offsets([tp])[tp]
    records = drain(c, end - start)
    assert [r.offset for r in records] == list(range(start, end))
    return records


# --------------------------------------------------------------------------- round trips


ONE_MB = bytes(range(256)) * (MB // 256)

# (key, value, headers) sent -> (key, value, headers) read back
SEND_CASES: list[tuple[Any, Any, Any, bytes | None, bytes | None, list[tuple[str, bytes | None]]]] = [
    (None, b"no key", None, None, b"no key", []),
    (b"", b"empty key", [], b"", b"empty key", []),
    (b"k1", None, [("why", b"tombstone")], b"k1", None, [("why", b"tombstone")]),
    (b"k2", b"", [("h", None)], b"k2", b"", [("h", None)]),
    (
        "ключ",
        "välue",
        [("日本語", "ü"), ("dup", b"1"), ("dup", b"2")],
        "ключ".encode(),
        "välue".encode(),
        [("日本語", "ü".encode()), ("dup", b"1"), ("dup", b"2")],
    ),
    (b"big", ONE_MB, [("", b"")], b"big", ONE_MB, [("", b"")]),
    (bytearray(b"ba"), memoryview(b"mv"), None, b"ba", b"mv", []),
]


def test_send_poll_round_trips_every_field(clients: Clients) -> None:
    clients.admin.create_topic("rt", 2)
    producer = clients.producer()
    base = now_ms() - 1000
    futures = [
        producer.send("rt", value=v, key=k, headers=h, partition=i % 2, timestamp_ms=base + i)
        for i, (k, v, h, *_) in enumerate(SEND_CASES)
    ]
    producer.flush()
    metas = [f.get(timeout=10) for f in futures]
    assert all(isinstance(m, RecordMetadata) for m in metas)
    assert [m.partition for m in metas] == [i % 2 for i in range(len(SEND_CASES))]
    assert [m.offset for m in metas] == [0, 0, 1, 1, 2, 2, 3]
    assert [m.timestamp for m in metas] == [base + i for i in range(len(SEND_CASES))]
    assert {m.topic for m in metas} == {"rt"}

    consumer = clients.consumer()
    consumer.subscribe(["rt"])
    got = {(r.partition, r.offset): r for r in drain(consumer, len(SEND_CASES))}
    for i, (meta, (*_, key, value, headers)) in enumerate(zip(metas, SEND_CASES, strict=True)):
        r = got[(meta.partition, meta.offset)]
        assert r == ConsumerRecord("rt", i % 2, meta.offset, base + i, 0, key, value, headers)


def header_case(i: int) -> list[dict[str, Any]] | None:
    """Null, empty, or two headers (one with a null value and a unicode key)."""
    if i % 4 == 0:
        return None
    if i % 4 == 1:
        return []
    return [{"key": "h", "value": b"%d" % i}, {"key": "ü", "value": None}]


@pytest.mark.parametrize("kind", ["table", "record_batch", "pandas"])
@pytest.mark.parametrize("value_type", ["binary", "string"])
def test_send_batch_poll_arrow_round_trips_every_column(clients: Clients, kind: str, value_type: str) -> None:
    clients.admin.create_topic("bulk", 3)
    producer = clients.producer()
    n = 30
    base = now_ms() - 10_000
    values: list[Any] = [f"value-{i}-é" if i % 7 else "" for i in range(n)]
    values[5] = None  # a tombstone
    keys = [None if i % 3 == 0 else f"key-{i % 4}".encode() for i in range(n)]
    partitions = [i % 3 for i in range(n)]
    stamps = [base + (i * 37) % 11 for i in range(n)]  # CreateTime not monotonic
    headers = [header_case(i) for i in range(n)]
    encoded = [None if v is None else v.encode() for v in values]
    columns = {
        "key": pa.array(keys, pa.binary()),
        "value": pa.array(values, pa.string()) if value_type == "string" else pa.array(encoded, pa.binary()),
        "partition": pa.array(partitions, pa.int32()),
        "timestamp": pa.array(stamps, pa.int64()),
        "headers": pa.array(headers, HEADERS_TYPE),
    }
    table = pa.table(columns)
    data: Any = {"table": table, "record_batch": table.to_batches()[0], "pandas": table.to_pandas()}[kind]
    result = producer.send_batch("bulk", data)
    assert result.record_count == n and result.topic == "bulk"
    assert result.offsets == {0: (0, 9), 1: (0, 9), 2: (0, 9)}

    consumer = clients.consumer()
    consumer.subscribe(["bulk"])
    got = drain_arrow(consumer, n).sort_by([("partition", "ascending"), ("offset", "ascending")])
    assert got.column("topic").to_pylist() == ["bulk"] * n
    order = sorted(range(n), key=lambda i: (partitions[i], i))  # send order kept within a partition
    assert got.column("partition").to_pylist() == [partitions[i] for i in order]
    assert got.column("offset").to_pylist() == [i % 10 for i in range(n)]
    assert got.column("timestamp").cast(pa.int64()).to_pylist() == [stamps[i] for i in order]
    assert got.column("key").to_pylist() == [keys[i] for i in order]
    assert got.column("value").to_pylist() == [encoded[i] for i in order]
    assert got.column("headers").to_pylist() == [headers[i] for i in order]


def test_send_batch_timestamp_column_of_timestamp_type_and_default_timestamp(clients: Clients) -> None:
    clients.admin.create_topic("ts", 1)
    producer = clients.producer()
    stamps = [now_ms() - 5000, now_ms() - 9000]
    producer.send_batch("ts", pa.table({"value": [b"a", b"b"], "timestamp": pa.array(stamps, pa.timestamp("ms"))}))
    before = now_ms()
    producer.send_batch("ts", pd.DataFrame({"value": [b"c"]}))  # no timestamp: now
    after = now_ms()
    records = read_partition(clients, "ts", 0)
    assert [r.value for r in records] == [b"a", b"b", b"c"]
    assert [r.timestamp for r in records[:2]] == stamps
    assert before <= records[2].timestamp <= after
    assert [r.key for r in records] == [None] * 3 and [r.headers for r in records] == [[]] * 3


# --------------------------------------------------------------------------- partitioning


def test_keyed_records_land_on_kafkas_partition_in_order(clients: Clients) -> None:
    clients.admin.create_topic("keyed", 5)
    producer = clients.producer(linger_ms=1)
    keys = [f"user-{i % 13}".encode() for i in range(120)]
    futures = [producer.send("keyed", key=k, value=b"%d" % i) for i, k in enumerate(keys)]
    producer.flush()
    metas = [f.get(timeout=10) for f in futures]
    for k, m in zip(keys, metas, strict=True):
        assert m.partition == kafka_partition(k, 5)
    # The same keys through send_batch land on the same partitions.
    result = producer.send_batch("keyed", pa.table({"key": keys, "value": [b"b%d" % i for i in range(120)]}))
    assert set(result.offsets) == {kafka_partition(k, 5) for k in keys}

    records = drain(_subscribed(clients, "keyed"), 240)
    per_key: dict[bytes, list[bytes]] = defaultdict(list)
    for r in records:
        assert r.key is not None and r.value is not None
        assert r.partition == kafka_partition(r.key, 5)
    for rs in by_partition(records).values():
        for r in rs:
            per_key[r.key].append(r.value)  # type: ignore[index,arg-type]  # not None, checked above
    for k in set(keys):
        sent = [b"%d" % i for i, kk in enumerate(keys) if kk == k] + [
            b"b%d" % i for i, kk in enumerate(keys) if kk == k
        ]
        assert per_key[k] == sent
    # RecordMetadata agrees with what is read back.
    read = {(r.partition, r.offset): r.value for r in records}
    for i, m in enumerate(metas):
        assert read[(m.partition, m.offset)] == b"%d" % i


def _subscribed(clients: Clients, *topics: str, **config: Any) -> Consumer:
    c = clients.consumer(**config)
    c.subscribe(list(topics))
    return c


def test_null_keys_are_spread_over_partitions_across_batches(clients: Clients) -> None:
    clients.admin.create_topic("spread", 3)
    producer = clients.producer(linger_ms=10_000)  # only flush() closes a batch
    batches = []
    for b in range(6):
        futures = [producer.send("spread", value=b"%d-%d" % (b, i)) for i in range(10)]
        producer.flush()
        batches.append({f.get(timeout=10).partition for f in futures})
    assert all(len(parts) == 1 for parts in batches)  # sticky within a batch
    sequence = [next(iter(parts)) for parts in batches]
    assert all(a != b for a, b in zip(sequence, sequence[1:], strict=False))  # never twice in a row
    assert len(set(sequence)) >= 2

    # send_batch: null-keyed rows go in runs of about batch_size bytes, each run to another partition.
    bulk = clients.producer(batch_size=100)
    values = [b"0123456789"] * 50
    result = bulk.send_batch("spread", pa.table({"value": values}))
    assert result.record_count == 50 and len(result.offsets) >= 2
    records = drain(_subscribed(clients, "spread"), 110)
    from_bulk = [r for r in records if r.value == b"0123456789"]
    assert len(from_bulk) == 50
    assert sum(last - first + 1 for first, last in result.offsets.values()) == 50


def test_acks_zero_gives_offset_minus_one_but_writes(clients: Clients) -> None:
    clients.admin.create_topic("fire", 1)
    producer = clients.producer(acks=0)
    metas = [producer.send("fire", value=b"x%d" % i, timestamp_ms=1_700_000_000_000).get(timeout=10) for i in range(3)]
    assert [(m.partition, m.offset) for m in metas] == [(0, -1)] * 3
    assert [r.value for r in read_partition(clients, "fire", 0)] == [b"x0", b"x1", b"x2"]


# --------------------------------------------------------------------------- positions and time


def _many_small_objects(clients: Clients, topic: str, stamps: list[int], per_object: int = 3) -> None:
    producer = clients.producer()
    for lo in range(0, len(stamps), per_object):
        chunk = stamps[lo : lo + per_object]
        producer.send_batch(
            topic,
            pa.table(
                {
                    "value": [b"v%d" % (lo + i) for i in range(len(chunk))],
                    "timestamp": chunk,
                    "partition": [0] * len(chunk),
                }
            ),
        )


def _check_seek_and_times(clients: Clients, topic: str, stamps: list[int], start: int = 0) -> None:
    consumer = clients.consumer(auto_offset_reset="none")
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    assert consumer.beginning_offsets([tp]) == {tp: start}
    assert consumer.end_offsets([tp]) == {tp: len(stamps)}
    for offset in range(start, len(stamps) + 1):
        consumer.seek(tp, offset)
        assert consumer.position(tp) == offset
        got = consumer.poll(max_records=2).get(tp, [])
        expected = list(range(offset, min(offset + 2, len(stamps))))
        assert [r.offset for r in got] == expected
        assert [r.value for r in got] == [b"v%d" % o for o in expected]
        assert [r.timestamp for r in got] == [stamps[o] for o in expected]
        assert consumer.position(tp) == offset + len(expected)
    for target in sorted({*stamps, min(stamps) - 1, max(stamps) + 1, *(s + 1 for s in stamps)}):
        expected_offset = next((o for o in range(start, len(stamps)) if stamps[o] >= target), None)
        answer = consumer.offsets_for_times({tp: target})[tp]
        if expected_offset is None:
            assert answer is None, target
        else:
            assert answer == OffsetAndTimestamp(expected_offset, stamps[expected_offset]), target


def test_seek_and_offsets_for_times_across_many_small_objects(clients: Clients) -> None:
    clients.admin.create_topic("small", 1)
    base = now_ms() - 60_000
    stamps = [base + d for d in (0, 10, 5, 30, 30, 20, 60, 50, 70, 100, 90, 95, 200, 150, 210, 300)]
    _many_small_objects(clients, "small", stamps)
    assert clients.admin.describe_topic("small")["partitions"][0]["segments"] == 6
    _check_seek_and_times(clients, "small", stamps)


def test_seek_and_offsets_for_times_after_merge_into_rewritten_segments(clients: Clients) -> None:
    # No self-maintenance: the producer's passes would merge some of the objects before the explicit pass below.
    config = {"segment.bytes": 8192, "file.delete.delay.ms": 0, "auto.maintenance.enable": "false", **PARTITIONED}
    clients.admin.create_topic("merged", 1, config)
    base = now_ms() - 60_000
    stamps = [base + (i * 7919) % 1000 for i in range(30)]  # shuffled CreateTime
    _many_small_objects(clients, "merged", stamps)
    store = clients.admin.root.store
    before = [i.key for i in store.list("topics/merged/") if "/log/" in i.key]
    assert len(before) == 10
    totals = clients.admin.maintain("merged")
    assert totals["merged"] >= 2
    after = [i.key for i in store.list("topics/merged/") if "/log/" in i.key]
    rewritten = [k for k in after if ".g1." in k]
    assert len(rewritten) == totals["merged"]
    # The appended objects that were merged are gone (file.delete.delay.ms=0); the rest is untouched.
    assert totals["garbage_deleted"] == len(before) - (len(after) - len(rewritten))
    desc = clients.admin.describe_topic("merged")["partitions"][0]
    assert desc["segments"] == len(after) and (desc["start_offset"], desc["end_offset"]) == (0, 30)
    _check_seek_and_times(clients, "merged", stamps)


def test_seek_to_beginning_end_and_position(clients: Clients) -> None:
    clients.admin.create_topic("pos", 2)
    producer = clients.producer()
    producer.send_batch("pos", pa.table({"value": [b"a"] * 7, "partition": [0] * 4 + [1] * 3}))
    clients.admin.delete_records("pos", {0: 2})
    consumer = clients.consumer(auto_offset_reset="latest")
    tp0, tp1 = TopicPartition("pos", 0), TopicPartition("pos", 1)
    consumer.assign([tp0, tp1])
    assert consumer.assignment() == {tp0, tp1}
    assert consumer.beginning_offsets([tp0, tp1]) == {tp0: 2, tp1: 0}
    assert consumer.end_offsets([tp0, tp1]) == {tp0: 4, tp1: 3}
    assert consumer.position(tp0) == 4 and consumer.position(tp1) == 3  # latest
    consumer.seek_to_beginning()
    assert (consumer.position(tp0), consumer.position(tp1)) == (2, 0)
    records = drain(consumer, 5)
    assert sorted((r.partition, r.offset) for r in records) == [(0, 2), (0, 3), (1, 0), (1, 1), (1, 2)]
    assert (consumer.position(tp0), consumer.position(tp1)) == (4, 3)
    consumer.seek_to_beginning(tp1)
    assert (consumer.position(tp0), consumer.position(tp1)) == (4, 0)
    consumer.seek_to_end(tp1)
    assert consumer.position(tp1) == 3
    producer.send("pos", value=b"new", partition=1).get(timeout=10)
    assert [(r.offset, r.value) for r in drain(consumer, 1)] == [(3, b"new")]


# --------------------------------------------------------------------------- waiting


def test_long_poll_returns_data_produced_by_another_thread(clients: Clients) -> None:
    clients.admin.create_topic("live", 1)
    consumer = _subscribed(clients, "live")
    polled_empty = threading.Event()
    real_fetch = consumer._fetch

    def spying_fetch(max_records: int) -> Any:
        out = real_fetch(max_records)
        if not out:
            polled_empty.set()
        return out

    consumer._fetch = spying_fetch  # type: ignore[method-assign]
    producer = clients.producer()
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            assert polled_empty.wait(30)  # the consumer is waiting inside poll()
            producer.send("live", value=b"hello", key=b"k").get(timeout=10)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    thread = threading.Thread(target=produce)
    thread.start()
    started = time.monotonic()
    got = consumer.poll(timeout_ms=60_000)
    elapsed = time.monotonic() - started
    thread.join(30)
    assert not errors
    records = got[TopicPartition("live", 0)]
    assert [(r.offset, r.key, r.value) for r in records] == [(0, b"k", b"hello")]
    assert elapsed < 60  # returned on the data, not on the timeout


def test_poll_waits_out_its_timeout_and_returns_empty(clients: Clients) -> None:
    clients.admin.create_topic("quiet", 2)
    consumer = _subscribed(clients, "quiet")
    started = time.monotonic()
    assert consumer.poll(timeout_ms=150) == {}
    assert time.monotonic() - started >= 0.15
    table = consumer.poll_arrow(timeout_ms=50)
    assert table.num_rows == 0 and table.schema == ARROW_SCHEMA


def test_subscribe_pattern_picks_up_new_topics_and_partitions(clients: Clients) -> None:
    consumer = clients.consumer(metadata_max_age_ms=1)
    consumer.subscribe(pattern=r"ev-.*")
    assert consumer.poll(timeout_ms=0) == {} and consumer.assignment() == set()
    clients.admin.create_topic("ev-a", 1)
    clients.admin.create_topic("other", 1)
    producer = clients.producer()
    producer.send("ev-a", value=b"a0").get(timeout=10)
    producer.send("other", value=b"o0").get(timeout=10)
    assert [(r.topic, r.value) for r in drain(consumer, 1)] == [("ev-a", b"a0")]
    assert consumer.assignment() == {TopicPartition("ev-a", 0)}

    clients.admin.create_partitions("ev-a", 3)
    producer.send("ev-a", value=b"a2", partition=2).get(timeout=10)  # a producer that knew only 1 partition
    clients.admin.create_topic("ev-b", 1)
    producer.send("ev-b", value=b"b0").get(timeout=10)
    got = drain(consumer, 2)
    assert sorted((r.topic, r.partition, r.offset, r.value) for r in got) == [
        ("ev-a", 2, 0, b"a2"),
        ("ev-b", 0, 0, b"b0"),
    ]
    assert consumer.assignment() == {TopicPartition("ev-a", p) for p in range(3)} | {TopicPartition("ev-b", 0)}


# --------------------------------------------------------------------------- retention and deletion


def _objects(clients: Clients, topic: str) -> list[tuple[str, int]]:
    return [(i.key, i.size) for i in clients.admin.root.store.list(f"topics/{topic}/") if "/log/" in i.key]


def test_retention_ms_moves_start_and_consumers_reset_or_fail(clients: Clients) -> None:
    # Retention by the explicit pass below only: the producer's own passes would retire the hour-old objects
    # as soon as a second one is written, before the consumers below have read offset 0.
    clients.admin.create_topic("old", 1, {"retention.ms": 1000, "auto.maintenance.enable": False, **PARTITIONED})
    producer = clients.producer()
    stale = now_ms() - 3_600_000
    for i in range(4):  # four objects of two records, all an hour old
        producer.send_batch(
            "old", pa.table({"value": [b"%d" % (2 * i), b"%d" % (2 * i + 1)], "timestamp": [stale] * 2})
        )
    tp = TopicPartition("old", 0)
    earliest = clients.consumer(auto_offset_reset="earliest")
    strict = clients.consumer(auto_offset_reset="none")
    for c in (earliest, strict):  # both have read (and cached their view of the log) before retention
        c.assign([tp])
        c.seek(tp, 0)
        assert [r.offset for r in c.poll(max_records=1)[tp]] == [0]
    clients.admin.maintain("old")
    desc = clients.admin.describe_topic("old")["partitions"][0]
    assert (desc["start_offset"], desc["end_offset"]) == (6, 8)  # the last object is never retired
    assert earliest.beginning_offsets([tp]) == {tp: 6}
    for c in (earliest, strict):
        c.seek(tp, 1)  # now before the start
    assert [(r.offset, r.value) for r in drain(earliest, 2)] == [(6, b"6"), (7, b"7")]
    with pytest.raises(OffsetOutOfRangeError, match=r"offset 1 .*old-0"):
        strict.poll(timeout_ms=0)
    assert len(_objects(clients, "old")) == 4  # deletion waits for file.delete.delay.ms


def test_retention_bytes_keeps_the_newest_objects_within_the_limit(clients: Clients) -> None:
    clients.admin.create_topic("big", 1, {"retention.bytes": 1, **PARTITIONED})
    producer = clients.producer()
    for i in range(5):
        producer.send_batch("big", pa.table({"value": [b"x" * 100 * (i + 1)] * 3}))
    sizes = [size for _, size in sorted(_objects(clients, "big"))]
    limit = sizes[-1] + sizes[-2]  # keep exactly the last two objects
    clients.admin.alter_config("big", {"retention.bytes": limit})
    clients.admin.maintain("big")
    assert clients.admin.describe_topic("big")["partitions"][0]["start_offset"] == 9
    clients.admin.alter_config("big", {"retention.bytes": sizes[-1] - 1})  # below even the last object
    clients.admin.maintain("big")
    assert clients.admin.describe_topic("big")["partitions"][0]["start_offset"] == 12
    assert [r.offset for r in read_partition(clients, "big", 0, start=12)] == [12, 13, 14]


def test_delete_records(clients: Clients) -> None:
    clients.admin.create_topic("dr", 2)
    clients.producer().send_batch("dr", pa.table({"value": [b"%d" % i for i in range(10)], "partition": [0, 1] * 5}))
    assert clients.admin.delete_records("dr", {0: 3, 1: 5}) == {0: 3, 1: 5}
    assert clients.admin.delete_records("dr", {0: 3}) == {0: 3}  # idempotent
    desc = clients.admin.describe_topic("dr")["partitions"]
    assert [(p["start_offset"], p["end_offset"]) for p in desc] == [(3, 5), (5, 5)]
    consumer = clients.consumer(auto_offset_reset="earliest")
    consumer.subscribe(["dr"])
    assert [(r.partition, r.offset, r.value) for r in drain(consumer, 2)] == [(0, 3, b"6"), (0, 4, b"8")]


def test_delete_topic_then_recreate_gives_an_empty_topic(clients: Clients) -> None:
    clients.admin.create_topic("phoenix", 2)
    producer = clients.producer()
    producer.send_batch("phoenix", pa.table({"value": [b"old"] * 6, "partition": [0, 1, 1, 1, 0, 1]}))
    clients.admin.delete_topic("phoenix")
    assert "phoenix" not in clients.admin.list_topics()
    assert clients.admin.root.store.list("topics/phoenix/") == []
    meta = clients.admin.create_topic("phoenix", 1)
    assert meta.partitions == 1 and meta.version == 0
    desc = clients.admin.describe_topic("phoenix")
    assert desc["topic_id"] == meta.topic_id
    assert desc["partitions"] == [{"partition": 0, "start_offset": 0, "end_offset": 0, "bytes": 0, "segments": 0}]
    fresh = clients.producer()
    assert fresh.send("phoenix", value=b"new").get(timeout=10).offset == 0
    assert [r.value for r in read_partition(clients, "phoenix", 0)] == [b"new"]


def test_log_append_time_overrides_create_time(clients: Clients) -> None:
    clients.admin.create_topic("lat", 1, {"message.timestamp.type": "LogAppendTime"})
    producer = clients.producer()
    before = now_ms()
    meta = producer.send("lat", value=b"a", timestamp_ms=1000).get(timeout=10)
    producer.send_batch("lat", pa.table({"value": [b"b", b"c"], "timestamp": [2000, 3000]}))
    after = now_ms()
    records = read_partition(clients, "lat", 0)
    assert [r.value for r in records] == [b"a", b"b", b"c"]
    assert all(before <= r.timestamp <= after for r in records)
    assert records[1].timestamp == records[2].timestamp  # one append, one time
    assert meta.timestamp == records[0].timestamp  # RecordMetadata reports the time the log kept


def test_describe_topic_numbers_are_exact(clients: Clients) -> None:
    clients.admin.create_topic("desc", 3, {"compression.type": "zstd", "retention.ms": -1, **PARTITIONED})
    producer = clients.producer()
    producer.send_batch("desc", pa.table({"value": [b"v"] * 5, "partition": [0] * 5}))
    producer.send_batch("desc", pa.table({"value": [b"w"] * 2, "partition": [0, 2]}))
    clients.admin.delete_records("desc", {0: 2})
    desc = clients.admin.describe_topic("desc")
    sizes: dict[int, list[int]] = defaultdict(list)
    for key, size in _objects(clients, "desc"):
        sizes[int(key.split("/")[3])].append(size)
    assert desc["name"] == "desc" and len(desc["topic_id"]) == 32
    assert desc["config"]["compression.type"] == "zstd" and desc["config"]["retention.ms"] == -1
    assert desc["config"]["segment.bytes"] == 64 * MB
    assert desc["partitions"] == [
        {"partition": 0, "start_offset": 2, "end_offset": 6, "bytes": sum(sizes[0]), "segments": 2},
        {"partition": 1, "start_offset": 0, "end_offset": 0, "bytes": 0, "segments": 0},
        {"partition": 2, "start_offset": 0, "end_offset": 1, "bytes": sum(sizes[2]), "segments": 1},
    ]
    if not clients.url.startswith("memory://"):  # the bytes are the files' sizes on disk
        on_disk = sum(p.stat().st_size for p in Path(clients.url).rglob("*.arrow"))
        assert on_disk == sum(sizes[0]) + sum(sizes[2])
    assert clients.admin.list_topics() == ["desc"]


def test_poll_arrow_is_bounded_by_bytes_not_by_max_poll_records(tmp_path: Path) -> None:
    """Kafka bounds fetches by bytes (fetch.max.bytes, max.partition.fetch.bytes); ``max_poll_records``
    exists for ``poll``'s Python objects, and ``poll_arrow`` without ``max_records`` ignores it."""
    import os

    url = str(tmp_path)
    LogStore(url).create_topic("bytes", 2)
    values = pa.array([os.urandom(100) for _ in range(40_000)], pa.binary())  # incompressible: stored ~ decoded
    with Producer(url, batch_size=64 * 1024) as producer:  # stored batches of about 64 KiB
        producer.send_batch("bytes", pa.table({"value": values, "partition": pa.array([0, 1] * 20_000, pa.int32())}))
    slack = 2 * 64 * 1024  # soft bounds: a partition's read may end one stored batch past its bound

    def first_poll(**config: Any) -> dict[int, int]:
        with Consumer(url, auto_offset_reset="earliest", **config) as consumer:
            consumer.assign([TopicPartition("bytes", 0), TopicPartition("bytes", 1)])
            table = consumer.poll_arrow()
        rows = table.group_by("partition").aggregate([("offset", "count")]).to_pydict()
        return dict(zip(rows["partition"], rows["offset_count"], strict=True))

    per_partition = first_poll(max_partition_fetch_bytes=256 * 1024)
    assert sum(per_partition.values()) > 500  # not max_poll_records
    assert all(500 < n * 100 <= 256 * 1024 + slack for n in per_partition.values()), per_partition
    total = first_poll(max_partition_fetch_bytes=10**9, fetch_max_bytes=300 * 1024)
    assert 500 < sum(total.values()) * 100 <= 300 * 1024 + slack, total
    everything = first_poll(max_partition_fetch_bytes=10**9)
    assert sum(everything.values()) == 40_000
    with Consumer(url, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("bytes", 0)])
        assert len(next(iter(consumer.poll().values()))) == 500  # poll keeps max_poll_records
        assert consumer.poll_arrow(max_records=7).num_rows == 7


def test_poll_arrow_topic_and_partition_columns_are_right_across_polls(tmp_path: Path) -> None:
    """``poll_arrow`` keeps its topic and partition columns between polls and slices them (RepeatedColumns):
    every row still names its own topic and partition, as batches grow, topics and partitions alternate,
    and tables handed out earlier keep their values."""
    url = str(tmp_path)
    admin = LogStore(url)
    admin.create_topic("a", 3)
    admin.create_topic("bb", 2)
    with Producer(url, linger_ms=0) as producer:
        for rows in (3, 50, 7, 400, 1):  # stored batches of growing and shrinking sizes
            for topic, partitions in (("a", 3), ("bb", 2)):
                for partition in range(partitions):
                    values = pa.array([b"%s-%d-%d" % (topic.encode(), partition, i) for i in range(rows)])
                    where = pa.array([partition] * rows, pa.int32())
                    producer.send_batch(topic, pa.table({"value": values, "partition": where}))
    tables = []
    with Consumer(url, auto_offset_reset="earliest", max_partition_fetch_bytes=200) as consumer:
        consumer.assign([TopicPartition(t, p) for t, n in (("a", 3), ("bb", 2)) for p in range(n)])
        while sum(t.num_rows for t in tables) < 5 * 461:
            tables.append(consumer.poll_arrow(timeout_ms=5_000))
        kept = consumer._fetcher.columns
        assert len(kept._topics["a"]) >= 400 and len(kept._partitions[1]) >= 400  # grown, then sliced
    assert len(tables) >= 5
    for table in tables:
        for row in table.select(["topic", "partition", "value"]).to_pylist():
            assert row["value"].startswith(b"%s-%d-" % (row["topic"].encode(), row["partition"])), row
    assert tables[0].column("topic").to_pylist()[0] in ("a", "bb")


def test_repeated_columns_keep_at_most_max_rows_and_slice_at_most_twice_a_batch() -> None:
    """Columns longer than ``MAX_ROWS`` are built for their batch and not kept; a kept column is sliced only
    for batches of at least half its length, so that a table (pickled, it carries whole buffers) never
    carries more than twice its rows."""
    import pickle

    from pyspark_logsource.client.fetcher import RepeatedColumns

    class Small(RepeatedColumns):
        MAX_ROWS = 8

    columns = Small()
    assert columns.topic("t", 5).to_pylist() == ["t"] * 5
    assert columns.topic("t", 12).to_pylist() == ["t"] * 12  # longer than MAX_ROWS: built, not kept
    assert len(columns._topics["t"]) == 5
    assert columns.topic("t", 8).to_pylist() == ["t"] * 8
    assert len(columns._topics["t"]) == 8
    assert columns.topic("t", 3).to_pylist() == ["t"] * 3  # under half of the kept 8: built alone
    assert len(columns._topics["t"]) == 8
    kept = columns._topics["t"]
    half = columns.topic("t", 4)
    assert half.to_pylist() == ["t"] * 4 and half.buffers()[1].address == kept.buffers()[1].address  # a slice
    assert columns.partition(3, 12).to_pylist() == [3] * 12
    assert 3 not in columns._partitions
    assert columns.partition(3, 2).to_pylist() == [3, 3]
    assert columns.partition(3, 2).type == pa.int32()
    assert columns.topic("u", 0).to_pylist() == []

    big = RepeatedColumns()
    big.topic("topic-name", 100_000)
    big.partition(0, 100_000)
    for n in (1, 10, 49_999, 50_000, 100_000):
        fresh = len(pickle.dumps(pa.repeat(pa.scalar("topic-name", pa.string()), n)))
        assert len(pickle.dumps(big.topic("topic-name", n))) <= 2 * fresh + 1_000, n
        fresh = len(pickle.dumps(pa.array([0] * n, pa.int32())))
        assert len(pickle.dumps(big.partition(0, n))) <= 2 * fresh + 1_000, n


def test_send_and_send_batch_racing_on_one_partition_keep_every_record(tmp_path: Path) -> None:
    """The sender thread and ``send_batch`` append to one partition at once with one producer id: each
    append must claim its own sequence, or the second takes the first's object for its own (PROTOCOL.md
    11.1), acknowledging offsets that hold other records (found while building typed topics)."""
    url = str(tmp_path)
    LogStore(url).create_topic("race", 1)
    expected: set[bytes] = set()
    acknowledged: dict[int, bytes] = {}
    with Producer(url, linger_ms=0) as producer:
        for round_ in range(40):
            singles = [b"s%d-%d" % (round_, i) for i in range(5)]
            batch = [b"b%d-%d" % (round_, i) for i in range(3)]
            expected.update(singles, batch)
            futures = [producer.send("race", value) for value in singles]  # the sender writes these meanwhile
            result = producer.send_batch("race", pa.table({"value": batch}))
            first, last = result.offsets[0]
            acknowledged.update(zip(range(first, last + 1), batch, strict=True))
            for value, future in zip(singles, futures, strict=True):
                acknowledged[future.get(timeout=10).offset] = value
    consumer = Consumer(url, auto_offset_reset="earliest")
    consumer.assign([TopicPartition("race", 0)])
    stored: dict[int, bytes] = {}
    while len(stored) < len(expected):
        table = consumer.poll_arrow(timeout_ms=2000)
        assert table.num_rows, f"only {len(stored)} of {len(expected)} records were written"
        stored.update(zip(table.column("offset").to_pylist(), table.column("value").to_pylist(), strict=True))
    consumer.close()
    assert set(stored.values()) == expected
    assert stored == acknowledged  # every acknowledged offset holds the record it was acknowledged for
