"""Segment objects: Arrow IPC record batches with a checksummed batch index.

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
from collections.abc import Collection, Generator, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import google_crc32c
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from .documents import JsonDocument
from .errors import CorruptRecordError, InvalidConfigError
from .layout import rewrite_id_of
from .parallel import ordered_imap, ordered_map, submit
from .records import RECORD_SCHEMA
from .storage import Store
from .typed_layout import TypedLayout, layout_for

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


@dataclass(frozen=True)
class BatchMeta:
    """What a producer states about a batch besides its records."""

    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    attributes: int = 0
    #: Transaction number of a transactional batch (PROTOCOL.md 11.2), -1 otherwise.
    transaction: int = -1


@dataclass
class EncodedBatch:
    """One record batch already serialised as an Arrow IPC message, with its index row.

    ``message`` is any bytes-like object (an Arrow buffer when freshly encoded, bytes or a memoryview
    when taken from a stored object): the segment's assembly copies it into the object once.
    """

    message: bytes | pa.Buffer | memoryview
    #: The index row: INDEX_SCHEMA's columns, and a typed batch's ``value_stats`` (PROTOCOL.md 11.8).
    row: dict[str, Any]


#: Length of the schema message that opens every IPC stream of RECORD_SCHEMA (computed once).
_RECORD_SCHEMA_BYTES = RECORD_SCHEMA.serialize().to_pybytes()
_SCHEMA_LENGTH = len(_RECORD_SCHEMA_BYTES)


def encode_batch(
    batch: pa.RecordBatch, meta: BatchMeta, options: ipc.IpcWriteOptions, layout: TypedLayout | None = None
) -> EncodedBatch:
    """Serialise one record batch (with offsets) to its IPC message and index row.

    ``layout``: the batch is a typed topic's (its ``value`` a struct of that version's fields), stored
    as that version's columns (PROTOCOL.md 11.8).
    """
    return encode_batches_together([batch], [meta], options, layout)[0]


def encode_batches_together(
    batches: Sequence[pa.RecordBatch],
    metas: Sequence[BatchMeta],
    options: ipc.IpcWriteOptions,
    layout: TypedLayout | None = None,
) -> list[EncodedBatch]:
    """Serialise record batches (with offsets, one schema) to their IPC messages and index rows, with
    one Arrow call for them all: each message is the one its batch alone would give (Arrow writes a
    stream message by message), a slice of one stream buffer.

    One call rather than one per batch matters beyond the arithmetic. A thread that encodes while
    another runs Python (a producer's sender under a loop of ``send``) takes the GIL back after each
    Arrow call that let go of it, and each time it waits out the interpreter's switch interval first.
    ``layout``: as for :func:`encode_batch`.
    """
    if any(batch.num_rows == 0 for batch in batches):
        raise ValueError("a stored batch holds at least one record")
    stored = list(batches) if layout is None else [layout.to_stored(batch) for batch in batches]
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, stored[0].schema, options=options) as writer:
        writer.write_table(pa.Table.from_batches(stored))  # a message per batch: chunks are kept as they are
    stream = sink.getvalue()
    reader = pa.BufferReader(stream)
    ipc.read_message(reader)  # the schema message
    start = reader.tell()
    encoded = []
    for batch, stored_batch, meta in zip(batches, stored, metas, strict=True):
        ipc.read_message(reader)
        end = reader.tell()
        # A slice of the stream's buffer, not a bytes copy: the segment's assembly copies it once, into the object.
        message = stream.slice(start, end - start)
        encoded.append(EncodedBatch(message, _index_row(batch, stored_batch, meta, message, layout)))
        start = end
    return encoded


def _index_row(
    batch: pa.RecordBatch,
    stored: pa.RecordBatch,
    meta: BatchMeta,
    message: pa.Buffer,
    layout: TypedLayout | None,
) -> dict[str, Any]:
    """A freshly encoded batch's index row (``stored``: the batch as stored, ``message`` its IPC message)."""
    offsets = batch.column(0)
    timestamps = batch.column(1).view(pa.int64())  # timestamp[ms] as its int64 ms, without a cast kernel
    ts_np = timestamps.to_numpy(zero_copy_only=False)
    row = {
        "base_offset": int(offsets[0].as_py()),
        "last_offset": int(offsets[-1].as_py()),
        "record_count": batch.num_rows,
        "first_timestamp": int(ts_np[0]),
        "max_timestamp": int(ts_np.max()),
        "crc32c": int(google_crc32c.value(message)),
        "producer_id": meta.producer_id,
        "producer_epoch": meta.producer_epoch,
        "base_sequence": meta.base_sequence,
        "attributes": meta.attributes,
        "uncompressed_bytes": stored.nbytes,
        "transaction": meta.transaction,
    }
    if layout is not None:
        row["value_stats"] = layout.batch_stats(stored)
    return row


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
_COMPACTION_FIELDS = ("min_append_ms", "max_append_ms", "clean_end", "first_compacted_ms", "compacted_ms")


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


def assemble_segment(
    batches: Sequence[EncodedBatch], meta_fields: dict[str, Any], layout: TypedLayout | None = None
) -> tuple[bytes, SegmentMeta]:
    """Lay out already-encoded batches as one segment object (:class:`SegmentParts`, joined)."""
    parts = SegmentParts(batches, meta_fields, layout)
    data = b"".join(parts)
    return data, parts.meta


class SegmentParts:
    """A segment object's bytes, produced in order, part by part, as its batches arrive::

        schema message | batch message 1 | ... | batch message n | end of stream | index | tail

    Iterating yields the parts; once it is done, :attr:`meta` and :attr:`size` describe the object and
    :attr:`parts` holds every part (to send the object again after a failed create). Batches may be an
    iterator that encodes them on the fly: the index and the tail, which depend on every batch, come
    last, so a store can write the first batches while later ones are still being compressed.

    ``meta_fields`` supplies the fields of :class:`SegmentMeta` that the batches cannot tell
    (next_offset, compression, writer, append_id, writer_epoch...); counts, timestamps and the schema
    CRC are computed here. With ``running_max_floor`` the object's ``running_max_timestamp`` is the
    greater of it and the batches' greatest timestamp (an append's, PROTOCOL.md 6). Batch messages are
    copied verbatim, so their CRCs stay valid when segments are merged. ``layout``: the batches were
    encoded as that value schema version's (PROTOCOL.md 11.8), which the object states.
    """

    def __init__(
        self,
        batches: Iterable[EncodedBatch],
        meta_fields: dict[str, Any],
        layout: TypedLayout | None = None,
        running_max_floor: int | None = None,
    ) -> None:
        self._batches = batches
        self._meta_fields = meta_fields
        self._layout = layout
        self._running_max_floor = running_max_floor
        self.parts: list[bytes | pa.Buffer | memoryview] = []
        self._meta: SegmentMeta | None = None
        self.size = 0
        self._producer = self._produce()
        self._failure: BaseException | None = None

    @property
    def meta(self) -> SegmentMeta:
        """The object's segment JSON, once every part has been produced."""
        if self._meta is None:
            raise RuntimeError("the segment's parts have not all been produced yet")
        return self._meta

    def __iter__(self) -> Iterator[bytes | pa.Buffer | memoryview]:
        """Every part in order. Iterating again, after a complete or an interrupted pass (a store that
        failed mid-write), yields the parts produced so far and then produces the rest."""
        done = 0
        while True:
            while done < len(self.parts):
                yield self.parts[done]
                done += 1
            if self._meta is not None:
                return
            if self._failure is not None:
                raise self._failure
            try:
                next(self._producer)
            except StopIteration:
                pass
            except BaseException as exc:  # an encoding failure: every later pass raises it too
                self._failure = exc
                raise

    def close(self) -> None:
        """Stop producing (after a store gave up mid-write): batches not yet encoded are cancelled, and
        the producing generator, which refers to this object, lets it go now rather than at the next
        garbage collection. Parts produced so far stay; a complete object is unaffected."""
        self._producer.close()

    def _produce(self) -> Generator[None, None, None]:
        """Append the next part to :attr:`parts` at each step; the last step also sets :attr:`meta`."""
        layout = self._layout
        schema_bytes = _RECORD_SCHEMA_BYTES if layout is None else layout.schema_bytes
        self._part(schema_bytes)
        yield None
        rows = []
        for encoded in self._batches:
            rows.append({**encoded.row, "position": self.size, "length": len(encoded.message)})
            self._part(encoded.message)
            yield None
        position = self.size
        self._part(END_OF_STREAM)
        position += len(END_OF_STREAM)
        meta_fields = self._meta_fields
        if not rows and "min_timestamp" not in meta_fields:
            # Only a compacted object may hold no batch (PROTOCOL.md 11.6), and it states its timestamps.
            raise ValueError("a segment holds at least one batch")
        if layout is not None:
            meta_fields = {
                **meta_fields,
                "value_schema_version": layout.version,
                "value_schema": layout.encoded,
                "format_version": TYPED_FORMAT_VERSION,
            }
        if self._running_max_floor is not None:
            batch_max = max(r["max_timestamp"] for r in rows)
            meta_fields = {**meta_fields, "running_max_timestamp": max(self._running_max_floor, batch_max)}
        stated = ("base_offset", "extra", SCHEMA_CRC_KEY, "min_timestamp", "max_timestamp")
        meta = SegmentMeta(
            base_offset=meta_fields.get("base_offset", rows[0]["base_offset"] if rows else 0),
            record_count=sum(r["record_count"] for r in rows),
            batch_count=len(rows),
            min_timestamp=min(r["first_timestamp"] for r in rows) if rows else meta_fields["min_timestamp"],
            max_timestamp=max(r["max_timestamp"] for r in rows) if rows else meta_fields["max_timestamp"],
            # The schema message is outside every batch CRC; the (checksummed) index carries its CRC.
            schema_crc32c=crc32c(schema_bytes),
            extra=dict(meta_fields.get("extra", {})),
            **{k: v for k, v in meta_fields.items() if k not in stated},
        )
        index_schema = INDEX_SCHEMA
        if layout is not None and rows and all(r.get("value_stats") is not None for r in rows):
            # Statistics only when every batch has them (a merge of objects that lack them omits the column).
            index_schema = INDEX_SCHEMA.append(pa.field("value_stats", layout.stats_type))
        else:
            rows = [{k: v for k, v in r.items() if k != "value_stats"} for r in rows]
        table = pa.Table.from_pylist(rows, schema=index_schema).replace_schema_metadata(
            {"plog.segment": meta.to_json()}
        )
        sink = pa.BufferOutputStream()
        with ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        index_bytes = sink.getvalue().to_pybytes()
        self._part(index_bytes + TAIL.pack(position, crc32c(index_bytes), meta.format_version, MAGIC))
        self._meta = meta

    def _part(self, part: bytes | pa.Buffer | memoryview) -> None:
        self.parts.append(part)
        self.size += len(part)


#: numpy types of the index's fixed-width columns, for :func:`_index_column_numpy`.
_INDEX_NUMPY_TYPES: dict[pa.DataType, np.dtype[Any]] = {
    pa.int64(): np.dtype(np.int64),
    pa.int32(): np.dtype(np.int32),
    pa.int16(): np.dtype(np.int16),
    pa.uint32(): np.dtype(np.uint32),
}


def _index_column_numpy(column: pa.ChunkedArray) -> np.ndarray:
    """A null-free fixed-width index column as numpy, without pyarrow's ``to_numpy``.

    ``to_numpy`` imports pandas on its first call in a process, about 150 ms of CPU: a cost every Spark
    query's source runner and every fresh Python worker paid on its first index, which needs none of it.
    One chunk (an index as read) is a view of its buffer; a column of several is joined.
    """
    dtype = _INDEX_NUMPY_TYPES.get(column.type)
    if dtype is None or column.null_count:
        return column.to_numpy()
    parts = [
        np.frombuffer(chunk.buffers()[1], dtype=dtype, count=len(chunk), offset=chunk.offset * dtype.itemsize)
        for chunk in column.chunks
    ]
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)


