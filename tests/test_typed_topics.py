"""Typed topics (PROTOCOL.md 11.8): value schemas in topic metadata, fields stored as columns, checks on
write, evolution under the compatibility modes, reads as one schema, pruned decoding, merges and
compaction that keep versions apart."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from pyspark_logsource import Consumer, LogStore, Producer
from pyspark_logsource.client.types import TopicPartition
from segment_format.errors import (
    CorruptRecordError,
    IncompatibleSchemaError,
    InvalidConfigError,
    InvalidRecordError,
)
from segment_format.inspect.verify import verify
from segment_format.protocol import RootProtocol
from segment_format.root import LogRoot
from segment_format.segment import TAIL, read_index
from segment_format.typed.layout import Projection, entry_layout
from segment_format.typed.value_schema import parse_ddl

SCHEMA = "user string, n int NOT NULL, ts timestamp"


#: For tests that read a partition's segment objects themselves.
PARTITIONED = {"storage.layout": "partitioned"}


def _store(tmp_path: Path, schema: Any = SCHEMA, partitions: int = 1, **kwargs: Any) -> tuple[str, LogStore]:
    url = str(tmp_path / "root")
    admin = LogStore(url)
    admin.create_topic("ev", partitions, kwargs.pop("config", None), value_schema=schema, **kwargs)
    return url, admin


def _read_all(url: str, topic: str = "ev") -> pa.Table:
    consumer = Consumer(url, auto_offset_reset="earliest")
    consumer.subscribe([topic])
    tables = []
    while True:
        table = consumer.poll_arrow(timeout_ms=300)
        if not table.num_rows:
            break
        tables.append(table)
    consumer.close()
    return pa.concat_tables(tables) if tables else pa.table({})


def _ends(admin: LogStore, topic: str = "ev") -> list[int]:
    return [p["end_offset"] for p in admin.describe_topic(topic)["partitions"]]


# ---------------------------------------------------------------------------------------- creation


@pytest.mark.parametrize(
    "spec",
    [
        SCHEMA,
        pa.schema([("user", pa.utf8()), pa.field("n", pa.int32(), nullable=False), ("ts", pa.timestamp("us", "UTC"))]),
        json.dumps(
            {
                "type": "record",
                "name": "Ev",
                "fields": [
                    {"name": "user", "type": ["null", "string"]},
                    {"name": "n", "type": "int"},
                    {"name": "ts", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
                ],
            }
        ),
    ],
    ids=["ddl", "pyarrow", "avro"],
)
def test_a_topic_is_typed_from_any_schema_form(tmp_path: Path, spec: Any) -> None:
    _url, admin = _store(tmp_path, spec)
    described = admin.describe_topic("ev")
    assert described["value_schema"] == parse_ddl(SCHEMA)
    assert described["value_schema_version"] == 1
    assert described["value_schema_compatibility"] == "BACKWARD"
    assert [e["version"] for e in described["value_schema_history"]] == [1]


def test_an_untyped_topic_stays_as_it_was(tmp_path: Path) -> None:
    admin = LogStore(str(tmp_path))
    meta = admin.create_topic("plain", 1)
    assert meta.schema_history is None and b"value_schemas" not in meta.to_json()
    assert "value_schema" not in admin.describe_topic("plain")
    with pytest.raises(InvalidConfigError, match="untyped"):
        admin.evolve_value_schema("plain", SCHEMA)


def test_a_typed_topic_in_an_older_root_waits_for_the_feature(tmp_path: Path) -> None:
    url = str(tmp_path)
    admin = LogStore(url)
    admin.create_topic("plain", 1)  # protocol object 0 without typedTopics
    with pytest.raises(InvalidConfigError, match="typedTopics.*may be used from"):
        admin.create_topic("ev", 1, value_schema=SCHEMA)
    assert "typedTopics" in RootProtocol(admin.root.store).version.reader_features  # enabled, to be used later
    fresh = LogStore(str(tmp_path / "fresh"))
    fresh.create_topic("ev", 1, value_schema=SCHEMA)  # a new root lists it in object 0: no wait
    assert "typedTopics" in RootProtocol(fresh.root.store).version.reader_features


def test_bad_schemas_and_modes_are_refused_naming_them(tmp_path: Path) -> None:
    admin = LogStore(str(tmp_path))
    with pytest.raises(InvalidConfigError, match="uint32"):
        admin.create_topic("ev", 1, value_schema=pa.schema([("u", pa.uint32())]))
    with pytest.raises(InvalidConfigError, match="SIDEWAYS"):
        admin.create_topic("ev", 1, value_schema=SCHEMA, value_schema_compatibility="SIDEWAYS")
    with pytest.raises(InvalidConfigError, match="__plog"):
        admin.create_topic("ev", 1, value_schema="__plog_x int")
    assert admin.list_topics() == []


# ---------------------------------------------------------------------------------------- writing


def test_send_takes_dicts_and_tombstones_and_poll_gives_them_back(tmp_path: Path) -> None:
    url, _admin = _store(tmp_path)
    when = datetime.datetime(2026, 11, 25, 12, 0, tzinfo=datetime.timezone.utc)
    with Producer(url) as producer:
        producer.send("ev", {"user": "ann", "n": 1, "ts": when}, key=b"a").get(timeout=10)
        producer.send("ev", {"n": 2}, key=b"b").get(timeout=10)  # a missing nullable field is null
        producer.send("ev", pa.scalar({"user": "cy", "n": 3}, entry_layout_value_type()), key=b"c").get(timeout=10)
        producer.send("ev", pa.table({"user": ["dee"], "n": pa.array([4], pa.int32())}), key=b"d").get(timeout=10)
        producer.send("ev", None, key=b"a").get(timeout=10)  # a tombstone, as in Kafka
        with pytest.raises(InvalidRecordError, match="one record"):
            producer.send("ev", pa.table({"n": pa.array([1, 2], pa.int32())}), key=b"e")
    consumer = Consumer(url, auto_offset_reset="earliest")
    consumer.assign([TopicPartition("ev", 0)])
    records = consumer.poll(timeout_ms=2000)[TopicPartition("ev", 0)]
    assert [r.value for r in records] == [
        {"user": "ann", "n": 1, "ts": when},
        {"user": None, "n": 2, "ts": None},
        {"user": "cy", "n": 3, "ts": None},
        {"user": "dee", "n": 4, "ts": None},
        None,
    ]


def entry_layout_value_type() -> pa.DataType:
    return pa.struct([("user", pa.utf8()), ("n", pa.int32())])


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({"user": "x"}, "field 'n' is not nullable"),
        ({"user": "x", "n": None}, "field 'n' is not nullable"),
        ({"user": "x", "n": "5"}, "field 'n' holds '5' of type str, which is not int32"),
        ({"user": "x", "n": True}, "field 'n' holds True of type bool"),
        ({"user": "x", "n": 1, "zz": 2}, r"unknown field\(s\) \['zz'\]"),
        (b"raw bytes", "a value is a dict of fields"),
    ],
)
def test_send_refuses_bad_values_naming_the_field(tmp_path: Path, value: Any, named: str) -> None:
    url, admin = _store(tmp_path)
    with Producer(url) as producer:
        with pytest.raises(InvalidRecordError, match=f"value schema version 1.*{named}"):
            producer.send("ev", value, key=b"k")
        producer.send("ev", {"n": 1}, key=b"k").get(timeout=10)  # a plain bytes send after: still the full path
        with pytest.raises(InvalidRecordError, match="a value is a dict"):
            producer.send("ev", b"v", key=b"k")
    assert _ends(admin) == [1]


def test_an_int_out_of_range_fails_its_future_and_writes_nothing(tmp_path: Path) -> None:
    url, admin = _store(tmp_path)
    with Producer(url) as producer:
        future = producer.send("ev", {"n": 2**40}, key=b"k")  # an int, but not an int32: Arrow judges it
        with pytest.raises(InvalidRecordError, match="field 'n'.*int32"):
            future.get(timeout=10)
    assert _ends(admin) == [0]


@pytest.mark.parametrize("form", ["struct", "fields"])
def test_send_batch_takes_a_struct_value_or_top_level_fields(tmp_path: Path, form: str) -> None:
    url, _admin = _store(tmp_path, partitions=3)
    users, ns = ["a", "b", None], pa.array([1, 2, 3], pa.int32())
    if form == "struct":
        value = pa.StructArray.from_arrays(
            [pa.array(users), ns], names=["user", "n"], mask=pa.array([False, False, True])
        )
        table = pa.table({"key": ["k1", "k2", "k3"], "value": value})
    else:
        table = pa.table({"key": ["k1", "k2", "k3"], "user": users, "n": ns})
    with Producer(url) as producer:
        assert producer.send_batch("ev", table).record_count == 3
    got = _read_all(url).sort_by("key")
    assert got.schema.field("value").type == pa.struct(
        [("user", pa.utf8()), ("n", pa.int32()), ("ts", pa.timestamp("us", "UTC"))]
    )
    expected_third = None if form == "struct" else {"user": None, "n": 3, "ts": None}
    assert got.column("value").to_pylist() == [
        {"user": "a", "n": 1, "ts": None},
        {"user": "b", "n": 2, "ts": None},
        expected_third,
    ]


@pytest.mark.parametrize(
    ("columns", "named"),
    [
        ({"user": ["a", "b"], "n": pa.array([1, 2], pa.int64())}, "field 'n' holds values of type int64"),
        ({"user": ["a", "b"], "n": pa.array([1, None], pa.int32())}, "field 'n' is not nullable, but record 1"),
        ({"user": ["a", "b"]}, "non-nullable field 'n' is missing"),
        ({"user": ["a", "b"], "n": pa.array([1, 2], pa.int32()), "nn": [1, 2]}, r"unknown field\(s\) \['nn'\]"),
        ({"user": [1, 2], "n": pa.array([1, 2], pa.int32())}, "field 'user' holds values of type int64"),
    ],
)
def test_send_batch_refuses_bad_data_and_writes_nothing(tmp_path: Path, columns: dict[str, Any], named: str) -> None:
    url, admin = _store(tmp_path, partitions=4)
    with Producer(url) as producer, pytest.raises(InvalidRecordError, match=f"value schema version 1.*{named}"):
        producer.send_batch("ev", pa.table({"key": ["k1", "k2"], **columns}))
    assert _ends(admin) == [0, 0, 0, 0]


def test_widenings_and_other_representations_are_implicit(tmp_path: Path) -> None:
    url, _admin = _store(tmp_path, "n bigint NOT NULL, x double, s string, ts timestamp")
    table = pa.table(
        {
            "key": ["k"],
            "n": pa.array([7], pa.int16()),
            "x": pa.array([1.5], pa.float32()),
            "s": pa.array(["big"], pa.large_utf8()),
            "ts": pa.array([0], pa.timestamp("ms", "Europe/Paris")),
        }
    )
    with Producer(url) as producer:
        producer.send_batch("ev", table)
        with pytest.raises(InvalidRecordError, match="timestamp"):  # a zoneless time is not an instant
            producer.send_batch("ev", table.set_column(4, "ts", pa.array([0], pa.timestamp("ms"))))
    value = _read_all(url).column("value").to_pylist()[0]
    assert value == {"n": 7, "x": 1.5, "s": "big", "ts": datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)}


# ---------------------------------------------------------------------------------------- storage


def test_a_typed_object_is_plain_arrow_with_the_fields_as_columns(tmp_path: Path) -> None:
    url, admin = _store(tmp_path, config=PARTITIONED)  # one object per append, its own file
    with Producer(url) as producer:
        producer.send("ev", {"user": "ann", "n": 1}, key=b"a").get(timeout=10)
        producer.send("ev", None, key=b"a").get(timeout=10)
    files = sorted((tmp_path / "root").rglob("*.arrow"))
    assert files
    data = files[0].read_bytes()
    assert TAIL.unpack(data[-TAIL.size :])[2] == 2  # format version 2: older readers refuse it
    table = ipc.open_stream(pa.py_buffer(data)).read_all()  # any Arrow reader, no plog needed
    assert table.column_names == ["offset", "timestamp", "key", "headers", "__plog_tombstone", "user", "n", "ts"]
    assert table.schema.metadata == {b"plog.value_schema_version": b"1"}
    root = LogRoot(url)
    view = root.partition("ev", 0).view()
    index = read_index(root.store, view.segments[0].key)
    assert index.meta.value_schema_version == 1 and index.meta.format_version == 2
    assert index.meta.value_schema == root.topic("ev").schema_history.current.encoded  # type: ignore[union-attr]
    report = verify(root, "ev")
    assert report.ok, report.problems
    assert admin.describe_topic("ev")["partitions"][0]["end_offset"] == 2


def test_pruned_reads_decode_only_the_fields_asked_for(tmp_path: Path) -> None:
    fields = ", ".join(f"f{i} string" for i in range(10))
    url, _admin = _store(tmp_path, fields, config={"compression.type": "none"})
    row = {f"f{i}": "x" * 200 for i in range(10)}
    with Producer(url) as producer:
        producer.send_batch("ev", pa.Table.from_pylist([row] * 2000).append_column("key", pa.array(["k"] * 2000)))
    root = LogRoot(url)
    log = root.partition("ev", 0)
    layout = entry_layout(root.topic("ev").schema_history.current)  # type: ignore[union-attr]

    def decoded_bytes(projection: Projection | None) -> tuple[int, pa.Table]:
        log.reader._buffer = None
        log.reader._decoded = None
        batches, _ = log.read(0, projection=projection)
        table = pa.Table.from_batches(batches)
        return table.column("value").nbytes, table

    all_bytes, everything = decoded_bytes(None)
    two_bytes, two = decoded_bytes(Projection(layout, ["f3", "f7"]))
    assert two.schema.field("value").type.names == ["f3", "f7"]
    assert two.column("value").to_pylist()[0] == {"f3": row["f3"], "f7": row["f7"]}
    assert everything.num_rows == two.num_rows == 2000
    assert two_bytes * 4 < all_bytes  # 2 of 10 equal fields decoded: about a fifth of the bytes
    with pytest.raises(InvalidRecordError, match=r"unknown value field\(s\) \['nope'\]"):
        Projection(layout, ["nope"])


# ---------------------------------------------------------------------------------------- evolution


def test_evolution_reads_all_history_as_the_newest_schema(tmp_path: Path) -> None:
    url, admin = _store(tmp_path, "user string, n int NOT NULL")
    with Producer(url) as producer:
        producer.send("ev", {"user": "old", "n": 1}, key=b"k").get(timeout=10)
    admin.evolve_value_schema("ev", "user string, n bigint NOT NULL, extra string")  # widen + add nullable
    with Producer(url) as producer:
        producer.send("ev", {"user": "new", "n": 2**40, "extra": "e"}, key=b"k").get(timeout=10)
    got = _read_all(url)
    assert got.schema.field("value").type == pa.struct([("user", pa.utf8()), ("n", pa.int64()), ("extra", pa.utf8())])
    assert got.column("value").to_pylist() == [
        {"user": "old", "n": 1, "extra": None},
        {"user": "new", "n": 2**40, "extra": "e"},
    ]
    history = admin.describe_topic("ev")["value_schema_history"]
    assert [e["version"] for e in history] == [1, 2]


def test_small_objects_of_two_schema_versions_merge_into_one_with_a_section_each(tmp_path: Path) -> None:
    """A commit range over runs of versions 1 and 2 copies them into one shared object (PROTOCOL.md 10.2), a
    section per version, each opened by its own schema message: the history still reads as the newest schema."""
    url, admin = _store(tmp_path, "user string, n int NOT NULL", 2, config={"auto.maintenance.enable": "false"})
    with Producer(url) as producer:
        for i in range(8):
            producer.send("ev", {"user": f"u{i}", "n": i}, partition=i % 2).get(timeout=10)
    admin.evolve_value_schema("ev", "user string, n bigint NOT NULL, extra string")
    with Producer(url) as producer:
        for i in range(8, 17):
            producer.send("ev", {"user": f"u{i}", "n": i, "extra": "e"}, partition=i % 2).get(timeout=10)
    before = _read_all(url).sort_by("timestamp")
    assert admin.maintain("ev")["merged"] == 1
    store = LogRoot(url).store
    (range_key,) = [i.key for i in store.list("topics/ev/") if i.key.endswith(".g1.json")]
    entries = json.loads(store.get(range_key))["entries"]
    assert len({e["object"] for e in entries}) == 1 and {e["value_schema_version"] for e in entries} == {1, 2}
    assert verify(LogRoot(url), "ev").ok
    after = _read_all(url).sort_by("timestamp")
    assert after.column("value").to_pylist() == before.column("value").to_pylist()
    assert [v["user"] for v in after.column("value").to_pylist()] == [f"u{i}" for i in range(17)]


def test_a_writer_holding_an_older_schema_writes_the_current_version(tmp_path: Path) -> None:
    url, admin = _store(tmp_path, "user string, n int NOT NULL")
    root = LogRoot(url, metadata_max_age_s=0.0)
    log = root.partition("ev", 0)
    old = entry_layout(root.topic("ev").schema_history.current)  # type: ignore[union-attr]
    admin.evolve_value_schema("ev", "user string, n int NOT NULL, extra string")
    from segment_format.records import null_headers
    from segment_format.segment import BatchMeta

    value = old.values_from_python([{"user": "u", "n": 1}], "ev")
    stamps = pa.array([0], pa.int64()).cast(pa.timestamp("ms", "UTC"))
    payload = pa.RecordBatch.from_arrays([stamps, pa.array([b"k"]), value, null_headers(1)], schema=old.payload_schema)
    log.append([(payload, BatchMeta())])
    index = log.index(log.view().segments[-1])
    assert index.meta.value_schema_version == 2  # confirmed current before the create, and converted


@pytest.mark.parametrize(
    ("mode", "change", "allowed"),
    [
        ("BACKWARD", "a int, b string", True),  # add a nullable field
        ("BACKWARD", "a int, b string NOT NULL", False),  # add a non-nullable field
        ("BACKWARD", "b string", True),  # remove a field... backward reads it as dropped
        ("BACKWARD", "a bigint", True),  # widen
        ("BACKWARD", "a smallint", False),  # narrow
        ("FORWARD", "a int, b string NOT NULL", False),  # every mode but NONE reads history backward
        ("FORWARD", "a bigint", False),  # the old schema cannot read the widened data
        ("FULL", "a int, b string", True),
        ("FULL", "a string", False),
        ("NONE", "a string", True),
    ],
)
def test_each_mode_allows_and_refuses_changes_through_the_admin(
    tmp_path: Path, mode: str, change: str, allowed: bool
) -> None:
    _url, admin = _store(tmp_path, "a int", value_schema_compatibility=mode)
    if allowed:
        admin.evolve_value_schema("ev", change)
        assert admin.describe_topic("ev")["value_schema_version"] == 2
    else:
        with pytest.raises(InvalidConfigError, match=f"refused under {mode}: .*field"):
            admin.evolve_value_schema("ev", change)
        assert admin.describe_topic("ev")["value_schema_version"] == 1


def test_an_evolution_checks_against_the_version_that_won(tmp_path: Path) -> None:
    _url, admin = _store(tmp_path, "a int")
    admin.evolve_value_schema("ev", "a int, b int")  # the winner of a race
    with pytest.raises(InvalidConfigError, match="field 'b' is read as string but the data holds int32"):
        admin.evolve_value_schema("ev", "a int, b string")  # built on version 1, checked against 2
    admin.evolve_value_schema("ev", "a int, b int", compatibility="FULL")  # same schema: only the mode changes
    described = admin.describe_topic("ev")
    assert described["value_schema_version"] == 2 and described["value_schema_compatibility"] == "FULL"


def test_after_a_none_change_unreadable_history_is_an_error_not_a_skip(tmp_path: Path) -> None:
    url, admin = _store(tmp_path, "a string", value_schema_compatibility="NONE")
    with Producer(url) as producer:
        producer.send("ev", {"a": "text"}, key=b"k").get(timeout=10)
    admin.evolve_value_schema("ev", "a int")
    consumer = Consumer(url, auto_offset_reset="earliest")
    consumer.subscribe(["ev"])
    with pytest.raises(IncompatibleSchemaError, match="field 'a' is string in value schema version 1.*version 2"):
        consumer.poll_arrow(timeout_ms=1000)
    consumer.close()


def test_poll_arrow_gives_one_value_type_per_table_and_loses_nothing(tmp_path: Path) -> None:
    """A consumer of a typed and an untyped topic: each table holds one value type, and the records of
    the other wait for the next poll instead of being skipped (found by a second reader)."""
    url, admin = _store(tmp_path)
    admin.create_topic("plain", 1)
    with Producer(url) as producer:
        for i in range(3):
            producer.send("ev", {"n": i}, key=b"k").get(timeout=10)
            producer.send("plain", b"v%d" % i).get(timeout=10)
    consumer = Consumer(url, auto_offset_reset="earliest")
    consumer.subscribe(["ev", "plain"])
    seen: dict[str, list[Any]] = {"ev": [], "plain": []}
    for _ in range(20):
        table = consumer.poll_arrow(timeout_ms=200)
        if table.num_rows:
            assert len(set(table.column("topic").to_pylist())) == 1  # one value type per table
            seen[table.column("topic")[0].as_py()] += table.column("value").to_pylist()
        if sum(map(len, seen.values())) == 6:
            break
    assert [v["n"] for v in seen["ev"]] == [0, 1, 2] and seen["plain"] == [b"v0", b"v1", b"v2"]
    with pytest.raises(InvalidConfigError, match="read_to_end returns one table"):
        consumer.read_to_end()
    consumer.close()


def test_dates_and_times_beyond_year_9999_are_written_whole(tmp_path: Path) -> None:
    """Statistics of a timestamp Python cannot hold: kept as its integer, so a refused or crashed
    write never follows a valid one (found by a second reader)."""
    url, admin = _store(tmp_path, "ts timestamp, d date", partitions=2)
    far = pa.array([0, 300_000_000_000_000_000], pa.timestamp("us", "UTC"))
    with Producer(url) as producer:
        producer.send_batch("ev", pa.table({"key": ["a", "b"], "ts": far, "d": pa.array([0, 3_000_000], pa.date32())}))
    assert sum(_ends(admin)) == 2
    root = LogRoot(url)
    layout = entry_layout(root.topic("ev").schema_history.current)  # type: ignore[union-attr]
    ints = []
    for p in (0, 1):
        batches, _ = root.partition("ev", p).read(0, projection=Projection(layout, filters=[("ts", ">", 5)]))
        ints += [b.column(3).field(0).cast(pa.int64()).to_pylist() for b in batches]
    assert sorted(v for chunk in ints for v in chunk) == [0, 300_000_000_000_000_000]


def test_a_payload_of_an_older_version_is_converted_not_refused(tmp_path: Path) -> None:
    """A producer that built its values for version 1 writes after a field was removed: they are
    converted as a reader of version 2 reads them (PROTOCOL.md 11.8), not refused part-way."""
    url, admin = _store(tmp_path, "a int, b string", partitions=3)
    producer = Producer(url)
    producer.send("ev", {"a": 0, "b": "kept until v2"}, key=b"k0").get(timeout=10)  # the producer holds v1
    admin.evolve_value_schema("ev", "a int")  # BACKWARD: removing a field is allowed
    producer.root.forget_topic("ev")
    table = pa.table({"key": ["k1", "k2", "k3"], "a": pa.array([1, 2, 3], pa.int32()), "b": ["x", "y", "z"]})
    stale = LogRoot(url)  # built for version 1, appended after version 2 exists
    layout_v1 = entry_layout(stale.topic("ev").schema_history.entry(1))  # type: ignore[union-attr]
    from segment_format.segment import BatchMeta
    from segment_format.typed.layout import typed_payload

    payload = typed_payload(table, layout_v1, "ev").to_batches()[0]
    stale.partition("ev", 0).append([(payload, BatchMeta())])
    producer.close()
    got = _read_all(url)
    assert sorted(v["a"] for v in got.column("value").to_pylist()) == [0, 1, 2, 3]
    assert got.schema.field("value").type == pa.struct([("a", pa.int32())])


def test_a_reader_whose_schema_says_not_null_fails_on_a_null_of_a_newer_version(tmp_path: Path) -> None:
    url, admin = _store(tmp_path, "a int NOT NULL")
    root = LogRoot(url)
    v1 = entry_layout(root.topic("ev").schema_history.current)  # type: ignore[union-attr]
    admin.evolve_value_schema("ev", "a int")  # BACKWARD: a field may become nullable
    with Producer(url) as producer:
        producer.send("ev", {"a": None}, key=b"k").get(timeout=10)
    with pytest.raises(IncompatibleSchemaError, match="field 'a' is null in a record of value schema version 2"):
        LogRoot(url).partition("ev", 0).read(0, projection=Projection(v1))
    with pytest.raises(IncompatibleSchemaError):  # nor skipped by statistics, which could not judge it
        LogRoot(url).partition("ev", 0).read(0, projection=Projection(v1, filters=[("a", ">", 100)]))


def _topic_with_an_impostor(tmp_path: Path) -> tuple[LogRoot, Any]:
    """A topic typed "a int" whose first object is typed "a bigint", stating version 1 all the same."""
    url, _admin = _store(tmp_path, "a int")
    root = LogRoot(url)
    log = root.partition("ev", 0)
    impostor = _typed_object(entry_layout_for("a bigint"))  # version 1 too, but another schema
    root.store.put_if_absent(log.prefix + "log/00000000000000000000.arrow", impostor)
    return root, log


def test_verify_and_readers_refuse_objects_of_the_wrong_kind_or_schema(tmp_path: Path) -> None:
    root, _log = _topic_with_an_impostor(tmp_path)
    problems = verify(root, "ev").problems
    assert "value schema" in set(problems["problem"]), problems
    plain_url = str(tmp_path / "plain")
    LogStore(plain_url).create_topic("ev", 1)
    plain = LogRoot(plain_url)
    plain_log = plain.partition("ev", 0)
    plain.store.put_if_absent(
        plain_log.prefix + "log/00000000000000000000.arrow", _typed_object(entry_layout_for("a int"))
    )
    assert "value schema" in set(verify(plain, "ev").problems["problem"])
    with pytest.raises(CorruptRecordError, match="typed object in an untyped topic"):
        plain_log.read(0)


def test_a_consumer_meeting_a_newer_version_reads_the_metadata_again(tmp_path: Path) -> None:
    """An object of a version this process has not seen: the topic's metadata is read again and the
    read goes on as the newest schema (not an error for as long as the cached metadata lives)."""
    url, admin = _store(tmp_path, "n int")
    consumer = Consumer(url, auto_offset_reset="earliest")
    consumer.subscribe(["ev"])
    assert consumer.poll_arrow(timeout_ms=100).num_rows == 0  # the consumer holds version 1
    admin.evolve_value_schema("ev", "n bigint")  # a widening: version 1 cannot read version 2's data
    with Producer(url) as producer:
        producer.send("ev", {"n": 2**40}, key=b"k").get(timeout=10)
    table = pa.table({})
    for _ in range(10):
        table = consumer.poll_arrow(timeout_ms=200)
        if table.num_rows:
            break
    assert table.column("value").to_pylist() == [{"n": 2**40}]
    consumer.close()


# ---------------------------------------------------------------------------------------- maintenance


def test_merges_never_mix_versions_and_compaction_keeps_typed_records(tmp_path: Path) -> None:
    config = {"segment.bytes": 1 << 20, "cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.01}
    url, admin = _store(tmp_path, "n int", config={**config, "auto.maintenance.enable": False, **PARTITIONED})
    with Producer(url) as producer:
        for i in range(4):
            producer.send("ev", {"n": i}, key=b"same").get(timeout=10)
        admin.evolve_value_schema("ev", "n int, extra string")
    with Producer(url) as producer:
        for i in range(4, 8):
            producer.send("ev", {"n": i, "extra": "x"}, key=b"same" if i < 7 else b"other").get(timeout=10)
        producer.send("ev", None, key=b"other").get(timeout=10)
    admin.maintain("ev")
    admin.maintain("ev")
    root = LogRoot(url)
    versions = []
    for ref in root.partition("ev", 0).view().segments:
        versions.append(read_index(root.store, ref.key).meta.value_schema_version)
    assert set(versions) == {1, 2}
    got = _read_all(url)
    by_key: dict[bytes, Any] = {}
    for key, value in zip(got.column("key").to_pylist(), got.column("value").to_pylist(), strict=True):
        by_key[key] = value
    assert by_key == {b"same": {"n": 6, "extra": "x"}, b"other": None}
    assert got.num_rows < 9  # superseded records are gone


def test_a_tombstone_with_a_field_set_is_corruption(tmp_path: Path) -> None:
    layout = entry_layout_for("a int")
    stored = pa.RecordBatch.from_arrays(
        [
            pa.array([0], pa.int64()),
            pa.array([0], pa.int64()).cast(pa.timestamp("ms", "UTC")),
            pa.array([b"k"]),
            pa.nulls(1, layout.stored_schema.field("headers").type),
            pa.array([True]),
            pa.array([5], pa.int32()),
        ],
        schema=layout.stored_schema,
    )
    with pytest.raises(CorruptRecordError, match="tombstone.*field 'a' set"):
        layout.from_stored(stored)


def entry_layout_for(ddl: str) -> Any:
    from segment_format.typed.value_schema import SchemaHistory

    return entry_layout(SchemaHistory.first(parse_ddl(ddl), None, 0).current)


# ---------------------------------------------------------------------------------------- statistics


def test_batches_carry_field_statistics_that_merges_keep(tmp_path: Path) -> None:
    config = {"auto.maintenance.enable": False, **PARTITIONED}  # appended objects' indexes, merged as segments
    url, admin = _store(tmp_path, "n int, s string, x double, tags array<string>", config=config)
    with Producer(url) as producer:
        producer.send_batch(
            "ev", pa.table({"key": ["a", "b", "c"], "n": pa.array([5, None, -2], pa.int32()), "s": ["q", "b", None]})
        )
        producer.send_batch("ev", pa.table({"key": ["d"], "n": pa.array([9], pa.int32()), "x": [float("nan")]}))
        producer.send_batch("ev", pa.table({"key": ["e"], "n": pa.array([1], pa.int32())}))  # the tail, not merged
    root = LogRoot(url)
    log = root.partition("ev", 0)
    indexes = [read_index(root.store, ref.key) for ref in log.view().segments]
    stats = [idx.value_stats.to_pylist()[0] for idx in indexes]  # type: ignore[union-attr]
    assert stats[0] == {
        "n": {"min": -2, "max": 5, "null_count": 1},
        "s": {"min": "b", "max": "q", "null_count": 1},
        "x": {"min": None, "max": None, "null_count": 3},
    }  # no entry for the list field
    assert stats[1]["x"] == {"min": None, "max": None, "null_count": 0}  # NaN is not a bound
    admin.alter_config("ev", {"segment.bytes": 1024})  # each object closes a group by itself: copied as it is
    assert LogRoot(url).partition("ev", 0).merge_segments() >= 1
    merged = read_index(root.store, LogRoot(url).partition("ev", 0).view().segments[0].key)
    assert merged.meta.generation == 1 and merged.value_stats is not None
    assert merged.value_stats.to_pylist() == [stats[0]]


@pytest.mark.parametrize("layout_name", ["partitioned", "shared"])
def test_a_filtered_read_skips_batches_its_statistics_rule_out(tmp_path: Path, layout_name: str) -> None:
    """An appended object's index carries its batches' field statistics (PROTOCOL.md 11.8), and a shared
    topic's commit entries carry its runs' (7.3): a filtered read skips the batches they rule out in either."""
    config = {"auto.maintenance.enable": False, "storage.layout": layout_name}
    url, _admin = _store(tmp_path, "n int NOT NULL, s string", config=config)
    with Producer(url) as producer:
        for start in (0, 100, 200):  # three objects: n in [0, 10), [100, 110), [200, 210)
            rows = pa.table({"key": ["k"] * 10, "n": pa.array(range(start, start + 10), pa.int32())})
            producer.send_batch("ev", rows)
    root = LogRoot(url)
    log = root.partition("ev", 0)
    layout = entry_layout(root.topic("ev").schema_history.current)  # type: ignore[union-attr]

    assert all(log.index(ref).value_stats is not None for ref in log.view().segments)

    def read(*filters: Any) -> list[int]:
        batches, next_offset = log.read(0, projection=Projection(layout, filters=filters))
        assert next_offset == 30  # skipped batches are passed over, not stopped at
        return [v["n"] for b in batches for v in b.column("value").to_pylist()]

    assert read(("n", ">=", 105), ("n", "<", 150)) == list(range(100, 110))  # whole batches: the caller filters
    assert read(("n", "==", 50)) == []
    assert read(("n", "in", [3, 205])) == [*range(10), *range(200, 210)]
    assert read(("s", "is_not_null", None)) == []  # s is null everywhere
    assert read(("s", "is_null", None)) == [*range(10), *range(100, 110), *range(200, 210)]
    assert len(read(("n", "!=", 4))) == 30


@pytest.mark.parametrize(
    ("op", "value", "may"),
    [
        ("==", 5, True),
        ("==", 11, False),
        ("<", 1, False),
        ("<=", 1, True),
        (">", 10, False),
        (">=", 10, True),
        ("in", [0, 20], False),
        ("in", [0, 7], True),
        ("!=", 3, True),
        ("is_null", None, True),
        ("is_not_null", None, True),
    ],
)
def test_statistics_decide_only_what_they_prove(op: str, value: Any, may: bool) -> None:
    layout = entry_layout_for("n int, f double")
    stats = {"n": {"min": 1, "max": 10, "null_count": 2}, "f": {"min": 0.0, "max": 1.0, "null_count": 0}}
    assert Projection(layout, filters=[("n", op, value)]).may_match(stats, layout, 5) is may
    assert Projection(layout, filters=[("f", ">", 5.0)]).may_match(stats, layout, 5)  # floats: NaN may hide
    assert Projection(layout, filters=[("n", "==", 5)]).may_match(None, layout, 5)  # no statistics
    older = entry_layout_for("f double")
    assert not Projection(layout, filters=[("n", "==", 5)]).may_match(stats, older, 5)  # all null there


# ---------------------------------------------------------------------------------------- corruption


def _typed_object(layout: Any, **meta: Any) -> bytes:
    from segment_format.segment import BatchMeta, assemble_segment, encode_batch, ipc_options

    value = layout.values_from_python([{"a": 1}], "ev")
    stamps = pa.array([5], pa.int64()).cast(pa.timestamp("ms", "UTC"))
    from segment_format.records import null_headers

    batch = pa.RecordBatch.from_arrays(
        [pa.array([0], pa.int64()), stamps, pa.array([b"k"]), value, null_headers(1)], schema=layout.logical_schema
    )
    encoded = encode_batch(batch, BatchMeta(), ipc_options("lz4"), layout)
    fields = {"next_offset": 1, "running_max_timestamp": 5, "compression": "lz4", "created_ms": 5, "writer": "w"}
    if meta:  # a forged header: the typed fields as given, not as the layout would state them
        typed = {"value_schema_version": 1, "value_schema": layout.encoded, "format_version": 2}
        data, _ = assemble_segment([encoded], {**fields, **typed, **meta})
    else:
        data, _ = assemble_segment([encoded], fields, layout)
    return data


def test_typed_batches_encoded_together_are_the_messages_each_gives_alone() -> None:
    """An append encodes several batches with one Arrow call: a typed topic's batches too, as that
    version's stored columns, each message what the batch alone gives, with its value statistics."""
    import pyarrow.ipc as ipc

    from segment_format.records import null_headers
    from segment_format.segment import BatchMeta, encode_batches_together, ipc_options

    layout = entry_layout_for("a int, s string")
    options = ipc_options("lz4")
    batches = []
    for first, n in ((0, 3), (3, 50)):
        value = layout.values_from_python([{"a": i, "s": f"s{i}"} for i in range(first, first + n)], "ev")
        stamps = pa.array(range(first, first + n), pa.int64()).cast(pa.timestamp("ms", "UTC"))
        offsets = pa.array(range(first, first + n), pa.int64())
        columns = [offsets, stamps, pa.nulls(n, pa.binary()), value, null_headers(n)]
        batches.append(pa.RecordBatch.from_arrays(columns, schema=layout.logical_schema))
    together = encode_batches_together(batches, [BatchMeta(), BatchMeta()], options, layout)
    for encoded, batch in zip(together, batches, strict=True):
        stored = layout.to_stored(batch)
        sink = pa.BufferOutputStream()
        with ipc.new_stream(sink, stored.schema, options=options) as writer:
            writer.write_batch(stored)
            end = sink.tell()
        assert bytes(encoded.message) == sink.getvalue()[len(layout.schema_bytes) : end].to_pybytes()
        assert encoded.row["value_stats"] == layout.batch_stats(stored)
        assert encoded.row["record_count"] == batch.num_rows


