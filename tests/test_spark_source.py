"""The Spark source: ``spark.read.format("plog")`` and ``spark.readStream.format("plog")``.

Three layers:

* option parsing, planning and conversion, tested in this process without a
  JVM (fast, exhaustive);
* the stream and batch readers driven directly, as Spark's driver would call
  them (admission control, AvailableNow, new partitions, data loss, filter
  pushdown), still without a JVM;
* end-to-end through the shared local SparkSession (``spark`` fixture,
  ``-m spark``), including a driver killed with SIGKILL again and again and
  restarted from its checkpoint, which must deliver every record exactly once.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import subprocess
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from pyspark_logsource import LogStore, Producer
from segment_format.errors import InvalidConfigError
from segment_format.root import LogRoot
from tests.fixtures_spark import kill_driver, start_driver, wait_for, write_driver_script
from tests.soak import soak

pyspark = pytest.importorskip("pyspark")

from pyspark.sql.datasource import (  # noqa: E402
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
    Not,
)
from pyspark.sql.pandas.types import to_arrow_schema  # noqa: E402
from pyspark.sql.streaming.datasource import (  # noqa: E402
    ReadAllAvailable,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
)

from pyspark_logsource.spark.input_partition import PlogObjectsInputPartition  # noqa: E402
from pyspark_logsource.spark.options import parse_options  # noqa: E402
from pyspark_logsource.spark.planning import (  # noqa: E402
    GroupOffsetsWriter,
    OffsetRange,
    allocate_rows,
    split_ranges,
)
from pyspark_logsource.spark.source import (  # noqa: E402
    DataLossError,
    DefaultSource,
    PlogBatchReader,
    PlogInputPartition,
    PlogStreamReader,
    read_partition,
    spark_arrow_schema,
    spark_schema,
    to_spark_batch,
)
from pyspark_logsource.spark.workers import executor_root  # noqa: E402

T0 = 1_700_000_000_000  # ms; records get timestamps T0 + i * 1000


# ---------------------------------------------------------------------------- helpers


def produce(
    root: str, topic: str, partition: int, n: int, *, start: int = 0, headers: bool = False, ts0: int = T0
) -> None:
    """Append ``n`` records to one partition: values ``<topic>-<partition>-<offset>``, 1 s apart."""
    values = [f"{topic}-{partition}-{start + i}".encode() for i in range(n)]
    table = pa.table(
        {
            "value": pa.array(values, pa.binary()),
            "key": pa.array([f"k{(start + i) % 5}".encode() for i in range(n)], pa.binary()),
            "timestamp": pa.array(np.arange(ts0 + start * 1000, ts0 + (start + n) * 1000, 1000, dtype=np.int64)),
            "partition": pa.array(np.full(n, partition, np.int32)),
        }
    )
    if headers:
        table = table.append_column(
            "headers",
            pa.array(
                [[{"key": "i", "value": str(start + i).encode()}] if i % 2 == 0 else None for i in range(n)],
                pa.list_(pa.struct([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())])),
            ),
        )
    with Producer(root) as p:
        p.send_batch(topic, table)


def make_root(tmp_path: Path, topics: dict[str, int], per_partition: int = 0, layout: str = "partitioned") -> str:
    """A root with ``topics``; partitioned by default: these tests plan and check per-partition offset ranges
    (a shared topic is planned per group of commits, tested on its own below)."""
    root = str(tmp_path / "plog")
    with LogStore(root) as store:
        for name, partitions in topics.items():
            # The records carry fixed timestamps from the past, which time retention (applied by the
            # writers' self-maintenance, as a Kafka broker would) retires: keep them.
            store.create_topic(name, partitions, config={"retention.ms": -1, "storage.layout": layout})
    for name, partitions in topics.items():
        for p in range(partitions):
            if per_partition:
                produce(root, name, p, per_partition)
    return root


def log_table(root: str, topic: str) -> pa.Table:
    """Everything stored in ``topic`` as (topic, partition, offset, key, value, timestamp ms), sorted."""
    r = LogRoot(root)
    tables = []
    for p in range(r.topic(topic).partitions):
        batches, _ = r.partition(topic, p).read(r.partition(topic, p).view().start_offset)
        for b in batches:
            n = b.num_rows
            tables.append(
                pa.table(
                    {
                        "topic": pa.array([topic] * n),
                        "partition": pa.array([p] * n, pa.int32()),
                        "offset": b.column(0),
                        "key": b.column(2),
                        "value": b.column(3),
                        "ts": b.column(1).cast(pa.int64()),
                    }
                )
            )
    r.close()
    return pa.concat_tables(tables).sort_by([("partition", "ascending"), ("offset", "ascending")])


def spark_rows(table: pa.Table) -> pa.Table:
    """A Spark result in the shape of :func:`log_table`, sorted."""
    ts = table.column("timestamp").cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
    return pa.table(
        {
            "topic": table.column("topic"),
            "partition": table.column("partition"),
            "offset": table.column("offset"),
            "key": table.column("key"),
            "value": table.column("value"),
            "ts": pa.compute.divide(ts, 1000),
        }
    ).sort_by([("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")])


def keys(table: pa.Table) -> list[tuple[str, int, int]]:
    return list(
        zip(
            table.column("topic").to_pylist(),
            table.column("partition").to_pylist(),
            table.column("offset").to_pylist(),
            strict=True,
        )
    )


def stream_opts(**options: str) -> Any:
    # These tests call latestOffset right after appending: read the change notices on every call.
    return parse_options({"noticeinterval": "0", **options}, streaming=True)


def batch_opts(**options: str) -> Any:
    return parse_options(options, streaming=False)


def tps(offsets: dict) -> dict[tuple[str, int], int]:
    return {(t, int(p)): o for t, per in offsets.items() if not t.startswith("@") for p, o in per.items()}


# ---------------------------------------------------------------------------- options (no JVM)


@pytest.mark.parametrize(
    ("options", "streaming", "named"),
    [
        ({"url": "/r"}, True, "subscribe"),
        ({"url": "/r", "subscribe": "a", "assign": '{"a": [0]}'}, True, "assign"),
        ({"url": "/r", "subscribe": "a", "subscribePattern": "a.*"}, False, "subscribePattern"),
        ({"url": "/r", "subscribePattern": "(unclosed"}, True, "subscribePattern"),
        ({"url": "/r", "assign": "[0, 1]"}, True, "assign"),
        ({"url": "/r", "assign": '{"a": [-1]}'}, True, "assign"),
        ({"url": "/r", "subscribe": "bad topic!"}, True, "subscribe"),
        ({"url": "/r", "subscribe": "a", "startingOffsets": '{"a": {"0": 1'}, True, "startingOffsets"),
        ({"url": "/r", "subscribe": "a", "startingOffsets": '{"a": {"x": 1}}'}, True, "startingOffsets"),
        ({"url": "/r", "subscribe": "a", "startingOffsets": '{"a": {"0": -3}}'}, True, "startingOffsets"),
        ({"url": "/r", "subscribe": "a", "startingOffsets": "latest"}, False, "startingOffsets"),
        ({"url": "/r", "subscribe": "a", "startingOffsets": '{"a": {"0": -1}}'}, False, "startingOffsets"),
        ({"url": "/r", "subscribe": "a", "endingOffsets": "earliest"}, False, "endingOffsets"),
        ({"url": "/r", "subscribe": "a", "endingOffsets": "latest"}, True, "endingOffsets"),
        ({"url": "/r", "subscribe": "a", "endingTimestamp": "5"}, True, "endingTimestamp"),
        ({"url": "/r", "subscribe": "a", "startingTimestamp": "yesterday"}, True, "startingTimestamp"),
        (
            {"url": "/r", "subscribe": "a", "startingOffsetsByTimestamp": '{"a": {"0": -5}}'},
            True,
            "startingOffsetsByTimestamp",
        ),
        ({"url": "/r", "subscribe": "a", "maxOffsetsPerTrigger": "0"}, True, "maxOffsetsPerTrigger"),
        (
            {"url": "/r", "subscribe": "a", "maxOffsetsPerTrigger": "10", "minOffsetsPerTrigger": "20"},
            True,
            "minOffsetsPerTrigger",
        ),
        ({"url": "/r", "subscribe": "a", "maxBytesPerTrigger": "lots"}, True, "maxBytesPerTrigger"),
        ({"url": "/r", "subscribe": "a", "maxTriggerDelay": "soon"}, True, "maxTriggerDelay"),
        ({"url": "/r", "subscribe": "a", "minPartitions": "-1"}, False, "minPartitions"),
        ({"url": "/r", "subscribe": "a", "failOnDataLoss": "maybe"}, True, "failOnDataLoss"),
        ({"url": "/r", "subscribe": "a", "includeHeaders": "yes"}, True, "includeHeaders"),
        ({"url": "/r", "subscribe": "a", "isolationLevel": "serializable"}, True, "isolationLevel"),
        ({"url": "/r", "subscribe": "a", "groupIdForLag": "a/b"}, True, "groupIdForLag"),
        (
            {"url": "/r", "subscribe": "a", "kafka.bootstrap.servers": "x:9092"},
            True,
            "kafka.bootstrap.servers",
        ),
        ({"url": "/r", "subscribe": "a", "startingoffset": "earliest"}, True, "startingoffset"),
        ({"subscribe": "a"}, True, "url"),
        ({"url": "/a", "path": "/b", "subscribe": "a"}, True, "url"),
        ({"url": "memory://x", "subscribe": "a"}, True, "url"),
        ({"url": "/r", "subscribe": "a", "storage.client_kwargs": "{nope"}, True, "storage.client_kwargs"),
    ],
)
def test_bad_options_name_the_option(options: dict[str, str], streaming: bool, named: str) -> None:
    with pytest.raises(InvalidConfigError) as info:
        parse_options({k.lower(): v for k, v in options.items()}, streaming=streaming)
    assert f"plog option '{named}'" in str(info.value)


def test_options_are_parsed() -> None:
    opts = parse_options(
        {
            "path": "s3://b/plog",
            "subscribe": " b, a ,a",
            "startingoffsets": '{"a": {"0": 5, "1": -2}}',
            "maxoffsetspertrigger": "100",
            "minoffsetspertrigger": "10",
            "maxtriggerdelay": "30s",
            "maxbytespertrigger": "64m",
            "minpartitions": "4",
            "failondataloss": "FALSE",
            "includeheaders": "true",
            "isolationlevel": "read_uncommitted",
            "groupidforlag": "lag-1",
            "storage.endpoint_url": "http://127.0.0.1:9000",
            "storage.secret.key": "12345",
            "storage.secret": "s",
            "storage.anon": "false",
            "storage.client_kwargs": '{"region_name": "us-east-1"}',
            "storage.default_block_size": "5242880",
        },
        streaming=True,
    )
    assert opts.url == "s3://b/plog"
    assert opts.subscription.kind == "subscribe" and opts.subscription.topics == ("a", "b")
    assert opts.starting.kind == "offsets" and opts.starting.offsets == {"a": {0: 5, 1: -2}}
    assert (opts.max_offsets_per_trigger, opts.min_offsets_per_trigger) == (100, 10)
    assert opts.max_trigger_delay_ms == 30_000 and opts.max_bytes_per_trigger == 64 << 20
    assert opts.min_partitions == 4 and not opts.fail_on_data_loss and opts.include_headers
    assert opts.isolation_level == "read_uncommitted" and opts.group_id_for_lag == "lag-1"
    assert opts.storage_options == {
        "endpoint_url": "http://127.0.0.1:9000",
        "key": "12345",
        "secret": "s",
        "anon": False,
        "client_kwargs": {"region_name": "us-east-1"},
        "default_block_size": 5242880,
    }
    # Defaults: streams start at latest, batches read earliest..latest; Kafka's timestamp precedence.
    assert stream_opts(url="/r", subscribe="a").starting.kind == "latest"
    b = batch_opts(url="/r", subscribepattern="a.*", startingtimestamp="7", startingoffsets="earliest")
    assert (b.starting.kind, b.starting.timestamp, b.ending.kind) == ("timestamp", 7, "latest")
    assert batch_opts(url="/r", assign='{"a": [1, 0], "b": [0]}').subscription.assigned == (
        ("a", 0),
        ("a", 1),
        ("b", 0),
    )


# ---------------------------------------------------------------------------- schema and conversion (no JVM)


def test_arrow_schema_is_what_spark_expects() -> None:
    for headers in (False, True):
        assert to_arrow_schema(spark_schema(headers), timezone="UTC").equals(spark_arrow_schema(headers))
    assert spark_schema().simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,timestamp:timestamp,timestampType:int>"
    )
    assert spark_schema(True).fieldNames()[-1] == "headers"


def test_conversion_is_columnar(tmp_path: Path) -> None:
    root = make_root(tmp_path, {"conv": 1})
    produce(root, "conv", 0, 6, headers=True)
    r = LogRoot(root)
    (stored,), _ = r.partition("conv", 0).read(0)
    out = to_spark_batch(stored, "conv", 0, 1, True)
    assert out.schema.equals(spark_arrow_schema(True))
    assert out.column("topic").to_pylist() == ["conv"] * 6
    assert out.column("partition").to_pylist() == [0] * 6
    assert out.column("timestampType").to_pylist() == [1] * 6
    assert out.column("offset").to_pylist() == list(range(6))
    assert out.column("timestamp").cast(pa.int64()).to_pylist() == [(T0 + i * 1000) * 1000 for i in range(6)]
    assert out.column("headers").to_pylist()[:2] == [[{"key": "i", "value": b"0"}], None]
    assert out.column("value").buffers()[2].address == stored.column(3).buffers()[2].address  # zero-copy
    assert to_spark_batch(stored.slice(2, 3), "conv", 0, 0, False).column("offset").to_pylist() == [2, 3, 4]
    # Constant columns are slices of cached arrays, grown for bigger batches.
    big = pa.RecordBatch.from_arrays(
        [
            pa.array(np.arange(100_000)),
            pa.array(np.zeros(100_000, np.int64)).cast(pa.timestamp("ms", tz="UTC")),
            pa.nulls(100_000, pa.binary()),
            pa.nulls(100_000, pa.binary()),
            pa.nulls(100_000, stored.schema[4].type),
        ],
        schema=stored.schema,
    )
    out = to_spark_batch(big, "another-topic", 7, 0, False)
    assert out.column("topic").to_pylist() == ["another-topic"] * 100_000
    assert out.column("partition").to_pylist() == [7] * 100_000
    assert to_spark_batch(stored, "another-topic", 7, 0, False).column("topic").to_pylist() == ["another-topic"] * 6
    r.close()


def test_prefetch_thread_hands_over_batches_errors_and_stops(tmp_path: Path) -> None:
    from pyspark_logsource.spark.partition_reader import prefetched as _prefetched

    def source(n: int, fail: bool) -> Iterator[int]:
        yield from range(n)
        if fail:
            raise DataLossError("boom")

    assert list(_prefetched(source(100, False), 4)) == list(range(100))  # type: ignore[arg-type]
    with pytest.raises(DataLossError, match="boom"):
        list(_prefetched(source(10, True), 4))  # type: ignore[arg-type]
    before = threading.active_count()
    gen = _prefetched(source(10_000, False), 4)  # type: ignore[arg-type]
    assert next(gen) == 0
    gen.close()  # the consumer stops early (a LIMIT): the thread must end too
    wait_for(lambda: threading.active_count() <= before, 5, "the prefetch thread to end")


# ---------------------------------------------------------------------------- planning (no JVM)


def test_allocate_rows_is_exact_and_proportional() -> None:
    avail = {("a", 0): 1000, ("a", 1): 10, ("b", 0): 1}
    out = allocate_rows(avail, 100)
    assert sum(out.values()) == 100 and all(out[tp] <= avail[tp] for tp in avail)
    assert out[("a", 0)] >= 98
    assert allocate_rows(avail, 5000) == avail
    for _ in range(200):
        rnd = {("t", i): random.randint(0, 50) for i in range(random.randint(1, 6))}
        limit = random.randint(1, 200)
        got = allocate_rows(rnd, limit)
        assert sum(got.values()) == min(limit, sum(rnd.values()))
        assert all(0 <= got[tp] <= rnd[tp] for tp in rnd)


def test_split_ranges_follows_min_partitions() -> None:
    ranges = [OffsetRange("a", 0, 0, 900), OffsetRange("a", 1, 50, 150), OffsetRange("b", 0, 7, 7)]
    assert split_ranges(ranges, None) == ranges[:2]
    pieces = split_ranges(ranges, 10)
    assert len(pieces) == 10 and split_ranges(ranges, 10) == pieces  # deterministic
    for tp_range in ranges[:2]:
        mine = [p for p in pieces if (p.topic, p.partition) == (tp_range.topic, tp_range.partition)]
        assert mine[0].start == tp_range.start and mine[-1].until == tp_range.until
        assert all(x.until == y.start for x, y in zip(mine, mine[1:], strict=False))
    assert split_ranges([OffsetRange("a", 0, 0, 3)], 10) == [OffsetRange("a", 0, i, i + 1) for i in range(3)]


def test_group_offsets_writer(tmp_path: Path) -> None:
    root = LogRoot(str(tmp_path / "g"))
    a = GroupOffsetsWriter(root.store, "grp", keep=15)
    assert a.commit({"t": {"0": 5}}) == "groups/grp/offsets/00000000000000000000.json"
    assert a.commit({"t": {"0": 5}}) is None  # unchanged: nothing written
    b = GroupOffsetsWriter(root.store, "grp", keep=15)  # a second writer (another run) continues the sequence
    assert b.commit({"t": {"0": 5}}) is None
    assert b.commit({"t": {"0": 9}}) == "groups/grp/offsets/00000000000000000001.json"
    assert a.commit({"t": {"0": 11}}) == "groups/grp/offsets/00000000000000000002.json"  # lost race: next
    for i in range(40):
        a.commit({"t": {"0": 100 + i}})
    names = [i.key for i in root.store.list("groups/grp/offsets/")]
    assert len(names) <= 25 and names[-1].endswith("00000000000000000042.json")
    assert json.loads(root.store.get(names[-1])) == {"t": {"0": 139}}
    root.close()


# ---------------------------------------------------------------------------- batch reader, pushdown


def test_pushdown_narrows_ranges_through_the_indexes(tmp_path: Path) -> None:
    root = make_root(tmp_path, {"a": 3, "b": 1}, per_partition=50)
    reader = PlogBatchReader(batch_opts(url=root, subscribepattern="[ab]"))
    utc = dt.timezone.utc
    at = [dt.datetime.fromtimestamp((T0 + s * 1000) / 1000, utc) for s in (10, 20)]
    filters = [
        EqualTo(("topic",), "a"),
        In(("partition",), (0, 2)),
        GreaterThanOrEqual(("offset",), 5),
        LessThan(("offset",), 40),
        GreaterThan(("timestamp",), at[0]),
        LessThanOrEqual(("timestamp",), at[1]),
        Not(EqualTo(("partition",), 1)),
        EqualTo(("key",), b"k1"),
    ]
    left = reader.pushFilters(filters)
    # topic/partition/offset filters are applied exactly; timestamp bounds narrow but Spark re-checks them.
    assert left == [filters[4], filters[5], filters[6], filters[7]]
    parts = reader.partitions()
    assert [(p.topic, p.partition) for p in parts] == [("a", 0), ("a", 2)]
    for p in parts:
        assert p.start == 10 and 21 <= p.until <= 40  # time index: the first record >= ts 10 is offset 10
    rows = pa.Table.from_batches([b for p in parts for b in read_partition(p)])
    assert rows.num_rows == sum(p.until - p.start for p in parts)
    # Nothing matches: no partitions at all.
    empty = PlogBatchReader(batch_opts(url=root, subscribe="a"))
    empty.pushFilters([GreaterThan(("offset",), 10), LessThan(("offset",), 5)])
    assert empty.partitions() == []
    assert list(read_partition(pyspark.sql.datasource.InputPartition(None))) == []


def test_batch_reader_offsets_and_errors(tmp_path: Path) -> None:
    root = make_root(tmp_path, {"a": 2}, per_partition=20)
    ranges = lambda r: [(p.topic, p.partition, p.start, p.until) for p in r.partitions()]  # noqa: E731
    assert ranges(PlogBatchReader(batch_opts(url=root, subscribe="a"))) == [("a", 0, 0, 20), ("a", 1, 0, 20)]
    r = PlogBatchReader(
        batch_opts(url=root, assign='{"a": [1]}', startingoffsets='{"a": {"1": 3}}', endingoffsets='{"a": {"1": -1}}')
    )
    assert ranges(r) == [("a", 1, 3, 20)]
    r = PlogBatchReader(
        batch_opts(url=root, subscribe="a", startingtimestamp=str(T0 + 4500), endingtimestamp=str(T0 + 9000))
    )
    assert ranges(r) == [("a", 0, 5, 9), ("a", 1, 5, 9)]
    r = PlogBatchReader(
        batch_opts(
            url=root,
            subscribe="a",
            startingoffsetsbytimestamp=json.dumps({"a": {"0": T0, "1": T0 + 2000}}),
            endingoffsetsbytimestamp=json.dumps({"a": {"0": T0 + 1000, "1": T0 + 99_000}}),
        )
    )
    assert ranges(r) == [("a", 0, 0, 1), ("a", 1, 2, 20)]
    r = PlogBatchReader(batch_opts(url=root, subscribe="a", minpartitions="5"))
    assert len(ranges(r)) == 5
    bad = [
        ({"subscribe": "zzz"}, "subscribe", "unknown topic"),
        ({"assign": '{"a": [7]}'}, "assign", "partition 7"),
        (
            {"subscribe": "a", "startingoffsets": '{"a": {"0": 21, "1": 0}}'},
            "startingOffsets",
            "past the end",
        ),
        ({"subscribe": "a", "startingoffsets": '{"a": {"0": 1}}'}, "startingOffsets", "missing: a-1"),
        ({"subscribe": "a", "startingoffsets": '{"a": {"0": 1, "1": 1, "2": 1}}'}, "startingOffsets", "a-2"),
        ({"subscribe": "a", "endingoffsets": '{"a": {"0": 99, "1": 1}}'}, "endingOffsets", "past the end"),
        (
            {
                "subscribe": "a",
                "startingoffsets": '{"a": {"0": 9, "1": 0}}',
                "endingoffsets": '{"a": {"0": 2, "1": 5}}',
            },
            "startingOffsets",
            "after its end",
        ),
        ({"subscribe": "a", "startingtimestamp": str(T0 + 10**9)}, "startingTimestamp", "no record"),
    ]
    for options, named, words in bad:
        with pytest.raises(InvalidConfigError, match=f"plog option '{named}'.*{words}"):
            PlogBatchReader(batch_opts(url=root, **options)).partitions()
    r = PlogBatchReader(
        batch_opts(
            url=root,
            subscribe="a",
            startingtimestamp=str(T0 + 10**9),
            startingoffsetsbytimestampstrategy="latest",
        )
    )
    assert ranges(r) == []
    # Offsets before the log start: an error naming the option, or (failOnDataLoss=false) the log start.
    with LogStore(root) as store:
        store.delete_records("a", {0: 8})
    below = {"subscribe": "a", "startingoffsets": '{"a": {"0": 2, "1": 0}}'}
    with pytest.raises(DataLossError, match="plog option 'startingOffsets': offset 2 for a-0 is before"):
        PlogBatchReader(batch_opts(url=root, **below)).partitions()
    r = PlogBatchReader(batch_opts(url=root, failondataloss="false", **below))
    assert ranges(r) == [("a", 0, 8, 20), ("a", 1, 0, 20)]
    assert ranges(PlogBatchReader(batch_opts(url=root, subscribe="a"))) == [("a", 0, 8, 20), ("a", 1, 0, 20)]
    # The stream reader resolves starting timestamps the same way.
    s = PlogStreamReader(stream_opts(url=root, subscribe="a", startingtimestamp=str(T0 + 12_000)))
    assert s.initialOffset() == {"a": {"0": 12, "1": 12}}
    s = PlogStreamReader(
        stream_opts(url=root, subscribe="a", startingoffsetsbytimestamp=json.dumps({"a": {"0": 0, "1": T0 + 3_000}}))
    )
    assert s.initialOffset() == {"a": {"0": 8, "1": 3}}


# ---------------------------------------------------------------------------- stream reader, driven directly


@pytest.mark.parametrize("starting", [{"startingoffsets": "latest"}, {"startingtimestamp": str(T0 + 5_000)}])
def test_a_first_batch_re_run_after_a_crash_reads_from_its_original_start(
    tmp_path: Path, starting: dict[str, str]
) -> None:
    """Spark logs no start offset: the first batch carries its own, so a re-run does not start later."""
    root = make_root(tmp_path, {"s": 2}, per_partition=10)
    options = {"url": root, "subscribe": "s", **starting}
    first = PlogStreamReader(stream_opts(**options))
    start = first.initialOffset()
    assert tps(start) == ({("s", 0): 10, ("s", 1): 10} if "startingoffsets" in starting else {("s", 0): 5, ("s", 1): 5})
    for p in range(2):
        produce(root, "s", p, 5, start=10, ts0=T0 + 10_000)
    end = first.latestOffset(start, ReadAllAvailable())  # batch 0 planned: Spark writes ``end`` to its log
    assert tps(end) == {("s", 0): 15, ("s", 1): 15}
    # The driver dies before batch 0 commits; more records arrive; the restarted query re-runs batch 0 with
    # a start from initialOffset() called again, which now resolves later than the first time.
    for p in range(2):
        produce(root, "s", p, 5, start=15, ts0=T0 + 15_000)
    restarted = PlogStreamReader(stream_opts(url=root, subscribe="s", startingoffsets="latest"))
    later = restarted.initialOffset()
    assert tps(later) == {("s", 0): 20, ("s", 1): 20}
    parts = restarted.partitions(later, end)
    assert [(p.partition, p.start, p.until) for p in parts] == [
        (0, tps(start)[("s", 0)], 15),
        (1, tps(start)[("s", 1)], 15),
    ]
    # Later batches carry no start of their own: their start is the previous end, from Spark's offset log.
    following = restarted.latestOffset(end, ReadAllAvailable())
    assert following == {"s": {"0": 20, "1": 20}}
    assert [(p.start, p.until) for p in restarted.partitions(end, following)] == [(15, 20), (15, 20)]


def test_stream_reader_admission_control(tmp_path: Path) -> None:
    root = make_root(tmp_path, {"s": 2}, per_partition=100)
    r = PlogStreamReader(stream_opts(url=root, subscribe="s", startingoffsets="earliest", maxoffsetspertrigger="30"))
    assert r.getDefaultReadLimit() == ReadMaxRows(30)
    start = r.initialOffset()
    assert start == {"s": {"0": 0, "1": 0}}
    end = r.latestOffset(start, ReadMaxRows(30))
    assert sum(tps(end).values()) == 30 and tps(end) == {("s", 0): 15, ("s", 1): 15}
    assert r.reportLatestOffset() == {"s": {"0": 100, "1": 100}}
    assert r.latestOffset(end, ReadAllAvailable()) == {"s": {"0": 100, "1": 100}}  # all-available ignores options
    parts = r.partitions(start, end)
    assert [(p.partition, p.start, p.until) for p in parts] == [(0, 0, 15), (1, 0, 15)]
    assert r.partitions(end, end) == []
    assert r.latestOffset({"s": {"0": 100, "1": 100}}, ReadMaxRows(30)) == {"s": {"0": 100, "1": 100}}

    # maxBytesPerTrigger: stored bytes shared by partition; always at least one record.
    rb = PlogStreamReader(stream_opts(url=root, subscribe="s", startingoffsets="earliest", maxbytespertrigger="1"))
    assert isinstance(rb.getDefaultReadLimit(), ReadMaxBytes)
    step = rb.latestOffset(start, rb.getDefaultReadLimit())
    assert sum(tps(step).values()) == 1
    size = sum(ref.size for p in range(2) for ref in LogRoot(root).partition("s", p).view().segments)
    half = rb.latestOffset(start, ReadMaxBytes(size // 2))
    assert 60 <= sum(tps(half).values()) <= 140

    # minOffsetsPerTrigger waits for enough records, or for maxTriggerDelay.
    rm = PlogStreamReader(
        stream_opts(url=root, subscribe="s", startingoffsets="latest", minoffsetspertrigger="50", maxtriggerdelay="1s")
    )
    assert rm.getDefaultReadLimit() == ReadMinRows(50)
    at_end = rm.initialOffset()
    produce(root, "s", 0, 20, start=100)
    assert rm.latestOffset(at_end, ReadMinRows(50)) is at_end
    produce(root, "s", 1, 40, start=100)
    assert tps(rm.latestOffset(at_end, ReadMinRows(50))) == {("s", 0): 120, ("s", 1): 140}
    produce(root, "s", 0, 1, start=120)
    after = {"s": {"0": 120, "1": 140}}
    assert rm.latestOffset(after, ReadMinRows(50)) is after
    time.sleep(1.1)
    assert tps(rm.latestOffset(after, ReadMinRows(50))) == {("s", 0): 121, ("s", 1): 140}


def test_stream_reader_available_now_and_discovery(tmp_path: Path) -> None:
    root = make_root(tmp_path, {"p-1": 1}, per_partition=10)
    r = PlogStreamReader(
        stream_opts(
            url=root,
            subscribepattern="p-.*",
            startingoffsets="earliest",
            maxoffsetspertrigger="4",
            groupidforlag="lagging",
        )
    )
    r.prepareForTriggerAvailableNow()
    start = r.initialOffset()
    produce(root, "p-1", 0, 5, start=10)  # after AvailableNow began: not read
    seen = []
    while True:
        end = r.latestOffset(start, ReadMaxRows(4))
        if end is start:
            break
        seen.append(tps(end)[("p-1", 0)])
        r.commit(end)
        start = end
    assert seen == [4, 8, 10]
    assert r.reportLatestOffset() == {"p-1": {"0": 15}}
    groups = LogRoot(root).store.list("groups/lagging/offsets/")
    recorded = [json.loads(LogRoot(root).store.get(g.key)) for g in groups]
    assert recorded == [{"p-1": {"0": o}} for o in (0, 4, 8, 10)]

    # A normal trigger sees new partitions and topics (read from their start) as they appear.
    s = PlogStreamReader(stream_opts(url=root, subscribepattern="p-.*", startingoffsets="latest"))
    begin = s.initialOffset()
    assert begin == {"p-1": {"0": 15}}
    with LogStore(root) as store:
        store.create_partitions("p-1", 2)
        store.create_topic("p-2", 1)
        store.create_topic("q-1", 1)
    produce(root, "p-1", 1, 3)
    produce(root, "p-2", 0, 2)
    produce(root, "q-1", 0, 2)
    s._names_at = -1e9  # skip the metadata age for the test
    s.root.topic_names(refresh=True)  # and the root's cache of the names
    for name in ("p-1", "p-2"):
        s.root.topic(name, refresh=True)
    end = s.latestOffset(begin, ReadAllAvailable())
    assert end == {"p-1": {"0": 15, "1": 3}, "p-2": {"0": 2}, "@start": begin}  # a first batch: carries its start
    assert [(p.topic, p.partition, p.start, p.until) for p in s.partitions(begin, end)] == [
        ("p-1", 1, 0, 3),
        ("p-2", 0, 0, 2),
    ]


def test_stream_reader_data_loss(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = make_root(tmp_path, {"d": 1, "gone": 1}, per_partition=30)
    position = {"d": {"0": 10}, "gone": {"0": 5}}
    with LogStore(root) as store:
        store.delete_records("d", {0: 20})
        store.delete_topic("gone")
    strict = PlogStreamReader(stream_opts(url=root, subscribe="d"))
    with pytest.raises(DataLossError, match="gone.*failOnDataLoss=false"):
        strict.latestOffset(position, ReadAllAvailable())
    lenient = PlogStreamReader(stream_opts(url=root, subscribe="d", failondataloss="false"))
    end = lenient.latestOffset(position, ReadAllAvailable())
    assert end == {"d": {"0": 30}}  # the deleted topic drops out
    (part,) = lenient.partitions({"d": {"0": 10}}, end)
    with pytest.raises(DataLossError, match=r"offsets \[10, 20\) of d-0 are gone"):
        list(read_partition(PlogInputPartition(**{**part.__dict__, "fail_on_data_loss": True})))
    with caplog.at_level("WARNING"):
        rows = pa.Table.from_batches(list(read_partition(part)))
    assert rows.column("offset").to_pylist() == list(range(20, 30))
    assert "failOnDataLoss=false" in caplog.text
    # A starting offset before the log start is data loss as well.
    with pytest.raises(DataLossError):
        PlogStreamReader(stream_opts(url=root, subscribe="d", startingoffsets='{"d": {"0": 3}}')).initialOffset()
    assert PlogStreamReader(
        stream_opts(url=root, subscribe="d", startingoffsets='{"d": {"0": 3}}', failondataloss="false")
    ).initialOffset() == {"d": {"0": 20}}
    # A re-created topic: the log is behind the query's position.
    with LogStore(root) as store:
        store.delete_topic("d")
        store.create_topic("d", 1)
    produce(root, "d", 0, 4)
    with pytest.raises(DataLossError, match="re-created"):
        PlogStreamReader(stream_opts(url=root, subscribe="d")).latestOffset({"d": {"0": 30}}, ReadAllAvailable())
    assert PlogStreamReader(stream_opts(url=root, subscribe="d", failondataloss="false")).latestOffset(
        {"d": {"0": 30}}, ReadAllAvailable()
    ) == {"d": {"0": 0}}


def test_isolation_levels_with_transactions(tmp_path: Path) -> None:
    root = make_root(tmp_path, {"tx": 1}, per_partition=5)  # offsets 0..4, not transactional
    producer = Producer(root, transactional_id="txn-app", linger_ms=0)
    producer.init_transactions()
    for value, decide in ((b"committed", "commit"), (b"aborted", "abort"), (b"open", None)):
        producer.begin_transaction()
        for i in range(3):
            producer.send("tx", value=b"%s-%d" % (value, i), partition=0)
        producer.flush()
        if decide == "commit":
            producer.commit_transaction()
        elif decide == "abort":
            producer.abort_transaction()

    def values(reader: Any, start: dict, end: dict) -> list[bytes]:
        parts = reader.partitions(start, end)
        return [v for p in parts for b in read_partition(p) for v in b.column("value").to_pylist()]

    committed = PlogStreamReader(stream_opts(url=root, subscribe="tx", startingoffsets="earliest"))
    start = committed.initialOffset()
    end = committed.latestOffset(start, ReadAllAvailable())
    plain = [f"tx-0-{i}".encode() for i in range(5)]
    assert values(committed, start, end) == plain + [b"committed-%d" % i for i in range(3)]
    everything = PlogStreamReader(
        stream_opts(url=root, subscribe="tx", startingoffsets="earliest", isolationlevel="read_uncommitted")
    )
    end_all = everything.latestOffset(start, ReadAllAvailable())
    assert tps(end_all)[("tx", 0)] > tps(end)[("tx", 0)]  # read_uncommitted goes past the open transaction
    assert values(everything, start, end_all) == plain + [
        b"%s-%d" % (v, i) for v in (b"committed", b"aborted", b"open") for i in range(3)
    ]
    # The batch reader's "latest" is the last stable offset too.
    batch = PlogBatchReader(batch_opts(url=root, subscribe="tx"))
    assert [(p.start, p.until) for p in batch.partitions()] == [(0, tps(end)[("tx", 0)])]
    # Once the open transaction commits, the stream moves on and reads it, skipping the aborted one.
    assert committed.latestOffset(end, ReadAllAvailable()) is end  # nothing stable yet
    producer.commit_transaction()
    producer.close()
    after = committed.latestOffset(end, ReadAllAvailable())
    assert values(committed, end, after) == [b"open-%d" % i for i in range(3)]


# ============================================================================ through Spark


def read_df(spark: Any, root: str, **options: str) -> Any:
    reader = spark.read.format("plog")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(root)


@pytest.mark.spark
def test_format_plog_needs_no_registration(spark: Any, tmp_path: Path) -> None:
    import pyspark_logsource

    assert pyspark_logsource.DefaultSource is DefaultSource and DefaultSource.name() == "plog"
    root = make_root(tmp_path, {"e1": 2, "e2": 1}, per_partition=40)
    df = read_df(spark, root, subscribe="e1,e2")
    assert df.schema == spark_schema(False)
    got = spark_rows(df.toArrow())
    want = pa.concat_tables([log_table(root, "e1"), log_table(root, "e2")]).sort_by(
        [("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")]
    )
    assert got.num_rows == 120 and got.equals(want)
    assert set(df.select("timestampType").toArrow().column(0).to_pylist()) == {0}
    # The root as an option works too, and Spark applies what is not pushed down.
    df2 = spark.read.format("plog").option("url", root).option("assign", '{"e1": [1]}').load()
    assert df2.where("value like '%-3_'").count() == 10


@pytest.mark.spark
def test_headers_and_log_append_time(spark: Any, tmp_path: Path) -> None:
    root = str(tmp_path / "plog")
    with LogStore(root) as store:
        store.create_topic("h", 1)
        store.create_topic("lat", 1, {"message.timestamp.type": "LogAppendTime"})
    produce(root, "h", 0, 10, headers=True)
    produce(root, "lat", 0, 5)
    df = read_df(spark, root, subscribe="h", includeHeaders="true")
    assert df.schema == spark_schema(True)
    headers = df.orderBy("offset").select("headers").toArrow().column(0).to_pylist()
    assert headers[0] == [{"key": "i", "value": b"0"}] and headers[1] is None
    lat = read_df(spark, root, subscribe="lat").toArrow()
    assert set(lat.column("timestampType").to_pylist()) == {1}
    assert read_df(spark, root, subscribe="h", isolationLevel="read_uncommitted").count() == 10


@pytest.mark.spark
def test_batch_options_through_spark(spark: Any, tmp_path: Path) -> None:
    root = make_root(tmp_path, {"o": 2, "o2": 1}, per_partition=30)
    count = lambda **o: read_df(spark, root, **o).count()  # noqa: E731
    assert count(subscribePattern="o.*") == 90
    assert (
        count(
            subscribe="o",
            startingOffsets='{"o": {"0": 10, "1": -2}}',
            endingOffsets='{"o": {"0": 20, "1": 5}}',
        )
        == 15
    )
    assert count(subscribe="o", startingTimestamp=str(T0 + 25_000)) == 10
    assert count(subscribe="o", endingTimestamp=str(T0 + 3_000)) == 6
    assert count(subscribe="o", startingOffsetsByTimestamp=json.dumps({"o": {"0": T0, "1": T0 + 29_000}})) == 31
    df = read_df(spark, root, subscribe="o", minPartitions="6")
    assert df.rdd.getNumPartitions() == 6 and df.count() == 60 and df.distinct().count() == 60


@pytest.mark.spark
def test_filters_are_pushed_down(spark: Any, tmp_path: Path) -> None:
    root = make_root(tmp_path, {"f": 3}, per_partition=50)
    df = read_df(spark, root, subscribe="f")
    q = df.where("partition = 1 and offset >= 10 and offset < 20 and topic = 'f'")
    plan = q._jdf.queryExecution().executedPlan().toString()
    left_to_spark = [line for line in plan.splitlines() if "Filter" in line]
    assert all(not any(op in line for op in ("=", "<", ">")) for line in left_to_spark), plan  # only isnotnull
    assert sorted(r.offset for r in q.select("offset").collect()) == list(range(10, 20))
    t_lo = dt.datetime.fromtimestamp((T0 + 20_000) / 1000, dt.timezone.utc)
    q2 = df.where((df.timestamp >= t_lo) & (df.partition == 2))
    assert sorted(r.offset for r in q2.select("offset").collect()) == list(range(20, 50))
    # With pushdown off (Spark's default), the same reader plans and Spark filters everything itself.
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")
    try:
        fresh = read_df(spark, root, subscribe="f")
        assert fresh.where("partition = 1 and offset >= 10 and offset < 20").count() == 10
        assert fresh.count() == 150
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")


@pytest.mark.spark
@pytest.mark.xfail(
    tuple(int(x) for x in pyspark.__version__.split(".")[:2]) <= (4, 3),
    strict=False,
    reason="Spark <= 4.3 keeps the read plan of a pushed-down query on the DataFrame's data "
    "source and reuses it for later queries of that DataFrame that push nothing",
)
def test_dataframe_reuse_after_pushdown(spark: Any, tmp_path: Path) -> None:
    root = make_root(tmp_path, {"reuse": 2}, per_partition=50)
    df = read_df(spark, root, subscribe="reuse")
    assert df.where("partition = 1 and offset < 20").count() == 20
    assert df.count() == 100


@pytest.mark.spark
@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"subscribe": "bad", "assign": '{"bad": [0]}'}, "assign"),
        ({}, "subscribe"),
        ({"subscribe": "bad", "startingOffsets": "{oops"}, "startingOffsets"),
        ({"subscribe": "bad", "endingOffsets": '{"bad": {"0": 999}}'}, "endingOffsets"),
        ({"subscribe": "nope"}, "subscribe"),
        ({"subscribe": "bad", "bogusOption": "1"}, "bogusoption"),
    ],
)
def test_bad_options_fail_batch_reads(spark: Any, tmp_path: Path, options: dict[str, str], named: str) -> None:
    root = make_root(tmp_path, {"bad": 1}, per_partition=3)
    with pytest.raises(Exception, match=f"plog option '{named}'"):
        read_df(spark, root, **options).collect()


@pytest.mark.spark
@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"subscribe": "nope"}, "subscribe"),
        ({"subscribe": "bad", "startingOffsets": '{"bad": {"0": 999}}'}, "startingOffsets"),
        ({"subscribe": "bad", "endingOffsets": "latest"}, "endingOffsets"),
        ({"subscribe": "bad", "subscribePattern": "b.*"}, "subscribePattern"),
    ],
)
def test_bad_options_fail_streams_when_they_start(
    spark: Any, tmp_path: Path, options: dict[str, str], named: str
) -> None:
    from pyspark.errors import StreamingQueryException

    root = make_root(tmp_path, {"bad": 1}, per_partition=3)
    reader = spark.readStream.format("plog")
    for k, v in options.items():
        reader = reader.option(k, v)
    with pytest.raises(Exception, match=f"plog option '{named}'") as info:
        q = reader.load(root).writeStream.format("noop").start()
        try:
            q.awaitTermination(60)
        finally:
            q.stop()
    assert info.type.__name__ in ("AnalysisException", StreamingQueryException.__name__)


@pytest.mark.spark
def test_custom_schema_is_refused(spark: Any, tmp_path: Path) -> None:
    root = make_root(tmp_path, {"cs": 1}, per_partition=1)
    with pytest.raises(Exception, match="fixed schema"):
        spark.read.format("plog").schema("value binary").option("subscribe", "cs").load(root).collect()


def run_available_now(spark: Any, df: Any, sink: Path, checkpoint: Path) -> tuple[Any, pa.Table]:
    """Run ``df`` with Trigger.AvailableNow into a parquet sink; return the query and the sink's rows."""
    q = (
        df.writeStream.format("parquet")
        .option("path", str(sink))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(120)
    assert q.exception() is None, q.exception()
    return q, spark.read.parquet(str(sink)).toArrow()


@pytest.mark.spark
def test_stream_available_now_with_rate_limits(spark: Any, tmp_path: Path) -> None:
    root = make_root(tmp_path, {"an": 2}, per_partition=250)
    df = (
        spark.readStream.format("plog")
        .option("subscribe", "an")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "120")
        .option("minPartitions", "3")
        .load(root)
    )
    q, rows = run_available_now(spark, df, tmp_path / "sink", tmp_path / "ck")
    assert sorted(keys(rows)) == [("an", p, o) for p in range(2) for o in range(250)]
    progress = [p for p in q.recentProgress if p["numInputRows"]]
    assert len(progress) == 5 and all(p["numInputRows"] <= 120 for p in progress)
    assert json.loads(progress[-1]["sources"][0]["latestOffset"]) == {"an": {"0": 250, "1": 250}}
    assert json.loads(progress[-1]["sources"][0]["endOffset"]) == {"an": {"0": 250, "1": 250}}
    # The checkpoint holds the offsets: a restart reads only what came since.
    produce(root, "an", 1, 7, start=250)
    q2, rows2 = run_available_now(spark, df, tmp_path / "sink", tmp_path / "ck")
    assert sorted(set(keys(rows2)) - set(keys(rows))) == [("an", 1, o) for o in range(250, 257)]
    assert rows2.num_rows == 507
    # maxBytesPerTrigger through Spark: several small batches, nothing lost or repeated.
    dfb = (
        spark.readStream.format("plog")
        .option("subscribe", "an")
        .option("startingOffsets", "earliest")
        .option("maxBytesPerTrigger", "4k")
        .load(root)
    )
    q3, rows3 = run_available_now(spark, dfb, tmp_path / "sink3", tmp_path / "ck3")
    assert sorted(keys(rows3)) == sorted(keys(rows2))
    assert len([p for p in q3.recentProgress if p["numInputRows"]]) > 2