class SegmentIndex:
    """The parsed batch index of one segment object, searchable by offset and time.

    Arrays are numpy, so finding the batch for an offset or a timestamp is a
    binary search in memory after one read of the object's tail.
    """

    def __init__(self, key: str, size: int, meta: SegmentMeta, table: pa.Table) -> None:
        self.key = key
        self.size = size
        self.meta = meta
        self.table = table
        cols = {name: _index_column_numpy(table.column(name)) for name in INDEX_SCHEMA.names}
        self.base_offsets: np.ndarray = cols["base_offset"]
        self.last_offsets: np.ndarray = cols["last_offset"]
        self.positions: np.ndarray = cols["position"]
        self.lengths: np.ndarray = cols["length"]
        self.crcs: np.ndarray = cols["crc32c"]
        self.record_counts: np.ndarray = cols["record_count"]
        self.first_timestamps: np.ndarray = cols["first_timestamp"]
        self.max_timestamps: np.ndarray = cols["max_timestamp"]
        self.attributes: np.ndarray = cols["attributes"]
        self.producer_ids: np.ndarray = cols["producer_id"]
        self.producer_epochs: np.ndarray = cols["producer_epoch"]
        self.base_sequences: np.ndarray = cols["base_sequence"]
        self.transactions: np.ndarray = cols["transaction"]
        #: A typed object's per-batch field statistics (PROTOCOL.md 11.8), or None when it has none.
        self.value_stats: pa.ChunkedArray | None = (
            table.column("value_stats") if "value_stats" in table.column_names and meta.layout is not None else None
        )

    @property
    def batch_count(self) -> int:
        """Number of batches in the segment."""
        return len(self.base_offsets)

    def batch_for_offset(self, offset: int) -> int:
        """Index of the first batch whose last offset is >= ``offset`` (== batch_count if none)."""
        return int(np.searchsorted(self.last_offsets, offset, side="left"))

    def batch_for_timestamp(self, timestamp_ms: int) -> int:
        """Index of the first batch holding a record with timestamp >= ``timestamp_ms``.

        Uses the running maximum of batch max timestamps, Kafka's time index rule,
        so the answer is exact even when CreateTime goes backwards between batches.
        """
        running = np.maximum.accumulate(self.max_timestamps)
        return int(np.searchsorted(running, timestamp_ms, side="left"))


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


