"""Value schemas from the schema documents data engineers already have: Avro, JSON Schema, DDL (PROTOCOL.md 11.8).

:func:`value_schema_from` takes any accepted form (a :class:`pyarrow.Schema`, a DDL string, an Avro record
schema, a JSON Schema object, or a file holding one of the textual forms) and returns the value schema, checked
by :func:`segment_format.typed.value_schema.check_schema`. :func:`schema_from_avro` and
:func:`schema_from_json_schema` do one document kind each.

The mapping is exact or refused: a construct with no faithful value-schema type (a general union, a time of
day, a wall-clock timestamp, a recursive type, a remote ``$ref``...) raises
:class:`~segment_format.errors.InvalidConfigError` naming the field's path, such as ``field 'a.b'``; ``a[]``
is an array's items and ``a{}`` a map's values. Array items and map values keep the source's nullability.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa

from ..errors import InvalidConfigError
from .value_schema import check_schema, parse_ddl

__all__ = ["schema_from_avro", "schema_from_json_schema", "value_schema_from"]

_TIMESTAMP = pa.timestamp("us", tz="UTC")

#: decimal128's widest precision; wider decimals would need decimal256, which typed topics do not store.
_MAX_PRECISION = 38

#: A typed topic's Arrow type of each Avro primitive type ("null" only appears in unions).
_AVRO_PRIMITIVES: dict[str, pa.DataType] = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "string": pa.utf8(),
    "bytes": pa.binary(),
}

_TIME_OF_DAY = "a time of day, which typed topics do not store"
_LOCAL_TIME = "a wall-clock time without a time zone; typed topics store UTC instants only"

#: Avro logical types that typed topics cannot hold faithfully, and why.
_AVRO_REFUSED_LOGICAL = {
    "time-millis": _TIME_OF_DAY,
    "time-micros": _TIME_OF_DAY,
    "local-timestamp-millis": _LOCAL_TIME,
    "local-timestamp-micros": _LOCAL_TIME,
    "local-timestamp-nanos": _LOCAL_TIME,
    "timestamp-nanos": "nanoseconds; typed topics store timestamps in microseconds",
    "duration": "an interval, which typed topics do not store",
    "big-decimal": f"a decimal of unbounded precision; typed topics need decimal(p, s) with p <= {_MAX_PRECISION}",
}

#: The JSON Schema ``format`` values of ``"type": "string"`` with a type of their own.
_JSON_STRING_FORMATS: dict[str, pa.DataType] = {
    "date": pa.date32(),
    "date-time": _TIMESTAMP,
    "byte": pa.binary(),
}

_FORMS = (
    'a pyarrow.Schema, a DDL string ("user string, n int NOT NULL"), an Avro record schema '
    '(a dict or JSON text with "type": "record"), a JSON Schema object (a dict or JSON text with '
    '"properties" or "$schema"), or the path of a file holding DDL, Avro (.avsc) or JSON Schema (.json) text'
)

#: File name endings that mark a string as a path even when no such file exists (DDL never has them).
_SCHEMA_SUFFIXES = (".avsc", ".json", ".ddl", ".sql", ".txt", ".schema")


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _brief(node: object) -> str:
    """A short rendering of a schema node for an error message."""
    text = json.dumps(node, sort_keys=True, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def _load(doc: object, what: str) -> Mapping[str, Any]:
    """``doc`` as a parsed JSON object: JSON text is parsed, a mapping is taken as it is."""
    if isinstance(doc, str):
        try:
            doc = json.loads(doc)
        except json.JSONDecodeError as exc:
            raise InvalidConfigError(f"{what}: not valid JSON: {exc}") from None
    if not isinstance(doc, Mapping):
        raise InvalidConfigError(f"{what}: the document must be a JSON object, not {type(doc).__name__}")
    return doc


# --------------------------------------------------------------------------------------------------- Avro


def schema_from_avro(doc: str | Mapping[str, Any]) -> pa.Schema:
    """The value schema of an Avro record schema, given as JSON text or as the parsed dict.

    Each field of the top-level record becomes a column. A field is nullable exactly when its type is the
    union ``["null", T]`` or ``[T, "null"]``; any other union, a recursive record, and the logical types with
    no faithful Arrow type (times of day, ``local-timestamp-*``, ``timestamp-nanos``, ``duration``) are
    refused. Named types (records, enums, fixed) may be referenced by name after their definition, with
    Avro's namespace rules. Logical types Avro does not define are ignored, as the Avro specification says,
    and the underlying type is used.

    Raises :class:`~segment_format.errors.InvalidConfigError` naming the field path of what it cannot map.
    """
    root = _load(doc, "Avro schema")
    if root.get("type") != "record":
        raise InvalidConfigError(
            f'Avro schema: the top level must be a record ("type": "record"), not {_brief(root.get("type"))}'
        )
    converter = _Avro()
    full, namespace = converter.define(root, "", "")
    fields = converter.record_fields(root, "", namespace)
    converter.register(full, pa.struct(fields))
    return check_schema(pa.schema(fields))


class _Avro:
    """One Avro document's conversion; remembers the named types defined so far."""

    def __init__(self) -> None:
        #: Full name -> Arrow type; None while the type is being defined (a reference then is a recursion).
        self.named: dict[str, pa.DataType | None] = {}

    @staticmethod
    def fail(path: str, message: str) -> InvalidConfigError:
        where = f"field {path!r}" if path else "the top-level record"
        return InvalidConfigError(f"Avro schema: {where}: {message}")

    def type_of(self, node: object, path: str, namespace: str) -> tuple[pa.DataType, bool]:
        """The Arrow type of the Avro schema ``node`` and whether it admits null."""
        if isinstance(node, list):
            return self.union(node, path, namespace)
        return self.plain(node, path, namespace), False

    @staticmethod
    def is_null(node: object) -> bool:
        return node == "null" or (isinstance(node, Mapping) and node.get("type") == "null")

    def union(self, branches: list[Any], path: str, namespace: str) -> tuple[pa.DataType, bool]:
        others = [branch for branch in branches if not self.is_null(branch)]
        if any(isinstance(branch, list) for branch in branches):
            raise self.fail(path, "a union may not contain a union")
        if len(others) == 1 and len(branches) - len(others) <= 1:
            return self.plain(others[0], path, namespace), len(branches) == 2
        raise self.fail(
            path,
            f'the union {_brief(branches)} has no value-schema type; only ["null", T] or [T, "null"] '
            "(a nullable T) is supported",
        )

    def plain(self, node: object, path: str, namespace: str) -> pa.DataType:
        """The Arrow type of a schema that is not a union."""
        if isinstance(node, str):
            return self.named_type(node, path, namespace)
        if not isinstance(node, Mapping):
            raise self.fail(path, f"{_brief(node)} is not an Avro schema")
        kind = node.get("type")
        if isinstance(kind, Mapping):  # {"type": {"type": "array", ...}}: the inner schema is the type
            return self.plain(kind, path, namespace)
        if not isinstance(kind, str):
            raise self.fail(path, f"the schema {_brief(node)} needs a type name")
        if kind in _AVRO_PRIMITIVES:
            return self.logical(node, kind, path) or _AVRO_PRIMITIVES[kind]
        if kind == "record":
            full, inner = self.define(node, path, namespace)
            fields = self.record_fields(node, path, inner)
            return self.register(full, pa.struct(fields))
        if kind == "enum":
            full, _ = self.define(node, path, namespace)
            if not isinstance(node.get("symbols"), list):
                raise self.fail(path, "an enum needs a list of symbols")
            return self.register(full, pa.utf8())
        if kind == "fixed":
            full, _ = self.define(node, path, namespace)
            if not isinstance(node.get("size"), int) or isinstance(node.get("size"), bool) or node["size"] < 0:
                raise self.fail(path, "a fixed needs a size, a non-negative integer")
            return self.register(full, self.logical(node, kind, path) or pa.binary())
        if kind == "array":
            if "items" not in node:
                raise self.fail(path, "an array needs items")
            item, nullable = self.type_of(node["items"], f"{path}[]", namespace)
            return pa.list_(pa.field("item", item, nullable=nullable))
        if kind == "map":
            if "values" not in node:
                raise self.fail(path, "a map needs values")
            value, nullable = self.type_of(node["values"], f"{path}{{}}", namespace)
            return pa.map_(pa.utf8(), pa.field("value", value, nullable=nullable))
        return self.named_type(kind, path, namespace)

    def named_type(self, name: str, path: str, namespace: str) -> pa.DataType:
        """The type a bare name stands for: a primitive, or a named type defined earlier."""
        if name in _AVRO_PRIMITIVES:
            return _AVRO_PRIMITIVES[name]
        if name == "null":
            raise self.fail(path, 'the type "null" alone holds nothing; write ["null", T] for a nullable T')
        candidates = [name] if "." in name or not namespace else [f"{namespace}.{name}", name]
        for full in candidates:
            if full in self.named:
                kind = self.named[full]
                if kind is None:
                    raise self.fail(path, f"the type {full!r} contains itself; a value schema cannot be recursive")
                return kind
        raise self.fail(path, f"unknown type {name!r} (a named type must be defined before it is referenced)")

    def define(self, node: Mapping[str, Any], path: str, namespace: str) -> tuple[str | None, str]:
        """The full name of the named type ``node`` defines (None if it has no name), and its namespace."""
        name = node.get("name")
        if name is None:
            return None, namespace
        if not isinstance(name, str) or not name:
            raise self.fail(path, f"the name {_brief(name)} of a {node.get('type')} is not a string")
        if "." in name:
            full, inner = name, name.rsplit(".", 1)[0]
        else:
            space = node.get("namespace")
            inner = namespace if space is None else str(space)
            full = _join(inner, name)
        if name in _AVRO_PRIMITIVES or name == "null":
            raise self.fail(path, f"a named type may not be called {name!r}")
        if full in self.named:
            raise self.fail(path, f"the type {full!r} is defined twice")
        self.named[full] = None
        return full, inner

    def register(self, full: str | None, kind: pa.DataType) -> pa.DataType:
        if full is not None:
            self.named[full] = kind
        return kind

    def record_fields(self, node: Mapping[str, Any], path: str, namespace: str) -> list[pa.Field]:
        """The Arrow fields of the record ``node``; ``path`` is the record's own field path."""
        fields = node.get("fields")
        if not isinstance(fields, list) or not fields:
            raise self.fail(path, "a record needs a non-empty list of fields")
        result: list[pa.Field] = []
        seen: set[str] = set()
        for field in fields:
            name = field.get("name") if isinstance(field, Mapping) else None
            if not isinstance(name, str) or not name:
                raise self.fail(path, f"the record field {_brief(field)} needs a name")
            inner = _join(path, name)
            if name in seen:
                raise self.fail(inner, "the name appears twice in its record")
            seen.add(name)
            if "type" not in field:
                raise self.fail(inner, "the field has no type")
            kind, nullable = self.type_of(field["type"], inner, namespace)
            result.append(pa.field(name, kind, nullable=nullable))
        return result

    def logical(self, node: Mapping[str, Any], base: str, path: str) -> pa.DataType | None:
        """The Arrow type of ``node``'s logical type over the Avro type ``base``; None if it has none."""
        logical = node.get("logicalType")
        if logical is None:
            return None
        if not isinstance(logical, str):
            raise self.fail(path, f"the logicalType {_brief(logical)} is not a string")
        if logical in _AVRO_REFUSED_LOGICAL:
            raise self.fail(path, f"the logical type {logical!r} is {_AVRO_REFUSED_LOGICAL[logical]}")
        allowed = {
            "date": ("int",),
            "timestamp-millis": ("long",),
            "timestamp-micros": ("long",),
            "decimal": ("bytes", "fixed"),
            "uuid": ("string", "fixed"),
        }.get(logical)
        if allowed is None:
            return None  # a logical type Avro does not define: the specification says to use the base type
        if base not in allowed:
            raise self.fail(path, f"the logical type {logical!r} annotates {' or '.join(allowed)}, not {base}")
        if logical == "date":
            return pa.date32()
        if logical.startswith("timestamp-"):
            return _TIMESTAMP
        if logical == "uuid":
            if base == "fixed" and node.get("size") != 16:
                raise self.fail(path, "the logical type 'uuid' annotates a fixed of size 16")
            return None
        return self.decimal(node, base, path)

    def decimal(self, node: Mapping[str, Any], base: str, path: str) -> pa.DataType:
        precision, scale = node.get("precision"), node.get("scale", 0)
        if not isinstance(precision, int) or isinstance(precision, bool) or not 1 <= precision <= _MAX_PRECISION:
            raise self.fail(
                path, f"a decimal's precision must be an integer from 1 to {_MAX_PRECISION}, not {_brief(precision)}"
            )
        if not isinstance(scale, int) or isinstance(scale, bool) or not 0 <= scale <= precision:
            raise self.fail(path, f"a decimal's scale must be an integer from 0 to its precision, not {_brief(scale)}")
        if base == "fixed":
            size = node["size"]
            widest = math.floor(math.log10(2 ** (8 * size - 1) - 1)) if size > 0 else 0
            if precision > widest:
                raise self.fail(
                    path, f"a fixed of {size} bytes holds at most {widest} digits, not precision {precision}"
                )
        return pa.decimal128(precision, scale)