@pytest.mark.spark
def test_stream_min_offsets_per_trigger(spark: Any, tmp_path: Path) -> None:
    root = make_root(tmp_path, {"few": 1}, per_partition=3)
    df = (
        spark.readStream.format("plog")
        .option("subscribe", "few")
        .option("startingOffsets", "earliest")
        .option("minOffsetsPerTrigger", "100")
        .option("maxTriggerDelay", "4s")
        .load(root)
    )
    q = df.writeStream.format("memory").queryName("few").trigger(processingTime="200 milliseconds").start()
    try:
        began = time.monotonic()
        count = lambda: spark.sql("select count(*) from few").collect()[0][0]  # noqa: E731
        wait_for(lambda: count() == 3, 60, "the delayed batch")
        assert time.monotonic() - began >= 3.0  # held back until maxTriggerDelay, then read anyway
    finally:
        q.stop()
    # Trigger.AvailableNow does not wait for minOffsetsPerTrigger.
    _, rows = run_available_now(spark, df, tmp_path / "sink", tmp_path / "ck")
    assert sorted(keys(rows)) == [("few", 0, o) for o in range(3)]


@pytest.mark.spark
def test_stream_follows_new_data_partitions_and_topics(spark: Any, tmp_path: Path) -> None:
    root = make_root(tmp_path, {"live-a": 1}, per_partition=5)
    df = (
        spark.readStream.format("plog")
        .option("subscribePattern", "live-.*")
        .option("startingOffsets", "latest")
        .option("groupIdForLag", "dash")
        .load(root)
    )
    q = df.writeStream.format("memory").queryName("live").trigger(processingTime="200 milliseconds").start()
    try:
        count = lambda: spark.sql("select count(*) from live").collect()[0][0]  # noqa: E731
        wait_for(lambda: q.lastProgress is not None, 60, "the first batch")
        produce(root, "live-a", 0, 4, start=5)
        wait_for(lambda: count() == 4, 60, "new records")
        with LogStore(root) as store:
            store.create_partitions("live-a", 2)
            store.create_topic("live-b", 1)
            store.create_topic("other", 1)
        produce(root, "live-a", 1, 3)
        produce(root, "live-b", 0, 2)
        produce(root, "other", 0, 2)
        wait_for(lambda: count() == 9, 60, "the new partition and topic")
        rows = spark.sql("select * from live").toArrow()
        assert sorted(keys(rows)) == sorted(
            [("live-a", 0, o) for o in range(5, 9)]
            + [("live-a", 1, o) for o in range(3)]
            + [("live-b", 0, o) for o in range(2)]
        )
        objects = LogRoot(root).store
        wait_for(
            lambda: any(
                json.loads(objects.get(i.key)) == {"live-a": {"0": 9, "1": 3}, "live-b": {"0": 2}}
                for i in objects.list("groups/dash/offsets/")
            ),
            30,
            "group offsets",
        )
        assert q.lastProgress["sources"][0]["latestOffset"] is not None
    finally:
        q.stop()