def parse_index_bytes(key: str, size: int, index_bytes: bytes | memoryview) -> SegmentIndex:
    """Parse the (already checksummed) index stream of object ``key``.

    The index must start with the columns of :data:`INDEX_SCHEMA`; columns a
    later writer appended after them are kept in ``table`` and otherwise
    ignored (PROTOCOL.md 12.4). Raises
    :class:`CorruptRecordError` when the stream or its header does not parse
    or the known columns differ.
    """
    try:
        table = ipc.open_stream(pa.py_buffer(index_bytes)).read_all()
        meta = SegmentMeta.from_json(table.schema.metadata[b"plog.segment"])
    except (pa.ArrowException, KeyError, TypeError, ValueError, CorruptRecordError) as exc:
        raise CorruptRecordError(f"segment index does not parse: {exc}", key=key) from exc
    known = pa.schema(list(table.schema.remove_metadata())[: len(INDEX_SCHEMA)])
    if known != INDEX_SCHEMA:  # later versions may append columns; readers ignore them
        raise CorruptRecordError("segment index has an unexpected schema", key=key)
    _check_typed_header(key, meta)
    return SegmentIndex(key, size, meta, table)


def _check_typed_header(key: str, meta: SegmentMeta) -> None:
    """A typed object states its version, its stored schema and format version 2; an untyped one none
    of them (PROTOCOL.md 11.8): else a reader would decode its batches with the wrong schema."""
    typed = (meta.value_schema_version is not None, meta.value_schema is not None)
    if typed == (False, False):
        if meta.format_version != FORMAT_VERSION:
            raise CorruptRecordError(f"untyped segment states format_version {meta.format_version}", key=key)
        return
    if typed != (True, True) or meta.format_version != TYPED_FORMAT_VERSION or meta.schema_crc32c is None:
        raise CorruptRecordError(
            "typed segment must state value_schema_version, value_schema, schema_crc32c and format_version "
            f"{TYPED_FORMAT_VERSION}",
            key=key,
        )
    try:
        meta.layout  # noqa: B018 - decodes and caches the schema, or fails here rather than at a batch
    except (ValueError, pa.ArrowException) as exc:
        raise CorruptRecordError(f"typed segment's value_schema does not decode: {exc}", key=key) from exc


