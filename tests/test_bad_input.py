"""Bad input: every mistake is a PlogError naming its culprit, and harms nothing already written.

Each test starts from a root holding known records (topic ``good``, three
partitions). After every bad call the whole root is read back with a fresh
consumer and compared with that snapshot, and the store's listing must be
unchanged: a refused call writes nothing, anywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

import pandas as pd
import pyarrow as pa
import pytest

from pyspark_logsource import (
    Consumer,
    InvalidConfigError,
    InvalidRecordError,
    InvalidTopicError,
    LogStore,
    OffsetOutOfRangeError,
    PlogError,
    Producer,
    ProducerClosedError,
    TopicAlreadyExistsError,
    TopicPartition,
    UnknownTopicOrPartitionError,
)
from pyspark_logsource.client.config import PRODUCER_CONFIG
from pyspark_logsource.spark.option_schema import SINK_OPTIONS
from pyspark_logsource.spark.options import parse_options
from segment_format.layout import ROOT_NOTICE_KEY
from segment_format.records import HEADERS_TYPE
from segment_format.topic import validate_config

TOPIC = "good"
PARTITIONS = 3
TP = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]


class World:
    """A root with known contents, and the means to prove they are intact."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.url = str(tmp_path / "plog")
        self.admin = LogStore(self.url)
        self.admin.create_topic(TOPIC, PARTITIONS, {"compression.type": "zstd"})
        self.producer = Producer(self.url, linger_ms=0)
        for i in range(6):
            self.producer.send(TOPIC, value=b"v%d" % i, key=b"k%d" % (i % 2), headers=[("n", b"%d" % i)])
        self.producer.flush()
        self.producer.send_batch(
            TOPIC, pa.table({"value": [b"bulk%d" % i for i in range(9)], "partition": [0, 1, 2] * 3})
        )
        self._closables: list[Any] = [self.admin, self.producer]
        # The producer maintains after its writes on a thread of its own: the root is as it stays once done.
        assert self.producer._sender.maintainer.wait_idle(60)
        self.snapshot = self.read_everything()
        self.listing = self._listing()
        assert sum(len(v) for v in self.snapshot.values()) == 15

    def consumer(self, **config: Any) -> Consumer:
        c = Consumer(self.url, **config)
        self._closables.append(c)
        return c

    def read_everything(self) -> dict[TopicPartition, list[tuple[Any, ...]]]:
        consumer = Consumer(self.url, auto_offset_reset="earliest")
        try:
            consumer.assign(TP)
            starts, ends = consumer.beginning_offsets(TP), consumer.end_offsets(TP)
            out: dict[TopicPartition, list[tuple[Any, ...]]] = {tp: [] for tp in TP}
            while any(len(out[tp]) < ends[tp] - starts[tp] for tp in TP):
                polled = consumer.poll(timeout_ms=1000)
                assert polled, "records went missing"
                for tp, records in polled.items():
                    out[tp].extend((r.offset, r.timestamp, r.key, r.value, r.headers) for r in records)
            return out
        finally:
            consumer.close()

    def _listing(self, ignoring: frozenset[str] | set[str] = frozenset()) -> list[tuple[str, int | None]]:
        # The root change notice is replaced by every accepted write and metadata change (PROTOCOL.md 9.1):
        # only its existence is part of what a refused input must leave as it was.
        infos = self.admin.root.store.list("")
        return [(i.key, None if i.key == ROOT_NOTICE_KEY else i.size) for i in infos if i.key not in ignoring]

    def check_intact(self, ignoring: frozenset[str] | set[str] = frozenset()) -> None:
        assert self.admin.list_topics() == [TOPIC]
        assert self._listing(ignoring) == self.listing
        assert self.read_everything() == self.snapshot
        assert sorted(p.name for p in self.tmp_path.iterdir()) == ["plog"]  # nothing escaped the root

    def close(self) -> None:
        for c in reversed(self._closables):
            c.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.close()


