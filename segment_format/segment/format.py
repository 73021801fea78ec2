"""Segment objects' byte layout: constants, the segment JSON header, the tail, and checksums.

One segment object holds a run of record batches with increasing offsets. It
is written whole, once, and never changed (PROTOCOL.md 6)::

    +--------------------------------------------------------------+
    | Arrow IPC stream                                             |
    |   schema message (RECORD_SCHEMA)                             |
    |   record batch message 0   <- index row 0: position, length, |
    |   record batch message 1      crc32c, offsets, timestamps,   |
    |   ...                         producer id/epoch/sequence     |
    |   end-of-stream marker (0xFFFFFFFF 0x00000000)               |
    +--------------------------------------------------------------+
    | batch index: an Arrow IPC stream of one table, INDEX_SCHEMA, |
    |   one row per batch; schema metadata "plog.segment" = JSON   |
    +--------------------------------------------------------------+
    | tail, 24 bytes: index position u64 | index crc32c u32 |      |
    |                 format version u32 | magic "PLOGSEG1"        |
    +--------------------------------------------------------------+

Anyone can read the records with ``pyarrow.ipc.open_stream`` (it stops at the
end-of-stream marker); plog reads the tail, then the index, then only the
batches it needs, each checked against its CRC32C before it is decoded.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import google_crc32c
import pyarrow as pa
import pyarrow.ipc as ipc

from ..documents import JsonDocument
from ..errors import CorruptRecordError, InvalidConfigError
from ..typed.layout import TypedLayout, layout_for

#: The format version of untyped objects; typed objects (PROTOCOL.md 11.8) state TYPED_FORMAT_VERSION.
FORMAT_VERSION = 1
TYPED_FORMAT_VERSION = 2
#: The greatest format version this reader knows.
MAX_FORMAT_VERSION = TYPED_FORMAT_VERSION
MAGIC = b"PLOGSEG1"
TAIL = struct.Struct("<QII8s")
END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"
#: How much of an object's end a reader fetches at once, hoping the index fits.
TAIL_READ = 64 * 1024
#: Objects up to this size are read whole, index and batches in one request, by a reader about to read
#: their batches (PROTOCOL.md 9): on S3 each request is billed, and a small object's bytes cost less than a request.
WHOLE_READ = 8 * 1024 * 1024
#: A reader reads at least this much of a larger object per request (whole batches, up to the object's data end),
#: keeping what it read ahead for its next read, so a backlog costs at most one request per this many bytes. As
#: large as WHOLE_READ, so that reading ahead holds no more per partition than a whole read does: with the
#: index's own request, a 64 MiB segment costs 9 GETs, one per 7 MiB (issue 11 asks at most one per 4 MiB).
READ_AHEAD = 8 * 1024 * 1024
#: JSON name of the CRC32C of the schema message in the segment JSON (objects written before it lack it).
SCHEMA_CRC_KEY = "schema_crc32c"

# Batch attribute bits, at the positions Kafka's record batch v2 uses them.
ATTR_LOG_APPEND_TIME = 1 << 3
ATTR_TRANSACTIONAL = 1 << 4
ATTR_CONTROL = 1 << 5

COMPRESSIONS = {"none": None, "lz4": "lz4", "zstd": "zstd", "uncompressed": None, "lz4_frame": "lz4"}

INDEX_SCHEMA = pa.schema(
    [
        pa.field("base_offset", pa.int64(), nullable=False),
        pa.field("last_offset", pa.int64(), nullable=False),
        pa.field("record_count", pa.int32(), nullable=False),
        pa.field("first_timestamp", pa.int64(), nullable=False),
        pa.field("max_timestamp", pa.int64(), nullable=False),
        pa.field("position", pa.int64(), nullable=False),
        pa.field("length", pa.int64(), nullable=False),
        pa.field("crc32c", pa.uint32(), nullable=False),
        pa.field("producer_id", pa.int64(), nullable=False),
        pa.field("producer_epoch", pa.int16(), nullable=False),
        pa.field("base_sequence", pa.int32(), nullable=False),
        pa.field("attributes", pa.int16(), nullable=False),
        pa.field("uncompressed_bytes", pa.int64(), nullable=False),
        pa.field("transaction", pa.int64(), nullable=False),
    ]
)


def crc32c(data: bytes | memoryview) -> int:
    """CRC32C (Castagnoli), the checksum Kafka's record batch v2 uses."""
    if isinstance(data, memoryview):
        # google_crc32c refuses memoryviews but takes an Arrow buffer over the same memory: no copy.
        try:
            data = pa.py_buffer(data)
        except BufferError:  # not contiguous
            data = bytes(data)
    return int(google_crc32c.value(data))