def index_problems(index: SegmentIndex) -> list[tuple[str, int | None]]:
    """What in the index disagrees with itself: ``(problem, offset)`` pairs, empty when nothing does.

    Rows must lie in offset order, each claiming at least one record and no more
    than its offsets span; an appended object (generation 0) must hold each offset
    of its range once; the header's counts, offsets and timestamps must be those of
    the rows (PROTOCOL.md 6.3). Readers raise the first problem
    (:func:`check_index_consistency`); the verifier reports them all.
    """
    m, n = index.meta, index.batch_count
    if n == 0:
        if rewrite_id_of(index.key) is not None:  # a compacted object may hold no record (PROTOCOL.md 11.6)
            empty = m.record_count == 0 and m.batch_count == 0
            return [] if empty else [("segment header counts records its index lacks", None)]
        return [("index lists no batches", None)]
    bases, lasts, counts = index.base_offsets, index.last_offsets, index.record_counts
    first_ts, max_ts = index.first_timestamps, index.max_timestamps
    out: list[tuple[str, int | None]] = []
    if m.batch_count != n:
        out.append((f"segment header says batch_count {m.batch_count} but the index has {n} rows", m.base_offset))
    impossible = (counts < 1) | (lasts < bases) | (lasts - bases + 1 < counts)
    unordered = np.zeros(n, dtype=bool)
    unordered[1:] = bases[1:] <= lasts[:-1]
    for i in np.flatnonzero(impossible | unordered):
        base, last = int(bases[i]), int(lasts[i])
        if impossible[i]:
            claim = f"index row {i} claims offsets {base}..{last} with {int(counts[i])} record(s)"
            out.append((f"{claim}: impossible", base))
        if unordered[i]:
            out.append(
                (
                    f"index row {i} claims offsets {base}..{last}, out of order: not after the previous "
                    f"row's last offset {int(lasts[i - 1])}",
                    base,
                )
            )
    if m.generation == 0 and (
        int(bases[0]) != m.base_offset
        or int(lasts[-1]) + 1 != m.next_offset
        or bool((lasts - bases + 1 != counts).any())
        or bool((bases[1:] != lasts[:-1] + 1).any())
    ):
        # An appended object holds every offset of its range (5, 8): only compaction (reserved) leaves gaps.
        # Else a last object claiming a next_offset past its records would move the log end offset.
        out.append(
            (
                f"appended segment covers [{m.base_offset}, {m.next_offset}) but its batches do not hold "
                f"each of those offsets once ({int(bases[0])}..{int(lasts[-1])}, {int(counts.sum())} records)",
                m.base_offset,
            )
        )
    header = []
    if m.record_count != int(counts.sum()):
        header.append(f"record_count {m.record_count} but the batches hold {int(counts.sum())}")
    if m.base_offset > int(bases[0]) or m.next_offset <= int(lasts[-1]):
        header.append(
            f"offsets [{m.base_offset}, {m.next_offset}) but the batches hold {int(bases[0])}..{int(lasts[-1])}"
        )
    if m.min_timestamp != int(first_ts.min()) or m.max_timestamp != int(max_ts.max()):
        header.append(
            f"timestamps [{m.min_timestamp}, {m.max_timestamp}] but the batches span "
            f"[{int(first_ts.min())}, {int(max_ts.max())}]"
        )
    if m.running_max_timestamp < m.max_timestamp:
        header.append(f"running_max_timestamp {m.running_max_timestamp} is below max_timestamp {m.max_timestamp}")
    return out + [(f"segment header says {p}", m.base_offset) for p in header]