@pytest.mark.parametrize(
    ("meta", "named"),
    [
        ({"value_schema": "not base64 of a schema"}, "value_schema does not decode"),
        ({"format_version": 1}, "typed segment must state"),
    ],
)
def test_a_damaged_typed_header_is_corruption(meta: dict[str, Any], named: str) -> None:
    from segment_format.segment import parse_index

    data = _typed_object(entry_layout_for("a int"), **meta)
    with pytest.raises(CorruptRecordError, match=named):
        parse_index("k", len(data), data, 0)


def test_an_object_whose_schema_is_not_the_topics_entry_is_corruption(tmp_path: Path) -> None:
    _root, log = _topic_with_an_impostor(tmp_path)
    with pytest.raises(CorruptRecordError, match="not the topic's version 1"):
        log.read(0)


def test_value_fields_may_be_named_like_record_columns(tmp_path: Path) -> None:
    url, _admin = _store(tmp_path, "key string, offset bigint, timestamp string, headers int")
    with Producer(url) as producer:
        producer.send("ev", {"key": "k", "offset": 7, "timestamp": "t", "headers": 1}, key=b"real").get(timeout=10)
    got = _read_all(url)
    assert got.column("key").to_pylist() == [b"real"] and got.column("offset").to_pylist() == [0]
    assert got.column("value").to_pylist() == [{"key": "k", "offset": 7, "timestamp": "t", "headers": 1}]
    root = LogRoot(url)
    layout = entry_layout(root.topic("ev").schema_history.current)  # type: ignore[union-attr]
    batches, _ = root.partition("ev", 0).read(0, projection=Projection(layout, ["headers", "key"]))
    assert batches[0].column(3).to_pylist() == [{"key": "k", "headers": 1}]


