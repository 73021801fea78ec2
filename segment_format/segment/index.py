"""The sparse batch index of a segment object: its columns, parsing it, and checking its consistency."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from ..errors import CorruptRecordError
from ..layout import rewrite_id_of
from ..records import RECORD_SCHEMA
from ..stores.base import Store
from .format import (
    END_OF_STREAM,
    FORMAT_VERSION,
    INDEX_SCHEMA,
    TAIL,
    TYPED_FORMAT_VERSION,
    SegmentMeta,
    check_index_checksum,
    parse_tail,
)

#: Length of the schema message that opens every IPC stream of RECORD_SCHEMA (computed once; the writer
#: writes the same bytes, ``writer._RECORD_SCHEMA_BYTES``).
_SCHEMA_LENGTH = len(RECORD_SCHEMA.serialize().to_pybytes())


#: numpy types of the index's fixed-width columns, for :func:`_index_column_numpy`.
INDEX_NUMPY_TYPES: dict[pa.DataType, np.dtype[Any]] = {
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
    dtype = INDEX_NUMPY_TYPES.get(column.type)
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
        #: Where the batches' bytes are: the object itself, or for a run of a shared topic (PROTOCOL.md 7.3)
        #: the shared object holding it. ``key`` names the index either way.
        self.data_key = key
        #: A run's bytes are batch messages only: no schema message before them, no end-of-stream after.
        self.is_run = False
        #: Added to every decoded batch's offsets: a run's base (a shared object stores them relative to it).
        self.offset_shift = 0
        #: A ``LogAppendTime`` run's commit time, which every record of it takes as its timestamp; None otherwise.
        self.stamp_ms: int | None = None

    def run_of(self, data_key: str, offset_shift: int, stamp_ms: int | None) -> None:
        """Make this the index of a run of shared object ``data_key`` (PROTOCOL.md 7.3): batches read from there,
        offsets shifted by ``offset_shift``, timestamps replaced by ``stamp_ms`` when given."""
        self.data_key = data_key
        self.is_run = True
        self.offset_shift = offset_shift
        self.stamp_ms = stamp_ms

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