def check_index_consistency(index: SegmentIndex, index_position: int) -> None:
    """Raise :class:`CorruptRecordError` unless the index agrees with itself and with the object's layout.

    The index CRC only says the index is the one its writer wrote; a writer's
    bug (or a forged index with a fresh CRC) can still lie. A reader relies on
    these facts without decoding every batch (binary searches, LSO scans,
    read_committed skipping aborted batches), so they are checked once, when
    the index is parsed (PROTOCOL.md 6.3): :func:`index_problems`, and the batches tiling the
    data part from the first batch to the end-of-stream marker just before
    ``index_position``.
    """
    problems = index_problems(index)
    if problems:
        raise CorruptRecordError(problems[0][0], key=index.key, offset=problems[0][1])
    key = index.key
    if index.batch_count == 0:  # an empty compacted object: the schema message, then the end-of-stream marker
        layout = index.meta.layout
        schema_length = _SCHEMA_LENGTH if layout is None else len(layout.schema_bytes)
        if index_position != schema_length + len(END_OF_STREAM):
            raise CorruptRecordError("an empty segment holds bytes besides its schema and end marker", key=key)
        return
    positions, lengths = index.positions, index.lengths
    ends = positions + lengths
    if (
        int(positions[0]) <= 0
        or bool((lengths <= 0).any())
        or bool((positions[1:] != ends[:-1]).any())
        or int(ends[-1]) + len(END_OF_STREAM) != index_position
    ):
        raise CorruptRecordError(
            f"segment index's batch positions do not tile the data part [{int(positions[0])}, {index_position})",
            key=key,
        )


def parse_index(key: str, size: int, tail_bytes: bytes, tail_start: int, store: Store | None = None) -> SegmentIndex:
    """Parse a segment's index from bytes ``[tail_start, size)`` of the object.

    If the index starts before ``tail_start`` the missing bytes are fetched
    from ``store``. Any inconsistency raises :class:`CorruptRecordError`.
    The steps (:func:`parse_tail`, :func:`check_index_checksum`,
    :func:`parse_index_bytes`) are public so the verifier accepts exactly what
    this reader accepts.
    """
    tail = parse_tail(key, size, tail_bytes)
    index_end = size - TAIL.size
    if tail.index_position >= tail_start:
        # A copy: the index is cached long after the object's bytes are dropped, and a slice of an Arrow
        # buffer (an object read whole) would keep the whole object alive with it.
        index_bytes = bytes(tail_bytes[tail.index_position - tail_start : index_end - tail_start])
    else:
        if store is None:
            raise CorruptRecordError("segment index lies outside the bytes given", key=key)
        index_bytes = store.get_range(key, tail.index_position, index_end)
    check_index_checksum(key, tail, index_bytes)
    index = parse_index_bytes(key, size, index_bytes)
    if index.meta.format_version != tail.format_version:
        raise CorruptRecordError(
            f"segment tail says format version {tail.format_version}, its header {index.meta.format_version}", key=key
        )
    check_index_consistency(index, tail.index_position)
    return index