# --------------------------------------------------------------------------------------------- JSON Schema


def schema_from_json_schema(doc: str | Mapping[str, Any]) -> pa.Schema:
    """The value schema of a JSON Schema document (a draft 7 / 2020-12 subset), as JSON text or a dict.

    The top level must be ``"type": "object"`` with ``properties``; each property becomes a column, in the
    order of ``properties``. A property is nullable unless it is ``required`` and its schema does not admit
    null (``"type": [T, "null"]``, ``anyOf``/``oneOf`` of T and ``{"type": "null"}``, or OpenAPI's
    ``"nullable": true``). ``string`` maps to utf8, or date32 (format ``date``), timestamp (``date-time``)
    or binary (format ``byte`` or ``contentEncoding: base64``); ``integer`` to int64; ``number`` to float64;
    ``boolean`` to bool; ``array`` to a list of its ``items``; an object with ``properties`` to a struct, and
    one with only an ``additionalProperties`` schema to a map from utf8. Local ``$ref`` pointers
    (``#/definitions/...``, ``#/$defs/...``) are followed; remote ones, recursion, ``allOf`` and other
    unions are refused.

    Raises :class:`~segment_format.errors.InvalidConfigError` naming the property path of what it cannot map.
    """
    root = _load(doc, "JSON Schema")
    converter = _JsonSchema(root)
    top, active = converter.follow(root, "", ())
    if top.get("type") != "object" or not isinstance(top.get("properties"), Mapping) or not top["properties"]:
        raise InvalidConfigError(
            'JSON Schema: the top level must be {"type": "object"} with a non-empty "properties" object'
        )
    return check_schema(pa.schema(converter.struct_fields(top, "", active)))


