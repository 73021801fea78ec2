"""``read_topic``: a topic's records as a ``pyarrow.RecordBatchReader`` for DuckDB, Polars and pandas.

What it returns is checked against what a consumer reads (the same records at the same offsets),
under read_committed against transactions decided and open, over offset and time ranges, column
choices, a typed topic, a compacted topic's gaps, in many batches, and through DuckDB and Polars.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pyspark_logsource import (
    Consumer,
    InvalidConfigError,
    LogStore,
    OffsetOutOfRangeError,
    Producer,
    TopicPartition,
    UnknownTopicOrPartitionError,
    read_topic,
)
from pyspark_logsource.client.table_reader import TABLE_COLUMNS
from segment_format.root import LogRoot

COMPACT = {
    "cleanup.policy": "compact",
    "compression.type": "none",
    "file.delete.delay.ms": 60_000,
    "writer.max.staleness.ms": 30_000,
    "delete.retention.ms": 3_600_000,
    "auto.maintenance.enable": False,
}


def _consumed(url: str, topic: str, isolation: str = "read_committed") -> list[tuple[int, int, Any, Any]]:
    """Every record a consumer reads, as (partition, offset, key, value), sorted."""
    consumer = Consumer(url, auto_offset_reset="earliest", isolation_level=isolation)
    consumer.subscribe([topic])
    table = consumer.read_to_end(timeout_ms=10_000)
    consumer.close()
    return sorted(
        zip(
            table.column("partition").to_pylist(),
            table.column("offset").to_pylist(),
            table.column("key").to_pylist(),
            table.column("value").to_pylist(),
            strict=True,
        )
    )


def _rows(table: pa.Table) -> list[tuple[int, int, Any, Any]]:
    return sorted(
        zip(
            table.column("partition").to_pylist(),
            table.column("offset").to_pylist(),
            table.column("key").to_pylist(),
            table.column("value").to_pylist(),
            strict=True,
        )
    )


@pytest.fixture()
def url(tmp_path: Path) -> str:
    """A root with topic ``clicks``: 3 partitions, 300 records with keys k0..k9, at times 1000 + i."""
    root = str(tmp_path / "root")
    LogStore(root).create_topic("clicks", 3)
    producer = Producer(root, linger_ms=0)
    for i in range(300):
        producer.send(
            "clicks",
            key=b"k%d" % (i % 10),
            value=b"v%d" % i,
            partition=i % 3,
            timestamp_ms=1_000 + i,
            headers=[("h", b"x")],
        )
    producer.flush()
    producer.close()
    return root


def test_records_equal_what_the_consumer_reads(url: str) -> None:
    reader = read_topic(url, "clicks")
    assert isinstance(reader, pa.RecordBatchReader)
    assert reader.schema.names == list(TABLE_COLUMNS)
    table = reader.read_all()
    assert table.num_rows == 300
    assert _rows(table) == _consumed(url, "clicks")
    # Partitions in turn, offsets ascending within each; every column filled as poll_arrow's.
    pairs = list(zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(), strict=True))
    assert pairs == sorted(pairs)
    assert set(table.column("topic").to_pylist()) == {"clicks"}
    assert set(table.column("timestampType").to_pylist()) == {0}
    assert table.column("headers")[0].as_py() == [{"key": "h", "value": b"x"}]
    assert table.schema.field("timestamp").type == pa.timestamp("ms", tz="UTC")


def test_log_store_read_topic_is_the_same_reader(url: str) -> None:
    with LogStore(url) as store:
        table = store.read_topic("clicks", partitions=[2, 0]).read_all()
    assert set(table.column("partition").to_pylist()) == {0, 2}
    assert table.column("partition").to_pylist()[0] == 2  # in the order asked for
    assert _rows(table) == [r for r in _consumed(url, "clicks") if r[0] != 1]


def test_read_committed_hides_aborted_and_open_transactions(tmp_path: Path) -> None:
    url = str(tmp_path / "root")
    LogStore(url).create_topic("tx", 1)
    producer = Producer(url, transactional_id="app", linger_ms=0)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("tx", value=b"committed-1")
    producer.commit_transaction()
    producer.begin_transaction()
    producer.send("tx", value=b"aborted")
    producer.abort_transaction()
    producer.begin_transaction()
    producer.send("tx", value=b"committed-2")
    producer.commit_transaction()
    producer.begin_transaction()
    producer.send("tx", value=b"open")
    producer.flush()  # written, not decided
    try:
        committed = read_topic(url, "tx").read_all()
        assert committed.column("value").to_pylist() == [b"committed-1", b"committed-2"]
        assert [r[3] for r in _consumed(url, "tx")] == [b"committed-1", b"committed-2"]
        uncommitted = read_topic(url, "tx", isolation_level="read_uncommitted").read_all()
        assert uncommitted.column("value").to_pylist() == [b"committed-1", b"aborted", b"committed-2", b"open"]
        # A snapshot: a reader created while the transaction is open stops at its first offset (the
        # LSO), and commits after it was created do not change what it returns.
        before_commit = read_topic(url, "tx")
        producer.commit_transaction()
        assert before_commit.read_all().column("value").to_pylist() == [b"committed-1", b"committed-2"]
        after = read_topic(url, "tx").read_all().column("value").to_pylist()
        assert after == [b"committed-1", b"committed-2", b"open"]
    finally:
        producer.close()


def test_an_open_transaction_blocks_only_its_own_partition(tmp_path: Path) -> None:
    url = str(tmp_path / "root")
    LogStore(url).create_topic("tx", 2)
    plain = Producer(url, linger_ms=0)
    for i in range(4):
        plain.send("tx", value=b"p%d" % i, partition=i % 2)
    plain.flush()
    producer = Producer(url, transactional_id="app", linger_ms=0)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("tx", value=b"open", partition=0)
    producer.flush()
    plain.send("tx", value=b"after", partition=0)  # behind the open transaction: not stable yet
    plain.send("tx", value=b"p-late", partition=1)
    plain.flush()
    try:
        table = read_topic(url, "tx").read_all()
        by_partition = {
            p: [
                v
                for q, v in zip(table.column("partition").to_pylist(), table.column("value").to_pylist(), strict=True)
                if q == p
            ]
            for p in (0, 1)
        }
        assert by_partition == {0: [b"p0", b"p2"], 1: [b"p1", b"p3", b"p-late"]}
    finally:
        producer.abort_transaction()
        producer.close()
        plain.close()


def test_offset_ranges_single_and_per_partition(url: str) -> None:
    table = read_topic(url, "clicks", start=10, end=20).read_all()
    assert sorted(table.column("offset").to_pylist()) == sorted(list(range(10, 20)) * 3)
    table = read_topic(url, "clicks", start={0: 95}, end={1: 3}).read_all()
    offsets = {
        p: [
            o
            for q, o in zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(), strict=True)
            if q == p
        ]
        for p in range(3)
    }
    assert offsets == {0: [95, 96, 97, 98, 99], 1: [0, 1, 2], 2: list(range(100))}
    # An end past the log end reads to the end; a start past it reads nothing.
    assert read_topic(url, "clicks", partitions=0, start=90, end=10_000).read_all().num_rows == 10
    assert read_topic(url, "clicks", partitions=0, start=500).read_all().num_rows == 0


def test_time_range_uses_the_time_index(url: str) -> None:
    # Record i has timestamp 1000 + i; partition i % 3. [1030, 1060) holds records 30..59.
    table = read_topic(url, "clicks", start_time_ms=1_030, end_time_ms=1_060).read_all()
    assert sorted(table.column("value").to_pylist()) == sorted(b"v%d" % i for i in range(30, 60))
    stamps = table.column("timestamp").cast(pa.int64()).to_pylist()
    assert min(stamps) == 1_030 and max(stamps) == 1_059
    assert read_topic(url, "clicks", start_time_ms=5_000).read_all().num_rows == 0
    assert read_topic(url, "clicks", end_time_ms=1_003).read_all().num_rows == 3


def test_column_selection_in_the_order_given(url: str) -> None:
    reader = read_topic(url, "clicks", columns=["offset", "key"], partitions=1)
    assert reader.schema.names == ["offset", "key"]
    table = reader.read_all()
    assert table.column("offset").to_pylist() == list(range(100))
    assert table.column("key").to_pylist()[:3] == [b"k1", b"k4", b"k7"]


def test_errors_name_the_culprit(url: str) -> None:
    with pytest.raises(UnknownTopicOrPartitionError, match="nope"):
        read_topic(url, "nope")
    with pytest.raises(UnknownTopicOrPartitionError, match="partition 7"):
        read_topic(url, "clicks", partitions=[7])
    with pytest.raises(InvalidConfigError, match="'bogus'"):
        read_topic(url, "clicks", columns=["key", "bogus"])
    with pytest.raises(InvalidConfigError, match="clicks-0: start offset 20 is after end offset 10"):
        read_topic(url, "clicks", start=20, end=10)
    with pytest.raises(InvalidConfigError, match="start -1"):
        read_topic(url, "clicks", start=-1)
    with pytest.raises(InvalidConfigError, match=r"partition\(s\) \[5\]"):
        read_topic(url, "clicks", partitions=[0], start={5: 0})
    with pytest.raises(InvalidConfigError, match="start or start_time_ms"):
        read_topic(url, "clicks", start=0, start_time_ms=0)
    with pytest.raises(InvalidConfigError, match="isolation_level"):
        read_topic(url, "clicks", isolation_level="dirty")
    with pytest.raises(InvalidConfigError, match="not typed"):
        read_topic(url, "clicks", value_fields=["user"])
    LogStore(url).delete_records("clicks", {0: 50})
    with pytest.raises(OffsetOutOfRangeError, match="clicks-0: start offset 10 is below the log start 50"):
        read_topic(url, "clicks", start=10)
    # Without a start, a partition is read from its log start.
    assert read_topic(url, "clicks", partitions=0).read_all().column("offset").to_pylist() == list(range(50, 100))


def test_a_typed_topic_gives_its_typed_value_columns(tmp_path: Path) -> None:
    url = str(tmp_path / "root")
    LogStore(url).create_topic("ev", 1, value_schema="user string, n int NOT NULL")
    producer = Producer(url, linger_ms=0)
    for i in range(20):
        producer.send("ev", {"user": f"u{i % 3}", "n": i}, key=b"k%d" % i)
    producer.send("ev", None, key=b"gone")  # a tombstone: a null value
    producer.flush()
    producer.close()
    consumer = Consumer(url, auto_offset_reset="earliest")
    consumer.subscribe(["ev"])
    polled = consumer.read_to_end()
    consumer.close()
    reader = read_topic(url, "ev")
    assert reader.schema.field("value").type == polled.schema.field("value").type
    assert pa.types.is_struct(reader.schema.field("value").type)
    table = reader.read_all()
    assert table.column("value").to_pylist() == polled.column("value").to_pylist()
    assert table.column("value")[3].as_py() == {"user": "u0", "n": 3}
    assert table.column("value")[20].as_py() is None
    only_n = read_topic(url, "ev", columns=["offset", "value"], value_fields=["n"]).read_all()
    full = reader.schema.field("value").type
    assert only_n.schema.field("value").type == pa.struct([full.field("n")])
    assert [v["n"] for v in only_n.column("value").to_pylist()[:20]] == list(range(20))


def test_a_compacted_topic_reads_across_its_gaps(tmp_path: Path) -> None:
    url = str(tmp_path / "root")
    store = LogStore(url)
    store.create_topic("state", 1, {**COMPACT, "storage.layout": "partitioned"})  # compacted here
    producer = Producer(url, linger_ms=0)
    for round_ in range(6):
        for k in range(5):
            producer.send("state", key=b"k%d" % k, value=b"%d-%d" % (k, round_))
        producer.send("state", key=b"once-%d" % round_, value=b"kept")  # kept between gaps
        producer.flush()
    producer.close()
    assert store.root.partition("state", 0).compact(force=True) >= 1
    table = read_topic(url, "state").read_all()
    offsets = table.column("offset").to_pylist()
    assert len(offsets) < 36 and offsets == sorted(offsets)  # gaps where superseded records were
    assert _rows(table) == _consumed(url, "state")
    last = {k: v for k, v in zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True)}
    assert last == {**{b"k%d" % k: b"%d-5" % k for k in range(5)}, **{b"once-%d" % r: b"kept" for r in range(6)}}
    # A range starting in a gap holds exactly the kept records inside it.
    gap = next(i for i in range(len(offsets) - 1) if offsets[i + 1] - offsets[i] > 1)
    inside = read_topic(url, "state", start=offsets[gap] + 1, end=offsets[-1]).read_all()
    assert inside.column("offset").to_pylist() == offsets[gap + 1 : -1]


def test_a_large_topic_streams_in_many_bounded_batches(tmp_path: Path) -> None:
    url = str(tmp_path / "root")
    LogStore(url).create_topic("big", 1, {"compression.type": "none"})
    producer = Producer(url, linger_ms=0, batch_size=64 * 1024)
    value = b"x" * 1_000
    for i in range(4_000):  # about 4 MB stored
        producer.send("big", value=value, key=b"%d" % i)
    producer.flush()
    producer.close()
    reader = read_topic(url, "big", chunk_bytes=256 * 1024)
    sizes = []
    rows = 0
    for batch in reader:
        sizes.append(batch.nbytes)
        rows += batch.num_rows
    assert rows == 4_000
    # Many batches, none near the whole topic: the reader never holds it all at once.
    assert len(sizes) >= 10
    assert max(sizes) < 1_000_000


def test_duckdb_queries_the_reader(url: str) -> None:
    duckdb = pytest.importorskip("duckdb")
    reader = read_topic(url, "clicks", columns=["key", "value"])  # noqa: F841 - DuckDB finds it by name
    counts = duckdb.sql("select key, count(*) as n from reader group by key order by key").fetchall()
    assert counts == [(b"k%d" % k, 30) for k in range(10)]


def test_polars_reads_the_reader(url: str) -> None:
    pl = pytest.importorskip("polars")
    frame = pl.from_arrow(read_topic(url, "clicks", partitions=0).read_all())
    assert isinstance(frame, pl.DataFrame)
    assert frame.height == 100
    assert frame["offset"].to_list() == list(range(100))
    grouped = frame.group_by("key").len().sort("key")
    assert grouped["len"].to_list() == [10] * 10


def test_end_offsets_are_fixed_when_the_reader_is_created(url: str) -> None:
    reader = read_topic(url, "clicks", partitions=0)
    producer = Producer(url, linger_ms=0)
    producer.send("clicks", value=b"late", partition=0)
    producer.flush()
    producer.close()
    assert reader.read_all().num_rows == 100
    consumer = Consumer(url)
    tp = TopicPartition("clicks", 0)
    assert consumer.end_offsets([tp]) == {tp: 101}
    consumer.close()


def test_the_root_read_topic_opens_is_released_once_read_or_dropped(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    closed: list[str] = []
    original = LogRoot.close

    def counting_close(self: LogRoot) -> None:
        closed.append(self.url)
        original(self)

    monkeypatch.setattr(LogRoot, "close", counting_close)
    reader = read_topic(url, "clicks")
    assert reader.read_all().num_rows == 300
    assert closed == [url]  # at the end of the records, not twice when the reader goes
    del reader
    gc.collect()
    assert closed == [url]
    never_read = read_topic(url, "clicks")
    del never_read
    gc.collect()
    assert closed == [url, url]