# ---------------------------------------------------------------------------------------- concurrency

_EVOLVER = """
import json, os, sys, time
from pyspark_logsource import LogStore
from segment_format.errors import InvalidConfigError
url, kind, rounds, gate = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
admin = LogStore(url)
while not os.path.exists(gate):  # both evolvers start together, so that they race
    time.sleep(0.001)
won = []
for i in range(rounds):
    current = admin.describe_topic("ev")["value_schema"]
    if f"x{i}" in current.names:
        continue  # the other process added this round's field first
    ddl = ", ".join(f"{f.name} {'int' if str(f.type) == 'int32' else 'string'}" for f in current)
    try:
        admin.evolve_value_schema("ev", f"{ddl}, x{i} {kind}")
        won.append(i)
    except InvalidConfigError as exc:
        assert "refused under BACKWARD" in str(exc), exc
print(json.dumps(won))
"""

_APPENDER = """
import sys
from pyspark_logsource import LogStore, Producer
url, count = sys.argv[1], int(sys.argv[2])
admin = LogStore(url)
with Producer(url, linger_ms=0) as producer:
    for i in range(count):
        producer.send("ev", {"a": i}, key=str(i)).get(timeout=30)
print(count)
"""


def test_concurrent_evolutions_and_writers_keep_one_readable_history(tmp_path: Path) -> None:
    """Two processes race to add the same fields with different types while a third writes: every
    field ends with one type, each version passed the check against all before it (put-if-absent of
    v+1, checked against the winner), and every record reads as the newest schema (PROTOCOL.md 11.8)."""
    import subprocess
    import sys
    import time

    from segment_format.typed.value_schema import evolution_problems
    from tests.fixtures_spark import PROJECT_ROOT

    url, admin = _store(tmp_path, "a int")
    rounds = 12

    def start(script: str, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", script, url, *args], cwd=PROJECT_ROOT, stdout=subprocess.PIPE, text=True
        )

    gate = tmp_path / "go"
    procs = [start(_EVOLVER, kind, str(rounds), str(gate)) for kind in ("int", "string")]
    procs.append(start(_APPENDER, "60"))
    time.sleep(1.0)  # the interpreters start; the gate, not this, is what makes them race
    gate.touch()
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    won_int, won_string = (set(json.loads(o)) for o in outs[:2])
    assert not won_int & won_string and won_int | won_string == set(range(rounds))  # one winner per field
    history = admin.describe_topic("ev")["value_schema_history"]
    schemas = [entry["schema"] for entry in history]
    assert len(schemas) == rounds + 1
    for n in range(1, len(schemas)):
        assert evolution_problems(schemas[:n], schemas[n], "BACKWARD") == []
    newest = schemas[-1]
    for i in range(rounds):
        assert str(newest.field(f"x{i}").type) == ("int32" if i in won_int else "string")
    got = _read_all(url)
    assert sorted(v["a"] for v in got.column("value").to_pylist()) == list(range(60))


