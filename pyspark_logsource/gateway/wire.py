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

import io
import struct
from collections.abc import Hashable
from dataclasses import dataclass
from functools import cache
from typing import Any, cast

from kio.index import load_request_schema, load_response_schema
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer

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
        header, header_size = _reader(header_type)(frame, 0)
        body, body_size = _reader(body_type)(frame, header_size)
    except Exception as exc:  # noqa: BLE001 - kio's readers raise several kinds on bad bytes; all mean the same
        raise MalformedRequestError(
            f"API key {key} version {version} (correlation id {correlation_id}) does not decode: {exc}"
        ) from exc
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
