"""The ``plog`` command on typed topics (PROTOCOL.md 11.8): create, evolve, describe, produce, consume, inspect.

Each test gets a fresh root and creates its typed topic first: a root enables the ``typedTopics`` feature at once
only in its first protocol object (a root that already has untyped topics must wait ``file.delete.delay.ms``).
"""

from __future__ import annotations

import base64
import json
from datetime import date, datetime, timezone
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from pyspark_logsource import Consumer, LogStore, Producer, TopicPartition
from pyspark_logsource.views.values import schema_ddl, value_from_json, value_to_json
from segment_format.errors import InvalidRecordError
from segment_format.typed.value_schema import parse_ddl
from tests.fixtures_cli import Run

DDL = "user string NOT NULL, n int NOT NULL, ts timestamp, d date, raw binary, amount decimal(12,2), tags array<string>"


@pytest.fixture(autouse=True)
def _wide_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Wide tables: the assertions look for whole cells."""
    monkeypatch.setenv("COLUMNS", "250")


def _lines(*objects: object) -> bytes:
    return "".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objects).encode()


def _consume_json(run: Run, topic: str) -> list[dict]:
    code, out, err = run("consume", topic, "--from-beginning", "--format", "json", "--timeout-ms", "100")
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


def _end_offsets(url: str, topic: str) -> list[int]:
    with LogStore(url) as store:
        return [p["end_offset"] for p in store.describe_topic(topic)["partitions"]]


# --------------------------------------------------------------------------- topics create / describe


def test_create_typed_topic_from_ddl_and_describe_shows_schema_mode_and_history(run: Run, url: str) -> None:
    code, out, err = run(
        "topics", "create", "ev", "--partitions", "2", "--value-schema", DDL, "--value-schema-compatibility", "full"
    )
    assert code == 0, err
    assert "created topic 'ev' with 2 partitions" in out
    assert "typed: value schema v1 (user STRING NOT NULL, n INT NOT NULL, ts TIMESTAMP" in out
    assert "compatibility FULL" in out
    with LogStore(url) as store:
        info = store.describe_topic("ev")
    assert info["value_schema"].equals(parse_ddl(DDL)) and info["value_schema_compatibility"] == "FULL"

    code, out, _ = run("topics", "describe", "ev")
    assert code == 0
    assert "value schema v1  compatibility FULL · 7 fields · 1 version" in out
    for cell in ("user", "STRING", "string", "NOT NULL", "TIMESTAMP", "timestamp[us, tz=UTC]", "DECIMAL(12,2)"):
        assert cell in out, cell
    assert "ARRAY<STRING>" in out and "list<item: string>" in out
    # The DDL line reads back as the same schema, so it can be edited and passed to `topics evolve`.
    ddl = next(line for line in out.splitlines() if line.startswith("DDL: "))[len("DDL: ") :]
    assert parse_ddl(ddl).equals(parse_ddl(DDL))
    assert "value schema history" in out and "v1" in out


def test_untyped_describe_has_no_schema_section(run: Run) -> None:
    run("topics", "create", "plain")
    code, out, _ = run("topics", "describe", "plain")
    assert code == 0 and "value schema" not in out and "DDL:" not in out


def test_create_typed_topic_from_avro_and_json_schema_files(run: Run, url: str, tmp_path: Path) -> None:
    avsc = tmp_path / "order.avsc"
    avsc.write_text(
        json.dumps(
            {
                "type": "record",
                "name": "Order",
                "fields": [
                    {"name": "id", "type": "string"},
                    {"name": "qty", "type": ["null", "int"]},
                    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
                ],
            }
        )
    )
    json_schema = tmp_path / "user.json"
    json_schema.write_text(
        json.dumps(
            {
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "properties": {"name": {"type": "string"}, "born": {"type": "string", "format": "date"}},
                "required": ["name"],
            }
        )
    )
    ddl_file = tmp_path / "click.ddl"
    ddl_file.write_text("page string NOT NULL, ms bigint\n")
    assert run("topics", "create", "orders", "--value-schema", str(avsc))[0] == 0
    assert run("topics", "create", "users", "--value-schema", str(json_schema))[0] == 0
    assert run("topics", "create", "clicks", "--value-schema", str(ddl_file))[0] == 0
    with LogStore(url) as store:
        orders = store.describe_topic("orders")["value_schema"]
        users = store.describe_topic("users")["value_schema"]
        clicks = store.describe_topic("clicks")["value_schema"]
    assert orders.field("id").nullable is False and orders.field("qty").type == pa.int32()
    assert orders.field("at").type == pa.timestamp("us", tz="UTC")
    assert users.field("name").nullable is False and users.field("born").type == pa.date32()
    assert clicks.equals(parse_ddl("page string NOT NULL, ms bigint"))


def test_create_refuses_bad_schemas_naming_the_culprit(run: Run, tmp_path: Path) -> None:
    code, _, err = run("topics", "create", "t", "--value-schema", "user strin")
    assert code == 2 and err.startswith("error: ") and "'STRIN'" in err and "Traceback" not in err
    code, _, err = run("topics", "create", "t", "--value-schema", str(tmp_path / "missing.avsc"))
    assert code == 2 and "missing.avsc" in err and "does not exist" in err
    code, _, err = run("topics", "create", "t", "--value-schema", "a time_of_day_is_not_a_type")
    assert code == 2 and "error: " in err
    code, _, err = run("topics", "create", "t", "--value-schema-compatibility", "FULL")
    assert code == 2 and "--value-schema-compatibility needs --value-schema" in err
    code, _, err = run("topics", "create", "t", "--value-schema", "a int", "--value-schema-compatibility", "LOOSE")
    assert code == 2 and "'LOOSE' is not one of" in err  # argparse names the choices
    assert run("topics", "list")[1] == ""  # nothing was created


def test_typed_topic_on_a_root_with_untyped_topics_is_refused_until_the_feature_settles(
    run: Run, tmp_path: Path
) -> None:
    older = ["--url", str(tmp_path / "older")]  # a root made by its first, untyped, topic
    run("topics", "create", "plain", *older, with_url=False)
    code, _, err = run("topics", "create", "typed", "--value-schema", "a int", *older, with_url=False)
    assert code == 2 and "typedTopics" in err and "retry" in err and "Traceback" not in err


# --------------------------------------------------------------------------- topics evolve


def test_evolve_prints_the_new_version_and_refuses_breaking_changes(run: Run, url: str) -> None:
    run("topics", "create", "ev", "--value-schema", "user string, n int NOT NULL")
    code, out, err = run("topics", "evolve", "ev", "--value-schema", "user string, n bigint NOT NULL, extra string")
    assert code == 0, err
    assert "topic 'ev': value schema v2" in out
    assert "added extra STRING" in out and "changed n INT NOT NULL -> n BIGINT NOT NULL" in out
    assert "compatibility BACKWARD" in out and "warning" not in err

    # Narrowing n back breaks BACKWARD: the error names the field and the rule; no version is added.
    code, _, err = run("topics", "evolve", "ev", "--value-schema", "user string, n int NOT NULL, extra string")
    assert code == 2 and "refused under BACKWARD" in err and "field 'n'" in err and "widening" in err
    # Adding a non-nullable field: old data has no value for it.
    code, _, err = run(
        "topics", "evolve", "ev", "--value-schema", "user string, n bigint NOT NULL, extra string, k int NOT NULL"
    )
    assert code == 2 and "'k'" in err
    # The same schema again: no new version.
    code, out, _ = run("topics", "evolve", "ev", "--value-schema", "user string, n bigint NOT NULL, extra string")
    assert code == 0 and "unchanged at v2" in out

    code, out, _ = run("topics", "describe", "ev")
    assert "value schema v2" in out and "2 versions" in out
    assert "n INT NOT NULL" in out and "n BIGINT NOT NULL" in out  # both versions in the history
    with LogStore(url) as store:
        assert [e["version"] for e in store.describe_topic("ev")["value_schema_history"]] == [1, 2]


def test_evolve_under_none_warns_that_nothing_was_checked(run: Run, url: str) -> None:
    run("topics", "create", "ev", "--value-schema", "user string, n int")
    # --compatibility with a breaking change: checked under the mode in force, with a hint how to change it first.
    code, _, err = run("topics", "evolve", "ev", "--value-schema", "user int", "--compatibility", "NONE")
    assert code == 2 and "refused under BACKWARD" in err and "plog topics evolve ev --compatibility NONE" in err

    code, out, err = run("topics", "evolve", "ev", "--compatibility", "none")  # the mode alone
    assert code == 0 and "unchanged at v1, compatibility NONE" in out
    assert "later changes are not checked" in err

    code, out, err = run("topics", "evolve", "ev", "--value-schema", "user int")
    assert code == 0 and "value schema v2" in out and "changed user STRING -> user INT" in out
    assert "warning: compatibility NONE: nothing was checked" in err and "fail to read" in err
    assert "under BACKWARD this change would have been refused" in err and "field 'user'" in err
    with LogStore(url) as store:
        info = store.describe_topic("ev")
    assert info["value_schema_version"] == 2 and info["value_schema_compatibility"] == "NONE"


def test_evolve_bad_usage(run: Run) -> None:
    run("topics", "create", "ev", "--value-schema", "a int")
    run("topics", "create", "plain")
    code, _, err = run("topics", "evolve", "ev")
    assert code == 2 and "--value-schema" in err
    code, _, err = run("topics", "evolve", "plain", "--value-schema", "a int")
    assert code == 2 and "untyped" in err
    code, _, err = run("topics", "evolve", "ghost", "--value-schema", "a int")
    assert code == 2 and "unknown topic 'ghost'" in err


# --------------------------------------------------------------------------- produce / consume


def test_produce_json_converts_iso_base64_decimal_and_consume_prints_objects(run: Run, url: str) -> None:
    run("topics", "create", "ev", "--partitions", "2", "--value-schema", DDL)
    first = {
        "user": "ann",
        "n": 1,
        "ts": "2024-05-01T12:00:00.250Z",
        "d": "2024-05-01",
        "raw": base64.b64encode(b"\x00\xffbin").decode(),
        "amount": 12.50,
        "tags": ["a", "b"],
    }
    lines = [
        first,
        {"user": "bob", "n": 2, "ts": "2024-05-01T14:00:00+02:00", "amount": "0.10"},  # offset: the same instant
        "",  # blank lines are skipped
        {"user": "cy", "n": 3, "ts": "2024-05-01T12:00:00"},  # no zone: UTC
    ]
    code, out, err = run("produce", "ev", "--json", "--key-field", "user", stdin=_lines(*lines))
    assert code == 0, err
    assert "produced 3 records to 'ev'" in out

    records = sorted(_consume_json(run, "ev"), key=lambda r: r["value"]["n"])
    assert [r["key"] for r in records] == ["ann", "bob", "cy"]  # --key-field in the schema: kept in the value too
    values = [r["value"] for r in records]
    assert values[0] == {**first, "ts": "2024-05-01T12:00:00.250000Z", "amount": "12.50"}
    assert values[1]["ts"] == "2024-05-01T12:00:00Z" and values[1]["amount"] == "0.10"
    assert values[1]["raw"] is None and values[1]["tags"] is None and values[1]["d"] is None
    assert values[2]["ts"] == "2024-05-01T12:00:00Z"

    # What was stored is typed, not strings.
    consumer = Consumer(url, auto_offset_reset="earliest")
    consumer.assign([TopicPartition("ev", p) for p in range(2)])
    table = consumer.poll_arrow(timeout_ms=500)
    consumer.close()
    stored = {v["user"]: v for v in table.column("value").to_pylist()}
    assert stored["ann"]["ts"] == datetime(2024, 5, 1, 12, 0, 0, 250000, tzinfo=timezone.utc)
    assert stored["ann"]["d"] == date(2024, 5, 1) and stored["ann"]["raw"] == b"\x00\xffbin"
    assert stored["ann"]["amount"] == Decimal("12.50")

    # The default format prints each value as compact JSON; it produces back unchanged (a round trip).
    code, out, _ = run("consume", "ev", "--from-beginning", "--timeout-ms", "100")
    assert code == 0
    printed = out.splitlines()
    assert len(printed) == 3 and all(line.startswith('{"user":') and ", " not in line for line in printed)
    run("topics", "create", "copy", "--value-schema", DDL)
    code, _, err = run("produce", "copy", "--json", stdin="\n".join(printed).encode())
    assert code == 0, err
    assert sorted(r["value"]["user"] for r in _consume_json(run, "copy")) == ["ann", "bob", "cy"]
    assert {json.dumps(r["value"], sort_keys=True) for r in _consume_json(run, "copy")} == {
        json.dumps(v, sort_keys=True) for v in values
    }


def test_key_field_outside_the_schema_is_only_the_key(run: Run) -> None:
    run("topics", "create", "ev", "--value-schema", "n int")
    lines = _lines({"id": "k1", "n": 1}, {"n": 2})
    code, _, err = run("produce", "ev", "--json", "--key-field", "id", "--missing-key", "warn", stdin=lines)
    assert code == 0 and "1 line(s) had no field 'id'" in err, err
    records = _consume_json(run, "ev")
    assert [(r["key"], r["value"]) for r in records] == [("k1", {"n": 1}), (None, {"n": 2})]


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        ({"user": "x", "n": "3"}, "field 'n' holds '3' of type str, which is not int32"),
        ({"user": "x"}, "field 'n' is not nullable and has no value"),
        ({"user": "x", "n": None}, "field 'n' is not nullable"),
        ({"user": "x", "n": 1, "zz": 2}, "unknown field(s) ['zz']"),
        ({"user": "x", "n": 1.5}, "field 'n' holds 1.5 of type float"),
        ({"user": "x", "n": True}, "field 'n' holds True of type bool"),
        ({"user": "x", "n": 2**40}, "field 'n' holds 1099511627776, which is not int32"),  # only Arrow sees it
        ({"user": "x", "n": 1, "ts": "yesterday"}, "field 'ts' holds 'yesterday', which is not an ISO 8601"),
        ({"user": "x", "n": 1, "ts": 1714564800000}, "field 'ts' holds 1714564800000, which is not an ISO 8601"),
        ({"user": "x", "n": 1, "d": "May 1st"}, "field 'd' holds 'May 1st', which is not an ISO 8601 date"),
        ({"user": "x", "n": 1, "raw": "not base64!"}, "field 'raw' holds 'not base64!', which is not base64"),
        ({"user": "x", "n": 1, "amount": "ten"}, "field 'amount' holds 'ten', which is not a decimal"),
        ({"user": "x", "n": 1, "tags": ["a", 2]}, "field 'tags[]' holds 2, which is not string"),
    ],
)
def test_bad_line_names_the_field_keeps_earlier_records_and_sends_nothing_after(
    run: Run, bad: dict, expected: str
) -> None:
    run("topics", "create", "ev", "--value-schema", DDL)
    good = [{"user": "a", "n": 1}, {"user": "b", "n": 2}]
    code, out, err = run("produce", "ev", "--json", stdin=_lines(*good, bad, {"user": "after", "n": 4}))
    assert code == 2 and "Traceback" not in err
    assert "error: line 3: topic 'ev' (value schema version 1): " in err
    assert expected in err, err
    assert "the 2 records before it were sent, nothing after it" in err
    assert "produced 2 records" in out
    assert [r["value"]["user"] for r in _consume_json(run, "ev")] == ["a", "b"]


def test_nested_struct_fields_are_checked_strictly(run: Run) -> None:
    run("topics", "create", "ev", "--value-schema", "loc struct<lat: double, n: int NOT NULL>")
    code, _, err = run("produce", "ev", "--json", stdin=_lines({"loc": {"lat": 1, "n": 1.5}}))
    assert code == 2 and "field 'loc.n' holds 1.5" in err  # Arrow alone would store 1
    code, _, err = run("produce", "ev", "--json", stdin=_lines({"loc": {"lat": 1.0, "n": 1, "x": 0}}))
    assert code == 2 and "field 'loc' has unknown field(s) ['x']" in err  # Arrow alone would drop it
    code, _, err = run("produce", "ev", "--json", stdin=_lines({"loc": {"lat": 1, "n": 2}}))
    assert code == 0, err
    assert [r["value"] for r in _consume_json(run, "ev")] == [{"loc": {"lat": 1.0, "n": 2}}]


def test_plain_lines_to_a_typed_topic_are_refused_before_anything_is_sent(run: Run, url: str) -> None:
    run("topics", "create", "ev", "--value-schema", "user string")
    code, out, err = run("produce", "ev", stdin=b'{"user": "a"}\nplain text\n')
    assert code == 2 and "topic 'ev' is typed (value schema v1: user STRING): give --json" in err
    assert out == "" and _end_offsets(url, "ev") == [0]
    code, _, err = run("produce", "ev", "--json", stdin=b"[1]\n")
    assert code == 2 and "line 1: expected a JSON object, got list" in err
    assert _end_offsets(url, "ev") == [0]


def test_consume_after_evolution_and_tombstones(run: Run, url: str) -> None:
    run("topics", "create", "ev", "--value-schema", "user string, n int")
    run("produce", "ev", "--json", "--key-field", "user", stdin=_lines({"user": "a", "n": 1}))
    run("topics", "evolve", "ev", "--value-schema", "user string, n bigint, extra string")
    code, _, err = run(
        "produce", "ev", "--json", "--key-field", "user", stdin=_lines({"user": "b", "n": 2**40, "extra": "e"})
    )
    assert code == 0, err
    with Producer(url) as producer:
        producer.send("ev", None, key="a")  # a tombstone
    code, out, _ = run("consume", "ev", "--from-beginning", "--timeout-ms", "100")
    assert out.splitlines() == [
        '{"user":"a","n":1,"extra":null}',  # written under v1, read as v2: the new field is null
        '{"user":"b","n":1099511627776,"extra":"e"}',
        "null",
    ]
    records = _consume_json(run, "ev")
    assert [r["value"] for r in records][2] is None and records[2]["key"] == "a"


# --------------------------------------------------------------------------- inspect


def test_inspect_shows_the_schema_version_of_each_segment_and_typed_records(run: Run) -> None:
    run("topics", "create", "ev", "--value-schema", "user string, n int")
    run("produce", "ev", "--json", stdin=_lines({"user": "a [x]", "n": 1}, {"user": "b", "n": 2}))
    run("topics", "evolve", "ev", "--value-schema", "user string, n int, extra string")
    run("produce", "ev", "--json", stdin=_lines({"user": "c", "n": 3, "extra": "e"}))

    code, out, err = run("inspect", "ev", "--index")
    assert code == 0, err
    assert "schema" in out
    rows = [line for line in out.splitlines() if ".arrow" in line and "│" in line]
    assert len(rows) == 2 and rows[0].rstrip(" │").endswith("v1") and rows[1].rstrip(" │").endswith("v2")

    code, out, err = run("inspect", "ev", "--batch", "1")
    assert code == 0, err
    assert "value schema version" in out and "v1" in out
    assert '{"user":"a [x]","n":1}' in out and '{"user":"b","n":2}' in out  # the object's own version
    code, out, _ = run("inspect", "ev", "--batch", "2", "--width", "20")
    assert code == 0 and "v2" in out and '{"user":"c","n":3,"…' in out  # cut to 20 characters


def test_untyped_inspect_has_no_schema_column(run: Run) -> None:
    run("topics", "create", "plain")
    run("produce", "plain", stdin=b"x\n")
    code, out, _ = run("inspect", "plain")
    assert code == 0 and "schema" not in out


# --------------------------------------------------------------------------- the JSON codec


def test_value_json_round_trip_and_schema_ddl() -> None:
    schema = parse_ddl(
        "s string, b binary, t timestamp, d date, x decimal(38,10), f float, "
        "m map<string, array<timestamp>>, mi map<int, string>, st struct<a: bigint, `odd name`: boolean>"
    )
    kind = pa.struct(list(schema))
    value = {
        "s": "ü",
        "b": b"\x01\x02",
        "t": datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=timezone.utc),
        "d": date(2024, 1, 2),
        "x": Decimal("1234567890123456789012345678.0123456789"),
        "f": 0.5,
        "m": [("k", [datetime(2024, 1, 1, tzinfo=timezone.utc)])],
        "mi": [(1, "one")],
        "st": {"a": 2**40, "odd name": True},
    }
    stored = pa.array([value], type=kind).to_pylist()[0]
    printed = value_to_json(stored, kind)
    assert printed["b"] == "AQI=" and printed["t"] == "2024-01-02T03:04:05.000006Z"
    assert printed["x"] == "1234567890123456789012345678.0123456789"  # exact, as a string
    assert printed["m"] == {"k": ["2024-01-01T00:00:00Z"]} and printed["mi"] == [[1, "one"]]
    parsed = json.loads(json.dumps(printed), parse_float=Decimal)
    back = value_from_json(parsed, kind)
    assert pa.array([back], type=kind).to_pylist()[0] == stored
    # A decimal as a JSON number stays exact too (parsed as Decimal, never a float).
    exact = value_from_json(json.loads('{"x": 0.1000000000000000000001}', parse_float=Decimal), kind)
    assert exact["x"] == Decimal("0.1000000000000000000001")
    assert parse_ddl(schema_ddl(schema)).equals(schema)
    with pytest.raises(InvalidRecordError, match=r"field 'mi key' holds 'one', which is not int32"):
        value_from_json({"mi": [["one", "x"]]}, kind)