@pytest.mark.spark
def test_stream_fail_on_data_loss(spark: Any, tmp_path: Path) -> None:
    root = make_root(tmp_path, {"dl": 1}, per_partition=20)

    def stream(fail: str) -> Any:  # a new reader each time: DataStreamReader.option() mutates the reader
        return (
            spark.readStream.format("plog")
            .option("subscribe", "dl")
            .option("startingOffsets", "earliest")
            .option("failOnDataLoss", fail)
            .load(root)
        )

    run_available_now(spark, stream("true"), tmp_path / "s1", tmp_path / "ck")
    run_available_now(spark, stream("false"), tmp_path / "s2", tmp_path / "ck2")
    produce(root, "dl", 0, 20, start=20)
    with LogStore(root) as store:
        store.delete_records("dl", {0: 30})
    q = (
        stream("true")
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "s1"))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception, match=r"offsets \[20, 30\) of dl-0 are gone.*failOnDataLoss=false"):
        q.awaitTermination(120)
    q.stop()
    _, rows = run_available_now(spark, stream("false"), tmp_path / "s2", tmp_path / "ck2")
    assert sorted(keys(rows)) == [("dl", 0, o) for o in [*range(20), *range(30, 40)]]


@pytest.mark.spark
@pytest.mark.s3
def test_storage_options_reach_fsspec_and_stay_hidden(spark: Any, s3_url: tuple[str, dict[str, Any]]) -> None:
    url, storage = s3_url
    with LogStore(url, storage) as store:
        store.create_topic("s3t", 2)
    with Producer(url, storage) as p:
        p.send_batch(
            "s3t",
            pa.table({"value": [b"x%d" % i for i in range(30)], "partition": [i % 2 for i in range(30)]}),
        )
    df = (
        spark.read.format("plog")
        .option("subscribe", "s3t")
        .option("storage.endpoint_url", storage["endpoint_url"])
        .option("storage.secret.key", storage["key"])
        .option("storage.secret", storage["secret"])
        .option("storage.client_kwargs", json.dumps(storage["client_kwargs"]))
        .load(url)
    )
    assert df.count() == 30
    secret_df = (
        spark.read.format("plog")
        .option("subscribe", "s3t")
        .option("storage.endpoint_url", storage["endpoint_url"])
        .option("storage.secret.key", storage["key"])
        .option("storage.secret", "very-secret-value-123")
        .option("storage.client_kwargs", json.dumps(storage["client_kwargs"]))
        .load(url)
    )
    plan = secret_df._jdf.queryExecution().toString()
    assert "very-secret-value-123" not in plan


