"""Typed topics through Spark (PROTOCOL.md 11.8, issue 15): the source's typed schema (a ``value``
struct, or ``flattenValue``), ``valueFields`` pruning, the schema a streaming query keeps across an
evolution and takes up after a restart, and the sink's typed writes (a struct or top-level fields,
bad data refused with nothing written).

Each test makes its typed topic the first topic of a fresh root: a root whose protocol object
exists without the ``typedTopics`` feature must wait before its first typed topic (12.2).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from segment_format.errors import InvalidConfigError, InvalidRecordError
from segment_format.root import LogRoot
from segment_format.segment import BatchMeta
from segment_format.typed.layout import entry_layout
from segment_format.typed.value_schema import parse_ddl
from tests.fixtures_spark import PROJECT_ROOT

pyspark = pytest.importorskip("pyspark")

from pyspark.sql.types import (  # noqa: E402
    ArrayType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pyspark_logsource.spark.conversion import typed_arrow_schema, typed_spark_schema  # noqa: E402
from pyspark_logsource.spark.options import parse_options  # noqa: E402
from pyspark_logsource.spark.partition_reader import read_partition  # noqa: E402
from pyspark_logsource.spark.source import PlogBatchReader  # noqa: E402

T0 = 1_700_000_000_000
#: Every Arrow type a value schema may hold, as DDL.
ALL_TYPES = (
    "user string, n int NOT NULL, score double, tags array<string>, attrs map<string, int>, "
    "at timestamp, day date, amount decimal(10,2), inner struct<a: int, b: string>"
)
#: Topic config of the tests: records keep their past timestamps, no background maintenance.
#: Partitioned: the tests check per-partition planned reads and the field statistics of appended objects'
#: indexes, which a shared topic's runs get once moved into segments (PROTOCOL.md 10.2).
CONFIG = {"retention.ms": -1, "auto.maintenance.enable": False, "storage.layout": "partitioned"}


# ---------------------------------------------------------------------------- helpers


def typed_root(tmp_path: Path, topics: dict[str, tuple[str, int]]) -> str:
    """A fresh root whose first topics are typed: name -> (value schema DDL, partitions)."""
    url = str(tmp_path / "plog")
    root = LogRoot(url)
    try:
        for name, (ddl, partitions) in topics.items():
            root.catalog.create(name, partitions, dict(CONFIG), value_schema=parse_ddl(ddl))
    finally:
        root.close()
    return url


def append(
    url: str, topic: str, values: Sequence[dict[str, Any] | None], partition: int = 0, first_key: int = 0
) -> None:
    """Append records with these values (None: a tombstone) to one partition, as the topic's current version."""
    root = LogRoot(url)  # a fresh root: the topic's current metadata, evolved or not
    try:
        meta = root.topic(topic, refresh=True)
        assert meta.schema_history is not None
        layout = entry_layout(meta.schema_history.current)
        n = len(values)
        payload = pa.RecordBatch.from_arrays(
            [
                pa.array([T0 + i for i in range(n)], pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
                pa.array([f"k{first_key + i}".encode() for i in range(n)], pa.binary()),
                layout.values_from_python(list(values), topic),
                pa.nulls(n, layout.payload_schema.field("headers").type),
            ],
            schema=layout.payload_schema,
        )
        root.partition(topic, partition, meta).append([(payload, BatchMeta())])
    finally:
        root.close()


def stored_values(url: str, topic: str, partition: int = 0) -> list[dict[str, Any] | None]:
    """Every committed value of one partition, read as the topic's current schema."""
    root = LogRoot(url)
    try:
        log = root.partition(topic, partition, root.topic(topic, refresh=True))
        batches, _ = log.read(0, isolation="read_committed", resolver=_resolver(root))
        return pa.Table.from_batches(batches).column("value").to_pylist() if batches else []
    finally:
        root.close()


def log_end(url: str, topic: str, partition: int = 0) -> int:
    """Where a partition's log ends, committed or not: 0 when nothing was ever appended."""
    root = LogRoot(url)
    try:
        return root.partition(topic, partition, root.topic(topic, refresh=True)).view().end_offset
    finally:
        root.close()


def _resolver(root: LogRoot) -> Any:
    from coordinator.transactions import TransactionCoordinator

    return TransactionCoordinator(root.store).resolve


def read_df(spark: Any, url: str, **options: str) -> Any:
    reader = spark.read.format("plog")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(url)


def row_values(n: int, start: int = 0) -> list[dict[str, Any] | None]:
    """Values of :data:`ALL_TYPES`, every fifth a tombstone."""
    out: list[dict[str, Any] | None] = []
    for i in range(start, start + n):
        out.append(
            None
            if i % 5 == 4
            else {
                "user": f"u{i}",
                "n": i,
                "score": i / 2,
                "tags": [f"t{i}", None],
                "attrs": [("a", i)],
                "at": dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=i),
                "day": dt.date(2024, 1, 1) + dt.timedelta(days=i),
                "amount": decimal.Decimal(i) / 100,
                "inner": {"a": i, "b": None},
            }
        )
    return out


