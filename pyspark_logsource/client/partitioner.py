"""Kafka's default key partitioner, bit-for-bit.

Kafka assigns a record with a non-null key to partition
``toPositive(murmur2(serializedKey)) % numPartitions``
(``org.apache.kafka.clients.producer.internals.BuiltInPartitioner.partitionForKey``), where
``murmur2`` is ``org.apache.kafka.common.utils.Utils.murmur2`` and ``toPositive`` masks off the
sign bit. This module reproduces both exactly, as a scalar reference implementation and as a
vectorised NumPy implementation over pyarrow binary/string arrays.

Null keys are not hashed by Kafka (the producer spreads them with its sticky partitioner); here
they are reported as ``-1`` and the caller decides where they go.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa

__all__ = [
    "MURMUR2_SEED",
    "kafka_partition",
    "murmur2",
    "murmur2_array",
    "partitions_for_keys",
    "to_positive",
]

MURMUR2_SEED = 0x9747B28C
_M = 0x5BD1E995
_R = 24
_MASK32 = 0xFFFFFFFF

# NumPy scalars so that array arithmetic stays in uint32 (and wraps) on every NumPy version.
_SEED_U32 = np.uint32(MURMUR2_SEED)
_M_U32 = np.uint32(_M)
_R_U32 = np.uint32(_R)
_S8 = np.uint32(8)
_S13 = np.uint32(13)
_S15 = np.uint32(15)
_S16 = np.uint32(16)
_S24 = np.uint32(24)
_POSITIVE_MASK_U32 = np.uint32(0x7FFFFFFF)

KeyArray: TypeAlias = pa.Array | pa.ChunkedArray


def murmur2(data: bytes) -> int:
    """Return Kafka's ``Utils.murmur2`` hash of ``data`` as a signed 32-bit int.

    This is a line-by-line port of the Java code (seed ``0x9747b28c``, ``m = 0x5bd1e995``,
    ``r = 24``): ``h = seed ^ length``; each little-endian 4-byte block is mixed in; the
    1-3 trailing bytes are folded in with the Java ``switch`` fall-through; then the final
    avalanche ``h ^= h >>> 13; h *= m; h ^= h >>> 15``. Java ``int`` overflow is emulated by
    masking to 32 bits, and the result is reinterpreted as signed, exactly as Java returns it.
    """
    data = bytes(data)
    length = len(data)
    h = (MURMUR2_SEED ^ length) & _MASK32
    nblocks = length // 4
    for i in range(nblocks):
        i4 = i * 4
        k = data[i4] | (data[i4 + 1] << 8) | (data[i4 + 2] << 16) | (data[i4 + 3] << 24)
        k = (k * _M) & _MASK32
        k ^= k >> _R
        k = (k * _M) & _MASK32
        h = (h * _M) & _MASK32
        h ^= k
    tail = length & ~3
    rem = length % 4
    if rem == 3:
        h ^= data[tail + 2] << 16
    if rem >= 2:
        h ^= data[tail + 1] << 8
    if rem >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def to_positive(n: int) -> int:
    """Return ``n & 0x7fffffff``, Kafka's ``Utils.toPositive`` (clears the sign bit; not ``abs``)."""
    return n & 0x7FFFFFFF


def _check_num_partitions(num_partitions: int) -> None:
    """Raise ``ValueError`` unless ``0 < num_partitions <= 2**31 - 1`` (a positive Java int)."""
    if not 0 < num_partitions <= 0x7FFFFFFF:
        raise ValueError(f"num_partitions must be a positive 32-bit int, got {num_partitions}")


def kafka_partition(key: bytes, num_partitions: int) -> int:
    """Return the partition Kafka's default partitioner picks for a non-null serialized ``key``.

    Equal to ``to_positive(murmur2(key)) % num_partitions``. Raises ``ValueError`` if
    ``num_partitions`` is not a positive 32-bit int.
    """
    _check_num_partitions(num_partitions)
    return to_positive(murmur2(key)) % num_partitions


def _as_binary_array(arr: pa.Array) -> pa.Array:
    """Return ``arr`` as a (large) binary/string array whose buffers are [validity, offsets, data]."""
    t = arr.type
    if pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t):
        return arr
    if pa.types.is_large_string(t):
        return arr
    try:
        return arr.cast(pa.large_binary())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise TypeError(f"cannot hash keys of Arrow type {t}; expected binary or string") from exc


def _mixed_block(data: npt.NDArray[np.uint8], pos: npt.NDArray[np.int64]) -> npt.NDArray[np.uint32]:
    """Read the little-endian 4-byte blocks at byte positions ``pos`` and apply the k-mix."""
    k = (
        data[pos].astype(np.uint32)
        | (data[pos + 1].astype(np.uint32) << _S8)
        | (data[pos + 2].astype(np.uint32) << _S16)
        | (data[pos + 3].astype(np.uint32) << _S24)
    )
    k *= _M_U32
    k ^= k >> _R_U32
    k *= _M_U32
    return k