def read_index(store: Store, key: str, size: int | None = None) -> SegmentIndex:
    """Read and verify the index of segment object ``key`` (one or two range reads)."""
    return read_segment(store, key, size)[0]


def read_segment(
    store: Store, key: str, size: int | None = None, whole: int = 0
) -> tuple[SegmentIndex, bytes | pa.Buffer | None]:
    """Read and verify the index of segment object ``key``, and the whole object when it is small.

    An object of at most ``whole`` bytes (``0``: never) is read whole, in one
    request, and returned with its index, so that a reader about to read its
    batches needs no second request; otherwise only its end is read (the
    last :data:`TAIL_READ` bytes, or ``whole`` when larger), and ``None`` is
    returned for the bytes. When ``size`` is unknown the object's end is read
    with :meth:`Store.get_suffix`, which tells the size (on S3 one request,
    present or absent). The index is verified exactly as :func:`parse_index`
    verifies it; the returned bytes are not: each batch is verified when it is
    decoded (:func:`decode_range`).
    """
    want = max(whole, TAIL_READ)
    if size is None:
        data, size = store.get_suffix(key, want)
        tail_start = size - len(data)
    else:
        tail_start = 0 if size <= whole else max(0, size - TAIL_READ)
        # Bytes whose batches are about to be decoded are read into Arrow's memory (Store.get_range_buffer).
        read = store.get_range_buffer if size <= whole else store.get_range
        data = read(key, tail_start, size)
    if len(data) != size - tail_start:
        raise CorruptRecordError(f"segment object is {tail_start + len(data)} bytes, expected {size}", key=key)
    index = parse_index(key, size, data, tail_start, store)
    return index, (data if tail_start == 0 and size <= whole else None)


def check_batch_checksum(index: SegmentIndex, i: int, message: bytes | memoryview) -> None:
    """Raise :class:`CorruptRecordError` unless batch ``i``'s message has the length and CRC32C its index row gives."""
    base, last = int(index.base_offsets[i]), int(index.last_offsets[i])
    if len(message) != int(index.lengths[i]):
        raise CorruptRecordError(
            f"record batch {i} (offsets {base}..{last}) is {len(message)} bytes, "
            f"the index says {int(index.lengths[i])}",
            key=index.key,
            offset=base,
        )
    actual = crc32c(message)
    if actual != int(index.crcs[i]):
        raise CorruptRecordError(
            f"record batch {i} (offsets {base}..{last}) fails its CRC32C "
            f"({actual:08x}, the index says {int(index.crcs[i]):08x})",
            key=index.key,
            offset=base,
        )


def decode_message(
    index: SegmentIndex, i: int, message: bytes | memoryview, fields: Sequence[str] | None = None
) -> pa.RecordBatch:
    """Decode batch ``i``'s (already checksummed) message with :data:`RECORD_SCHEMA`, or a typed
    object's stored schema (PROTOCOL.md 11.8), giving the logical batch (``value`` a struct).

    Columns a writer appended after the record schema's are not decoded. ``fields`` (typed objects):
    decode only these value fields, so that their buffers alone are decompressed.
    Raises :class:`CorruptRecordError` when the message does not decode.
    """
    layout = index.meta.layout
    try:
        if layout is None:
            return ipc.read_record_batch(ipc.read_message(pa.py_buffer(message)), RECORD_SCHEMA)
        included = layout.stored_indices(fields)
        if included is None:
            stored = ipc.read_record_batch(ipc.read_message(pa.py_buffer(message)), layout.stored_schema)
        else:  # selective decoding needs a stream reader: the schema message, then the batch
            stream = pa.py_buffer(layout.schema_bytes + bytes(message))
            options = ipc.IpcReadOptions(included_fields=included)
            stored = ipc.open_stream(stream, options=options).read_next_batch()
    except (pa.ArrowException, OSError, ValueError) as exc:  # pyarrow raises OSError for bad framing
        raise CorruptRecordError(
            f"record batch {i} does not decode: {exc}", key=index.key, offset=int(index.base_offsets[i])
        ) from exc
    return layout.from_stored(stored, fields, key=index.key)


