"""Kafka record batches (magic v2) to and from plog's Arrow payloads: the batch around the records.

::

    baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8 (2) | crc uint32 |
    attributes int16 | lastOffsetDelta int32 | baseTimestamp int64 | maxTimestamp int64 |
    producerId int64 | producerEpoch int16 | baseSequence int32 | recordCount int32 | records ...
    (crc: CRC-32C of the bytes from attributes to the end of the records)

A batch is this 61-byte header and its records section, compressed as one block when bits 0-2 of the
attributes name a codec (:mod:`.compression`). Here a batch is framed, checked (length, magic, CRC, codec,
count) and its header read or written; the records section itself, decoded and encoded a whole buffer at
once, is :mod:`.record_codec`'s, so that the header's rules and the per-record layout each read on their own.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import cramjam
import google_crc32c
import numpy as np
import pyarrow as pa

from .compression import CODEC_IDS, CODEC_NAMES, compress, decompress
from .errors import CorruptRecordBatchError
from .record_codec import decode_records, empty_payload, encode_records

# baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
# baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordCount
_HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = _HEADER.size  # 61
_CRC_START = 21  # the CRC covers attributes .. end of the batch
_LENGTH_END = 12  # batchLength counts the bytes after itself (from partitionLeaderEpoch on)
_HEAD = struct.Struct(">qi")  # baseOffset, batchLength
_TAIL = struct.Struct(">hiqqqhii")  # attributes .. recordCount, the part the CRC covers

CODEC_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08  # 1 = LogAppendTime
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20


@dataclass(frozen=True)
class DecodedBatch:
    """One decoded record batch: its header fields and its records as a payload batch."""

    base_offset: int
    partition_leader_epoch: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    payload: pa.RecordBatch  # PAYLOAD_SCHEMA, one row per record, in order
    offset_deltas: np.ndarray  # int64, each record's offset delta

    @property
    def record_count(self) -> int:
        """How many records the batch holds (0 for a control batch, whose records are not decoded)."""
        return len(self.offset_deltas)

    @property
    def codec(self) -> str | None:
        """The compression codec's name, or None."""
        return CODEC_NAMES[self.attributes & CODEC_MASK]

    @property
    def transactional(self) -> bool:
        """Whether the batch belongs to a transaction (attributes bit 4)."""
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def control(self) -> bool:
        """Whether this is a control batch (transaction markers; attributes bit 5)."""
        return bool(self.attributes & CONTROL_BIT)

    @property
    def log_append_time(self) -> bool:
        """Whether the timestamps are LogAppendTime (attributes bit 3) rather than CreateTime."""
        return bool(self.attributes & TIMESTAMP_TYPE_BIT)


# ---------------------------------------------------------------------------------------------- decoding


def decode_batches(data: bytes | memoryview, *, max_uncompressed_bytes: int) -> list[DecodedBatch]:
    """Decode the record batches in ``data`` (a Produce request's ``records``: batches back to back).

    Each batch's records section may decompress to at most ``max_uncompressed_bytes``. Raises
    :class:`CorruptRecordBatchError`, naming what is wrong, for any bytes that are not whole valid
    magic-v2 batches -- never any other exception. A control batch is returned with an empty payload.
    With LogAppendTime every record's timestamp is the batch's maxTimestamp (as Kafka reads it).
    """
    raw = data if isinstance(data, bytes) else bytes(data)
    batches = []
    pos = 0
    end = len(raw)
    while pos < end:
        try:
            batch, pos = _decode_one(raw, pos, max_uncompressed_bytes)
        except CorruptRecordBatchError as exc:
            raise CorruptRecordBatchError(f"record batch at byte {pos}: {exc}") from None
        except (
            IndexError,
            ValueError,
            OverflowError,
            struct.error,
            UnicodeDecodeError,
            pa.ArrowException,
            cramjam.DecompressionError,
        ) as exc:
            raise CorruptRecordBatchError(f"record batch at byte {pos} does not decode: {exc}") from None
        batches.append(batch)
    return batches