# ---------------------------------------------------------------------------- conversion (no JVM)


def test_typed_schema_maps_every_type() -> None:
    value_type = entry_layout(_entry(ALL_TYPES)).value_type
    schema = typed_spark_schema(value_type)
    value = schema["value"].dataType
    assert schema.fieldNames() == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    assert value == StructType(
        [
            StructField("user", StringType()),
            StructField("n", IntegerType()),
            StructField("score", DoubleType()),
            StructField("tags", ArrayType(StringType())),
            StructField("attrs", MapType(StringType(), IntegerType())),
            StructField("at", TimestampType()),
            StructField("day", DateType()),
            StructField("amount", DecimalType(10, 2)),
            StructField("inner", StructType([StructField("a", IntegerType()), StructField("b", StringType())])),
        ]
    )
    flat = typed_spark_schema(value_type, include_headers=True, flatten=True)
    assert flat.fieldNames()[:8] == [
        "key",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
        "user",
    ]
    assert typed_arrow_schema(value_type, True, True).names == flat.fieldNames()
    clash = entry_layout(_entry("partition bigint, x int")).value_type
    with pytest.raises(InvalidConfigError, match=r"flattenValue.*\['partition'\]"):
        typed_spark_schema(clash, flatten=True)
    assert typed_spark_schema(clash).fieldNames()[1] == "value"  # as a struct, the names do not collide


def _entry(ddl: str) -> Any:
    from segment_format.typed.value_schema import SchemaHistory

    return SchemaHistory.first(parse_ddl(ddl), None, 0).current


# ---------------------------------------------------------------------------- valueFields: only those are decoded

#: A child process that plans a batch read with the options in ``argv[1]`` and reads every input
#: partition as a Spark task would, then reports the Arrow memory pool's peak: the bytes decoded.
_PEAK_SCRIPT = """
import json, sys
import pyarrow as pa
from pyspark_logsource.spark.options import parse_options
from pyspark_logsource.spark.partition_reader import read_partition
from pyspark_logsource.spark.source import PlogBatchReader

opts = parse_options(json.loads(sys.argv[1]), streaming=False)
rows, names = 0, None
for part in PlogBatchReader(opts).partitions():
    for batch in read_partition(part):
        rows += batch.num_rows
        names = batch.schema.names if names is None else names
        value = batch.column("value") if "value" in batch.schema.names else None
        names = names if value is None else names + [value.type.field(i).name for i in range(value.type.num_fields)]
print(json.dumps({"rows": rows, "names": names, "peak": pa.default_memory_pool().max_memory()}))
"""


def test_value_fields_decode_only_those_fields(tmp_path: Path) -> None:
    url = typed_root(tmp_path, {"wide": ("blob string, n int", 1)})
    blob = "x" * 2048
    for chunk in range(4):  # 4 objects of 500 records, ~1 MB of blob each once decompressed
        append(url, "wide", [{"blob": f"{blob}{chunk}-{i}", "n": i} for i in range(500)], first_key=chunk * 500)
    options = {"path": url, "subscribe": "wide"}

    # In this process: the plan carries the fields, and the task yields only them.
    parts = PlogBatchReader(parse_options({**options, "valueFields": "n"}, streaming=False)).partitions()
    assert parts and all(p.value_fields == ("n",) and p.value_schema is not None for p in parts)
    batches = [b for p in parts for b in read_partition(p)]
    assert sum(b.num_rows for b in batches) == 2000
    assert {b.column("value").type for b in batches} == {pa.struct([pa.field("n", pa.int32())])}

    # The bytes decoded, seen as the Arrow pool's peak of a fresh process: the blob column is never
    # decompressed when it is not asked for (PROTOCOL.md 11.8: a reader decodes only what it needs).
    def peak(extra: dict[str, str]) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(_PEAK_SCRIPT), json.dumps({**options, **extra})],
            capture_output=True,
            text=True,
            check=True,
            cwd=PROJECT_ROOT,
            timeout=60,
        )
        return json.loads(done.stdout.strip().splitlines()[-1])

    full, pruned = peak({}), peak({"valueFields": "n"})
    assert full["rows"] == pruned["rows"] == 2000
    assert "blob" in full["names"] and "blob" not in pruned["names"]
    assert full["peak"] > 1_000_000, full  # at least one object's blob column, decompressed
    assert pruned["peak"] * 5 < full["peak"], (pruned, full)