def refused(world: World, error: type[PlogError], call: Callable[[], Any], *culprits: str) -> PlogError:
    """``call`` raises ``error`` (a PlogError) whose message names every culprit; nothing is harmed."""
    with pytest.raises(error) as excinfo:
        call()
    exc = excinfo.value
    assert isinstance(exc, PlogError)
    for culprit in culprits:
        assert culprit in str(exc), f"{culprit!r} not named in: {exc}"
    world.check_intact()
    return exc


# --------------------------------------------------------------------------- topic names


BAD_NAMES = ["", ".", "..", "a/b", "../etc", "/abs", "a\\b", "sp ace", "ü", "x" * 250, "a\x00b", "tab\t"]


@pytest.mark.parametrize("name", BAD_NAMES, ids=lambda n: repr(n)[:20])
def test_invalid_topic_names_are_refused_everywhere(world: World, name: str) -> None:
    named = repr(name)
    refused(world, InvalidTopicError, lambda: world.admin.create_topic(name, 1), named)
    refused(world, InvalidTopicError, lambda: world.admin.describe_topic(name), named)
    refused(world, InvalidTopicError, lambda: world.admin.delete_topic(name), named)
    refused(world, InvalidTopicError, lambda: world.producer.send(name, value=b"x"), named)
    refused(world, InvalidTopicError, lambda: world.producer.send_batch(name, pa.table({"value": [b"x"]})), named)
    consumer = world.consumer()
    refused(world, InvalidTopicError, lambda: consumer.assign([TopicPartition(name, 0)]), named)
    refused(world, InvalidTopicError, lambda: consumer.subscribe([name]), named)
    assert consumer.assignment() == set()


@pytest.mark.parametrize("name", [None, 7, b"good", ["good"]], ids=repr)
def test_non_str_topic_names_are_refused(world: World, name: Any) -> None:
    kind = type(name).__name__
    refused(world, InvalidTopicError, lambda: world.admin.create_topic(name, 1), kind)
    refused(world, InvalidTopicError, lambda: world.admin.describe_topic(name), kind)
    refused(world, InvalidTopicError, lambda: world.producer.send(name, value=b"x"), kind)
    refused(world, InvalidConfigError, lambda: world.consumer().assign([(name, 0)]), repr(name))  # type: ignore[list-item]


def test_longest_legal_name_is_accepted(world: World) -> None:
    name = "n" * 249
    world.admin.create_topic(name, 1)
    world.producer.send(name, value=b"x").get(timeout=10)
    # Closed before the delete: the sender maintains after acknowledging (PROTOCOL.md 10.1), and a pass
    # still running would create the topic's maintainer lease after the delete removed it.
    world.producer.close()
    assert world.admin.describe_topic(name)["partitions"][0]["end_offset"] == 1
    world.admin.delete_topic(name)
    # The deleted topic's flush stays in its shared object until the root collector's C + D have passed
    # (PROTOCOL.md 10.2): the one object besides the world's.
    (left,) = [i.key for i in world.admin.root.store.list("shared/") if i.key not in dict(world.listing)]
    world.check_intact(ignoring={left})


# --------------------------------------------------------------------------- unknown topics and partitions


def test_unknown_topic(world: World) -> None:
    refused(world, UnknownTopicOrPartitionError, lambda: world.producer.send("nope", value=b"x"), "'nope'")
    refused(
        world,
        UnknownTopicOrPartitionError,
        lambda: world.producer.send_batch("nope", pa.table({"value": [b"x"]})),
        "'nope'",
    )
    consumer = world.consumer()
    refused(world, UnknownTopicOrPartitionError, lambda: consumer.assign([TopicPartition("nope", 0)]), "'nope'")
    refused(world, UnknownTopicOrPartitionError, lambda: consumer.subscribe(["nope"]), "'nope'")
    refused(world, UnknownTopicOrPartitionError, lambda: consumer.subscribe([TOPIC, "nope"]), "'nope'")
    assert consumer.assignment() == set() and consumer.subscription() == set()
    refused(
        world,
        UnknownTopicOrPartitionError,
        lambda: consumer.end_offsets([TopicPartition("nope", 0)]),
        "'nope'",
    )
    refused(world, UnknownTopicOrPartitionError, lambda: world.admin.describe_topic("nope"), "'nope'")
    refused(world, UnknownTopicOrPartitionError, lambda: world.admin.delete_topic("nope"), "'nope'")
    refused(world, UnknownTopicOrPartitionError, lambda: world.admin.create_partitions("nope", 4), "'nope'")
    refused(world, UnknownTopicOrPartitionError, lambda: world.admin.delete_records("nope", {0: 0}), "'nope'")
    # The error is also a KeyError, as in kafka-python, but prints as a plain sentence.
    assert str(UnknownTopicOrPartitionError("unknown topic 'x'")) == "unknown topic 'x'"