def _decode_one(raw: bytes, pos: int, max_uncompressed: int) -> tuple[DecodedBatch, int]:
    left = len(raw) - pos
    if left < HEADER_SIZE:
        raise CorruptRecordBatchError(f"{left} trailing bytes, fewer than a batch header's {HEADER_SIZE}")
    (
        base_offset,
        batch_length,
        leader_epoch,
        magic,
        crc,
        attributes,
        last_offset_delta,
        base_ts,
        max_ts,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    ) = _HEADER.unpack_from(raw, pos)
    if magic != 2:
        raise CorruptRecordBatchError(f"magic {magic} not supported (only magic 2 record batches)")
    total = _LENGTH_END + batch_length
    if batch_length < HEADER_SIZE - _LENGTH_END:
        raise CorruptRecordBatchError(f"batch length {batch_length} shorter than a batch header")
    if total > left:
        raise CorruptRecordBatchError(f"batch length {batch_length} beyond the {left - _LENGTH_END} bytes given")
    end = pos + total
    actual = google_crc32c.value(raw[pos + _CRC_START : end])
    if actual != crc:
        raise CorruptRecordBatchError(f"CRC mismatch: header says {crc:#010x}, bytes give {actual:#010x}")
    codec_id = attributes & CODEC_MASK
    if codec_id not in CODEC_NAMES:
        raise CorruptRecordBatchError(f"unknown codec {codec_id}")
    if count < 0:
        raise CorruptRecordBatchError(f"negative record count {count}")
    fields = (
        base_offset,
        leader_epoch,
        attributes,
        last_offset_delta,
        base_ts,
        max_ts,
        producer_id,
        producer_epoch,
        base_sequence,
    )
    if attributes & CONTROL_BIT:
        return DecodedBatch(*fields, empty_payload(), np.empty(0, np.int64)), end
    body: bytes | memoryview = raw[pos + HEADER_SIZE : end]
    codec = CODEC_NAMES[codec_id]
    if codec is not None:
        body = decompress(codec, body, max_uncompressed)
    elif len(body) > max_uncompressed:
        raise CorruptRecordBatchError(f"records of {len(body)} bytes beyond max_uncompressed_bytes")
    timestamp = max_ts if attributes & TIMESTAMP_TYPE_BIT else None
    payload, deltas = decode_records(body, count, base_ts, timestamp)
    return DecodedBatch(*fields, payload, deltas), end


def encode_batch(
    records: pa.RecordBatch | pa.Table,
    *,
    base_offset: int | None = None,
    compression: str | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    attributes: int = 0,
    partition_leader_epoch: int = 0,
    log_append_time_ms: int | None = None,
) -> bytes:
    """Encode ``records`` (RECORD_SCHEMA: offset, timestamp, key, value, headers) as one magic-v2 batch.

    Offsets may have gaps (records compacted away or aborted): ``base_offset`` defaults to the first row's
    offset, each record's offset delta is its offset minus it, and lastOffsetDelta is the last one's.
    ``compression`` (None, ``gzip``, ``snappy``, ``lz4`` or ``zstd``) sets the codec bits, ``attributes``
    adds others (transactional, control); ``log_append_time_ms`` marks the timestamps LogAppendTime and
    makes it the batch's maxTimestamp. Returns the complete batch, CRC and length filled in.
    """
    table = records if isinstance(records, pa.Table) else pa.Table.from_batches([records])
    n = table.num_rows
    offsets = table.column("offset").to_numpy().astype(np.int64)
    stamps = table.column("timestamp").cast(pa.int64()).to_numpy().astype(np.int64)
    if base_offset is None:
        if n == 0:
            raise ValueError("an empty batch needs its base_offset")
        base_offset = int(offsets[0])
    codec_bits = 0 if compression is None else CODEC_IDS.get(compression, -1)
    if codec_bits < 0:
        raise ValueError(f"unknown compression {compression!r}; expected one of {sorted(CODEC_IDS)} or None")
    attrs = (attributes & ~CODEC_MASK) | codec_bits
    if n:
        base_ts = int(stamps[0])
        max_ts = int(stamps.max())
        deltas = offsets - base_offset
        section: bytes | pa.Buffer = encode_records(
            deltas,
            stamps - base_ts,
            table.column("key").combine_chunks(),
            table.column("value").combine_chunks(),
            table.column("headers").combine_chunks(),
        )
        last_delta = int(deltas[-1])
    else:
        base_ts = max_ts = -1
        section = b""
        last_delta = 0
    if log_append_time_ms is not None:
        attrs |= TIMESTAMP_TYPE_BIT
        max_ts = log_append_time_ms
    if compression is not None:
        section = compress(compression, section)
    tail = _TAIL.pack(attrs, last_delta, base_ts, max_ts, producer_id, producer_epoch, base_sequence, n)
    crc = google_crc32c.extend(google_crc32c.value(tail), section)
    head = _HEAD.pack(base_offset, HEADER_SIZE - _LENGTH_END + len(section)) + struct.pack(
        ">ibI", partition_leader_epoch, 2, crc
    )
    return b"".join([head, tail, section])