def decode_batch(
    index: SegmentIndex, i: int, message: bytes | memoryview, fields: Sequence[str] | None = None
) -> pa.RecordBatch:
    """Verify batch ``i``'s message against its CRC32C and decode it (``fields``: see :func:`decode_message`)."""
    check_batch_checksum(index, i, message)
    batch = decode_message(index, i, message, fields)
    problems = batch_problems(index, i, batch)
    if problems:
        raise CorruptRecordError(problems[0], key=index.key, offset=int(index.base_offsets[i]))
    return batch


def batch_problems(index: SegmentIndex, i: int, batch: pa.RecordBatch) -> list[str]:
    """What in decoded batch ``i`` disagrees with its index row: its record count, offsets and timestamps.

    Readers take offsets from the ``offset`` column (PROTOCOL.md 5) but find
    batches by the index: a batch whose records are not the ones its row
    claims would be returned at the wrong place (6.3). Readers raise the first
    problem (:func:`decode_batch`); the verifier reports them all.
    """
    base, last, count = int(index.base_offsets[i]), int(index.last_offsets[i]), int(index.record_counts[i])
    out = []
    if batch.num_rows != count:
        out.append(f"record batch {i} holds {batch.num_rows} record(s), the index says {count}")
    if batch.num_rows == 0:
        return out
    offsets, stamps = batch.column(0), batch.column(1)
    if offsets.null_count or stamps.null_count:
        return [*out, f"record batch {i} has null offsets or timestamps"]
    values = offsets.to_numpy()
    if int(values[0]) != base or int(values[-1]) != last:
        out.append(f"record batch {i} holds offsets {int(values[0])}..{int(values[-1])}, the index says {base}..{last}")
    if bool((np.diff(values) <= 0).any()):
        out.append(f"record batch {i} offsets are not strictly increasing")
    ms = stamps.view(pa.int64()).to_numpy()
    first_ts, max_ts = int(index.first_timestamps[i]), int(index.max_timestamps[i])
    if int(ms[0]) != first_ts or int(ms.max()) != max_ts:
        out.append(
            f"record batch {i} timestamps start at {int(ms[0])} with max {int(ms.max())}; "
            f"the index says {first_ts} and {max_ts}"
        )
    return out


def schema_crc32c(meta: SegmentMeta) -> int | None:
    """The CRC32C of the schema message that the segment header records (None: written before it existed)."""
    return meta.schema_crc32c


def check_schema_message(index: SegmentIndex, schema: bytes | memoryview) -> None:
    """Verify the schema message that opens the data stream, which no batch CRC covers.

    Plain ``pyarrow.ipc.open_stream`` readers depend on it, so damage there is
    reported like damage anywhere else: :class:`CorruptRecordError`.
    """
    expected = schema_crc32c(index.meta)
    layout = index.meta.layout
    if layout is not None:  # typed: the CRC, and the message is that of the version the object states (11.8)
        try:
            ok = expected is not None and crc32c(schema) == expected
            ok = ok and ipc.read_schema(pa.py_buffer(bytes(schema))).equals(layout.stored_schema, check_metadata=True)
        except (pa.ArrowException, OSError, ValueError):
            ok = False
    elif expected is not None:
        ok = crc32c(schema) == expected
    else:  # written before the schema CRC existed: the schema must at least parse to RECORD_SCHEMA
        try:
            ok = ipc.read_schema(pa.py_buffer(bytes(schema))).equals(RECORD_SCHEMA)
        except (pa.ArrowException, OSError, ValueError):  # pyarrow raises OSError for bad framing
            ok = False
    if not ok:
        raise CorruptRecordError(f"segment schema message (bytes [0, {len(schema)})) is damaged", key=index.key)


def check_end_of_stream(index: SegmentIndex, eos: bytes | memoryview) -> None:
    """Verify the end-of-stream marker after the last batch (no batch CRC covers it either)."""
    if bytes(eos) != END_OF_STREAM:
        raise CorruptRecordError("segment end-of-stream marker is damaged", key=index.key)


def batch_range(index: SegmentIndex, first: int, last: int) -> tuple[int, int]:
    """The bytes ``[start, end)`` a read of batches ``first..last`` needs (see :func:`read_batches`)."""
    start = 0 if first == 0 else int(index.positions[first])
    batches_end = int(index.positions[last] + index.lengths[last])
    end = batches_end + len(END_OF_STREAM) if last == index.batch_count - 1 else batches_end
    return start, end