@pytest.mark.parametrize("partition", [3, 99, -1, True, "1", 1.0])
def test_send_to_a_partition_out_of_range(world: World, partition: Any) -> None:
    refused(
        world,
        UnknownTopicOrPartitionError,
        lambda: world.producer.send(TOPIC, value=b"x", partition=partition),
        f"partition {partition!r}",
        f"'{TOPIC}'",
        "0..2",
    )


def test_assign_and_seek_partitions_out_of_range(world: World) -> None:
    consumer = world.consumer()
    refused(
        world,
        UnknownTopicOrPartitionError,
        lambda: consumer.assign([TopicPartition(TOPIC, 3)]),
        "partition 3",
    )
    refused(
        world,
        UnknownTopicOrPartitionError,
        lambda: consumer.assign([TP[0], TopicPartition(TOPIC, -1)]),
        "partition -1",
    )
    assert consumer.assignment() == set()  # all or nothing
    refused(world, InvalidConfigError, lambda: consumer.assign([TOPIC]), repr(TOPIC))  # type: ignore[list-item]
    consumer.assign([TP[0]])
    refused(world, InvalidConfigError, lambda: consumer.seek(TP[1], 0), "partition=1", "not assigned")
    refused(world, InvalidConfigError, lambda: consumer.position(TopicPartition(TOPIC, 7)), "partition=7")


@pytest.mark.parametrize("bad", [3, -2, 2**40])
def test_send_batch_partition_column_out_of_range(world: World, bad: int) -> None:
    table = pa.table({"value": [b"a", b"b", b"c"], "partition": pa.array([0, bad, 1], pa.int64())})
    refused(
        world,
        UnknownTopicOrPartitionError,
        lambda: world.producer.send_batch(TOPIC, table),
        f"partition {bad}",
    )


# --------------------------------------------------------------------------- offsets


def test_seek_to_a_negative_or_non_int_offset(world: World) -> None:
    consumer = world.consumer()
    consumer.assign(TP)
    bad_offsets: tuple[Any, ...] = (-1, -100, "3", 1.5, None, True)
    for bad in bad_offsets:
        refused(world, OffsetOutOfRangeError, partial(consumer.seek, TP[0], bad), repr(bad), "good")
    refused(world, InvalidConfigError, lambda: consumer.offsets_for_times({TP[0]: -1}), "-1")


def test_reading_past_the_end_or_before_the_start_with_reset_none(world: World) -> None:
    ends = world.consumer().end_offsets(TP)
    consumer = world.consumer(auto_offset_reset="none")
    consumer.assign(TP)
    refused(world, OffsetOutOfRangeError, lambda: consumer.poll(), "no position", "partition=0")
    consumer.seek(TP[0], 0)
    consumer.seek(TP[1], 0)
    consumer.seek(TP[2], ends[TP[2]] + 1)
    exc = refused(world, OffsetOutOfRangeError, lambda: consumer.poll(), f"offset {ends[TP[2]] + 1}", "good-2")
    assert f"0..{ends[TP[2]]}" in str(exc)
    # The records of the healthy partitions fetched before the error were not skipped.
    assert consumer.position(TP[0]) == 0 and consumer.position(TP[1]) == 0
    consumer.seek(TP[2], 0)
    got: dict[TopicPartition, list[Any]] = {tp: [] for tp in TP}
    while sum(map(len, got.values())) < 15:
        for tp, records in consumer.poll(timeout_ms=1000).items():
            got[tp].extend((r.offset, r.timestamp, r.key, r.value, r.headers) for r in records)
    assert got == world.snapshot

    # Before the start: move the start of partition 0 (this is a legitimate write), then read below it.
    world.admin.delete_records(TOPIC, {0: 2})
    world.listing = world._listing()
    world.snapshot[TP[0]] = world.snapshot[TP[0]][2:]
    consumer.seek(TP[0], 1)
    refused(world, OffsetOutOfRangeError, lambda: consumer.poll(), "offset 1", "good-0", f"2..{ends[TP[0]]}")
    refused(world, OffsetOutOfRangeError, lambda: world.admin.delete_records(TOPIC, {0: 1}), "good-0", "to 1")
    refused(
        world,
        OffsetOutOfRangeError,
        lambda: world.admin.delete_records(TOPIC, {1: ends[TP[1]] + 1}),
        "good-1",
    )
    refused(world, UnknownTopicOrPartitionError, lambda: world.admin.delete_records(TOPIC, {3: 0}), "partition 3")


