"""The records section of a Kafka record batch (magic v2), decoded and encoded a whole buffer at once.

Each record is::

    length varint, attributes int8, timestampDelta varlong, offsetDelta varint,
    keyLength varint (-1 null), key, valueLength varint (-1 null), value,
    headerCount varint, then per header: keyLength varint, key (UTF-8), valueLength varint (-1 null), value

(varints are zigzag-encoded, as protobuf's ``sint``). The gateway decodes every produced batch and encodes
every fetched one, so both directions work on whole buffers: one Python step per record (its length prefix,
to find where it starts), then every field of every record at once with numpy, and keys and values gathered
into Arrow arrays by ``take`` over the records buffer, so no per-record ``bytes`` object is made. Only records
that carry headers are parsed one by one.

The batch around the records (its header, CRC and compression) is :mod:`.record_batch`'s; this module sees
only the uncompressed records section, and raises :class:`CorruptRecordBatchError` for what it cannot read.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from segment_format.records import HEADER_TYPE, HEADERS_TYPE, PAYLOAD_SCHEMA, TIMESTAMP_TYPE, null_headers

from .errors import CorruptRecordBatchError

#: The fewest bytes one record can take: a 1-byte length, then attributes, timestampDelta, offsetDelta,
#: keyLength, valueLength and headerCount of one byte each.
MIN_RECORD_SIZE = 7

# Made once, not per batch: column indexes of a varint's bytes, and each byte's shift.
_AR16 = np.arange(16, dtype=np.int64)
_SHIFTS = (np.arange(10, dtype=np.uint64) * np.uint64(7)).astype(np.uint64)
_ONE = np.uint64(1)


# ---------------------------------------------------------------------------------------------- decoding


def empty_payload() -> pa.RecordBatch:
    """A payload batch of no records (a control batch's, whose records are not decoded, or an empty one's)."""
    return pa.RecordBatch.from_pylist([], PAYLOAD_SCHEMA)


def _varint_slow(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """An unsigned varint at ``pos`` (at most 10 bytes): (value, position after it)."""
    value = 0
    for shift in range(0, 70, 7):
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
    raise CorruptRecordBatchError(f"varint longer than 10 bytes at byte {pos - 10}")


def _record_ends(buf: bytes | memoryview, count: int) -> np.ndarray:
    """Where each record ends: the one walk that must go record by record, kept to a few steps a record.

    Reads each length prefix as unsigned (a zigzag length ``n >= 0`` is ``2n``); the caller decodes the
    prefixes again at once and refuses odd (negative) ones, so ``pos`` only moves forward here.
    """
    size = len(buf)
    if count > size // MIN_RECORD_SIZE:  # also bounds the loop below, whatever the lengths say
        raise CorruptRecordBatchError(f"record count {count} does not fit in {size} bytes of records")
    ends: list[int] = []
    add = ends.append
    pos = 0
    try:
        for _ in range(count):
            b = buf[pos]
            if b < 0x80:  # a record below 64 bytes
                pos += 1 + (b >> 1)
            else:
                b2 = buf[pos + 1]
                if b2 < 0x80:  # below 8 KiB
                    pos += 2 + (((b & 0x7F) | (b2 << 7)) >> 1)
                else:
                    v, pos = _varint_slow(buf, pos)
                    pos += v >> 1
            add(pos)
    except IndexError:
        _diagnose_lengths(buf, count)
    if pos != size:
        _diagnose_lengths(buf, count)
    return np.array(ends, np.int64)


def _diagnose_lengths(buf: bytes | memoryview, count: int) -> None:
    """Walk the length prefixes again, slowly and signed, to say what is wrong with them (always raises)."""
    size = len(buf)
    pos = 0
    for i in range(count):
        if pos >= size:
            raise CorruptRecordBatchError(f"record {i} starts past the {size} bytes of records")
        try:
            u, pos = _varint_slow(buf, pos)
        except IndexError:
            raise CorruptRecordBatchError(f"record {i}'s length runs past the {size} bytes of records") from None
        length = (u >> 1) ^ -(u & 1)
        if length < 0:
            raise CorruptRecordBatchError(f"record {i} has a negative length {length}")
        pos += length
    if pos > size:
        raise CorruptRecordBatchError(f"record lengths run {pos - size} bytes past the {size} bytes of records")
    raise CorruptRecordBatchError(f"{size - pos} bytes left after the {count} records the header counts")


def _varints(pad: np.ndarray, pos: np.ndarray, ends: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    """Decode the zigzag varint at each position at once: (int64 values, positions after them).

    ``pad`` is the records buffer followed by at least 10 zero bytes, so no read runs off its end.
    """
    b0 = pad[pos]
    long0 = b0 >= 0x80
    if not long0.any():
        u = b0.astype(np.int64)
        nxt = pos + 1
    else:
        b1 = pad[pos + 1]
        if not (long0 & (b1 >= 0x80)).any():  # every varint one or two bytes
            u = np.where(long0, (b0 & 0x7F).astype(np.int64) | (b1.astype(np.int64) << 7), b0.astype(np.int64))
            nxt = pos + 1 + long0
        else:
            grid = pad[pos[:, None] + _AR16[:10]]
            last = grid < 0x80
            if not last.any(axis=1).all():
                raise CorruptRecordBatchError(f"{what} varint longer than 10 bytes")
            n = last.argmax(axis=1)
            parts = (grid & 0x7F).astype(np.uint64) << _SHIFTS
            parts[_AR16[:10] > n[:, None]] = 0
            u = np.bitwise_or.reduce(parts, axis=1).view(np.int64)
            nxt = pos + 1 + n
    if (nxt > ends).any():
        i = int(np.argmax(nxt > ends))
        raise CorruptRecordBatchError(f"record {i}: {what} runs past the record's end")
    values = (u.view(np.uint64) >> _ONE).view(np.int64) ^ -(u & 1)
    return values, nxt


def _lengths(
    pad: np.ndarray, pos: np.ndarray, ends: np.ndarray, what: str, nullable: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """A length-prefixed byte field in every record: (lengths, -1 for null; start positions)."""
    length, start = _varints(pad, pos, ends, f"{what} length")
    lowest = -1 if nullable else 0
    bad = (length < lowest) | (length > ends - start)
    if bad.any():
        i = int(np.argmax(bad))
        raise CorruptRecordBatchError(
            f"record {i}: {what} length {int(length[i])} is negative "
            f"or beyond the record's {int(ends[i] - start[i])} bytes left"
        )
    return length, start


def _gather(buffer: pa.Buffer, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """The byte strings ``buffer[start:start+length]`` (null where the length is -1) as one BinaryArray.

    The strings lie in order without overlap, so the boundaries ``s0, e0, s1, e1, ...`` are a valid offsets
    buffer over the records buffer itself: a zero-copy array of the strings and the gaps between them, from
    which ``take`` copies every other element in one C loop.
    """
    n = len(starts)
    if n == 0:
        return pa.array([], pa.binary())
    null = lengths < 0
    bounds = np.empty(2 * n, np.int32)
    bounds[0::2] = starts
    bounds[1::2] = starts + np.where(null, 0, lengths)
    spans = pa.Array.from_buffers(pa.binary(), 2 * n - 1, [None, pa.py_buffer(bounds), buffer])
    index = pa.array(np.arange(0, 2 * n, 2, dtype=np.int32), mask=null if null.any() else None)
    return spans.take(index)


def decode_records(
    body: bytes | memoryview, count: int, base_ts: int, log_append_ts: int | None
) -> tuple[pa.RecordBatch, np.ndarray]:
    """The records section ``body`` (uncompressed) of a batch of ``count`` records: its payload batch and each
    record's offset delta. Timestamps are ``base_ts`` plus each record's delta, or ``log_append_ts`` for every
    record when it is given (LogAppendTime)."""
    size = len(body)
    if size >= 2**31 - 16:
        raise CorruptRecordBatchError(f"records of {size} bytes, beyond what one batch may hold")
    ends = _record_ends(body, count)
    if count == 0:
        return empty_payload(), np.empty(0, np.int64)
    pad = np.zeros(size + 16, np.uint8)
    pad[:size] = np.frombuffer(body, np.uint8)
    prefix = np.empty(count, np.int64)
    prefix[0] = 0
    prefix[1:] = ends[:-1]
    length, starts = _varints(pad, prefix, ends, "record length")
    short = (length < MIN_RECORD_SIZE - 1) | (starts + length != ends)
    if short.any():
        i = int(np.argmax(short))
        raise CorruptRecordBatchError(f"record {i} has length {int(length[i])}, shorter than any record")
    pos = starts + 1  # past the record's attributes (unused in v2)
    ts_delta, pos = _varints(pad, pos, ends, "timestampDelta")
    offset_deltas, pos = _varints(pad, pos, ends, "offsetDelta")
    key_len, key_start = _lengths(pad, pos, ends, "key")
    value_len, value_start = _lengths(pad, key_start + np.maximum(key_len, 0), ends, "value")
    header_count, pos = _varints(pad, value_start + np.maximum(value_len, 0), ends, "header count")
    has_headers = header_count != 0
    if has_headers.any():
        if (header_count < 0).any():
            i = int(np.argmax(header_count < 0))
            raise CorruptRecordBatchError(f"record {i}: negative header count {int(header_count[i])}")
        headers = _decode_headers(body, header_count, pos, ends)
        plain = ~has_headers
    else:
        headers = null_headers(count)
        plain = None
    done = pos == ends if plain is None else (pos == ends) | ~plain
    if not done.all():
        i = int(np.argmax(~done))
        raise CorruptRecordBatchError(f"record {i}: {int(ends[i] - pos[i])} bytes left after its last field")
    buffer = pa.py_buffer(pad)
    stamps = ts_delta + base_ts if log_append_ts is None else np.full(count, log_append_ts, np.int64)
    payload = pa.RecordBatch.from_arrays(
        [
            pa.Array.from_buffers(TIMESTAMP_TYPE, count, [None, pa.py_buffer(stamps)]),
            _gather(buffer, key_start, key_len),
            _gather(buffer, value_start, value_len),
            headers,
        ],
        schema=PAYLOAD_SCHEMA,
    )
    return payload, offset_deltas


def _decode_headers(body: bytes | memoryview, counts: np.ndarray, pos: np.ndarray, ends: np.ndarray) -> pa.Array:
    """The headers column, parsing one by one the records that have headers (null for those without)."""
    n = len(counts)
    list_offsets = np.zeros(n + 1, np.int32)
    keys: list[str] = []
    values: list[bytes | None] = []
    if isinstance(body, memoryview):
        body = bytes(body)  # slices of bytes are bytes: no per-header conversion
    rows = np.flatnonzero(counts)
    add_key = keys.append
    add_value = values.append
    for i, p, end, c in zip(rows.tolist(), pos[rows].tolist(), ends[rows].tolist(), counts[rows].tolist(), strict=True):
        if c > (end - p) // 2:  # each header takes at least two bytes
            raise CorruptRecordBatchError(f"record {i}: header count {c} does not fit in its {end - p} bytes")
        for _ in range(c):
            u = body[p]
            if u < 0x80:  # the usual one-byte length, read inline
                p += 1
            else:
                u, p = _varint_slow(body, p)
            klen = (u >> 1) ^ -(u & 1)
            if klen < 0 or p + klen > end:
                raise CorruptRecordBatchError(f"record {i}: header key length {klen} is negative or past its end")
            try:
                add_key(str(body[p : p + klen], "utf-8"))
            except UnicodeDecodeError:
                raise CorruptRecordBatchError(f"record {i}: header key is not UTF-8") from None
            p += klen
            u = body[p]
            if u < 0x80:
                p += 1
            else:
                u, p = _varint_slow(body, p)
            vlen = (u >> 1) ^ -(u & 1)
            if vlen < -1 or p + vlen > end:
                raise CorruptRecordBatchError(f"record {i}: header value length {vlen} is negative or past its end")
            if vlen < 0:
                add_value(None)
            else:
                add_value(body[p : p + vlen])
                p += vlen
        if p != end:
            raise CorruptRecordBatchError(f"record {i}: {end - p} bytes left after its headers")
        list_offsets[i + 1] = c
    np.cumsum(list_offsets, out=list_offsets)
    items = pa.StructArray.from_arrays(
        [pa.array(keys, pa.string()), pa.array(values, pa.binary())], fields=list(HEADER_TYPE)
    )
    return pa.ListArray.from_arrays(pa.array(list_offsets), items, type=HEADERS_TYPE, mask=pa.array(counts == 0))


# ---------------------------------------------------------------------------------------------- encoding


def _varint_bytes(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unsigned varints of ``u`` (uint64) as an (n, width) byte grid, width the longest one's, and each one's
    length."""
    n = len(u)
    width = max(1, -(-int(u.max()).bit_length() // 7)) if n else 1
    if width == 1:
        return u.astype(np.uint8).reshape(n, 1), np.ones(n, np.int64)
    grid = np.empty((n, width), np.uint8)
    length = np.ones(n, np.int64)
    rest = u.copy()
    for j in range(width):
        low = (rest & np.uint64(0x7F)).astype(np.uint8)
        rest >>= np.uint64(7)
        more = rest != 0
        grid[:, j] = low | (more.astype(np.uint8) << 7)
        length += more
    return grid, length


def _zigzag(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.int64)
    return ((v << 1) ^ (v >> 63)).view(np.uint64)


def _header_suffix(headers: list[dict[str, object]] | None) -> bytes:
    if not headers:
        return b"\x00"
    parts = [_encode_varint(len(headers))]
    for header in headers:
        key = str(header["key"]).encode("utf-8")
        value = header["value"]
        parts.append(_encode_varint(len(key)))
        parts.append(key)
        if value is None:
            parts.append(b"\x01")  # zigzag(-1)
        else:
            assert isinstance(value, bytes)
            parts.append(_encode_varint(len(value)))
            parts.append(value)
    return b"".join(parts)


def _encode_varint(value: int) -> bytes:
    u = (value << 1) ^ (value >> 63)
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


def _binary_column(column: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """A binary column with nulls as empty strings, and each value's Kafka length (-1 for null)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    lengths = pc.binary_length(column)
    if column.null_count:
        return pc.fill_null(column, b""), lengths.fill_null(-1).to_numpy().astype(np.int64)
    return column, lengths.to_numpy().astype(np.int64)


def encode_records(
    offset_deltas: np.ndarray, ts_deltas: np.ndarray, keys: pa.Array, values: pa.Array, headers: pa.Array
) -> pa.Buffer:
    """The records section of a batch (uncompressed) in one buffer.

    The small varint parts of every record are built at once in numpy; the output is then the concatenation
    ``pre0 key0 mid0 value0 suffix0 pre1 ...``, which ``take`` over the parts, keys and values writes in one
    C loop.
    """
    n = len(offset_deltas)
    keys, key_len = _binary_column(keys)
    values, value_len = _binary_column(values)
    if headers.null_count == n or not pc.list_value_length(headers).to_numpy(zero_copy_only=False).any():
        suffixes = None
        suffix_len = np.ones(n, np.int64)
    else:
        suffix_list = [_header_suffix(h) for h in headers.to_pylist()]
        suffixes = pa.array(suffix_list, pa.binary())
        suffix_len = np.fromiter(map(len, suffix_list), np.int64, n)
    ts_grid, ts_n = _varint_bytes(_zigzag(ts_deltas))
    od_grid, od_n = _varint_bytes(_zigzag(offset_deltas))
    kl_grid, kl_n = _varint_bytes(_zigzag(key_len))
    vl_grid, vl_n = _varint_bytes(_zigzag(value_len))
    body_len = 1 + ts_n + od_n + kl_n + np.maximum(key_len, 0) + vl_n + np.maximum(value_len, 0) + suffix_len
    bl_grid, bl_n = _varint_bytes(_zigzag(body_len))
    zero = np.zeros((n, 1), np.uint8)
    one = np.ones(n, np.int64)
    # row i of the grid: length, attributes (0), timestampDelta, offsetDelta, keyLength | valueLength | hc=0
    parts = [
        (bl_grid, bl_n),
        (zero, one),
        (ts_grid, ts_n),
        (od_grid, od_n),
        (kl_grid, kl_n),
        (vl_grid, vl_n),
        (zero, one),
    ]
    grid = np.hstack([g for g, _ in parts])
    mask = np.hstack([_AR16[: g.shape[1]] < used[:, None] for g, used in parts])
    small = grid[mask]
    pre_n = bl_n + 1 + ts_n + od_n + kl_n
    piece_len = np.empty(3 * n, np.int64)
    piece_len[0::3] = pre_n
    piece_len[1::3] = vl_n
    piece_len[2::3] = 1
    piece_off = np.zeros(3 * n + 1, np.int32)
    np.cumsum(piece_len, out=piece_off[1:])
    pieces = pa.Array.from_buffers(pa.binary(), 3 * n, [None, pa.py_buffer(piece_off), pa.py_buffer(small)])
    sources = [pieces, keys, values] if suffixes is None else [pieces, keys, values, suffixes]
    combined = pa.concat_arrays(sources)
    idx = np.empty((n, 5), np.int64)
    row = np.arange(n, dtype=np.int64)
    idx[:, 0] = 3 * row
    idx[:, 1] = 3 * n + row
    idx[:, 2] = 3 * row + 1
    idx[:, 3] = 4 * n + row
    idx[:, 4] = 3 * row + 2 if suffixes is None else 5 * n + row
    out = combined.take(pa.array(idx.reshape(-1)))
    bounds = np.frombuffer(out.buffers()[1], np.int32)
    return out.buffers()[2][int(bounds[0]) : int(bounds[5 * n])]
