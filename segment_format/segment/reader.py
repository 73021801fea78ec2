"""Reading segment objects: the index (one or two range reads), then batches, checked and decoded."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import Future
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from ..errors import CorruptRecordError
from ..parallel import ordered_imap, ordered_map, submit
from ..records import RECORD_SCHEMA
from ..stores.base import Store
from .format import END_OF_STREAM, TAIL_READ, crc32c, schema_crc32c
from .index import SegmentIndex, parse_index
from .writer import EncodedBatch


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
            key=index.data_key,
            offset=base,
        )
    actual = crc32c(message)
    if actual != int(index.crcs[i]):
        raise CorruptRecordError(
            f"record batch {i} (offsets {base}..{last}) fails its CRC32C "
            f"({actual:08x}, the index says {int(index.crcs[i]):08x})",
            key=index.data_key,
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
            f"record batch {i} does not decode: {exc}", key=index.data_key, offset=int(index.base_offsets[i])
        ) from exc
    return layout.from_stored(stored, fields, key=index.data_key)


def decode_batch(
    index: SegmentIndex, i: int, message: bytes | memoryview, fields: Sequence[str] | None = None
) -> pa.RecordBatch:
    """Verify batch ``i``'s message against its CRC32C and decode it (``fields``: see :func:`decode_message`)."""
    check_batch_checksum(index, i, message)
    batch = placed_batch(index, decode_message(index, i, message, fields))
    problems = batch_problems(index, i, batch)
    if problems:
        raise CorruptRecordError(problems[0], key=index.data_key, offset=int(index.base_offsets[i]))
    return batch


def placed_batch(index: SegmentIndex, batch: pa.RecordBatch) -> pa.RecordBatch:
    """A run's decoded batch with its absolute offsets and, in a ``LogAppendTime`` topic, its commit's time
    (PROTOCOL.md 7.3); any other object's batch as it is."""
    if index.offset_shift:
        offsets = pc.add(batch.column(0), pa.scalar(index.offset_shift, pa.int64()))
        batch = batch.set_column(0, batch.schema.field(0), offsets)
    if index.stamp_ms is not None:
        stamps = pa.array(np.full(batch.num_rows, index.stamp_ms, np.int64)).cast(batch.schema.field(1).type)
        batch = batch.set_column(1, batch.schema.field(1), stamps)
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
    """The bytes ``[start, end)`` a read of batches ``first..last`` needs (see :func:`read_batches`): a whole
    object's read from its first batch takes in the schema message, to its last the end-of-stream marker;
    a run's (PROTOCOL.md 7.3) holds batch messages only."""
    batches_end = int(index.positions[last] + index.lengths[last])
    if index.is_run:
        return int(index.positions[first]), batches_end
    start = 0 if first == 0 else int(index.positions[first])
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
            "segment object is shorter than its index says", key=index.data_key, offset=int(index.base_offsets[first])
        )
    view = memoryview(data)
    if first == 0 and not index.is_run:  # then start is 0
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
    batches = decode_range(index, first, last, start, store.get_range(index.data_key, start, end))
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
        data = store.get_range(index.data_key, start, end)
    rows = index.table.to_pylist()
    out = []
    for i, row in enumerate(rows):
        lo = int(index.positions[i]) - start
        message = data[lo : lo + int(index.lengths[i])]
        check_batch_checksum(index, i, message)
        row = {k: v for k, v in row.items() if k not in ("position", "length")}
        out.append(EncodedBatch(message, row))
    return out