# --------------------------------------------------------------------------- records


@pytest.mark.parametrize(
    ("field", "bad", "culprits"),
    [
        ("value", 1, ["value", "int"]),
        ("value", {"a": 1}, ["value", "dict"]),
        ("value", 1.5, ["value", "float"]),
        ("value", ["x"], ["value", "list"]),
        ("key", 7, ["key", "int"]),
        ("key", {"k": b"v"}, ["key", "dict"]),
        ("key", object(), ["key", "object"]),
    ],
)
def test_value_or_key_of_the_wrong_type(world: World, field: str, bad: Any, culprits: list[str]) -> None:
    kwargs = {"value": b"ok", "key": b"ok", field: bad}
    refused(world, InvalidRecordError, lambda: world.producer.send(TOPIC, **kwargs), *culprits)
    world.producer.flush()
    world.check_intact()  # nothing was buffered either


def test_null_key_and_null_value_is_refused(world: World) -> None:
    refused(world, InvalidRecordError, lambda: world.producer.send(TOPIC), "key or a value")


@pytest.mark.parametrize(
    ("headers", "culprits"),
    [
        ("h=v", ["headers", "str"]),
        ({"h": b"v"}, ["headers", "dict"]),
        ([("h",)], ["('h',)"]),
        ([("h", b"v", b"w")], ["('h', b'v', b'w')"]),
        ([(1, b"v")], ["(1, b'v')"]),
        ([b"h"], ["b'h'"]),
        ([("h", 5)], ["'h'", "int"]),
        ([("ok", b"v"), ("h", {"x": 1})], ["'h'", "dict"]),
    ],
)
def test_malformed_headers(world: World, headers: Any, culprits: list[str]) -> None:
    refused(world, InvalidRecordError, lambda: world.producer.send(TOPIC, value=b"x", headers=headers), *culprits)


@pytest.mark.parametrize("bad", [-1, -(2**40), 1.5, "now", True])
def test_bad_timestamp(world: World, bad: Any) -> None:
    refused(
        world,
        InvalidRecordError,
        lambda: world.producer.send(TOPIC, value=b"x", timestamp_ms=bad),
        "timestamp_ms",
    )


