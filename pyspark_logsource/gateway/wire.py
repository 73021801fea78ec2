"""Kafka's wire framing: size-prefixed requests in, size-prefixed responses out.

A request on the wire::

    +----------+----------------------------+---------------------------+
    | size i32 | request header (v1 or v2)  | request body (per API and |
    |          | api key, version, corr. id,|  version, kio's entity)   |
    |          | client id [, tagged fields]|                           |
    +----------+----------------------------+---------------------------+

The header and body types are kio's, generated from Kafka's own JSON message
definitions, so no struct here is written by hand. The header's version follows
the body's: flexible versions (compact strings, tagged fields) use header v2,
the others v1; a response uses the header its schema names (ApiVersions always
answers with header v0, KIP-511, so that a client learns the versions even when
it asked with one the gateway does not know).
"""

from __future__ import annotations

import dataclasses
import io
import struct
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from functools import cache
from typing import Any, cast

from kio.index import load_request_schema, load_response_schema
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer

from .entities import null_violation
from .errors import MalformedRequestError

API_VERSIONS_KEY = 18
_PREFIX = struct.Struct(">hhi")  # api key, api version, correlation id: the same in every header version


@dataclass(frozen=True)
class Request:
    """One decoded request: its header's fields and kio's body entity."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any
    size: int


@dataclass(frozen=True)
class UnsupportedVersion:
    """A request whose API the gateway serves, at a version it does not: only ApiVersions gets an answer."""

    api_key: int
    api_version: int
    correlation_id: int


@cache
def _reader(entity: type) -> Any:
    return entity_reader(entity)


@cache
def _writer(entity: type) -> Any:
    return entity_writer(entity)


# ------------------------------------------------------------------------------ length checks before kio
#
# kio's native reader reserves memory for an array as soon as it reads the array's length: a frame of a few
# dozen bytes announcing 2**35 elements makes it ask for hundreds of GiB, and Rust aborts the whole process on a
# failed allocation (no exception to catch). Kafka's own parser refuses a length larger than the bytes left.
# So before kio sees a frame, this walk does the same: it follows the request's schema (kio's field metadata,
# as kio's own writer does) and checks every length (arrays, strings, bytes, tagged fields) against the bytes
# that remain, and that varints have at most 5 bytes, as in Kafka. It builds nothing.

_Check = Callable[[bytes, int, int], int]

_FIXED_SIZES = {
    "int8": 1, "uint8": 1, "bool": 1, "int16": 2, "uint16": 2, "error_code": 2, "int32": 4, "uint32": 4,
    "timedelta_i32": 4, "int64": 8, "uint64": 8, "float64": 8, "timedelta_i64": 8, "datetime_i64": 8, "uuid": 16,
}  # fmt: skip
_MAX_VARINT_BYTES = 5  # Kafka's unsigned varints are 32-bit


class _Short(Exception):
    """A length or field runs past the frame (turned into MalformedRequestError by the caller)."""


def _uvarint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    for i in range(_MAX_VARINT_BYTES):
        if pos + i >= end:
            raise _Short(f"varint at byte {pos} runs past the end")
        byte = buf[pos + i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos + i + 1
        shift += 7
    raise _Short(f"varint at byte {pos} is longer than {_MAX_VARINT_BYTES} bytes")


def _skip(pos: int, size: int, end: int, what: str) -> int:
    if size > end - pos:
        raise _Short(f"{what} of {size} bytes at byte {pos}, only {end - pos} left")
    return pos + size


def _length(buf: bytes, pos: int, end: int, flexible: bool, legacy_width: int) -> tuple[int, int]:
    """A length (-1 for null) in its compact (varint of length+1) or legacy (int16/int32) form."""
    if flexible:
        value, pos = _uvarint(buf, pos, end)
        return value - 1, pos
    _skip(pos, legacy_width, end, "length")
    return int.from_bytes(buf[pos : pos + legacy_width], "big", signed=True), pos + legacy_width


def _primitive_check(kafka_type: str, flexible: bool, legacy_string: bool = False) -> _Check:
    if kafka_type in _FIXED_SIZES:
        size = _FIXED_SIZES[kafka_type]
        return lambda buf, pos, end: _skip(pos, size, end, kafka_type)
    if kafka_type in ("string", "bytes", "records"):
        compact = flexible and not legacy_string
        width = 2 if kafka_type == "string" else 4

        def check(buf: bytes, pos: int, end: int) -> int:
            size, pos = _length(buf, pos, end, compact, width)
            return pos if size < 0 else _skip(pos, size, end, kafka_type)

        return check
    raise MalformedRequestError(f"no length check for the Kafka type {kafka_type!r}")  # a kio we do not know


def _array_check(element: _Check, flexible: bool, min_element: int) -> _Check:
    def check(buf: bytes, pos: int, end: int) -> int:
        count, pos = _length(buf, pos, end, flexible, 4)
        if count < 0:
            return pos
        if count * min_element > end - pos:
            raise _Short(f"array of {count} elements at byte {pos}, only {end - pos} bytes left")
        for _ in range(count):
            pos = element(buf, pos, end)
        return pos

    return check


def _field_check(field: dataclasses.Field[Any], flexible: bool, header: bool, tagged: bool) -> _Check:
    from kio.serial._introspect import (  # kio's own field classification (as its writer uses it)
        EntityField,
        EntityTupleField,
        PrimitiveTupleField,
        classify_field,
        get_schema_field_type,
        is_optional,
    )

    kind = classify_field(field)
    if isinstance(kind, (EntityField, EntityTupleField)):
        inner = _entity_check(kind.type_)
        if isinstance(kind, EntityTupleField):
            return _array_check(inner, flexible, 1)
        if is_optional(field) and not tagged:  # KIP-893: an int8 marker, -1 for null, before a nullable struct

            def nullable(buf: bytes, pos: int, end: int) -> int:
                _skip(pos, 1, end, "null marker")
                return pos + 1 if buf[pos] == 0xFF else inner(buf, pos + 1, end)

            return nullable
        return inner
    kafka_type = get_schema_field_type(field)
    element = _primitive_check(kafka_type, flexible, legacy_string=header and field.name == "client_id")
    if isinstance(kind, PrimitiveTupleField):
        return _array_check(element, flexible, _FIXED_SIZES.get(kafka_type, 1))
    return element


@cache
def _entity_check(entity: type) -> _Check:
    from kio.serial._introspect import get_field_tag

    flexible = bool(getattr(entity, "__flexible__"))  # noqa: B009 - a kio class attribute mypy cannot see
    header = entity.__name__ == "RequestHeader"
    plain: list[_Check] = []
    tagged: dict[int, _Check] = {}
    for field in dataclasses.fields(entity):
        tag = get_field_tag(field)
        check = _field_check(field, flexible, header, tag is not None)
        if tag is None:
            plain.append(check)
        else:
            tagged[int(tag)] = check

    def check_entity(buf: bytes, pos: int, end: int) -> int:
        for check in plain:
            pos = check(buf, pos, end)
        if not flexible:
            return pos
        count, pos = _uvarint(buf, pos, end)
        if count > end - pos:
            raise _Short(f"{count} tagged fields at byte {pos}, only {end - pos} bytes left")
        for _ in range(count):
            tag, pos = _uvarint(buf, pos, end)
            size, pos = _uvarint(buf, pos, end)
            field_end = _skip(pos, size, end, f"tagged field {tag}")
            if tag in tagged:
                tagged[tag](buf, pos, field_end)
            pos = field_end
        return pos

    return check_entity


def check_lengths(frame: bytes, header_type: type, body_type: type) -> None:
    """Raise MalformedRequestError if a length in ``frame`` (header, then body) exceeds the bytes left."""
    try:
        pos = _entity_check(header_type)(frame, 0, len(frame))
        _entity_check(body_type)(frame, pos, len(frame))
    except _Short as exc:
        raise MalformedRequestError(str(exc)) from None


def peek_header(frame: bytes) -> tuple[int, int, int]:
    """The api key, version and correlation id of a frame, without decoding the rest."""
    if len(frame) < _PREFIX.size:
        raise MalformedRequestError(f"request of {len(frame)} bytes is shorter than a request header")
    key, version, correlation_id = _PREFIX.unpack_from(frame)
    return int(key), int(version), int(correlation_id)


def decode_request(frame: bytes, supported: dict[int, tuple[int, int]]) -> Request | UnsupportedVersion:
    """Decode a frame (without its size prefix) into a :class:`Request`.

    ``supported`` maps each API key the gateway serves to its (min, max) version.
    An unknown API key, bytes that do not decode, or bytes left over after the
    body raise :class:`MalformedRequestError` (the caller closes the connection,
    as Kafka's broker does); a served API at a version outside its range comes
    back as :class:`UnsupportedVersion`.
    """
    key, version, correlation_id = peek_header(frame)
    if key not in supported:
        raise MalformedRequestError(f"unknown or unsupported API key {key} (correlation id {correlation_id})")
    low, high = supported[key]
    if not low <= version <= high:
        return UnsupportedVersion(key, version, correlation_id)
    body_type = load_request_schema(key, version)
    header_type = RequestHeaderV2 if body_type.__flexible__ else RequestHeaderV1
    try:
        check_lengths(frame, header_type, body_type)  # before kio, which would reserve memory for any length
        header, header_size = _reader(header_type)(frame, 0)
        body, body_size = _reader(body_type)(frame, header_size)
    except Exception as exc:  # noqa: BLE001 - kio's readers raise several kinds on bad bytes; all mean the same
        raise MalformedRequestError(
            f"API key {key} version {version} (correlation id {correlation_id}) does not decode: {exc}"
        ) from exc
    null = null_violation(body)
    if null is not None:
        raise MalformedRequestError(
            f"API key {key} version {version} (correlation id {correlation_id}) does not decode: "
            f"{null} is null, which its schema does not allow"
        )
    # Bytes after the body are ignored, as Kafka's broker ignores them (its parser reads the fields it
    # knows); librdkafka sends some after a Metadata request. They are never interpreted.
    return Request(key, version, correlation_id, header.client_id, body, len(frame))


def encode_response(correlation_id: int, body: Any) -> bytes:
    """A response frame, size prefix included, for kio's response entity ``body``."""
    header_type = body.__header_schema__
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    _writer(header_type)(out, header_type(correlation_id=correlation_id))
    _writer(cast(Hashable, type(body)))(out, body)
    frame = out.getbuffer()
    struct.pack_into(">i", frame, 0, len(frame) - 4)
    return bytes(frame)


def response_type(api_key: int, api_version: int) -> type:
    """kio's response entity for an API at a version."""
    return load_response_schema(api_key, api_version)
