"""Value schemas from Avro, JSON Schema, DDL and files (segment_format.typed.schema_import): mappings and refusals."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from segment_format.errors import InvalidConfigError
from segment_format.typed.schema_import import schema_from_avro, schema_from_json_schema, value_schema_from
from segment_format.typed.value_schema import decode_schema, encode_schema

TS = pa.timestamp("us", tz="UTC")


def avro(*fields: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "record", "name": "Row", "fields": list(fields), **extra}


def jschema(properties: dict[str, Any], required: Any = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"type": "object", "properties": properties}
    if required is not None:
        doc["required"] = required
    return doc


def not_null_list(kind: pa.DataType) -> pa.DataType:
    return pa.list_(pa.field("item", kind, nullable=False))


def not_null_map(kind: pa.DataType) -> pa.DataType:
    return pa.map_(pa.utf8(), pa.field("value", kind, nullable=False))


# ------------------------------------------------------------------------------------------------- Avro

AVRO_TYPES: list[tuple[Any, pa.DataType]] = [
    ("boolean", pa.bool_()),
    ("int", pa.int32()),
    ("long", pa.int64()),
    ("float", pa.float32()),
    ("double", pa.float64()),
    ("string", pa.utf8()),
    ("bytes", pa.binary()),
    ({"type": "string"}, pa.utf8()),
    ({"type": "fixed", "name": "F", "size": 4}, pa.binary()),
    ({"type": "enum", "name": "E", "symbols": ["A", "B"]}, pa.utf8()),
    ({"type": "array", "items": "long"}, not_null_list(pa.int64())),
    ({"type": "array", "items": ["null", "long"]}, pa.list_(pa.int64())),
    ({"type": "map", "values": "double"}, not_null_map(pa.float64())),
    ({"type": "map", "values": ["null", "double"]}, pa.map_(pa.utf8(), pa.float64())),
    ({"type": "int", "logicalType": "date"}, pa.date32()),
    ({"type": "long", "logicalType": "timestamp-millis"}, TS),
    ({"type": "long", "logicalType": "timestamp-micros"}, TS),
    ({"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}, pa.decimal128(10, 2)),
    ({"type": "bytes", "logicalType": "decimal", "precision": 38}, pa.decimal128(38, 0)),
    (
        {"type": "fixed", "name": "D", "size": 8, "logicalType": "decimal", "precision": 18, "scale": 4},
        pa.decimal128(18, 4),
    ),
    ({"type": "string", "logicalType": "uuid"}, pa.utf8()),
    ({"type": "fixed", "name": "U", "size": 16, "logicalType": "uuid"}, pa.binary()),
    ({"type": "string", "logicalType": "my-own-thing"}, pa.utf8()),  # unknown logical types: the base type
    ({"type": {"type": "array", "items": "int"}}, not_null_list(pa.int32())),
]


@pytest.mark.parametrize(("avro_type", "expected"), AVRO_TYPES, ids=[str(e) for _, e in AVRO_TYPES])
def test_avro_type_mapping(avro_type: Any, expected: pa.DataType) -> None:
    schema = schema_from_avro(avro({"name": "v", "type": avro_type}))
    assert schema == pa.schema([pa.field("v", expected, nullable=False)])


def test_avro_nullability_and_order() -> None:
    schema = schema_from_avro(
        avro(
            {"name": "a", "type": "string"},
            {"name": "b", "type": ["null", "string"], "default": None},
            {"name": "c", "type": ["long", "null"]},
            {"name": "d", "type": [{"type": "null"}, {"type": "int", "logicalType": "date"}]},
            {"name": "e", "type": ["int"]},
        )
    )
    assert schema == pa.schema(
        [
            pa.field("a", pa.utf8(), nullable=False),
            pa.field("b", pa.utf8()),
            pa.field("c", pa.int64()),
            pa.field("d", pa.date32()),
            pa.field("e", pa.int32(), nullable=False),
        ]
    )


def test_avro_nested_records_keep_nullability() -> None:
    schema = schema_from_avro(
        avro(
            {
                "name": "geo",
                "type": [
                    "null",
                    {
                        "type": "record",
                        "name": "Geo",
                        "fields": [
                            {"name": "lat", "type": "double"},
                            {"name": "label", "type": ["null", "string"]},
                        ],
                    },
                ],
            },
        )
    )
    geo = pa.struct([pa.field("lat", pa.float64(), nullable=False), pa.field("label", pa.utf8())])
    assert schema == pa.schema([pa.field("geo", geo)])


def test_avro_json_text_is_accepted() -> None:
    doc = avro({"name": "n", "type": "int"})
    assert schema_from_avro(json.dumps(doc)) == schema_from_avro(doc)


def test_avro_named_references_resolve_with_namespaces() -> None:
    point = {
        "type": "record",
        "name": "Point",
        "namespace": "geo",
        "fields": [{"name": "x", "type": "double"}, {"name": "y", "type": "double"}],
    }
    schema = schema_from_avro(
        avro(
            {"name": "start", "type": point},
            {"name": "end", "type": "geo.Point"},  # full name
            {"name": "via", "type": {"type": "array", "items": "geo.Point"}},
            {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A"]}},
            {"name": "again", "type": ["null", "Kind"]},  # short name in the (empty) enclosing namespace
            {"name": "h", "type": {"type": "fixed", "name": "Hash", "size": 16}},
            {"name": "h2", "type": {"type": "Hash"}},
            namespace="app",
        )
    )
    struct = pa.struct([pa.field("x", pa.float64(), nullable=False), pa.field("y", pa.float64(), nullable=False)])
    assert schema.field("start").type == struct
    assert schema.field("end").type == struct
    assert schema.field("via").type == not_null_list(struct)
    assert schema.field("again") == pa.field("again", pa.utf8())
    assert schema.field("h2").type == pa.binary()


def test_avro_short_names_resolve_in_the_enclosing_namespace() -> None:
    inner = {"type": "record", "name": "Inner", "fields": [{"name": "v", "type": "int"}]}
    schema = schema_from_avro(
        avro(
            {"name": "a", "type": inner},
            {"name": "b", "type": "Inner"},
            {"name": "c", "type": "com.acme.Inner"},
            namespace="com.acme",
        )
    )
    assert schema.field("a").type == schema.field("b").type == schema.field("c").type


@pytest.mark.parametrize(
    ("doc", "culprit"),
    [
        (avro({"name": "u", "type": ["int", "string"]}), "field 'u'"),
        (avro({"name": "u", "type": ["null", "int", "string"]}), "field 'u'"),
        (avro({"name": "u", "type": ["null", "null"]}), "field 'u'"),
        (avro({"name": "u", "type": ["null", ["null", "int"]]}), "field 'u'"),
        (avro({"name": "n", "type": "null"}), "field 'n'"),
        (avro({"name": "t", "type": {"type": "int", "logicalType": "time-millis"}}), "field 't'"),
        (avro({"name": "t", "type": {"type": "long", "logicalType": "time-micros"}}), "field 't'"),
        (avro({"name": "t", "type": {"type": "long", "logicalType": "local-timestamp-millis"}}), "field 't'"),
        (avro({"name": "t", "type": {"type": "long", "logicalType": "local-timestamp-micros"}}), "field 't'"),
        (avro({"name": "t", "type": {"type": "long", "logicalType": "timestamp-nanos"}}), "field 't'"),
        (
            avro({"name": "t", "type": {"type": "fixed", "name": "Du", "size": 12, "logicalType": "duration"}}),
            "field 't'",
        ),
        (avro({"name": "d", "type": {"type": "string", "logicalType": "date"}}), "field 'd'"),
        (avro({"name": "d", "type": {"type": "int", "logicalType": "timestamp-millis"}}), "field 'd'"),
        (avro({"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 39}}), "field 'd'"),
        (avro({"name": "d", "type": {"type": "bytes", "logicalType": "decimal"}}), "field 'd'"),
        (
            avro({"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 5}}),
            "field 'd'",
        ),
        (
            avro(
                {
                    "name": "d",
                    "type": {"type": "fixed", "name": "F", "size": 2, "logicalType": "decimal", "precision": 9},
                }
            ),
            "field 'd'",
        ),
        (avro({"name": "x", "type": "uint32"}), "field 'x'"),
        (avro({"name": "x", "type": {"type": "array"}}), "field 'x'"),
        (avro({"name": "x", "type": {"type": "array", "items": ["int", "string"]}}), "field 'x[]'"),
        (
            avro({"name": "x", "type": {"type": "map", "values": {"type": "int", "logicalType": "time-millis"}}}),
            "field 'x{}'",
        ),
        (avro({"name": "x"}), "field 'x'"),
        (avro({"name": "x", "type": "int"}, {"name": "x", "type": "long"}), "field 'x'"),
        (
            avro(
                {
                    "name": "a",
                    "type": {
                        "type": "record",
                        "name": "A",
                        "fields": [{"name": "b", "type": {"type": "long", "logicalType": "local-timestamp-millis"}}],
                    },
                }
            ),
            "field 'a.b'",
        ),
        (
            avro(
                {
                    "name": "a",
                    "type": {"type": "record", "name": "A", "fields": [{"name": "b", "type": ["int", "long"]}]},
                }
            ),
            "field 'a.b'",
        ),
        (avro({"name": "a", "type": {"type": "record", "name": "A", "fields": []}}), "field 'a'"),
        (avro({"name": "later", "type": "Later"}), "field 'later'"),  # referenced before it is defined
        (
            avro(
                {"name": "a", "type": {"type": "enum", "name": "E", "symbols": ["X"]}},
                {"name": "b", "type": {"type": "enum", "name": "E", "symbols": ["Y"]}},
            ),
            "field 'b'",
        ),
        (
            avro(
                {
                    "name": "node",
                    "type": {
                        "type": "record",
                        "name": "Node",
                        "fields": [{"name": "next", "type": ["null", "Node"]}],
                    },
                }
            ),
            "field 'node.next'",
        ),
        (avro({"name": "self", "type": ["null", "Row"]}), "field 'self'"),  # the top-level record itself
    ],
)
def test_avro_refusals_name_the_culprit(doc: dict[str, Any], culprit: str) -> None:
    with pytest.raises(InvalidConfigError, match=f"^Avro schema: {re.escape(culprit)}"):
        schema_from_avro(doc)


@pytest.mark.parametrize(
    "doc",
    [
        "not json",
        "[1, 2]",
        '"string"',
        {"type": "enum", "name": "E", "symbols": ["A"]},
        {"type": "record", "fields": []},
    ],
)
def test_avro_top_level_must_be_a_record(doc: Any) -> None:
    with pytest.raises(InvalidConfigError, match="Avro schema"):
        schema_from_avro(doc)


def test_avro_reserved_names_are_refused_by_the_check() -> None:
    with pytest.raises(InvalidConfigError, match="__plog_x"):
        schema_from_avro(avro({"name": "__plog_x", "type": "int"}))


# ------------------------------------------------------------------------------------------ JSON Schema

JSON_TYPES: list[tuple[dict[str, Any], pa.DataType]] = [
    ({"type": "string"}, pa.utf8()),
    ({"type": "string", "format": "email"}, pa.utf8()),
    ({"type": "string", "format": "date"}, pa.date32()),
    ({"type": "string", "format": "date-time"}, TS),
    ({"type": "string", "format": "byte"}, pa.binary()),
    ({"type": "string", "contentEncoding": "base64"}, pa.binary()),
    ({"type": "integer"}, pa.int64()),
    ({"type": "number"}, pa.float64()),
    ({"type": "boolean"}, pa.bool_()),
    ({"type": "array", "items": {"type": "integer"}}, not_null_list(pa.int64())),
    ({"type": "array", "items": {"type": ["integer", "null"]}}, pa.list_(pa.int64())),
    ({"type": "object", "additionalProperties": {"type": "number"}}, not_null_map(pa.float64())),
    ({"type": "object", "additionalProperties": {"type": ["number", "null"]}}, pa.map_(pa.utf8(), pa.float64())),
    (
        {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "string"}}, "required": ["x"]},
        pa.struct([pa.field("x", pa.int64(), nullable=False), pa.field("y", pa.utf8())]),
    ),
]


@pytest.mark.parametrize(("prop", "expected"), JSON_TYPES, ids=[str(e) for _, e in JSON_TYPES])
def test_json_schema_type_mapping(prop: dict[str, Any], expected: pa.DataType) -> None:
    schema = schema_from_json_schema(jschema({"v": prop}, required=["v"]))
    assert schema == pa.schema([pa.field("v", expected, nullable=False)])


def test_json_schema_nullability_and_order() -> None:
    doc = jschema(
        {
            "z": {"type": "string"},
            "req": {"type": "integer"},
            "req_null": {"type": ["integer", "null"]},
            "req_anyof": {"anyOf": [{"type": "null"}, {"type": "string", "format": "date"}]},
            "req_oneof": {"oneOf": [{"type": "boolean"}, {"type": "null"}]},
            "req_openapi": {"type": "number", "nullable": True},
            "a": {"type": "boolean"},
        },
        required=["req", "req_null", "req_anyof", "req_oneof", "req_openapi", "not_a_property"],
    )
    schema = schema_from_json_schema({"$schema": "https://json-schema.org/draft/2020-12/schema", **doc})
    assert schema == pa.schema(
        [
            pa.field("z", pa.utf8()),
            pa.field("req", pa.int64(), nullable=False),
            pa.field("req_null", pa.int64()),
            pa.field("req_anyof", pa.date32()),
            pa.field("req_oneof", pa.bool_()),
            pa.field("req_openapi", pa.float64()),
            pa.field("a", pa.bool_()),
        ]
    )


def test_json_schema_refs_resolve() -> None:
    doc = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$ref": "#/definitions/Order",
        "definitions": {
            "Order": {
                "type": "object",
                "properties": {
                    "id": {"$ref": "#/definitions/Id"},
                    "ship_to": {"$ref": "#/$defs/Address"},
                    "bill_to": {"anyOf": [{"$ref": "#/$defs/Address"}, {"type": "null"}]},
                    "lines": {"type": "array", "items": {"$ref": "#/definitions/Line"}},
                },
                "required": ["id", "ship_to", "bill_to", "lines"],
            },
            "Id": {"type": "string", "format": "uuid"},
            "Line": {"$ref": "#/definitions/Line~1v2"},  # a chain, and an escaped pointer
            "Line/v2": {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]},
        },
        "$defs": {
            "Address": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    address = pa.struct([pa.field("city", pa.utf8())])
    line = pa.struct([pa.field("sku", pa.utf8(), nullable=False)])
    assert schema_from_json_schema(json.dumps(doc)) == pa.schema(
        [
            pa.field("id", pa.utf8(), nullable=False),
            pa.field("ship_to", address, nullable=False),
            pa.field("bill_to", address),
            pa.field("lines", not_null_list(line), nullable=False),
        ]
    )


def _js_nested(leaf: dict[str, Any]) -> dict[str, Any]:
    return jschema({"a": {"type": "object", "properties": {"b": leaf}}})


@pytest.mark.parametrize(
    ("doc", "culprit"),
    [
        (jschema({"x": {}}), "property 'x'"),
        (jschema({"x": {"enum": ["a", "b"]}}), "property 'x'"),
        (jschema({"x": True}), "property 'x'"),
        (jschema({"x": {"type": "null"}}), "property 'x'"),
        (jschema({"x": {"type": ["string", "integer"]}}), "property 'x'"),
        (jschema({"x": {"type": ["string", "integer", "null"]}}), "property 'x'"),
        (jschema({"x": {"type": "decimal"}}), "property 'x'"),
        (jschema({"x": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}), "property 'x'"),
        (jschema({"x": {"oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]}}), "property 'x'"),
        (jschema({"x": {"allOf": [{"type": "string"}]}}), "property 'x'"),
        (jschema({"x": {"type": "array"}}), "property 'x'"),
        (jschema({"x": {"type": "array", "items": [{"type": "string"}]}}), "property 'x'"),
        (jschema({"x": {"type": "array", "items": {"type": "object"}}}), "property 'x[]'"),
        (jschema({"x": {"type": "object"}}), "property 'x'"),
        (jschema({"x": {"type": "object", "additionalProperties": True}}), "property 'x'"),
        (jschema({"x": {"type": "object", "additionalProperties": {"oneOf": []}}}), "property 'x{}'"),
        (jschema({"x": {"$ref": "https://example.com/schemas/x.json"}}), "property 'x'"),
        (jschema({"x": {"$ref": "other.json#/definitions/X"}}), "property 'x'"),
        (jschema({"x": {"$ref": "#/definitions/Missing"}}), "property 'x'"),
        (jschema({"x": {"$ref": "#anchor"}}), "property 'x'"),
        (_js_nested({"type": ["boolean", "number"]}), "property 'a.b'"),
        (_js_nested({"$ref": "http://example.com/b.json"}), "property 'a.b'"),
        (
            {
                **jschema({"tree": {"$ref": "#/$defs/Node"}}),
                "$defs": {
                    "Node": {
                        "type": "object",
                        "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
                    }
                },
            },
            "property 'tree.kids[]'",
        ),
        (jschema({"x": {"type": "string"}}, required="x"), "the top level"),
    ],
)
def test_json_schema_refusals_name_the_culprit(doc: dict[str, Any], culprit: str) -> None:
    with pytest.raises(InvalidConfigError, match=f"^JSON Schema: {re.escape(culprit)}"):
        schema_from_json_schema(doc)


@pytest.mark.parametrize(
    "doc",
    [
        "{not json",
        "[]",
        {"type": "array", "items": {"type": "string"}},
        {"type": "object"},
        {"type": "object", "properties": {}},
        {"properties": {"x": {"type": "string"}}},
        {"type": "object", "additionalProperties": {"type": "string"}},
    ],
)
def test_json_schema_top_level_must_be_an_object_with_properties(doc: Any) -> None:
    with pytest.raises(InvalidConfigError, match="^JSON Schema"):
        schema_from_json_schema(doc)


# --------------------------------------------------------------------------------------------- dispatch

AVRO_DOC = avro({"name": "user", "type": "string"}, {"name": "n", "type": ["null", "int"]})
JSON_DOC = jschema({"user": {"type": "string"}, "n": {"type": "integer"}}, required=["user"])
DDL = "user string NOT NULL, n int"
EXPECTED_AVRO = pa.schema([pa.field("user", pa.utf8(), nullable=False), pa.field("n", pa.int32())])
EXPECTED_JSON = pa.schema([pa.field("user", pa.utf8(), nullable=False), pa.field("n", pa.int64())])


def test_dispatch_on_objects_and_text() -> None:
    assert value_schema_from(EXPECTED_AVRO) == EXPECTED_AVRO
    assert value_schema_from(DDL) == EXPECTED_AVRO
    assert value_schema_from(AVRO_DOC) == EXPECTED_AVRO
    assert value_schema_from(json.dumps(AVRO_DOC)) == EXPECTED_AVRO
    assert value_schema_from("\n  " + json.dumps(AVRO_DOC, indent=2)) == EXPECTED_AVRO
    assert value_schema_from(JSON_DOC) == EXPECTED_JSON
    assert value_schema_from(json.dumps(JSON_DOC)) == EXPECTED_JSON
    with_schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **JSON_DOC}
    assert value_schema_from(with_schema) == EXPECTED_JSON
    only_properties = {k: v for k, v in JSON_DOC.items() if k != "type"}
    with pytest.raises(InvalidConfigError, match="top level"):  # routed to JSON Schema, which wants the type
        value_schema_from(only_properties)


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("row.avsc", json.dumps(AVRO_DOC, indent=2), EXPECTED_AVRO),
        ("row.json", json.dumps(JSON_DOC), EXPECTED_JSON),
        ("row.ddl", "user string NOT NULL,\n  n int\n", EXPECTED_AVRO),
        ("schema", "\ufeff" + json.dumps(AVRO_DOC), EXPECTED_AVRO),  # no suffix, and a byte order mark
        ("avro-as.json", json.dumps(AVRO_DOC), EXPECTED_AVRO),  # content decides, not the suffix
    ],
)
def test_dispatch_on_files(tmp_path: Path, name: str, content: str, expected: pa.Schema) -> None:
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    assert value_schema_from(path) == expected
    assert value_schema_from(str(path)) == expected


def test_dispatch_file_problems(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigError, match="does not exist"):
        value_schema_from(tmp_path / "missing.avsc")
    with pytest.raises(InvalidConfigError, match="does not exist"):
        value_schema_from(str(tmp_path / "missing.avsc"))
    with pytest.raises(InvalidConfigError, match="does not exist"):
        value_schema_from("schemas/row.json")
    with pytest.raises(InvalidConfigError, match="not a file"):
        value_schema_from(tmp_path)
    empty = tmp_path / "empty.ddl"
    empty.write_text("  \n")
    with pytest.raises(InvalidConfigError, match="empty"):
        value_schema_from(empty)
    bad = tmp_path / "bad.avsc"
    bad.write_text("{ nope")
    with pytest.raises(InvalidConfigError, match="bad.avsc.*not valid JSON"):
        value_schema_from(bad)
    binary = tmp_path / "binary.avsc"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(InvalidConfigError, match="cannot be read"):
        value_schema_from(binary)


@pytest.mark.parametrize(
    "spec",
    [None, 42, b"user string", ["user string"], {"name": "x", "fields": []}, "[1, 2]", '"string"', "", "   "],
)
def test_dispatch_refuses_other_forms_and_says_what_is_accepted(spec: Any) -> None:
    with pytest.raises(InvalidConfigError) as info:
        value_schema_from(spec)
    if spec not in ("", "   "):  # an empty string is taken as DDL, whose parser says it must not be empty
        assert "pyarrow.Schema" in str(info.value) and "DDL" in str(info.value) and "Avro" in str(info.value)


def test_dispatch_passes_errors_of_the_chosen_form_through() -> None:
    with pytest.raises(InvalidConfigError, match="value schema DDL"):
        value_schema_from("user strung")
    with pytest.raises(InvalidConfigError, match="^Avro schema: field 'u'"):
        value_schema_from(avro({"name": "u", "type": ["int", "string"]}))
    with pytest.raises(InvalidConfigError, match="^JSON Schema: property 'x'"):
        value_schema_from(json.dumps(jschema({"x": {"type": "null"}})))
    with pytest.raises(InvalidConfigError, match="unsigned"):
        value_schema_from(pa.schema([pa.field("u", pa.uint8())]))


# ------------------------------------------------------------------------------------------ round trips


def _every_avro_type() -> pa.Schema:
    fields = [{"name": f"f{i}", "type": t} for i, (t, _) in enumerate(AVRO_TYPES)]
    # Named types must be unique within one document: rename the named ones by position.
    for field in fields:
        if isinstance(field["type"], dict) and "name" in field["type"]:
            field["type"] = {**field["type"], "name": f"T_{field['name']}"}
    fields.append({"name": "opt", "type": ["null", {"type": "array", "items": ["null", "string"]}]})
    return schema_from_avro(avro(*fields))


def _every_json_type() -> pa.Schema:
    properties = {f"p{i}": prop for i, (prop, _) in enumerate(JSON_TYPES)}
    return schema_from_json_schema(jschema(properties, required=list(properties)[::2]))


@pytest.mark.parametrize("make", [_every_avro_type, _every_json_type])
def test_imported_schemas_survive_the_stored_form(make: Any) -> None:
    schema = make()
    assert len(schema) > 10
    assert decode_schema(encode_schema(schema)) == schema