BAD_TABLES: list[tuple[str, Any, list[str]]] = [
    ("no value column", pa.table({"key": [b"k"]}), ["'value'"]),
    ("misspelled column", pa.table({"vaule": [b"v"]}), ["'vaule'"]),
    ("misspelled extra column", pa.table({"value": [b"v"], "keys": [b"k"]}), ["'keys'"]),
    ("int value", pa.table({"value": [1, 2]}), ["'value'", "int64"]),
    ("null-typed value", pa.table({"value": pa.nulls(2)}), ["'value'", "null"]),
    ("struct key", pa.table({"value": [b"v"], "key": [{"a": 1}]}), ["'key'", "struct"]),
    ("double key", pa.table({"value": [b"v"], "key": [1.5]}), ["'key'", "double"]),
    ("string timestamp", pa.table({"value": [b"v"], "timestamp": ["yesterday"]}), ["'timestamp'", "string"]),
    (
        "negative timestamp",
        pa.table({"value": [b"v", b"w"], "timestamp": [5, -7]}),
        ["'timestamp'", "-7", "row 1"],
    ),
    ("float partition", pa.table({"value": [b"v"], "partition": [1.0]}), ["'partition'", "double"]),
    ("string partition", pa.table({"value": [b"v"], "partition": ["1"]}), ["'partition'", "string"]),
    (
        "int headers",
        pa.table({"value": [b"v"], "headers": pa.array([[1]], pa.list_(pa.int64()))}),
        ["'headers'"],
    ),
    ("string headers", pa.table({"value": [b"v"], "headers": ["h=v"]}), ["'headers'", "string"]),
    (
        "misnamed header fields",
        pa.table({"value": [b"v"], "headers": pa.array([[{"k": "a", "v": b"x"}]])}),
        ["'headers'"],
    ),
    (
        "null header key",
        pa.table(
            {
                "value": [b"v"],
                "headers": pa.array(
                    [[{"key": None, "value": b"x"}]],
                    pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
                ),
            }
        ),
        ["'headers'"],
    ),
    ("pandas without value", pd.DataFrame({"val": [b"x"]}), ["'val'"]),
    ("a list", [{"value": b"x"}], ["list"]),
    ("a dict", {"value": [b"x"]}, ["dict"]),
    ("bytes", b"value", ["bytes"]),
]


@pytest.mark.parametrize(("data", "culprits"), [(d, c) for _, d, c in BAD_TABLES], ids=[n for n, _, _ in BAD_TABLES])
def test_send_batch_bad_tables(world: World, data: Any, culprits: list[str]) -> None:
    refused(world, InvalidRecordError, lambda: world.producer.send_batch(TOPIC, data), *culprits)


def test_send_batch_good_headers_column_still_works(world: World) -> None:
    """The refusals above are not over-eager: the same shapes done right are accepted."""
    headers = pa.array([[{"key": "a", "value": None}], None], HEADERS_TYPE)
    world.producer.send_batch(TOPIC, pa.table({"value": ["x", "y"], "headers": headers, "partition": [0, 0]}))
    end = world.consumer().end_offsets([TP[0]])[TP[0]]
    c = world.consumer()
    c.assign([TP[0]])
    c.seek(TP[0], end - 2)
    records = c.poll(timeout_ms=1000)[TP[0]]
    assert [(r.value, r.headers) for r in records] == [(b"x", [("a", None)]), (b"y", [])]


# --------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("config", "culprits"),
    [
        ({"bogus": 1}, ["'bogus'"]),
        ({"bootstrap_servers": "localhost:9092"}, ["'bootstrap_servers'"]),
        ({"acks": 2}, ["acks=2"]),
        ({"acks": "most"}, ["acks='most'"]),
        ({"compression_type": "snappy"}, ["'snappy'"]),
        ({"compression_type": 3}, ["3"]),
        ({"linger_ms": -1}, ["linger_ms=-1"]),
        ({"batch_size": "big"}, ["batch_size='big'"]),
        ({"max_block_ms": 1.5}, ["max_block_ms=1.5"]),
        ({"partitioner": "murmur2"}, ["partitioner"]),
        ({"value_serializer": 5}, ["value_serializer"]),
    ],
)
def test_bad_producer_config(world: World, config: dict[str, Any], culprits: list[str]) -> None:
    refused(world, InvalidConfigError, lambda: Producer(world.url, **config), *culprits)


@pytest.mark.parametrize(
    ("config", "culprits"),
    [
        ({"bogus": 1}, ["'bogus'"]),
        ({"auto_offset_reset": "smallest"}, ["auto_offset_reset='smallest'"]),
        ({"isolation_level": "dirty"}, ["isolation_level='dirty'"]),
        ({"max_poll_records": 0}, ["max_poll_records=0"]),
        ({"fetch_max_bytes": "1MB"}, ["fetch_max_bytes='1MB'"]),
        ({"group_id": "no/slashes"}, ["group_id"]),
        ({"group_id": "g", "partition_assignment_strategy": "fair"}, ["partition_assignment_strategy"]),
        ({"group_id": "g", "heartbeat_interval_ms": 500, "session_timeout_ms": 500}, ["heartbeat_interval_ms"]),
    ],
)
def test_bad_consumer_config(world: World, config: dict[str, Any], culprits: list[str]) -> None:
    refused(world, InvalidConfigError, lambda: Consumer(world.url, **config), *culprits)