def _hash_chunk(arr: pa.Array) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.bool_] | None]:
    """Hash one Arrow array; return (uint32 hashes, null mask or None if there are no nulls)."""
    arr = _as_binary_array(arr)
    n = len(arr)
    if n == 0:
        return np.empty(0, dtype=np.uint32), None
    large = pa.types.is_large_binary(arr.type) or pa.types.is_large_string(arr.type)
    off_dtype = np.int64 if large else np.int32
    _, off_buf, data_buf = arr.buffers()[:3]
    # Offsets of a sliced array start at arr.offset; the data buffer is never sliced.
    raw_offsets = np.frombuffer(off_buf, dtype=off_dtype, count=arr.offset + n + 1)[arr.offset :]
    offsets: npt.NDArray[np.int64] = raw_offsets.astype(np.int64, copy=False)
    data: npt.NDArray[np.uint8] = (
        np.empty(0, dtype=np.uint8) if data_buf is None else np.frombuffer(data_buf, dtype=np.uint8)
    )

    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    nblocks = lengths >> 2
    rem = lengths & 3

    with np.errstate(over="ignore"):
        h = _SEED_U32 ^ lengths.astype(np.uint32)

        # Block phase, column-wise: at step j only rows with more than j blocks take part.
        # Blocks that every row has are done on whole columns (no row gather/scatter).
        max_blocks = int(nblocks.max())
        min_blocks = int(nblocks.min())
        for j in range(min_blocks):
            h *= _M_U32
            h ^= _mixed_block(data, starts + 4 * j)
        # The remaining blocks: rows with more than min_blocks blocks are ordered by block count
        # (descending) once, so the rows still having block j are a prefix of that order and the
        # work is proportional to the number of blocks, however skewed the key lengths are.
        if max_blocks > min_blocks:
            longer = np.flatnonzero(nblocks > min_blocks)
            order = longer[np.argsort(-nblocks[longer], kind="stable")]
            neg_sorted_nb = -nblocks[order]  # ascending
            # active[i] = number of rows with nblocks > min_blocks + i
            active = np.searchsorted(neg_sorted_nb, -np.arange(min_blocks, max_blocks), side="left")
            for j, count in zip(range(min_blocks, max_blocks), active.tolist(), strict=True):
                rows = order[:count]
                hr = h[rows]
                hr *= _M_U32
                hr ^= _mixed_block(data, starts[rows] + 4 * j)
                h[rows] = hr

        # Tail phase: the Java switch falls through 3 -> 2 -> 1, then h *= m once.
        tail = starts + (nblocks << 2)
        r3 = np.flatnonzero(rem == 3)
        if r3.size:
            h[r3] ^= data[tail[r3] + 2].astype(np.uint32) << _S16
        r2 = np.flatnonzero(rem >= 2)
        if r2.size:
            h[r2] ^= data[tail[r2] + 1].astype(np.uint32) << _S8
        r1 = np.flatnonzero(rem >= 1)
        if r1.size:
            hr = h[r1]
            hr ^= data[tail[r1]].astype(np.uint32)
            hr *= _M_U32
            h[r1] = hr

        # Final avalanche.
        h ^= h >> _S13
        h *= _M_U32
        h ^= h >> _S15

    nulls: npt.NDArray[np.bool_] | None = None
    if arr.null_count:
        nulls = np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=np.bool_)
    return h, nulls


def _hash_keys(
    keys: KeyArray | Sequence[bytes | str | None],
) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.bool_] | None]:
    """Hash every key of an Arrow array, chunked array, or Python sequence of bytes/str/None."""
    if isinstance(keys, pa.ChunkedArray):
        chunks = [_hash_chunk(c) for c in keys.chunks]
    elif isinstance(keys, pa.Array):
        chunks = [_hash_chunk(keys)]
    else:
        chunks = [_hash_chunk(pa.array(list(keys)))]
    if not chunks:
        return np.empty(0, dtype=np.uint32), None
    if len(chunks) == 1:
        return chunks[0]
    h = np.concatenate([c[0] for c in chunks])
    if all(c[1] is None for c in chunks):
        return h, None
    nulls = np.concatenate([c[1] if c[1] is not None else np.zeros(len(c[0]), dtype=np.bool_) for c in chunks])
    return h, nulls


def murmur2_array(keys: KeyArray | Sequence[bytes | str | None]) -> npt.NDArray[np.int32]:
    """Vectorised :func:`murmur2` over a pyarrow binary/string array; returns signed int32 hashes.

    ``keys`` may be a ``pa.Array`` or ``pa.ChunkedArray`` of ``binary``, ``large_binary``,
    ``string`` or ``large_string`` (strings are hashed as their UTF-8 bytes, as a Kafka
    ``StringSerializer`` would produce), including sliced arrays with a non-zero offset. Other
    Arrow types are cast to ``large_binary`` when Arrow supports it. A Python sequence of
    ``bytes``/``str``/``None`` is accepted for convenience and converted with ``pa.array``.

    The work is done on the offsets and data buffers viewed as NumPy arrays in uint32
    arithmetic (which wraps like Java ``int``): one pass per 4-byte block index over the rows
    that still have such a block, one pass per tail byte, and the final mix. There is no
    per-row Python loop.

    Null keys: the corresponding entries are ``-1``. Note that ``-1`` is also a possible hash
    of a real key, so use ``keys.is_null()`` to tell them apart, or use
    :func:`partitions_for_keys`, where ``-1`` is unambiguous.
    """
    h, nulls = _hash_keys(keys)
    out = h.view(np.int32)
    if nulls is not None:
        out[nulls] = -1
    return out


def partitions_for_keys(keys: KeyArray | Sequence[bytes | str | None], num_partitions: int) -> npt.NDArray[np.int32]:
    """Vectorised :func:`kafka_partition`: ``to_positive(murmur2(key)) % num_partitions`` per key.

    Accepts the same inputs as :func:`murmur2_array`. Null keys map to ``-1`` (never a valid
    partition); the caller is expected to spread them itself. Raises ``ValueError`` if
    ``num_partitions`` is not a positive 32-bit int.
    """
    _check_num_partitions(num_partitions)
    h, nulls = _hash_keys(keys)
    parts = ((h & _POSITIVE_MASK_U32) % np.uint32(num_partitions)).astype(np.int32)
    if nulls is not None:
        parts[nulls] = -1
    return parts