# ---------------------------------------------------------------------------- SIGKILL, restart: exactly once

DRIVER = """
root, sink, checkpoint, started = ARGS
query = (spark.readStream.format("plog")
         .option("subscribePattern", "kill-.*")
         .option("startingOffsets", "earliest")
         .option("maxOffsetsPerTrigger", "2000")
         .option("minPartitions", "3")
         .load(root)
         .selectExpr("topic", "partition", "offset", "value")
         .writeStream.format("parquet")
         .option("path", sink)
         .option("checkpointLocation", checkpoint)
         .trigger(processingTime="250 milliseconds")
         .start())
open(started, "w").close()
query.awaitTermination()
"""


class Waves(threading.Thread):
    """Produces records in waves until stopped; adds a partition and a topic along the way."""

    def __init__(self, root: str) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.waves = 0

    def run(self) -> None:
        rnd = random.Random(7)
        try:
            with Producer(self.root, linger_ms=2) as producer:
                while not self.stop_event.is_set():
                    self.waves += 1
                    if self.waves == 15:
                        with LogStore(self.root) as store:
                            store.create_partitions("kill-a", 3)
                            store.create_topic("kill-c", 1)
                    topic = rnd.choice(["kill-a", "kill-b", "kill-c"] if self.waves >= 15 else ["kill-a", "kill-b"])
                    n = rnd.randint(20, 200)
                    for i in range(n):
                        producer.send(topic, value=f"{topic}:{self.waves}:{i}".encode())
                    producer.flush()
                    time.sleep(rnd.uniform(0.1, 0.6))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def started_or_exited(marker: Path, proc: subprocess.Popen) -> bool:
    return marker.exists() or proc.poll() is not None