def ipc_options(compression: str) -> ipc.IpcWriteOptions:
    """Arrow IPC write options for a topic's ``compression.type``."""
    try:
        codec = COMPRESSIONS[compression]
    except KeyError:
        raise InvalidConfigError(
            f"compression.type {compression!r} is not one of {sorted(set(COMPRESSIONS) - {'uncompressed'})}"
        ) from None
    return ipc.IpcWriteOptions(compression=codec)


#: The typed optional fields of the segment JSON that writers before them kept in ``extra``, with the key
#: they used there and the JSON type (Python type) of the value. A reader takes the top-level field and,
#: when it is absent, the ``extra`` entry, so that objects written the old way keep their meaning.
LEGACY_EXTRA_FIELDS: dict[str, tuple[str, type]] = {
    "append_id": ("append_id", str),
    "writer_epoch": ("writer_epoch", int),
    "transaction_timeout_ms": ("transaction.timeout.ms", int),
    "schema_crc32c": (SCHEMA_CRC_KEY, int),
}

#: Optional fields of a typed object's segment JSON (PROTOCOL.md 11.8), written only by typed objects.
_TYPED_FIELDS = ("value_schema_version", "value_schema")


#: Optional integer fields of the segment JSON that compaction reads and writes (PROTOCOL.md 11.6).
_COMPACTION_FIELDS = (
    "min_append_ms",
    "max_append_ms",
    "clean_end",
    "first_compacted_ms",
    "compacted_ms",
    "map_end",
)