def decode_range(
    index: SegmentIndex,
    first: int,
    last: int,
    start: int,
    data: bytes | memoryview | pa.Buffer,
    fields: Sequence[str] | None = None,
    skip: Collection[int] = (),
    decoded: Mapping[int, Future[pa.RecordBatch]] | None = None,
) -> list[pa.RecordBatch | None]:
    """Verify and decode batches ``first..last`` from ``data``, the object's bytes from ``start`` on.

    ``data`` must begin at or before :func:`batch_range`'s start and may run
    past its end (bytes read ahead); bytes it lacks are corruption (the object
    is shorter than its index says). Every check :func:`read_batches` makes
    is made here, on every call, whether the bytes were just read or kept
    from an earlier request. Batches in ``skip`` are not decoded (None in
    their place): a reader that will not return their records.

    ``decoded``: batches of this object already decoding with these
    ``fields`` (:func:`decode_range_ahead`), taken instead of being decoded
    again. Each was verified as :func:`decode_batch` verifies; its failure
    is raised here, when its turn in the range comes.
    """
    lo_needed, end = batch_range(index, first, last)
    batches_end = int(index.positions[last] + index.lengths[last])
    if start > lo_needed or start + len(data) < end:
        raise CorruptRecordError(
            "segment object is shorter than its index says", key=index.key, offset=int(index.base_offsets[first])
        )
    view = memoryview(data)
    if first == 0:  # then start is 0
        check_schema_message(index, view[: int(index.positions[0])])
    if end != batches_end:
        check_end_of_stream(index, view[batches_end - start : end - start])

    def decode(i: int) -> pa.RecordBatch | None:
        return None if i in skip else decode_batch(index, i, _message(index, i, start, view), fields)

    if not decoded:
        # Decompression releases the GIL: the batches of a range decode on a few threads at once.
        return ordered_map(decode, range(first, last + 1))
    numbers = range(first, last + 1)
    fresh = ordered_imap(decode, [i for i in numbers if i not in decoded and i not in skip])  # all start now
    # Taken in order, so that the first failure in order is raised, as without batches decoded ahead.
    return [None if i in skip else decoded[i].result() if i in decoded else next(fresh) for i in numbers]


def decode_range_ahead(
    index: SegmentIndex,
    first: int,
    last: int,
    start: int,
    data: bytes | memoryview | pa.Buffer,
    fields: Sequence[str] | None,
) -> dict[int, Future[pa.RecordBatch]]:
    """Start decoding batches ``first..last`` from ``data`` (the object's bytes from ``start`` on) on the
    pool, for a read expected next; pass the futures to :func:`decode_range` as ``decoded``.

    Only batches wholly inside ``data`` are started. Each is verified and decoded exactly as
    :func:`decode_batch` does, so a damaged batch fails when its future is taken, not before.
    """
    view = memoryview(data)
    out: dict[int, Future[pa.RecordBatch]] = {}
    for i in range(first, last + 1):
        if int(index.positions[i] + index.lengths[i]) > start + len(view):
            break
        out[i] = submit(partial(decode_batch, index, i, _message(index, i, start, view)), fields)
    return out


def _message(index: SegmentIndex, i: int, start: int, view: memoryview) -> memoryview:
    """Batch ``i``'s message in ``view``, the object's bytes from ``start`` on (which hold it whole)."""
    lo = int(index.positions[i]) - start
    return view[lo : lo + int(index.lengths[i])]


def read_batches(store: Store, index: SegmentIndex, first: int, last: int) -> list[pa.RecordBatch]:
    """Read batches ``first..last`` (inclusive) with one range read, each verified.

    The range is widened to take in the schema message when ``first`` is the
    first batch and the end-of-stream marker when ``last`` is the last one,
    so that a whole read checks every byte before the index.
    """
    start, end = batch_range(index, first, last)
    batches = decode_range(index, first, last, start, store.get_range(index.key, start, end))
    return [b for b in batches if b is not None]  # none is skipped


def raw_messages(store: Store, index: SegmentIndex, whole: bytes | None = None) -> list[EncodedBatch]:
    """All batches of a segment as verified raw messages with their index rows (for merging).

    ``whole``: the object's bytes, already read with its index; else the batches are read in one range.
    """
    if index.batch_count == 0:
        return []
    start = int(index.positions[0])
    end = int(index.positions[-1] + index.lengths[-1])
    if whole is not None and len(whole) == index.size:
        data = whole[start:end]
    else:
        data = store.get_range(index.key, start, end)
    rows = index.table.to_pylist()
    out = []
    for i, row in enumerate(rows):
        lo = int(index.positions[i]) - start
        message = data[lo : lo + int(index.lengths[i])]
        check_batch_checksum(index, i, message)
        row = {k: v for k, v in row.items() if k not in ("position", "length")}
        out.append(EncodedBatch(message, row))
    return out
