"""Value schemas of typed topics (PROTOCOL.md 11.8): DDL, the stored form, and every evolution rule."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from segment_format.errors import InvalidConfigError
from segment_format.typed.value_schema import (
    COMPATIBILITY_MODES,
    check_schema,
    decode_schema,
    encode_schema,
    evolution_problems,
    parse_ddl,
)

V1 = pa.schema([pa.field("user", pa.utf8()), pa.field("n", pa.int32(), nullable=False)])


def test_ddl_maps_as_spark_does() -> None:
    schema = parse_ddl(
        "user string, page STRING NOT NULL, ts timestamp, d date, n int, big bigint, f float, x double, "
        "price decimal(10, 2), ok boolean, raw binary, tags array<string>, attrs map<string, int>, "
        "geo struct<lat: double, lon double NOT NULL>"
    )
    assert schema == pa.schema(
        [
            pa.field("user", pa.utf8()),
            pa.field("page", pa.utf8(), nullable=False),
            pa.field("ts", pa.timestamp("us", tz="UTC")),
            pa.field("d", pa.date32()),
            pa.field("n", pa.int32()),
            pa.field("big", pa.int64()),
            pa.field("f", pa.float32()),
            pa.field("x", pa.float64()),
            pa.field("price", pa.decimal128(10, 2)),
            pa.field("ok", pa.bool_()),
            pa.field("raw", pa.binary()),
            pa.field("tags", pa.list_(pa.utf8())),
            pa.field("attrs", pa.map_(pa.utf8(), pa.int32())),
            pa.field("geo", pa.struct([pa.field("lat", pa.float64()), pa.field("lon", pa.float64(), nullable=False)])),
        ]
    )


@pytest.mark.parametrize(
    ("ddl", "named"),
    [
        ("user strnig", "unknown type 'STRNIG'"),
        ("user string,", "expected more"),
        ("a int, a string", "unique: ['a']"),
        ("__plog_x int", "are plog's own"),
        ("a int b int", "expected ',' after field 'a'"),
        ("", "non-empty"),
    ],
)
def test_bad_ddl_names_the_culprit(ddl: str, named: str) -> None:
    with pytest.raises(InvalidConfigError, match=named.replace("(", r"\(").replace("[", r"\[")):
        parse_ddl(ddl)


@pytest.mark.parametrize("kind", [pa.uint32(), pa.large_utf8(), pa.time64("us"), pa.timestamp("ms"), pa.float16()])
def test_types_typed_topics_do_not_store_are_refused(kind: pa.DataType) -> None:
    with pytest.raises(InvalidConfigError, match="typed topics do not store"):
        check_schema(pa.schema([pa.field("x", kind)]))


def test_the_stored_form_round_trips_without_metadata() -> None:
    schema = V1.with_metadata({b"k": b"v"})
    text = encode_schema(schema)
    assert decode_schema(text) == V1 and decode_schema(text).metadata is None
    with pytest.raises(InvalidConfigError, match="does not decode"):
        decode_schema("not base64!")


def _v(*fields: pa.Field) -> pa.Schema:
    return pa.schema(list(fields))


NULLABLE_ADDED = _v(*V1, pa.field("page", pa.utf8()))
REQUIRED_ADDED = _v(*V1, pa.field("page", pa.utf8(), nullable=False))
NULLABLE_REMOVED = _v(pa.field("n", pa.int32(), nullable=False))
REQUIRED_REMOVED = _v(pa.field("user", pa.utf8()))
LOOSENED = _v(pa.field("user", pa.utf8()), pa.field("n", pa.int32()))
WIDENED = _v(pa.field("user", pa.utf8()), pa.field("n", pa.int64(), nullable=False))
CHANGED = _v(pa.field("user", pa.int64()), pa.field("n", pa.int32(), nullable=False))


@pytest.mark.parametrize(
    ("new", "backward", "forward"),
    [
        (NULLABLE_ADDED, True, True),
        (REQUIRED_ADDED, False, True),
        (NULLABLE_REMOVED, True, True),
        (REQUIRED_REMOVED, True, False),
        (LOOSENED, True, False),
        (WIDENED, True, False),
        (CHANGED, False, False),
    ],
)
def test_each_change_is_allowed_exactly_in_the_directions_of_the_table(
    new: pa.Schema, backward: bool, forward: bool
) -> None:
    for mode in COMPATIBILITY_MODES:
        problems = evolution_problems([V1], new, mode)
        allowed = {
            "NONE": True,
            "BACKWARD": backward,
            "BACKWARD_TRANSITIVE": backward,
            "FORWARD": backward and forward,  # every mode but NONE also reads all history backward
            "FORWARD_TRANSITIVE": backward and forward,
            "FULL": backward and forward,
            "FULL_TRANSITIVE": backward and forward,
        }[mode]
        assert (not problems) == allowed, (mode, problems)


def test_a_refused_change_names_the_field_the_version_and_the_rule() -> None:
    [problem] = evolution_problems([V1], CHANGED, "BACKWARD")
    assert "backward (the new schema reading version 1's data)" in problem
    assert "field 'user' is read as int64 but the data holds string" in problem


def test_every_mode_but_none_reads_all_history_so_a_removed_name_cannot_return_with_another_type() -> None:
    v1 = _v(pa.field("x", pa.utf8()), pa.field("y", pa.int32()))
    v2 = _v(pa.field("y", pa.int32()))  # x removed: allowed
    v3 = _v(pa.field("y", pa.int32()), pa.field("x", pa.int64()))  # x back, as another type
    assert not evolution_problems([v1], v2, "BACKWARD")
    assert not evolution_problems([v2], v3, "BACKWARD")  # against the last entry alone it would pass
    assert any("version 1" in p and "'x'" in p for p in evolution_problems([v1, v2], v3, "BACKWARD"))
    assert not evolution_problems([v1, v2], v3, "NONE")
    v3_ok = _v(pa.field("y", pa.int32()), pa.field("x", pa.utf8()))
    assert not evolution_problems([v1, v2], v3_ok, "BACKWARD")


def test_transitive_forward_checks_every_entry() -> None:
    v1 = _v(pa.field("a", pa.int32()), pa.field("b", pa.int32(), nullable=False))
    v2 = _v(pa.field("a", pa.int32()), pa.field("b", pa.int32(), nullable=False), pa.field("c", pa.int32()))
    v3 = _v(pa.field("a", pa.int32()), pa.field("c", pa.int32()))  # b (required in v1, v2) removed
    assert evolution_problems([v1, v2], v3, "FORWARD")  # v2 cannot read v3's data: b missing
    v2b = _v(pa.field("a", pa.int32()), pa.field("b", pa.int32()), pa.field("c", pa.int32()))
    v3b = _v(pa.field("a", pa.int32()), pa.field("c", pa.int32()))
    assert evolution_problems([v1, v2b], v3b, "FULL_TRANSITIVE")  # v1 requires b
    assert not evolution_problems([v1, v2b], v3b, "FULL")  # the last entry alone reads it


def test_widenings_read_up_and_never_down() -> None:
    for old, new in [
        (pa.int8(), pa.int64()),
        (pa.float32(), pa.float64()),
        (pa.date32(), pa.timestamp("us", tz="UTC")),
        (pa.decimal128(5, 2), pa.decimal128(9, 2)),
        (pa.list_(pa.int32()), pa.list_(pa.int64())),
    ]:
        assert not evolution_problems([_v(pa.field("x", old))], _v(pa.field("x", new)), "BACKWARD")
        assert evolution_problems([_v(pa.field("x", new))], _v(pa.field("x", old)), "BACKWARD")
    assert evolution_problems(
        [_v(pa.field("x", pa.decimal128(5, 2)))], _v(pa.field("x", pa.decimal128(9, 3))), "BACKWARD"
    )


@given(st.lists(st.sampled_from([NULLABLE_ADDED, NULLABLE_REMOVED, LOOSENED, WIDENED, V1]), min_size=1, max_size=5))
def test_a_history_accepted_under_backward_is_readable_by_its_newest_schema(history: list[pa.Schema]) -> None:
    entries = [V1]
    for candidate in history:
        if not evolution_problems(entries, candidate, "BACKWARD"):
            entries.append(candidate)
    newest = entries[-1]
    for old in entries:  # the invariant readers rely on: one schema reads every batch ever written
        for field in newest:
            match = old.field(field.name) if field.name in old.names else None
            assert match is not None or field.nullable
            if match is not None:
                assert not evolution_problems([_v(match)], _v(field), "BACKWARD")