@dataclass
class SegmentMeta(JsonDocument):
    """The segment-level facts kept in the index's schema metadata (``plog.segment``), one JSON object.

    Required: ``base_offset``, ``next_offset`` (exclusive), ``record_count``,
    ``batch_count``, ``min_timestamp``, ``max_timestamp``,
    ``running_max_timestamp``, ``compression``, ``created_ms``, ``writer``;
    with defaults: ``generation`` (0 appended, >= 1 rewritten),
    ``format_version``, ``extra`` (an object, for genuine extensions).

    Optional, written only when they have a value (never as ``null``)::

        append_id               string   random id of the append attempt (appended objects; PROTOCOL.md 8)
        writer_epoch            integer  lease epoch the object was appended under (11.3)
        transaction_timeout_ms  integer  how long its transaction may stay undecided (11.2)
        schema_crc32c           integer  CRC32C of the schema message (6.3)
        min_append_ms           integer  earliest wall-clock time a record of it was appended (11.6)
        max_append_ms           integer  latest wall-clock time a record of it was appended (11.6)
        clean_end               integer  records below this offset passed through a compaction (11.6)
        first_compacted_ms      integer  every record of it passed its first compaction by then (11.6)
        compacted_ms            integer  when the compaction that wrote it read its clock (11.6)
        map_end                 integer  the end of the offset map of the compaction that wrote it (11.6)
        value_schema_version    integer  typed objects: the value schema version of every batch (11.8)
        value_schema            string   typed objects: that version's stored schema, as the topic keeps it (11.8)

    Objects written before these were fields carry them in ``extra`` (under
    the keys of :data:`LEGACY_EXTRA_FIELDS`); :meth:`from_dict` falls back
    to those, and leaves ``extra`` as stored.
    """

    base_offset: int
    next_offset: int
    record_count: int
    batch_count: int
    min_timestamp: int
    max_timestamp: int
    running_max_timestamp: int
    compression: str
    created_ms: int
    writer: str
    generation: int = 0
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)
    append_id: str | None = None
    writer_epoch: int | None = None
    transaction_timeout_ms: int | None = None
    schema_crc32c: int | None = None
    min_append_ms: int | None = None
    max_append_ms: int | None = None
    clean_end: int | None = None
    first_compacted_ms: int | None = None
    compacted_ms: int | None = None
    map_end: int | None = None
    value_schema_version: int | None = None
    value_schema: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object; optional fields without a value are left out (absent means unknown)."""
        doc = super().to_dict()
        for name in (*LEGACY_EXTRA_FIELDS, *_COMPACTION_FIELDS, *_TYPED_FIELDS):
            if doc[name] is None:
                del doc[name]
        return doc

    def append_bounds(self) -> tuple[int, int]:
        """(earliest, latest) time a record of the object was appended, never narrower than the truth
        (PROTOCOL.md 11.6): without the fields, 0 (unknown, so old) and ``created_ms`` (the object was
        created after every record in it was appended)."""
        low = 0 if self.min_append_ms is None else self.min_append_ms
        high = self.created_ms if self.max_append_ms is None else self.max_append_ms
        return low, high

    @classmethod
    def from_dict(cls, doc: Any, *, what: str = "") -> SegmentMeta:
        """Parse the JSON object, taking each optional field from ``extra`` when an older writer put it there."""
        meta = super().from_dict(doc, what=what)
        for name, (legacy_key, kind) in LEGACY_EXTRA_FIELDS.items():
            value = meta.extra.get(legacy_key)
            if getattr(meta, name) is not None or value is None:
                continue
            if not isinstance(value, kind) or isinstance(value, bool):
                raise CorruptRecordError(
                    f"{what or cls.__name__}: extra field {legacy_key!r} has an invalid value {value!r}"
                )
            setattr(meta, name, value)
        return meta

    @property
    def layout(self) -> TypedLayout | None:
        """How the object's batches are stored: None for an untyped object (section 5's schema)."""
        if self.value_schema_version is None or self.value_schema is None:
            return None
        return layout_for(self.value_schema_version, self.value_schema)


@dataclass(frozen=True)
class SegmentTail:
    """The 24 bytes that end every segment object: where the index starts, its CRC32C, the format version, the magic."""

    index_position: int
    index_crc: int
    format_version: int
    magic: bytes


def parse_tail(key: str, size: int, tail_bytes: bytes | memoryview) -> SegmentTail:
    """The tail of object ``key`` (``size`` bytes), from bytes that end where the object ends, checked.

    Raises :class:`CorruptRecordError` when there is no tail (the object is
    truncated, or not a segment), its version is not one this reader knows,
    or it points outside the object.
    """
    if size < TAIL.size or len(tail_bytes) < TAIL.size:
        raise CorruptRecordError(f"segment object is {size} bytes, too short for its {TAIL.size}-byte tail", key=key)
    tail = SegmentTail(*TAIL.unpack(bytes(tail_bytes[-TAIL.size :])))
    if tail.magic != MAGIC:
        raise CorruptRecordError(
            f"segment object ends in {tail.magic!r}, not the magic {MAGIC!r} (truncated or not a segment)", key=key
        )
    if not 1 <= tail.format_version <= MAX_FORMAT_VERSION:
        raise CorruptRecordError(
            f"segment format version {tail.format_version} is not one this reader knows (1..{MAX_FORMAT_VERSION})",
            key=key,
        )
    index_end = size - TAIL.size
    if not 0 < tail.index_position < index_end:
        raise CorruptRecordError(
            f"segment tail says the index starts at byte {tail.index_position}, outside [1, {index_end})", key=key
        )
    return tail


def check_index_checksum(key: str, tail: SegmentTail, index_bytes: bytes | memoryview) -> None:
    """Raise :class:`CorruptRecordError` unless ``index_bytes`` match the CRC32C the tail gives."""
    actual = crc32c(index_bytes)
    if actual != tail.index_crc:
        raise CorruptRecordError(
            f"segment index fails its CRC32C ({actual:08x}, the tail says {tail.index_crc:08x})", key=key
        )


def schema_crc32c(meta: SegmentMeta) -> int | None:
    """The CRC32C of the schema message that the segment header records (None: written before it existed)."""
    return meta.schema_crc32c