def test_bad_poll_and_subscribe_arguments(world: World) -> None:
    consumer = world.consumer()
    consumer.subscribe([TOPIC])
    refused(world, InvalidConfigError, lambda: consumer.poll(timeout_ms=-5), "timeout_ms=-5")
    refused(world, InvalidConfigError, lambda: consumer.poll(max_records=0), "max_records=0")
    refused(
        world,
        InvalidConfigError,
        partial(consumer.poll_arrow, timeout_ms=cast(Any, "soon")),
        "timeout_ms='soon'",
    )
    refused(world, InvalidConfigError, lambda: consumer.assign(TP), "assign() after subscribe()")
    other = world.consumer()
    refused(world, InvalidConfigError, lambda: other.subscribe(pattern="(unclosed"), "'(unclosed'")
    other.assign([TP[0]])
    refused(world, InvalidConfigError, lambda: other.subscribe([TOPIC]), "subscribe() after assign()")


@pytest.mark.parametrize(
    ("config", "culprits"),
    [
        ({"segment.bytes": -5}, ["segment.bytes=-5", "1024"]),
        ({"segment.bytes": 1023}, ["segment.bytes=1023"]),
        ({"segment.bytes": 2048.5}, ["segment.bytes=2048.5"]),
        ({"retention.ms": "a week"}, ["retention.ms='a week'"]),
        ({"retention.ms": True}, ["retention.ms=True"]),
        ({"retention.bytes": -2}, ["retention.bytes=-2"]),
        ({"segment.ms": 0}, ["segment.ms=0"]),
        ({"max.message.bytes": None}, ["max.message.bytes=None"]),
        ({"compression.type": "snappy"}, ["compression.type='snappy'"]),
        ({"cleanup.policy": "shred"}, ["cleanup.policy='shred'"]),
        ({"message.timestamp.type": "BrokerTime"}, ["'BrokerTime'"]),
        ({"retention.hours": 1}, ["'retention.hours'"]),
        ({"writer.max.staleness.ms": 5000, "file.delete.delay.ms": 1000}, ["writer.max.staleness.ms"]),
    ],
)
def test_bad_topic_config(world: World, config: dict[str, Any], culprits: list[str]) -> None:
    refused(world, InvalidConfigError, lambda: world.admin.create_topic("fresh", 1, config), *culprits)
    assert "fresh" not in world.admin.list_topics()
    before = world.admin.describe_topic(TOPIC)["config"]
    refused(world, InvalidConfigError, lambda: world.admin.alter_config(TOPIC, config), *culprits)
    assert world.admin.describe_topic(TOPIC)["config"] == before


def _read_options(streaming: bool = True, **options: str) -> Callable[[], Any]:
    return lambda: parse_options({"url": "/r", "subscribe": "t", **options}, streaming=streaming)


@pytest.mark.parametrize(
    ("check", "suggested"),
    [
        (_read_options(startingoffsets="earlist"), "'earliest'"),
        (_read_options(streaming=False, endingoffsets="lattest"), "'latest'"),
        (_read_options(isolationlevel="read_comitted"), "'read_committed'"),
        (_read_options(startingofsets="earliest"), "'startingOffsets'"),
        (lambda: SINK_OPTIONS.validate({"compression": "lz5"}), "'lz4'"),
        (lambda: validate_config({"cleanup.policy": "compct"}), "'compact'"),
        (lambda: validate_config({"retention.mss": 5}), "'retention.ms'"),
        (lambda: validate_config({"message.timestamp.type": "LogApendTime"}), "'LogAppendTime'"),
        (lambda: PRODUCER_CONFIG.validate({"compresion_type": "lz4"}), "'compression_type'"),
    ],
)  # fmt: skip
def test_a_misspelt_option_or_config_says_what_is_valid_and_suggests_the_closest(
    check: Callable[[], Any], suggested: str
) -> None:
    with pytest.raises(InvalidConfigError) as raised:
        check()
    assert f"(did you mean {suggested}?)" in str(raised.value)