_TYPED_WRITER = """
import os, sys
import pyarrow as pa
from pyspark_logsource import Producer
url, acks, first = sys.argv[1], sys.argv[2], int(sys.argv[3])
with Producer(url, linger_ms=0) as producer, open(acks, "a") as out:
    for i in range(first, first + 10_000):
        n = pa.array([i * 10 + j for j in range(10)], pa.int32())
        producer.send_batch("ev", pa.table({"key": [f"k{j}" for j in range(10)], "n": n, "s": ["v" * 200] * 10}))
        out.write(f"{i}\\n")
        out.flush()
        os.fsync(out.fileno())
"""

_TYPED_MAINTAINER = """
import sys
from pyspark_logsource import LogStore
admin = LogStore(sys.argv[1])
while True:
    admin.maintain("ev")
"""


def test_sigkilled_typed_writers_and_maintainer_lose_no_acknowledged_record(tmp_path: Path) -> None:
    """A typed writer SIGKILLed three times mid-stream while a maintainer merges (and is SIGKILLed too):
    every acknowledged record is there once, whole and typed, and verify finds nothing wrong."""
    import signal
    import subprocess
    import sys
    import time

    from tests.fixtures_spark import PROJECT_ROOT

    config = {"segment.bytes": 8 * 1024, "auto.maintenance.enable": False}
    url, _admin = _store(tmp_path, "n int NOT NULL, s string", partitions=2, config=config)
    acks = tmp_path / "acks"
    acks.touch()

    def start(script: str, *args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-c", script, url, *args], cwd=PROJECT_ROOT)

    def acked() -> list[int]:
        return [int(line) for line in acks.read_text().split()]

    maintainer = start(_TYPED_MAINTAINER)
    first = 0
    for round_ in range(3):
        writer = start(_TYPED_WRITER, str(acks), str(first))
        deadline = time.monotonic() + 60
        while len(acked()) < 15 * (round_ + 1) and time.monotonic() < deadline:
            time.sleep(0.01)  # polls the writer's acknowledgements; the kill below is what the test is about
        writer.send_signal(signal.SIGKILL)
        assert writer.wait(timeout=30) == -signal.SIGKILL
        first = max(acked()) + 1_000  # a new range: an unacknowledged batch of the killed writer may exist
    maintainer.send_signal(signal.SIGKILL)
    maintainer.wait(timeout=30)
    got = _read_all(url)
    values = got.column("value").to_pylist()
    assert all(v is not None and v["s"] == "v" * 200 for v in values)
    stored = [v["n"] for v in values]
    assert len(stored) == len(set(stored))  # nothing twice
    wanted = {i * 10 + j for i in acked() for j in range(10)}
    assert wanted <= set(stored), sorted(wanted - set(stored))[:10]
    report = verify(LogRoot(url), "ev")
    assert report.ok, report.problems
    root = LogRoot(url)
    merged = [ref for p in (0, 1) for ref in root.partition("ev", p).view().segments if ref.generation]
    assert merged, "the maintainer merged nothing: the test did not race merges with the writers"