class _JsonSchema:
    """One JSON Schema document's conversion; ``root`` is what local ``$ref`` pointers point into."""

    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root

    @staticmethod
    def fail(path: str, message: str) -> InvalidConfigError:
        where = f"property {path!r}" if path else "the top level"
        return InvalidConfigError(f"JSON Schema: {where}: {message}")

    def follow(self, node: object, path: str, active: tuple[str, ...]) -> tuple[Mapping[str, Any], tuple[str, ...]]:
        """``node`` with its ``$ref`` chain followed, and the refs now being expanded (to catch recursion)."""
        while isinstance(node, Mapping) and "$ref" in node:
            ref = node["$ref"]
            if not isinstance(ref, str) or not ref.startswith("#"):
                raise self.fail(path, f"the $ref {_brief(ref)} is not local; only '#/...' pointers are followed")
            if ref in active:
                raise self.fail(path, f"the $ref {ref!r} contains itself; a value schema cannot be recursive")
            node, active = self.pointer(ref, path), (*active, ref)
        if not isinstance(node, Mapping):
            raise self.fail(path, f"{_brief(node)} is not a schema object with a type")
        return node, active

    def pointer(self, ref: str, path: str) -> object:
        """What the local JSON pointer ``ref`` (``#/a/b``) designates in the root document."""
        if ref != "#" and not ref.startswith("#/"):
            raise self.fail(path, f"the $ref {ref!r} is not a JSON pointer ('#/...'); anchors are not followed")
        node: object = self.root
        for part in ref[2:].split("/") if ref != "#" else []:
            key = unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping) and key in node:
                node = node[key]
            elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
                node = node[int(key)]
            else:
                raise self.fail(path, f"the $ref {ref!r} points at nothing")
        return node

    @staticmethod
    def is_null(node: object) -> bool:
        return isinstance(node, Mapping) and node.get("type") in ("null", ["null"])

    def type_of(self, node: object, path: str, active: tuple[str, ...]) -> tuple[pa.DataType, bool]:
        """The Arrow type of the schema ``node`` and whether it admits null."""
        nullable = isinstance(node, Mapping) and node.get("nullable") is True
        schema, active = self.follow(node, path, active)
        nullable = nullable or schema.get("nullable") is True
        if "allOf" in schema:
            raise self.fail(path, "allOf is not supported")
        for key in ("anyOf", "oneOf"):
            if key in schema:
                branches = schema[key]
                others = [b for b in branches if not self.is_null(b)] if isinstance(branches, list) else []
                if isinstance(branches, list) and len(branches) == 2 and len(others) == 1:
                    return self.type_of(others[0], path, active)[0], True
                raise self.fail(
                    path, f'{key} is supported only as [T, {{"type": "null"}}] (a nullable T), not {_brief(branches)}'
                )
        kind = schema.get("type")
        if isinstance(kind, list):
            names = [name for name in kind if name != "null"]
            nullable = nullable or len(names) < len(kind)
            if len(names) != 1:
                raise self.fail(path, f"the type {_brief(kind)} is not one type, or one type and null")
            kind = names[0]
        if kind is None:
            raise self.fail(path, "the schema has no type")
        return self.plain(schema, kind, path, active), nullable

    def plain(self, schema: Mapping[str, Any], kind: object, path: str, active: tuple[str, ...]) -> pa.DataType:
        """The Arrow type of ``schema`` whose (non-null) JSON type is ``kind``."""
        if kind == "string":
            if schema.get("contentEncoding") == "base64":
                return pa.binary()
            fmt = schema.get("format")
            return _JSON_STRING_FORMATS.get(fmt, pa.utf8()) if isinstance(fmt, str) else pa.utf8()
        if kind == "integer":
            return pa.int64()
        if kind == "number":
            return pa.float64()
        if kind == "boolean":
            return pa.bool_()
        if kind == "array":
            items = schema.get("items")
            if not isinstance(items, Mapping):
                raise self.fail(path, "an array needs one schema object as its items (tuples are not supported)")
            if "prefixItems" in schema:
                raise self.fail(path, "prefixItems (tuples) is not supported")
            item, nullable = self.type_of(items, f"{path}[]", active)
            return pa.list_(pa.field("item", item, nullable=nullable))
        if kind == "object":
            properties = schema.get("properties")
            if isinstance(properties, Mapping) and properties:
                return pa.struct(self.struct_fields(schema, path, active))
            extra = schema.get("additionalProperties")
            if isinstance(extra, Mapping):
                value, nullable = self.type_of(extra, f"{path}{{}}", active)
                return pa.map_(pa.utf8(), pa.field("value", value, nullable=nullable))
            raise self.fail(path, "an object needs properties (a struct) or an additionalProperties schema (a map)")
        if kind == "null":
            raise self.fail(path, 'the type "null" alone holds nothing; write ["T", "null"] for a nullable T')
        raise self.fail(path, f"unknown type {_brief(kind)}")

    def struct_fields(self, schema: Mapping[str, Any], path: str, active: tuple[str, ...]) -> list[pa.Field]:
        """The Arrow fields of the object ``schema``'s properties, in their order."""
        properties = schema["properties"]
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
            raise self.fail(path, f"required must be a list of property names, not {_brief(required)}")
        fields = []
        for name, sub in properties.items():
            kind, nullable = self.type_of(sub, _join(path, name), active)
            fields.append(pa.field(name, kind, nullable=nullable or name not in required))
        return fields