def test_a_value_far_from_every_valid_one_gets_no_suggestion() -> None:
    with pytest.raises(InvalidConfigError) as raised:
        SINK_OPTIONS.validate({"compression": "snappy"})
    assert "is not one of" in str(raised.value) and "did you mean" not in str(raised.value)


def test_numeric_strings_are_accepted_for_integer_topic_config(world: World) -> None:
    """Values from a command line arrive as strings; they are converted, not refused."""
    meta = world.admin.create_topic("cli", 1, {"segment.bytes": "2048", "retention.ms": 60000.0})
    assert meta.config["segment.bytes"] == 2048 and meta.config["retention.ms"] == 60000
    world.admin.delete_topic("cli")
    world.check_intact()


def test_create_topic_twice_and_bad_partition_counts(world: World) -> None:
    refused(world, TopicAlreadyExistsError, lambda: world.admin.create_topic(TOPIC, PARTITIONS), f"'{TOPIC}'")
    refused(
        world,
        TopicAlreadyExistsError,
        lambda: world.admin.create_topic(TOPIC, 7, {"retention.ms": 1}),
        f"'{TOPIC}'",
    )
    desc = world.admin.describe_topic(TOPIC)
    assert len(desc["partitions"]) == PARTITIONS and desc["config"]["retention.ms"] == 7 * 24 * 3600 * 1000
    bad_counts: tuple[Any, ...] = (0, -1, "3", 2.0, True, None)
    for bad in bad_counts:
        refused(world, InvalidConfigError, partial(world.admin.create_topic, "fresh", bad), f"got {bad!r}")
    assert world.admin.list_topics() == [TOPIC]
    refused(world, InvalidConfigError, lambda: world.admin.create_partitions(TOPIC, 2), "3 partitions", "2")
    refused(world, InvalidConfigError, partial(world.admin.create_partitions, TOPIC, cast(Any, "4")), "'4'")


def test_bad_storage_urls(world: World) -> None:
    for url in ("", "bogus-protocol://x", "memory://"):
        refused(world, InvalidConfigError, partial(Producer, url), repr(url))
        refused(world, InvalidConfigError, partial(LogStore, url), repr(url))


# --------------------------------------------------------------------------- closed clients


def test_closed_producer(world: World) -> None:
    producer = Producer(world.url)
    future = producer.send(TOPIC, value=b"last words", partition=0)
    producer.close()
    assert future.get(timeout=10).offset == world.snapshot[TP[0]][-1][0] + 1  # flushed by close()
    world.listing = world._listing()
    world.snapshot = world.read_everything()
    refused(world, ProducerClosedError, lambda: producer.send(TOPIC, value=b"x"), "send()", "closed")
    refused(world, ProducerClosedError, lambda: producer.send_batch(TOPIC, pa.table({"value": [b"x"]})), "closed")
    producer.close()  # idempotent
    world.check_intact()


def test_closed_consumer(world: World) -> None:
    consumer = world.consumer()
    consumer.assign(TP)
    consumer.close()
    refused(world, InvalidConfigError, lambda: consumer.poll(), "closed")
    refused(world, InvalidConfigError, lambda: consumer.poll_arrow(), "closed")


def test_every_error_is_a_plog_error_and_keeps_its_builtin_base() -> None:
    assert issubclass(InvalidConfigError, ValueError) and issubclass(InvalidTopicError, ValueError)
    assert issubclass(InvalidRecordError, TypeError) and issubclass(OffsetOutOfRangeError, IndexError)
    assert issubclass(UnknownTopicOrPartitionError, KeyError)
    for error in (
        InvalidConfigError,
        InvalidRecordError,
        InvalidTopicError,
        OffsetOutOfRangeError,
        ProducerClosedError,
        TopicAlreadyExistsError,
        UnknownTopicOrPartitionError,
    ):
        assert issubclass(error, PlogError)
