"""The inspection API: tables of topics, partitions, segments, batches and records; verify; display; plots."""

from __future__ import annotations

import dataclasses
import io
import re
import shutil
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

import pyspark_logsource
from pyspark_logsource import LogStore, Producer, TopicPartition
from pyspark_logsource import views as pi
from pyspark_logsource.views import cards
from segment_format.errors import CorruptRecordError, OffsetOutOfRangeError, UnknownTopicOrPartitionError
from segment_format.inspect import listings as sl
from segment_format.inspect import verify as sv
from segment_format.layout import appended_name
from segment_format.records import RECORD_SCHEMA, payload_batch, with_offsets
from segment_format.root import LogRoot
from segment_format.segment import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    FORMAT_VERSION,
    INDEX_SCHEMA,
    MAGIC,
    TAIL,
    BatchMeta,
    assemble_segment,
    crc32c,
    encode_batch,
    ipc_options,
    raw_messages,
    read_batches,
    read_index,
)
from segment_format.stores import LocalStore
from segment_format.stores.base import ForwardingStore

ROUNDS = 4
PER_ROUND = 90  # rows per round, spread evenly over 3 partitions: 30 per partition per round
PARTITIONS = 3
T0 = (int(time.time()) // 60) * 60_000 - 3_600_000  # an hour ago: well inside the default retention


PARTITIONED = {"storage.layout": "partitioned"}


def value_of(round_: int, i: int) -> str:
    return f"round {round_} record {i:03d} " + "x" * 20


def produce_clicks(url: str) -> None:
    """Topic ``clicks``: 3 partitions, 4 appended objects each (one per round), 2 batches per object.

    Partitioned topics: these tests inspect and damage per-partition segment objects; a shared topic's
    objects and commits are inspected in ``test_shared_topics``."""
    with LogStore(url) as store:
        store.create_topic("clicks", PARTITIONS, {"segment.bytes": 1024 * 1024, **PARTITIONED})
        store.create_topic("orders", 1, {"compression.type": "zstd", "retention.ms": -1, **PARTITIONED})
    with Producer(url, batch_size=1024) as producer:
        for r in range(ROUNDS):
            i = np.arange(PER_ROUND)
            producer.send_batch(
                "clicks",
                pd.DataFrame(
                    {
                        "partition": i % PARTITIONS,
                        "key": [f"user-{k % 7}" for k in i],
                        "value": [value_of(r, int(k)) for k in i],
                        "timestamp": T0 + r * 60_000 + i * 100,
                    }
                ),
            )
        producer.send_batch("orders", pd.DataFrame({"value": ["order"] * 5, "timestamp": [T0] * 5}))


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("inspect") / "root"
    produce_clicks(str(root))
    return root


@pytest.fixture
def root_dir(base_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the base data, for tests that damage or change it."""
    target = tmp_path / "root"
    shutil.copytree(base_dir, target)
    return target


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def chain_files(root: Path, partition: int) -> list[Path]:
    view = LogRoot(str(root)).partition("clicks", partition).view()
    return [root / ref.key for ref in view.segments]


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def verify_without_changes(root: Path, topic: str | None = "clicks") -> sv.VerifyReport:
    """verify(), asserting that it changed no byte and no name under the root."""
    before = snapshot(root)
    report = sv.verify(str(root), topic)
    assert snapshot(root) == before
    return report


# --------------------------------------------------------------------------- tables


def test_topics_lists_every_topic_with_its_config(base_dir: Path) -> None:
    frame = sl.topics(str(base_dir))
    assert list(frame["topic"]) == ["clicks", "orders"]
    assert list(frame["partitions"]) == [3, 1]
    assert list(frame["compression.type"]) == ["lz4", "zstd"]
    assert list(frame["retention.ms"]) == [7 * 24 * 3600 * 1000, -1]
    assert frame["topic_id"].str.fullmatch(r"[0-9a-f]{32}").all()
    assert str(frame["created"].dtype).startswith("datetime64") and frame["created"].dt.tz is not None


def test_topic_config_marks_overrides(base_dir: Path) -> None:
    config = sl.topic_config(str(base_dir), "orders").set_index("key")
    assert config.loc["compression.type", "value"] == "zstd"
    assert not config.loc["compression.type", "is_default"]
    assert config.loc["cleanup.policy", "is_default"]
    # Partitioned in a root whose topics are shared by default (it lists sharedObjects): an override too.
    assert config.loc["storage.layout", "default"] == "shared"
    assert set(config.index[~config["is_default"]]) == {"compression.type", "retention.ms", "storage.layout"}


def test_partitions_offsets_bytes_and_counts(base_dir: Path) -> None:
    frame = sl.partitions(str(base_dir), "clicks")
    assert list(frame["partition"]) == [0, 1, 2]
    assert (frame["start_offset"] == 0).all()
    assert (frame["end_offset"] == ROUNDS * PER_ROUND // PARTITIONS).all()
    assert (frame["records"] == frame["end_offset"]).all()
    assert (frame["segments"] == ROUNDS).all()
    for p in range(PARTITIONS):
        assert frame.loc[p, "bytes"] == sum(f.stat().st_size for f in chain_files(base_dir, p))
    assert (frame["uncompressed_bytes"] > 0).all()
    assert list(frame["min_timestamp"]) == [pd.Timestamp(T0 + p * 100, unit="ms", tz="UTC") for p in range(3)]
    assert frame.loc[2, "max_timestamp"] == pd.Timestamp(T0 + 3 * 60_000 + 89 * 100, unit="ms", tz="UTC")
    assert (frame["superseded_objects"] == 0).all()


def test_segments_cover_the_chain_in_order(base_dir: Path) -> None:
    frame = sl.segments(str(base_dir), "clicks", 1)
    per_object = PER_ROUND // PARTITIONS
    assert list(frame["segment"]) == list(range(ROUNDS))
    assert list(frame["base_offset"]) == [r * per_object for r in range(ROUNDS)]
    assert list(frame["end_offset"]) == [(r + 1) * per_object for r in range(ROUNDS)]
    assert list(frame["last_offset"]) == [(r + 1) * per_object - 1 for r in range(ROUNDS)]
    assert list(frame["object"]) == [appended_name(r * per_object) for r in range(ROUNDS)]
    assert (frame["record_count"] == per_object).all()
    assert (frame["batch_count"] >= 2).all()
    assert list(frame["bytes"]) == [f.stat().st_size for f in chain_files(base_dir, 1)]
    assert (frame["compression"] == "lz4").all()
    assert (frame["kind"] == "appended").all() and (frame["generation"] == 0).all()
    assert frame["on_chain"].all() and not frame["below_start"].any()
    assert frame.loc[0, "min_timestamp"] == pd.Timestamp(T0 + 100, unit="ms", tz="UTC")
    assert frame.loc[3, "max_timestamp"] == pd.Timestamp(T0 + 3 * 60_000 + 88 * 100, unit="ms", tz="UTC")


def test_segments_after_merging_show_rewritten_and_superseded_objects(root_dir: Path) -> None:
    files = chain_files(root_dir, 0)
    limit = files[0].stat().st_size + files[1].stat().st_size + 1
    with LogStore(str(root_dir)) as store:
        store.alter_config("clicks", {"segment.bytes": limit})
        store.maintain("clicks")
    chain = sl.segments(str(root_dir), "clicks", 0)
    assert chain.loc[0, "kind"] == "rewritten" and chain.loc[0, "generation"] == 1
    assert (chain.loc[0, "base_offset"], chain.loc[0, "end_offset"]) == (0, 60)
    # Named with a rewrite id: new roots list boundedHistory (PROTOCOL.md 10, *Resolving transactions*).
    assert re.fullmatch(rf"{0:020d}-{60:020d}\.g1\.c[0-9]{{13}}[0-9a-f]{{8}}\.arrow", chain.loc[0, "object"])
    assert list(chain["end_offset"].iloc[:-1]) == list(chain["base_offset"].iloc[1:])
    everything = sl.segments(str(root_dir), "clicks", 0, superseded=True)
    off = everything[~everything["on_chain"]]
    assert {appended_name(0), appended_name(30)} <= set(off["object"])
    assert off["segment"].isna().all() and (off["record_count"] == 30).all()
    assert sl.partitions(str(root_dir), "clicks").loc[0, "superseded_objects"] == len(off)
    # A superseded object can still be looked at by name.
    assert sl.index_entries(str(root_dir), "clicks", 0, appended_name(0))["base_offset"].iloc[0] == 0


def test_index_entries_match_the_stored_index(base_dir: Path) -> None:
    frame = sl.index_entries(str(base_dir), "clicks", 2, 1)
    ref = LogRoot(str(base_dir)).partition("clicks", 2).view().segments[1]
    stored = read_index(LocalStore(str(base_dir)), ref.key).table.to_pylist()
    assert list(frame["batch"]) == list(range(len(stored)))
    for column in ("base_offset", "last_offset", "record_count", "position", "length", "crc32c", "producer_id"):
        assert list(frame[column]) == [row[column] for row in stored]
    assert list(frame["max_timestamp"]) == [pd.Timestamp(row["max_timestamp"], unit="ms", tz="UTC") for row in stored]


def test_batches_show_producer_fields_flags_and_checksums(tmp_path: Path) -> None:
    url = str(tmp_path / "txn")
    with LogStore(url) as store:
        store.create_topic("txn", 1, {"message.timestamp.type": "LogAppendTime", **PARTITIONED})
    root = LogRoot(url)
    log = root.partition("txn", 0)
    data = payload_batch([T0, T0 + 1, T0 + 2], [b"k"] * 3, [b"a", b"b", b"c"])
    control = payload_batch([T0 + 3], [b"COMMIT"], [None])
    log.append(
        [
            (data, BatchMeta(42, 3, 7, ATTR_TRANSACTIONAL)),
            (control, BatchMeta(42, 3, -1, ATTR_TRANSACTIONAL | ATTR_CONTROL)),
            (data, BatchMeta()),
        ]
    )
    frame = sl.batches(root, "txn", 0, 0)
    assert list(frame["record_count"]) == [3, 1, 3]
    assert list(frame["base_offset"]) == [0, 3, 4] and list(frame["last_offset"]) == [2, 3, 6]
    assert list(frame["producer_id"]) == [42, 42, -1]
    assert list(frame["producer_epoch"]) == [3, 3, -1]
    assert list(frame["base_sequence"]) == [7, -1, -1]
    assert list(frame["transactional"]) == [True, True, False]
    assert list(frame["control"]) == [False, True, False]
    assert (frame["timestamp_type"] == "LogAppendTime").all()
    assert list(frame["checksum"]) == ["ok", "ok", "ok"]
    assert frame["crc32c"].str.fullmatch(r"[0-9a-f]{8}").all()
    assert (sl.batches(root, "txn", 0, 0, check=False)["checksum"] == "not checked").all()

    # Damage the middle batch: only its checksum fails.
    key = log.view().segments[0].key
    flip(Path(url) / key, int(frame.loc[1, "position"] + frame.loc[1, "length"] // 2))
    damaged = sl.batches(url, "txn", 0, 0)
    assert list(damaged["checksum"]) == ["ok", "mismatch", "ok"]


def test_records_of_an_offset_range(base_dir: Path) -> None:
    url = str(base_dir)
    table = sl.records(url, "clicks", 1, 25, 35)
    assert table.schema.names == ["offset", "timestamp", "key", "value", "headers"]
    assert table.column("offset").to_pylist() == list(range(25, 35))  # crosses an object boundary at 30
    assert table.column("value").to_pylist()[:2] == [value_of(0, 76).encode(), value_of(0, 79).encode()]
    assert table.column("value").to_pylist()[5] == value_of(1, 1).encode()
    assert sl.records(url, "clicks", 1).num_rows == ROUNDS * PER_ROUND // PARTITIONS
    assert sl.records(url, "clicks", 1, 100, 10_000).column("offset").to_pylist() == list(range(100, 120))
    assert sl.records(url, "clicks", 1, 10, limit=4).column("offset").to_pylist() == [10, 11, 12, 13]
    assert sl.records(url, "clicks", 1, 120).num_rows == 0
    decoded = sl.records(url, "clicks", 0, 0, 2, decode=True)
    assert decoded.schema.field("value").type == pa.string()
    assert decoded.column("value").to_pylist() == [value_of(0, 0), value_of(0, 3)]
    assert decoded.column("key").to_pylist() == ["user-0", "user-3"]
    with pytest.raises(OffsetOutOfRangeError):
        sl.records(url, "clicks", 0, 121)
    with pytest.raises(UnknownTopicOrPartitionError):
        sl.records(url, "clicks", 3)


def test_records_of_a_batch(base_dir: Path) -> None:
    url = str(base_dir)
    index = sl.index_entries(url, "clicks", 0, 2)
    first = sl.batch_records(url, "clicks", 0, 2, 0)
    assert first.column("offset").to_pylist() == list(
        range(index.loc[0, "base_offset"], index.loc[0, "last_offset"] + 1)
    )
    last = sl.batch_records(url, "clicks", 0, 2, -1)
    assert last.column("offset").to_pylist()[-1] == 89
    whole = sl.batch_records(url, "clicks", 0, 2, decode=True)
    assert whole.column("offset").to_pylist() == list(range(60, 90))
    assert whole.column("value").to_pylist()[0] == value_of(2, 0)
    with pytest.raises(IndexError):
        sl.batch_records(url, "clicks", 0, 2, len(index))


def test_segment_selection(base_dir: Path) -> None:
    part = cards.inspect_topic(str(base_dir), "clicks").partition(0)
    assert len(part) == ROUNDS
    assert part.segment(-1).meta.base_offset == 90
    assert part.segment(appended_name(30)).meta.base_offset == 30
    assert part.segment(part.segment(1).key).meta.base_offset == 30
    assert part.segment_for(59).meta.base_offset == 30
    assert part.segment_for(60).meta.base_offset == 60
    assert len(part.segment(0)) == len(part.segment(0).index())
    with pytest.raises(IndexError):
        part.segment(ROUNDS)
    with pytest.raises(KeyError):
        part.segment("nope.arrow")
    with pytest.raises(TypeError):
        part.segment(1.5)  # type: ignore[arg-type]
    with pytest.raises(OffsetOutOfRangeError):
        part.segment_for(120)


def test_views_walk_down_to_records(base_dir: Path) -> None:
    root = cards.inspect_root(str(base_dir))
    assert list(root.topics()["topic"]) == ["clicks", "orders"]
    topic = root.topic("clicks")
    assert topic.num_partitions == 3 and len(topic.topic_id) == 32
    pd.testing.assert_frame_equal(topic.partitions(), sl.partitions(str(base_dir), "clicks"))
    part = topic.partition(2)
    assert (part.start_offset, part.end_offset) == (0, 120)
    assert part.summary()["segments"] == ROUNDS
    pd.testing.assert_frame_equal(part.segments(), sl.segments(str(base_dir), "clicks", 2))
    seg = part.segment(1)
    pd.testing.assert_frame_equal(seg.index(), sl.index_entries(str(base_dir), "clicks", 2, 1))
    pd.testing.assert_frame_equal(seg.batches(), sl.batches(str(base_dir), "clicks", 2, 1))
    assert seg.records().column("offset").to_pylist() == list(range(30, 60))
    assert seg.records(batch=0, decode=True).column("value").to_pylist()[0] == value_of(1, 2)
    assert part.records(5, 7).column("offset").to_pylist() == [5, 6]
    assert part.offset_timeline()["last_offset"].iloc[-1] == 119
    assert part.refresh().end_offset == 120


class TagBalance(HTMLParser):
    """Counts open and closed tags; void elements excluded."""

    VOID = {"br", "hr", "img", "meta", "input", "col"}

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack.pop() != tag:
            self.errors.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def check_html(markup: str) -> str:
    parser = TagBalance()
    parser.feed(markup)
    parser.close()
    assert not parser.errors and not parser.stack, (parser.errors, parser.stack)
    return " ".join(parser.text)


def test_views_display_as_html_and_text(base_dir: Path) -> None:
    topic = cards.inspect_topic(str(base_dir), "clicks")
    text = check_html(topic._repr_html_())
    assert "topic clicks" in text and topic.topic_id in text and "segment.bytes=1048576" in text
    assert "360" in text  # total records
    part = topic.partition(1)
    text = check_html(part._repr_html_())
    assert "partition clicks-1" in text and appended_name(90) in text and "120" in text
    seg = part.segment(0)
    text = check_html(seg._repr_html_())
    assert appended_name(0) in text and "lz4" in text and "appended (generation 0)" in text
    root_text = check_html(cards.inspect_root(str(base_dir))._repr_html_())
    assert "clicks" in root_text and "orders" in root_text
    assert repr(topic).startswith("topic clicks") and "start_offset" in repr(topic)
    assert repr(part).startswith("partition clicks-1") and appended_name(30) in repr(part)
    assert repr(seg).startswith(f"segment {appended_name(0)}")


def test_offset_timeline_and_throughput(base_dir: Path) -> None:
    timeline = sl.offset_timeline(str(base_dir), "clicks")
    batches = sum(len(sl.index_entries(str(base_dir), "clicks", p, s)) for p in range(3) for s in range(ROUNDS))
    assert len(timeline) == batches
    for _, rows in timeline.groupby("partition"):
        assert rows["last_offset"].is_monotonic_increasing
        assert rows["record_count"].sum() == 120
    assert set(sl.offset_timeline(str(base_dir), "clicks", [1])["partition"]) == {1}
    rates = sl.throughput(timeline)
    seconds = pd.Timedelta(rates.index.freq).total_seconds()
    assert list(rates.columns) == [0, 1, 2]
    assert (rates.sum() * seconds).round().tolist() == [120, 120, 120]
    assert (sl.throughput(timeline, "1min").sum() * 60).round().tolist() == [120, 120, 120]


def test_lag_frame_takes_mappings_and_dataframes() -> None:
    frame = sl.lag_frame({2: (5, 30), 0: (10, 50), 1: (50, 50), 3: (None, 7)})
    assert list(frame["partition"]) == [0, 1, 2, 3]
    assert frame["lag"].tolist()[:3] == [40, 0, 25] and pd.isna(frame["lag"].iloc[3])
    assert list(frame.columns) == ["partition", "committed", "end_offset", "lag"]
    by_tp = sl.lag_frame({TopicPartition("clicks", 1): (3, 4), TopicPartition("clicks", 0): (0, 4)})
    assert list(by_tp["topic"]) == ["clicks", "clicks"] and list(by_tp["lag"]) == [4, 1]
    given = pd.DataFrame({"partition": [1, 0], "committed": [7, 9], "end": [10, 9]})
    assert sl.lag_frame(given)["lag"].tolist() == [0, 3]
    with pytest.raises(ValueError, match="committed"):
        sl.lag_frame(pd.DataFrame({"partition": [0], "end_offset": [3]}))
    with pytest.raises(ValueError, match="pair"):
        sl.lag_frame({0: 5})


def test_consumer_lag_against_end_offsets(base_dir: Path) -> None:
    lag = cards.inspect_topic(str(base_dir), "clicks").consumer_lag({0: 100, 1: 120})
    assert list(lag["end_offset"]) == [120, 120, 120]
    assert lag["lag"].tolist()[:2] == [20, 0] and pd.isna(lag["lag"].iloc[2])


# --------------------------------------------------------------------------- verify


def test_verify_of_a_sound_root_finds_nothing(base_dir: Path) -> None:
    report = verify_without_changes(base_dir, None)
    assert report.ok and report.problems.empty
    assert report.topics == ["clicks", "orders"] and report.partitions == 4
    assert report.objects == len(list(base_dir.rglob("*.arrow")))
    assert report.records == 365
    assert report.bytes == sum(p.stat().st_size for p in base_dir.rglob("*.arrow"))
    assert "no problems" in report.summary() and "no problems" in check_html(report._repr_html_())
    report.raise_for_problems()
    assert list(report.to_frame().columns) == [
        "topic",
        "partition",
        "object",
        "offset",
        "problem",
        "detail",
        "on_chain",
    ]
    with pytest.raises(UnknownTopicOrPartitionError):
        sv.verify(str(base_dir), "nope")


def one_problem(report: sv.VerifyReport) -> pd.Series:
    assert len(report.problems) == 1, report
    return report.problems.iloc[0]


def test_verify_finds_a_flipped_byte_in_a_batch(root_dir: Path) -> None:
    target = chain_files(root_dir, 1)[2]
    index = sl.index_entries(str(root_dir), "clicks", 1, 2)
    flip(target, int(index.loc[1, "position"] + 10))
    report = verify_without_changes(root_dir)
    problem = one_problem(report)
    assert problem["problem"] == "batch checksum"
    assert problem["object"] == str(target.relative_to(root_dir))
    assert problem["partition"] == 1 and problem["offset"] == index.loc[1, "base_offset"]
    assert problem["on_chain"]
    assert "1 problem" in check_html(report._repr_html_())
    with pytest.raises(CorruptRecordError, match="batch checksum"):
        report.raise_for_problems()


def test_verify_finds_a_flipped_byte_in_an_index(root_dir: Path) -> None:
    target = chain_files(root_dir, 0)[0]
    size = target.stat().st_size
    flip(target, size - TAIL.size - 40)
    problem = one_problem(verify_without_changes(root_dir))
    assert problem["problem"] == "index checksum" and problem["object"] == str(target.relative_to(root_dir))


@pytest.mark.parametrize("keep", [0.5, 0.99, 10])
def test_verify_finds_a_truncated_object(root_dir: Path, keep: float) -> None:
    target = chain_files(root_dir, 2)[1]
    data = target.read_bytes()
    target.write_bytes(data[: int(len(data) * keep) if keep < 1 else int(keep)])
    problems = verify_without_changes(root_dir).problems
    assert "truncated" in set(problems["problem"])
    assert set(problems["object"]) == {str(target.relative_to(root_dir))}


def test_verify_finds_a_damaged_tail(root_dir: Path) -> None:
    target = chain_files(root_dir, 2)[0]
    flip(target, target.stat().st_size - 3)  # in the magic
    assert one_problem(verify_without_changes(root_dir))["problem"] == "tail"


def rewrite_object(path: Path, store_root: Path, change: Any) -> None:
    """Rebuild a segment object with ``change(rows)`` applied to its index rows: a valid index that lies."""
    store = LocalStore(str(store_root))
    key = str(path.relative_to(store_root))
    index = read_index(store, key)
    batches = raw_messages(store, index)
    change([b.row for b in batches])
    meta = {
        k: v
        for k, v in index.meta.__dict__.items()
        if k not in ("record_count", "batch_count", "min_timestamp", "max_timestamp", "format_version")
    }
    data, _ = assemble_segment(batches, meta)
    path.write_bytes(data)


@pytest.mark.parametrize("lie", ["record_count", "offsets", "timestamps"])
def test_verify_finds_an_index_that_disagrees_with_the_data(root_dir: Path, lie: str) -> None:
    target = chain_files(root_dir, 0)[1]

    def change(rows: list[dict[str, int]]) -> None:
        if lie == "record_count":
            rows[0]["record_count"] -= 1
        elif lie == "offsets":
            rows[1]["last_offset"] -= 1
        else:
            rows[0]["max_timestamp"] += 5

    rewrite_object(target, root_dir, change)
    problems = verify_without_changes(root_dir).problems
    assert set(problems["problem"]) == {"index mismatch"}, problems
    assert set(problems["object"]) == {str(target.relative_to(root_dir))}
    assert problems["offset"].notna().all()


def test_verify_rejects_an_appended_object_that_readers_reject(root_dir: Path) -> None:
    """An appended object whose batches skip an offset of its range: readers refuse it, so the verifier reports it."""
    target = chain_files(root_dir, 0)[-1]
    assert ".g" not in target.name  # an appended object

    def skip_one(rows: list[dict[str, int]]) -> None:
        rows[-1]["base_offset"] += 1
        rows[-1]["last_offset"] += 1

    rewrite_object(target, root_dir, skip_one)
    problems = verify_without_changes(root_dir).problems
    assert any("do not hold each of those offsets once" in d for d in problems["detail"]), problems


def test_verify_finds_a_gap_in_the_chain(root_dir: Path) -> None:
    files = chain_files(root_dir, 2)
    files[1].unlink()  # offsets 30..59 are gone
    problem = one_problem(verify_without_changes(root_dir))
    assert problem["problem"] == "chain gap" and problem["offset"] == 30 and problem["partition"] == 2
    assert "30..59" in problem["detail"]
    assert problem["object"] == str(files[0].relative_to(root_dir))


def test_verify_finds_a_missing_first_object(root_dir: Path) -> None:
    chain_files(root_dir, 0)[0].unlink()
    problem = one_problem(verify_without_changes(root_dir))
    assert problem["problem"] == "chain gap" and problem["offset"] == 0 and "0..29" in problem["detail"]


def test_verify_finds_overlapping_objects(root_dir: Path) -> None:
    target = chain_files(root_dir, 1)[0]  # offsets 0..29; replace it by one holding 0..34
    payload = payload_batch([T0 + i for i in range(35)], [None] * 35, [b"v"] * 35)
    encoded = encode_batch(with_offsets(payload, 0), BatchMeta(), ipc_options("lz4"))
    data, _ = assemble_segment(
        [encoded],
        {
            "base_offset": 0,
            "next_offset": 35,
            "compression": "lz4",
            "running_max_timestamp": T0 + 34,
            "created_ms": T0,
            "writer": "t",
        },
    )
    target.write_bytes(data)
    problem = one_problem(verify_without_changes(root_dir))
    assert problem["problem"] == "chain overlap" and problem["offset"] == 30


def test_verify_flags_damage_off_the_chain(root_dir: Path) -> None:
    files = chain_files(root_dir, 0)
    with LogStore(str(root_dir)) as store:
        store.alter_config("clicks", {"segment.bytes": files[0].stat().st_size + files[1].stat().st_size + 1})
        store.maintain("clicks")
    superseded = files[0]
    assert superseded not in chain_files(root_dir, 0) and superseded.exists()
    flip(superseded, 600)
    problem = one_problem(verify_without_changes(root_dir))
    assert problem["problem"] == "batch checksum" and not problem["on_chain"]


def test_verify_finds_stray_objects_and_bad_markers(root_dir: Path) -> None:
    log_dir = chain_files(root_dir, 0)[0].parent
    (log_dir / "notes.txt").write_bytes(b"hello")
    start_dir = log_dir.parent / "start"
    start_dir.mkdir()
    (start_dir / f"{10:020d}.json").write_bytes(b"{not json")
    problems = verify_without_changes(root_dir).problems
    assert sorted(problems["problem"]) == ["start marker", "stray object"]


def extend_object(
    path: Path, store_root: Path, *, index_column: bool, batch_column: bool, drop_index_column: bool = False
) -> None:
    """Rewrite a segment object as a later writer might, keeping its offsets, records and header.

    ``index_column`` appends a column to the index and ``batch_column`` one to every record batch (and to the
    schema message, whose CRC the header records): PROTOCOL.md section 12 lets a writer append index columns,
    which readers ignore, and readers decode batches with the record schema, so neither changes what is read.
    ``drop_index_column`` removes the index's last known column instead: an index no reader can use.
    """
    store = LocalStore(str(store_root))
    key = str(path.relative_to(store_root))
    index = read_index(store, key)
    batches = read_batches(store, index, 0, index.batch_count - 1)
    schema = RECORD_SCHEMA.append(pa.field("future_record_field", pa.int32())) if batch_column else RECORD_SCHEMA
    schema_bytes = schema.serialize().to_pybytes()
    sink = pa.BufferOutputStream()
    ends = []
    with ipc.new_stream(sink, schema, options=ipc_options(index.meta.compression)) as writer:
        for batch in batches:
            if batch_column:
                future = pa.array(range(batch.num_rows), pa.int32())
                batch = pa.RecordBatch.from_arrays([*batch.columns, future], schema=schema)
            writer.write_batch(batch)
            ends.append(sink.tell())
    data = sink.getvalue().to_pybytes()
    assert data.startswith(schema_bytes) and data.endswith(b"\xff\xff\xff\xff\x00\x00\x00\x00")
    rows = index.table.select(INDEX_SCHEMA.names).to_pylist()
    starts = [len(schema_bytes), *ends[:-1]]
    for row, start, end in zip(rows, starts, ends, strict=True):
        row.update(position=start, length=end - start, crc32c=crc32c(data[start:end]))
    index_schema = INDEX_SCHEMA
    if index_column:
        index_schema = index_schema.append(pa.field("future_index_field", pa.int64(), nullable=False))
        for i, row in enumerate(rows):
            row["future_index_field"] = 7 * i
    if drop_index_column:
        index_schema = index_schema.remove(len(INDEX_SCHEMA) - 1)
    meta = dataclasses.replace(index.meta, schema_crc32c=crc32c(schema_bytes))
    table = pa.Table.from_pylist(rows, schema=index_schema).replace_schema_metadata({"plog.segment": meta.to_json()})
    index_sink = pa.BufferOutputStream()
    with ipc.new_stream(index_sink, table.schema) as writer:
        writer.write_table(table)
    index_bytes = index_sink.getvalue().to_pybytes()
    path.write_bytes(data + index_bytes + TAIL.pack(len(data), crc32c(index_bytes), FORMAT_VERSION, MAGIC))


@pytest.mark.parametrize(
    ("index_column", "batch_column"), [(True, False), (False, True), (True, True)], ids=["index", "batches", "both"]
)
def test_verify_accepts_columns_a_later_writer_appended(root_dir: Path, index_column: bool, batch_column: bool) -> None:
    """What the reader accepts (PROTOCOL.md section 12: appended columns, ignored) verifies clean."""
    url = str(root_dir)
    before = sl.records(url, "clicks", 1)
    target = chain_files(root_dir, 1)[1]
    extend_object(target, root_dir, index_column=index_column, batch_column=batch_column)
    index = sl.index_entries(url, "clicks", 1, 1)
    assert ("future_index_field" in index.columns) is index_column
    assert sl.records(url, "clicks", 1).equals(before)  # the reader reads it, and reads the same records
    assert list(sl.batches(url, "clicks", 1, 1)["checksum"].unique()) == ["ok"]
    report = verify_without_changes(root_dir)
    assert report.ok, report
    assert report.records == ROUNDS * PER_ROUND


@pytest.mark.parametrize("damage", ["batch", "index"])
def test_verify_still_fails_a_corrupt_object_with_appended_columns(root_dir: Path, damage: str) -> None:
    url = str(root_dir)
    target = chain_files(root_dir, 1)[1]
    name = str(target.relative_to(root_dir))
    extend_object(target, root_dir, index_column=True, batch_column=True, drop_index_column=damage == "index")
    if damage == "batch":
        flip(target, int(sl.index_entries(url, "clicks", 1, 1).loc[0, "position"]) + 40)
    with pytest.raises(CorruptRecordError, match=name):  # the reader refuses it ...
        sl.records(url, "clicks", 1)
    problem = one_problem(verify_without_changes(root_dir))  # ... and so does verify, naming the object
    assert problem["object"] == name
    assert problem["problem"] == ("batch checksum" if damage == "batch" else "index unreadable")
    assert "(object" not in problem["detail"]  # the object has its column; the detail is the reader's sentence


class ReadOnlyStore(ForwardingStore):
    """A store that fails the test on any write or delete."""

    def put_if_absent(self, key: str, data: bytes, *, durable: bool = True) -> bool:
        raise AssertionError(f"inspection wrote {key}")

    def replace(self, key: str, data: bytes) -> None:
        raise AssertionError(f"inspection replaced {key}")

    def delete(self, key: str) -> None:
        raise AssertionError(f"inspection deleted {key}")


def test_inspection_never_writes(root_dir: Path) -> None:
    flip(chain_files(root_dir, 1)[1], 700)  # some damage for verify to find
    root = LogRoot(str(root_dir), store=ReadOnlyStore(LocalStore(str(root_dir))))
    sl.topics(root)
    sl.partitions(root, "clicks")
    sl.segments(root, "clicks", 0, superseded=True)
    sl.index_entries(root, "clicks", 0, 0)
    sl.batches(root, "clicks", 1, 1)
    sl.records(root, "clicks", 0)
    sl.batch_records(root, "clicks", 0, 0, 0)
    sl.offset_timeline(root, "clicks")
    topic = cards.inspect_topic(root, "clicks")
    topic._repr_html_()
    topic.partition(0)._repr_html_()
    topic.partition(0).segment(0)._repr_html_()
    assert not sv.verify(root).ok


def test_as_root_accepts_urls_roots_and_log_stores(base_dir: Path) -> None:
    root = LogRoot(str(base_dir))
    assert sl.as_root(root) is root
    with LogStore(str(base_dir)) as store:
        assert sl.as_root(store) is store.root
    assert sl.as_root(base_dir).url == str(base_dir)
    with pytest.raises(TypeError):
        sl.as_root(42)


# --------------------------------------------------------------------------- plots


def is_png(fig: Any) -> bool:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue().startswith(b"\x89PNG") and fig._repr_png_().startswith(b"\x89PNG")


def test_plot_partition_sizes(base_dir: Path) -> None:
    topic = pi.inspect_topic(str(base_dir), "clicks")
    fig = pi.plot_partition_sizes(topic)
    records_ax, bytes_ax = fig.axes
    assert [p.get_height() for p in records_ax.containers[0]] == [120, 120, 120]
    stored = [p.get_height() for p in bytes_ax.containers[0]]
    assert stored == list(topic.partitions()["bytes"].astype(float))
    assert is_png(fig)
    fig2 = pi.plot_partition_sizes(sl.partitions(str(base_dir), "clicks")[["partition", "records", "bytes"]])
    assert len(fig2.axes[1].patches) == 3
    with pytest.raises(ValueError):
        pi.plot_partition_sizes(pd.DataFrame({"partition": [0]}))
    with pytest.raises(TypeError):
        pi.plot_partition_sizes("clicks")  # type: ignore[arg-type]


def test_plot_offsets_over_time(base_dir: Path) -> None:
    topic = pi.inspect_topic(str(base_dir), "clicks")
    fig = pi.plot_offsets_over_time(topic)
    offsets_ax, rate_ax = fig.axes
    assert len(offsets_ax.lines) == 3 and len(rate_ax.lines) == 3
    assert max(np.max(np.asarray(line.get_ydata())) for line in offsets_ax.lines) == 120
    assert is_png(fig)
    single = pi.plot_offsets_over_time(topic.partition(1), rate=False)
    assert len(single.axes) == 1 and len(single.axes[0].lines) == 1
    some = pi.plot_offsets_over_time(topic.offset_timeline(), partitions=[0, 2])
    assert len(some.axes[0].lines) == 2


def test_plot_consumer_lag_from_a_hand_made_mapping() -> None:
    fig = pi.plot_consumer_lag({0: (10, 50), 1: (50, 50), 2: (None, 30)})
    (ax,) = fig.axes
    committed, lag = ax.containers[0], ax.containers[1]
    assert [p.get_height() for p in committed] == [10, 50, 0]
    assert [p.get_height() for p in lag] == [40, 0, 0]
    assert [p.get_y() for p in lag] == [10, 50, 0]
    assert len(ax.containers) == 3  # the partition with no committed offset, hatched
    assert "40 record(s) behind" in ax.get_title()
    assert is_png(fig)
    frame = pd.DataFrame({"partition": [0, 1], "committed": [5, 0], "end_offset": [5, 8]})
    from_frame = pi.plot_consumer_lag(frame, title="lag")
    assert [p.get_height() for p in from_frame.axes[0].containers[1]] == [0, 8]
    assert from_frame.axes[0].get_title() == "lag"


def test_plots_draw_on_given_axes(base_dir: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure()
    ax1, ax2, ax3 = fig.subplots(1, 3)
    topic = pi.inspect_topic(str(base_dir), "clicks")
    assert pi.plot_partition_sizes(topic, axes=(ax1, ax2)) is fig
    assert pi.plot_consumer_lag({TopicPartition("clicks", 0): (1, 2)}, ax=ax3) is fig
    assert [t.get_text() for t in ax3.get_xticklabels()] == ["clicks-0"]


#: What ``segment_format.inspect`` offered before it became listings, verify and cards: the notebooks' API.
INSPECTION_API = [
    "PROBLEMS",
    "PartitionView",
    "RootView",
    "SegmentView",
    "TopicView",
    "VerifyReport",
    "as_root",
    "batch_records",
    "batches",
    "consumer_lag",
    "index_entries",
    "inspect_root",
    "inspect_topic",
    "lag_frame",
    "offset_timeline",
    "partitions",
    "records",
    "segments",
    "throughput",
    "topic_config",
    "topics",
    "verify",
]


def test_reexports() -> None:
    homes = {name: module for module in (sl, sv, cards) for name in module.__all__}
    assert set(INSPECTION_API) <= set(pi.__all__)
    for name in INSPECTION_API:
        assert getattr(pi, name) is getattr(homes[name], name)
    assert pyspark_logsource.inspect_topic is cards.inspect_topic
    assert pyspark_logsource.verify is sv.verify
    assert pyspark_logsource.VerifyReport is sv.VerifyReport
    assert pi.__name__ == "pyspark_logsource.views"


def test_an_empty_topic_inspects_and_plots(tmp_path: Path) -> None:
    url = "memory://inspect-empty-" + tmp_path.name
    with LogStore(url) as store:
        store.create_topic("empty", 2)
    topic = cards.inspect_topic(url, "empty")
    assert list(topic.partitions()["records"]) == [0, 0]
    assert topic.partitions()["min_timestamp"].isna().all()
    part = topic.partition(1)
    assert part.segments().empty and part.records().num_rows == 0 and part.offset_timeline().empty
    check_html(topic._repr_html_())
    check_html(part._repr_html_())
    assert sv.verify(url).ok and sl.throughput(topic.offset_timeline()).empty
    assert is_png(pi.plot_partition_sizes(topic))
    assert is_png(pi.plot_offsets_over_time(topic))
    assert is_png(pi.plot_consumer_lag({}))


def test_verify_reports_topic_metadata_that_does_not_parse(tmp_path: Path) -> None:
    """Damaged topic metadata is a problem in the report, not an exception out of verify."""
    LogStore(str(tmp_path)).create_topic("t", partitions=1)
    (meta_file,) = (tmp_path / "topics" / "t" / "meta").iterdir()
    meta_file.write_bytes(b'{"name": "t", "partitions": "many"}')
    report = sv.verify(str(tmp_path), "t")
    assert not report.ok
    assert "topic metadata" in set(report.to_frame()["problem"]), report.summary()


def test_verify_reports_another_versions_metadata_under_a_version_key(tmp_path: Path) -> None:
    """Version 0's bytes stored as version 1: readers refuse them (the key is authoritative), so verify reports them."""
    LogStore(str(tmp_path)).create_topic("t", partitions=1)
    meta_dir = tmp_path / "topics" / "t" / "meta"
    (v0,) = meta_dir.iterdir()
    (meta_dir / v0.name.replace("0.json", "1.json")).write_bytes(v0.read_bytes())
    frame = sv.verify(str(tmp_path), "t").to_frame()
    found = frame[frame["problem"] == "topic metadata"]
    assert any("field 'version' is 0, its key says 1" in d for d in found["detail"]), frame