# ------------------------------------------------------------------------------------------------ dispatch


def value_schema_from(spec: object) -> pa.Schema:
    """The value schema ``spec`` describes, whatever its form.

    Accepted: a :class:`pyarrow.Schema` (checked as it is); a DDL string (:func:`~.value_schema.parse_ddl`);
    an Avro record schema (a dict with ``"type": "record"``, or its JSON text); a JSON Schema object (a dict
    with ``"properties"``, ``"$schema"`` or ``"type": "object"``, or its JSON text); or the path (a string or
    :class:`os.PathLike`) of a file holding one of the textual forms (``.avsc``, ``.json`` or DDL text).
    Text starting with ``{`` is JSON; a string naming an existing file is read first.

    Raises :class:`~segment_format.errors.InvalidConfigError` when ``spec`` is none of these or is invalid.
    """
    if isinstance(spec, pa.Schema):
        return check_schema(spec)
    if isinstance(spec, Mapping):
        return _from_json_object(spec)
    if isinstance(spec, os.PathLike):
        return _from_text(_read(Path(spec)), f"file {os.fspath(spec)!r}")
    if isinstance(spec, str):
        text = spec.strip()
        if text.startswith(("{", "[", '"')):
            return _from_text(text, "value schema")
        if text and os.path.isfile(text):
            return _from_text(_read(Path(text)), f"file {text!r}")
        if os.sep in text or "/" in text or text.lower().endswith(_SCHEMA_SUFFIXES):
            raise InvalidConfigError(f"value schema file {text!r} does not exist")
        return _from_text(text, "value schema")
    raise InvalidConfigError(f"a value schema cannot be made from {type(spec).__name__}; give {_FORMS}")


