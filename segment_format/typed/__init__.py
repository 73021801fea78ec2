"""Typed topics (PROTOCOL.md 11.8): value schemas, how typed values are laid out in records, schema import.

What lives here: ``value_schema`` (a topic's schema history, DDL parsing, evolution checks), ``layout``
(``TypedLayout``: a typed value's columns in a record batch, projections) and ``schema_import`` (value
schemas from Avro and JSON Schema).

May import: ``errors`` and ``records``; never ``segment/``, ``log/``, ``root`` or anything else above it
(checked by ``tests/test_layering.py``).
"""

from __future__ import annotations

from .layout import (
    FieldFilter,
    Projection,
    TypedLayout,
    entry_layout,
    layout_for,
    payload_with_value,
    python_types,
    read_value,
    typed_payload,
)
from .schema_import import schema_from_avro, schema_from_json_schema, value_schema_from
from .value_schema import (
    COMPATIBILITY_MODES,
    SchemaEntry,
    SchemaHistory,
    check_schema,
    decode_schema,
    encode_schema,
    evolution_problems,
    object_schema_problem,
    parse_ddl,
)

__all__ = [
    "COMPATIBILITY_MODES",
    "FieldFilter",
    "Projection",
    "SchemaEntry",
    "SchemaHistory",
    "TypedLayout",
    "check_schema",
    "decode_schema",
    "encode_schema",
    "entry_layout",
    "evolution_problems",
    "layout_for",
    "object_schema_problem",
    "parse_ddl",
    "payload_with_value",
    "python_types",
    "read_value",
    "schema_from_avro",
    "schema_from_json_schema",
    "typed_payload",
    "value_schema_from",
]