def test_pushed_filters_on_value_fields_skip_batches_undecoded(tmp_path: Path) -> None:
    """Spark's filters on value fields reach the tasks, which skip the batches whose statistics rule them
    out (PROTOCOL.md 11.8): the rows of those batches never come out, though Spark would drop them too."""
    from pyspark.sql.datasource import EqualTo, GreaterThan, IsNull

    url = typed_root(tmp_path, {"ev": ("n int, s string", 1)})
    for start in (0, 100, 200):  # three objects, n in [start, start + 10)
        append(url, "ev", [{"n": n, "s": "x"} for n in range(start, start + 10)], first_key=start)
    for flatten, column in ((False, ("value", "n")), (True, ("n",))):
        options = {"path": url, "subscribe": "ev", "flattenValue": str(flatten).lower()}
        reader = PlogBatchReader(parse_options(options, streaming=False))
        remaining = list(reader.pushFilters([GreaterThan(column, 150), EqualTo(("offset",), 25)]))
        assert [type(f) for f in remaining] == [GreaterThan]  # Spark still checks every row
        rows = [b for p in reader.partitions() for b in read_partition(p)]
        assert sum(b.num_rows for b in rows) == 1  # offset 25, in the one object the statistics keep
        reader = PlogBatchReader(parse_options(options, streaming=False))
        list(reader.pushFilters([GreaterThan(column, 150)]))
        got = [b for p in reader.partitions() for b in read_partition(p)]
        values = [
            r["n"] for b in got for r in (b.select(["n"]).to_pylist() if flatten else b.column("value").to_pylist())
        ]
        assert values == list(range(200, 210))  # the first two objects were not decoded
        reader = PlogBatchReader(parse_options(options, streaming=False))
        list(reader.pushFilters([IsNull(column)]))
        assert sum(b.num_rows for p in reader.partitions() for b in read_partition(p)) == 0


# ---------------------------------------------------------------------------- the source through Spark


@pytest.mark.spark
def test_filters_on_value_fields_give_spark_the_right_rows(spark: Any, tmp_path: Path) -> None:
    url = typed_root(tmp_path, {"ev": ("n int, s string", 1)})
    for start in (0, 100, 200):
        append(url, "ev", [{"n": n, "s": None if n % 2 else "x"} for n in range(start, start + 10)], first_key=start)
    df = read_df(spark, url, subscribe="ev")
    assert sorted(r.n for r in df.where("value.n > 150 AND value.s IS NOT NULL").select("value.n").collect()) == [
        200,
        202,
        204,
        206,
        208,
    ]
    flat = read_df(spark, url, subscribe="ev", flattenValue="true")
    assert flat.where("n IN (5, 105) OR n = 300").count() == 2