def _read(path: Path) -> str:
    if not path.is_file():
        raise InvalidConfigError(f"value schema file {str(path)!r} does not exist or is not a file")
    try:
        return path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidConfigError(f"value schema file {str(path)!r} cannot be read: {exc}") from None


def _from_text(text: str, source: str) -> pa.Schema:
    """The value schema of textual ``text``: JSON (Avro or JSON Schema) when it starts so, else DDL."""
    text = text.strip()
    if not text:
        raise InvalidConfigError(f"{source} is empty; give {_FORMS}")
    if text.startswith(("{", "[", '"')):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidConfigError(f"{source}: not valid JSON: {exc}") from None
        if not isinstance(doc, Mapping):
            raise InvalidConfigError(f"{source}: JSON {_brief(doc)} is not an object; give {_FORMS}")
        return _from_json_object(doc)
    return parse_ddl(text)


def _from_json_object(doc: Mapping[str, Any]) -> pa.Schema:
    if doc.get("type") == "record":
        return schema_from_avro(doc)
    if any(key in doc for key in ("properties", "$schema", "$ref")) or doc.get("type") == "object":
        return schema_from_json_schema(doc)
    raise InvalidConfigError(
        f"the JSON object {_brief(doc)} is neither an Avro record nor a JSON Schema; give {_FORMS}"
    )
