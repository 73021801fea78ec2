"""Kafka's record-batch compression codecs (gzip, snappy, lz4, zstd), all through cramjam.

The codec id is bits 0-2 of a record batch's attributes. What real clients write:

- gzip: a gzip stream;
- snappy: the Java client and librdkafka write snappy in xerial's framing (the magic ``\\x82SNAPPY\\x00``,
  two int32 version numbers, then blocks of ``[int32 length][raw snappy]``); some clients write raw snappy.
  Both are read; the xerial form is written;
- lz4: the LZ4 *frame* format;
- zstd: a zstd frame.

Decompression is bounded: an input that inflates beyond ``max_bytes`` is refused before more than
``max_bytes + 1`` bytes are ever held, so a decompression bomb costs no more memory than an honest batch.
"""

from __future__ import annotations

import struct

import cramjam
import numpy as np

from .errors import CorruptRecordBatchError

#: Codec names by the id in bits 0-2 of a batch's attributes (0 is no compression).
CODEC_NAMES: dict[int, str | None] = {0: None, 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
#: Codec ids by name.
CODEC_IDS: dict[str, int] = {name: cid for cid, name in CODEC_NAMES.items() if name is not None}

XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", 1, 1)  # version 1, compatible with version 1 (what Java writes)
_XERIAL_BLOCK = 32 * 1024  # the Java client's (xerial SnappyOutputStream's) default block size
_INT32 = struct.Struct(">i")


def compress(codec: str, data: bytes | memoryview) -> bytes:
    """Compress a record batch's records section with ``codec`` (``gzip``, ``snappy``, ``lz4`` or ``zstd``)."""
    if codec == "lz4":
        # level 0: LZ4's fast default, what librdkafka and the Java client use (cramjam's default is LZ4 HC)
        return bytes(cramjam.lz4.compress(data, level=0))
    if codec == "zstd":
        return bytes(cramjam.zstd.compress(data))
    if codec == "gzip":
        return bytes(cramjam.gzip.compress(data))
    if codec == "snappy":
        return _xerial_compress(data)
    raise ValueError(f"unknown compression {codec!r}; expected one of {sorted(CODEC_IDS)} or None")


def _xerial_compress(data: bytes | memoryview) -> bytes:
    view = memoryview(data)
    parts = [_XERIAL_HEADER]
    for start in range(0, len(view), _XERIAL_BLOCK):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + _XERIAL_BLOCK]))
        parts.append(_INT32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def decompress(codec: str, data: bytes | memoryview, max_bytes: int) -> memoryview:
    """Decompress a records section; at most ``max_bytes`` of output.

    Raises :class:`CorruptRecordBatchError` when the input does not decompress or its output would
    exceed ``max_bytes``.
    """
    try:
        if codec == "snappy":
            return _snappy_decompress(memoryview(data), max_bytes)
        module = {"gzip": cramjam.gzip, "lz4": cramjam.lz4, "zstd": cramjam.zstd}[codec]
        # decompress_into streams into a fixed buffer and stops when it is full, so a bomb never allocates
        # more than max_bytes + 1 (np.empty only reserves; pages are touched as they are written).
        out = np.empty(max_bytes + 1, np.uint8)
        try:
            written = module.decompress_into(data, out)
        except cramjam.DecompressionError as exc:
            if "failed to write whole buffer" in str(exc):
                raise CorruptRecordBatchError(
                    f"{codec} records decompress beyond max_uncompressed_bytes={max_bytes}"
                ) from None
            raise
        if written > max_bytes:
            raise CorruptRecordBatchError(f"{codec} records decompress beyond max_uncompressed_bytes={max_bytes}")
        return memoryview(out.data)[:written]
    except cramjam.DecompressionError as exc:
        raise CorruptRecordBatchError(f"{codec} records do not decompress: {exc}") from None


def _snappy_decompress(view: memoryview, max_bytes: int) -> memoryview:
    if view[:8] != XERIAL_MAGIC:
        return memoryview(_snappy_raw(view, max_bytes))
    if len(view) < 16:
        raise CorruptRecordBatchError(f"xerial snappy header truncated at {len(view)} bytes")
    blocks = []
    total = 0
    pos = 16  # magic, version, compatible version
    while pos < len(view):
        if pos + 4 > len(view):
            raise CorruptRecordBatchError(f"xerial snappy block length truncated at byte {pos}")
        (size,) = _INT32.unpack_from(view, pos)
        pos += 4
        if size < 0 or pos + size > len(view):
            raise CorruptRecordBatchError(f"xerial snappy block of {size} bytes beyond the {len(view) - pos} left")
        block = _snappy_raw(view[pos : pos + size], max_bytes - total)
        total += len(block)
        blocks.append(block)
        pos += size
    return memoryview(b"".join(blocks))


def _snappy_raw(view: memoryview, max_bytes: int) -> bytes:
    # raw snappy starts with its uncompressed length, so a bomb is refused before anything is allocated
    size = cramjam.snappy.decompress_raw_len(view)
    if size > max_bytes:
        raise CorruptRecordBatchError(f"snappy records decompress beyond max_uncompressed_bytes (to {size} bytes)")
    return bytes(cramjam.snappy.decompress_raw(view))