@pytest.mark.spark
def test_typed_batch_read_struct_flattened_and_pruned(spark: Any, tmp_path: Path) -> None:
    url = typed_root(tmp_path, {"ev": (ALL_TYPES, 2), "clash": ("partition bigint, x int", 1)})
    values = row_values(20)
    append(url, "ev", values[:10], partition=0)
    append(url, "ev", values[10:], partition=1, first_key=10)
    append(url, "clash", [{"partition": 1, "x": 2}])

    df = read_df(spark, url, subscribe="ev")
    assert df.schema == typed_spark_schema(entry_layout(_entry(ALL_TYPES)).value_type)
    got = df.orderBy("key").toArrow()
    by_key = dict(zip(got.column("key").to_pylist(), got.column("value").to_pylist(), strict=True))
    want = {f"k{i}".encode(): v for i, v in enumerate(values)}
    for key, value in want.items():  # Spark gives maps as lists of pairs, as Arrow does
        assert by_key[key] == value, key
    assert got.column("topic").to_pylist() == ["ev"] * 20

    flat = read_df(spark, url, subscribe="ev", flattenValue="true", includeHeaders="true")
    names = ["key", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]
    assert flat.columns == names + ["user", "n", "score", "tags", "attrs", "at", "day", "amount", "inner"]
    rows = {r["key"]: r for r in flat.select("key", "user", "n").collect()}
    assert rows[b"k3"]["user"] == "u3" and rows[b"k3"]["n"] == 3
    assert rows[b"k4"]["user"] is None and rows[b"k4"]["n"] is None  # a tombstone's fields are null

    pruned = read_df(spark, url, subscribe="ev", valueFields="amount,user")
    assert pruned.schema["value"].dataType.fieldNames() == ["user", "amount"]  # in the schema's order
    assert pruned.where("key = 'k7'").select("value.user", "value.amount").first() == ("u7", decimal.Decimal("0.07"))
    flat_pruned = read_df(spark, url, subscribe="ev", valueFields="n", flattenValue="true")
    assert flat_pruned.columns[-2:] == ["timestampType", "n"]
    assert sorted(r.n for r in flat_pruned.where("n is not null").collect()) == [i for i in range(20) if i % 5 != 4]

    with pytest.raises(Exception, match=r"valueFields.*\['nope'\]"):
        read_df(spark, url, subscribe="ev", valueFields="user,nope")
    with pytest.raises(Exception, match=r"flattenValue.*\['partition'\]"):
        read_df(spark, url, subscribe="clash", flattenValue="true")
    assert read_df(spark, url, subscribe="clash").first().value.asDict() == {"partition": 1, "x": 2}  # a struct: fine
    with pytest.raises(Exception, match="different value schemas"):
        read_df(spark, url, subscribe="ev,clash")
    LogRoot(url).catalog.create("raw", 1, dict(CONFIG))
    with pytest.raises(Exception, match=r"typed topics \['ev'\] and untyped topics \['raw'\]"):
        read_df(spark, url, subscribePattern="ev|raw")
    with pytest.raises(Exception, match="flattenValue.*typed topics only"):
        read_df(spark, url, subscribe="raw", flattenValue="true")


@pytest.mark.spark
def test_stream_keeps_its_schema_and_a_restart_takes_the_new_one(spark: Any, tmp_path: Path) -> None:
    url = typed_root(tmp_path, {"evo": ("user string, n int", 1)})
    checkpoint = str(tmp_path / "checkpoint")
    seen: list[tuple[int, list[str], list[dict[str, Any]]]] = []

    def collect(batch_df: Any, batch_id: int) -> None:
        table = batch_df.toArrow()
        keep = [name for name in table.schema.names if name in ("offset", "user", "extra")]
        seen.append((batch_id, keep, table.select(keep).to_pylist()))

    def start() -> Any:
        stream = (
            spark.readStream.format("plog")
            .option("subscribe", "evo")
            .option("startingOffsets", "earliest")
            .option("flattenValue", "true")
            .option("noticeInterval", "0")  # every trigger looks for new records: processAllAvailable sees them
            .load(url)
        )
        return stream.writeStream.foreachBatch(collect).option("checkpointLocation", checkpoint).start()

    append(url, "evo", [{"user": "a", "n": 1}, {"user": "b", "n": 2}])
    query = start()
    try:
        query.processAllAvailable()
        # A producer evolves the schema (a new nullable field) and writes with it while the query runs.
        LogRoot(url).catalog.update("evo", evolve=(parse_ddl("user string, n int, extra string"), None))
        append(url, "evo", [{"user": "c", "n": 3, "extra": "x3"}], first_key=2)
        query.processAllAvailable()
    finally:
        query.stop()
    assert [names for _, names, _ in seen] == [["offset", "user"]] * len(seen)
    assert [row for _, _, rows in seen for row in rows] == [
        {"offset": 0, "user": "a"},
        {"offset": 1, "user": "b"},
        {"offset": 2, "user": "c"},  # its new field is dropped: the run reads version 1
    ]

    # Restarted from the same checkpoint, the query is defined again: it reads version 2 and goes on
    # after the offsets it committed; Spark keeps no source schema in the checkpoint to refuse it.
    seen.clear()
    append(url, "evo", [{"user": "d", "n": 4, "extra": "x4"}], first_key=3)
    query = start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert [names for _, names, _ in seen] == [["offset", "user", "extra"]] * len(seen)
    assert [row for _, _, rows in seen for row in rows] == [{"offset": 3, "user": "d", "extra": "x4"}]


# ---------------------------------------------------------------------------- the sink