def committed_or_exited(checkpoint: Path, before: int, proc: subprocess.Popen) -> bool:
    return committed_batches(checkpoint) > before or proc.poll() is not None


def committed_batches(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return len([p for p in commits.iterdir() if p.name.isdigit()]) if commits.exists() else 0


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigkill_and_restart_delivers_exactly_once(spark: Any, tmp_path: Path) -> None:
    # CI's form kills three times (one while the driver starts, two while batches flow); the long form
    # (PLOG_LONG=1, benchmarks/soak) five times; PLOG_KILL_TEST_KILLS any number.
    kills = int(os.environ.get("PLOG_KILL_TEST_KILLS") or soak(ci=3, long=5))
    rnd = random.Random(os.environ.get("PLOG_KILL_TEST_SEED") or time.time_ns())
    root = make_root(tmp_path, {"kill-a": 2, "kill-b": 1})
    script = write_driver_script(tmp_path / "driver.py", DRIVER)
    sink, checkpoint, started, log = (
        tmp_path / "sink",
        tmp_path / "checkpoint",
        tmp_path / "started",
        tmp_path / "driver.log",
    )
    waves = Waves(root)
    waves.start()
    done_kills = 0
    batches_at_kill = []
    try:
        while done_kills < kills:
            started.unlink(missing_ok=True)
            proc = start_driver(
                script,
                [root, str(sink), str(checkpoint), str(started)],
                log,
                {"spark.sql.streaming.minBatchesToRetain": "100"},
            )
            try:
                wait_for(partial(started_or_exited, started, proc), 120, "the driver to start")
                assert proc.poll() is None, log.read_text()[-5000:]
                if done_kills % 3 != 2:  # mostly while batches flow; sometimes while it is still starting up
                    wait_for(
                        partial(committed_or_exited, checkpoint, committed_batches(checkpoint), proc),
                        120,
                        "a batch to commit",
                    )
                time.sleep(rnd.uniform(0.0, 2.5))  # a random moment: planning, reading, writing, committing
                assert proc.poll() is None, log.read_text()[-5000:]
            finally:
                kill_driver(proc)
            done_kills += 1
            batches_at_kill.append(committed_batches(checkpoint))
        waves.stop_event.set()
        waves.join(30)
        assert waves.error is None, waves.error
        ends = {}
        with LogStore(root) as store:
            for topic in store.list_topics():
                for p in store.describe_topic(topic)["partitions"]:
                    ends[(topic, p["partition"])] = p["end_offset"]
        expected = sorted((t, p, o) for (t, p), end in ends.items() for o in range(end))

        def sink_count() -> int:
            try:
                return spark.read.parquet(str(sink)).count()
            except Exception:  # noqa: BLE001 - not written yet
                return -1

        proc = start_driver(
            script,
            [root, str(sink), str(checkpoint), str(started)],
            log,
            {"spark.sql.streaming.minBatchesToRetain": "100"},
        )
        try:
            wait_for(lambda: sink_count() >= len(expected) or proc.poll() is not None, 240, "the sink to catch up")
            assert proc.poll() is None, log.read_text()[-5000:]
        finally:
            kill_driver(proc)
    finally:
        waves.stop_event.set()
    rows = spark.read.parquet(str(sink)).toArrow()  # honours _spark_metadata: committed files only
    got = sorted(keys(rows))
    assert len(got) == len(set(got)), "duplicates in the sink"
    assert got == expected
    values = dict(zip(keys(rows), rows.column("value").to_pylist(), strict=True))
    for topic in ("kill-a", "kill-b", "kill-c"):
        for row in log_table(root, topic).to_pylist():
            assert values[(topic, row["partition"], row["offset"])] == row["value"]
    assert ("kill-c", 0, 0) in values and ("kill-a", 2, 0) in values  # picked up while running
    print(f"kills={done_kills} committed batches at each kill={batches_at_kill} records={len(got)}")
    assert batches_at_kill[-1] >= kills // 2  # batches committed between kills, not only at the end


@pytest.mark.spark
def test_a_compacted_topic_streams_across_its_gaps_and_a_batch_read_gives_the_latest_value_per_key(
    spark: Any, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    root = str(tmp_path / "plog")
    config = {"cleanup.policy": "compact", "compression.type": "none", "auto.maintenance.enable": False}
    config["storage.layout"] = "partitioned"  # compacted here, segment by segment
    with LogStore(root) as store:
        store.create_topic("latest", 2, config={**config, "retention.ms": -1})
    with Producer(root) as producer:
        for status in range(5):
            for order in range(40):
                producer.send("latest", b"status-%d" % status, key=b"order-%d" % order)
            producer.flush()
        producer.send("latest", None, key=b"order-0")  # a tombstone: order 0 was deleted
        for order in range(40, 44):  # and a last append per partition, which compaction leaves alone
            producer.send("latest", b"status-0", key=b"order-%d" % order)
        producer.flush()
    with LogStore(root) as store:
        assert store.maintain("latest")["merged"] >= 2  # both partitions compacted
    kept = log_table(root, "latest")
    for p in (0, 1):
        pairs = zip(kept["partition"].to_pylist(), kept["offset"].to_pylist(), strict=True)
        offsets = [o for part, o in pairs if part == p]
        assert len(offsets) < offsets[-1] + 1  # gaps: fewer records than offsets
    # A stream from the start crosses the gaps without failOnDataLoss (true by default) stopping it.
    df = spark.readStream.format("plog").option("subscribe", "latest").option("startingOffsets", "earliest").load(root)
    _, rows = run_available_now(spark, df, tmp_path / "sink", tmp_path / "ck")
    assert sorted(keys(rows)) == sorted(keys(kept))
    # The latest value per key, the obvious way; the tombstone's key has a null value.
    latest = (
        spark.read.format("plog")
        .option("subscribe", "latest")
        .load(root)
        .groupBy("key")
        .agg(F.max_by("value", "offset").alias("value"))
        .toArrow()
    )
    got = dict(zip(latest.column("key").to_pylist(), latest.column("value").to_pylist(), strict=True))
    assert got == {
        b"order-0": None,
        **{b"order-%d" % o: b"status-4" for o in range(1, 40)},
        **{b"order-%d" % o: b"status-0" for o in range(40, 44)},
    }


@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
def test_the_driver_plans_from_indexes_without_fetching_batches(tmp_path: Path, isolation: str) -> None:
    """The driver never reads a batch: fetching whole objects with their indexes (what a consumer does before
    reading them) cost a 64-partition query 0.6 to 0.9 s of CPU at its start and, on S3, every object's bytes."""
    root = make_root(tmp_path, {"s": 2})
    for p in range(2):
        for start in (0, 10_000):
            produce(root, "s", p, 10_000, start=start)  # objects well over the 64 KiB an index read fetches
    r = PlogStreamReader(stream_opts(url=root, subscribe="s", startingoffsets="earliest", isolationlevel=isolation))
    r.prepareForTriggerAvailableNow()
    start = r.initialOffset()
    end = r.latestOffset(start, r.getDefaultReadLimit())
    assert end["s"] == {"0": 20_000, "1": 20_000}
    assert min(ref.size for ref in r.root.partition("s", 0).view().segments) > 2 * 64 * 1024
    assert len(r.partitions(start, end)) == 2
    assert r.root.index_cache.objects.nbytes == 0


def test_a_shared_topic_is_planned_per_shared_object_and_read_without_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A micro-batch of a wide shared topic (PROTOCOL.md 7.3) is a task per group of commits, not a task per
    partition: each shared object is read once, and tasks read their runs from the planner's commits, with
    no listing and no commit read of their own. Moved segments are still planned per partition."""
    root = str(tmp_path / "plog")
    config = {
        "storage.layout": "shared",
        "shared.move.ms": "0",
        "retention.ms": "-1",
        "auto.maintenance.enable": "false",
    }
    LogStore(root).create_topic("wide", 8, config=config)
    with Producer(root) as producer:
        for flush in range(6):
            values = [b"w-%d-%d" % (flush, i) for i in range(80)]
            producer.send_batch("wide", pa.table({"value": values, "partition": [i % 8 for i in range(80)]}))
            if flush == 1:
                producer.flush()
                LogStore(root).maintain("wide")  # the first two flushes move into segments
    r = PlogStreamReader(stream_opts(url=root, subscribe="wide", startingoffsets="earliest"))
    r.prepareForTriggerAvailableNow()
    start = r.initialOffset()
    end = r.latestOffset(start, r.getDefaultReadLimit())
    parts = r.partitions(start, end)
    grouped = [p for p in parts if isinstance(p, PlogObjectsInputPartition)]
    assert len(grouped) == 1 and grouped[0].partitions == frozenset(range(8))
    assert len(grouped[0].pieces) == 4 * 8  # the four flushes not moved, every partition's run of each
    assert len(parts) == 1 + 8  # and the moved part per partition

    piece = grouped[0].pieces[0]
    executor_root(piece.url, piece.storage_options)[0].topic("wide")  # a worker opens its root once, not per task
    requests: list[tuple[str, str]] = []
    store_type = type(r.root.store.inner) if hasattr(r.root.store, "inner") else type(r.root.store)
    for name in ("get", "get_range", "get_range_buffer", "list", "get_suffix"):
        original = getattr(store_type, name)

        def recording(self: Any, key: str, *args: Any, _name: str = name, _original: Any = original) -> Any:
            requests.append((_name, key))
            return _original(self, key, *args)

        monkeypatch.setattr(store_type, name, recording)
    table = pa.Table.from_batches(list(read_partition(grouped[0])))
    got = sorted(zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(), strict=True))
    assert got == [(p, o) for p in range(8) for o in range(20, 60)]
    shared_reads = [key for _, key in requests if key.startswith("shared/")]
    assert len(shared_reads) == len(set(shared_reads)) == 4  # each shared object once
    assert [req for req in requests if not req[1].startswith("shared/")] == []  # no listing, no commit read


@pytest.mark.spark
def test_a_shared_topic_reads_the_same_in_batch_and_stream_across_a_move(spark: Any, tmp_path: Path) -> None:
    """A shared topic (PROTOCOL.md 7.3), part moved into segments (10.2) and part still in shared objects:
    a batch read and an availableNow stream give every record the log holds, once, at its offset."""
    root = str(tmp_path / "plog")
    config = {"storage.layout": "shared", "shared.move.ms": "0", "retention.ms": "-1"}
    with LogStore(root) as store:
        store.create_topic("sh", 3, config=config)
    for flush in range(4):
        with Producer(root) as producer:
            values = [f"sh-{flush}-{i}".encode() for i in range(30)]
            producer.send_batch("sh", pa.table({"value": values, "partition": [i % 3 for i in range(30)]}))
        if flush == 1:
            LogStore(root).maintain("sh")  # the first two flushes move into each partition's segment
    want = log_table(root, "sh")
    assert want.num_rows == 120
    batch = spark_rows(read_df(spark, root, subscribe="sh").toArrow())
    assert batch.equals(want)
    df = spark.readStream.format("plog").option("subscribe", "sh").option("startingOffsets", "earliest").load(root)
    _, rows = run_available_now(spark, df, tmp_path / "sink", tmp_path / "ck")
    assert sorted(keys(rows)) == [("sh", p, o) for p in range(3) for o in range(40)]