@pytest.mark.spark
def test_sink_writes_a_struct_value_or_top_level_fields(spark: Any, tmp_path: Path) -> None:
    url = typed_root(tmp_path, {"out": ("user string, n bigint NOT NULL, note string", 2)})
    as_struct = spark.createDataFrame(
        [("k1", ("a", 1)), ("k2", ("b", 2)), ("k3", None)],
        "key string, value struct<user: string, n: int>",  # n widened to bigint, note missing: null
    )
    as_struct.write.mode("append").format("plog").option("topic", "out").save(url)
    fields = spark.createDataFrame(
        [("k4", "c", 3, "hi", 1), ("k5", "d", 4, None, 1)], "key string, User string, n bigint, note string, p int"
    ).withColumnRenamed("p", "partition")
    fields.write.mode("append").format("plog").option("topic", "out").save(url)
    # No key (placed as a producer places null keys) and no topic option: the topic column names it.
    keyless = spark.createDataFrame([("out", "e", 5)], "topic string, user string, n bigint")
    keyless.write.mode("append").format("plog").save(url)
    got = sorted((v for p in (0, 1) for v in stored_values(url, "out", p)), key=lambda v: (v is None, v and v["n"]))
    assert got == [
        {"user": "a", "n": 1, "note": None},
        {"user": "b", "n": 2, "note": None},
        {"user": "c", "n": 3, "note": "hi"},
        {"user": "d", "n": 4, "note": None},
        {"user": "e", "n": 5, "note": None},
        None,  # a null struct is a tombstone
    ]
    assert {"user": "c", "n": 3, "note": "hi"} in stored_values(url, "out", 1)  # routed by the 'partition' column


@pytest.mark.spark
def test_sink_refuses_bad_data_and_writes_nothing(spark: Any, tmp_path: Path) -> None:
    url = typed_root(tmp_path, {"strict": ("user string, n int NOT NULL", 1)})

    def write(df: Any) -> None:
        # One task: its refused batch is its only one, so nothing at all reaches the log (several tasks
        # would each append until one fails; the failed job then aborts what the others wrote).
        df.coalesce(1).write.mode("append").format("plog").option("topic", "strict").save(url)

    cases = [
        (spark.createDataFrame([("a", "one")], "user string, n string"), "field 'n' holds values of type string"),
        (spark.createDataFrame([("a", 1, 2)], "user string, n int, extra int"), r"unknown field\(s\) \['extra'\]"),
        (spark.createDataFrame([("a",)], "user string"), "non-nullable field 'n' is missing"),
        (spark.createDataFrame([("ok", 1), ("bad", None)], "user string, n int"), "field 'n' is not nullable"),
        (spark.createDataFrame([(("ok", None),)], "value struct<user: string, n: int>"), "field 'n' is not nullable"),
    ]
    for df, words in cases:
        with pytest.raises(Exception, match=words):
            write(df)
    assert log_end(url, "strict") == 0  # not even an uncommitted batch: refused before any append
    assert stored_values(url, "strict") == []
    with pytest.raises(InvalidRecordError, match="field 'n'"):  # the same check outside Spark
        append(url, "strict", [{"user": "a", "n": None}])


@pytest.mark.spark
def test_typed_round_trip_plog_to_plog(spark: Any, tmp_path: Path) -> None:
    url = typed_root(tmp_path, {"src": (ALL_TYPES, 2), "dst": (ALL_TYPES, 2)})
    values = row_values(30)
    append(url, "src", values[:15], partition=0)
    append(url, "src", values[15:], partition=1, first_key=15)
    checkpoint = str(tmp_path / "ck")
    # Streaming, flattened: the fields come back as top-level columns, and the sink takes them as such
    # (the source's offset and timestampType columns are ignored, its partition column routes).
    query = (
        spark.readStream.format("plog")
        .option("subscribe", "src")
        .option("startingOffsets", "earliest")
        .option("flattenValue", "true")
        .load(url)
        .where("user is not null")
        .writeStream.format("plog")
        .option("topic", "dst")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start(url)
    )
    query.awaitTermination(60)
    # Batch, as a struct: tombstones too.
    read_df(spark, url, subscribe="src").select("key", "value", "partition").where("value is null").write.mode(
        "append"
    ).format("plog").option("topic", "dst").save(url)
    got = read_df(spark, url, subscribe="dst").toArrow()
    by_key = dict(zip(got.column("key").to_pylist(), got.column("value").to_pylist(), strict=True))
    assert by_key == {f"k{i}".encode(): v for i, v in enumerate(values)}
    assert sorted(set(got.column("partition").to_pylist())) == [0, 1]
