"""Listings of a partition's segment objects, of a segment's index entries and of its batches."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..errors import CorruptRecordError, OffsetOutOfRangeError, PlogError
from ..layout import parse_segment_name
from ..log.chain import LogView, SegmentRef
from ..log.partition_log import PartitionLog
from ..segment import (
    ATTR_CONTROL,
    ATTR_LOG_APPEND_TIME,
    ATTR_TRANSACTIONAL,
    SegmentIndex,
    check_batch_checksum,
    read_index,
)
from ..stores.base import Store
from .tables import as_root, object_name, refreshed_partition_log, timestamps

_SEGMENT_COLUMNS = [
    "segment",
    "object",
    "base_offset",
    "last_offset",
    "end_offset",
    "record_count",
    "batch_count",
    "bytes",
    "uncompressed_bytes",
    "min_timestamp",
    "max_timestamp",
    "compression",
    "kind",
    "generation",
    "clean",
    "value_schema_version",
    "created",
    "below_start",
    "on_chain",
    "key",
]


def _segment_row(
    position: int | None, key: str, size: int, idx: SegmentIndex | None, start_offset: int, generation: int
) -> dict[str, Any]:
    m = idx.meta if idx is not None else None
    run = idx is not None and idx.is_run  # a shared topic's run (7.3): its bytes are in a shared object
    return {
        "segment": position,
        "object": object_name(idx.data_key if run and idx is not None else key),
        "base_offset": m.base_offset if m else None,
        "last_offset": int(idx.last_offsets[-1]) if idx is not None and idx.batch_count else None,
        "end_offset": m.next_offset if m else None,
        "record_count": m.record_count if m else None,
        "batch_count": m.batch_count if m else None,
        "bytes": size,
        "uncompressed_bytes": int(idx.table.column("uncompressed_bytes").to_numpy().sum()) if idx is not None else None,
        "min_timestamp": m.min_timestamp if m else None,
        "max_timestamp": m.max_timestamp if m else None,
        "compression": m.compression if m else None,
        "kind": "run"
        if run
        else "appended"
        if generation == 0
        else ("compacted" if m and m.compacted_ms is not None else "rewritten"),
        "generation": generation,
        # Every record passed through a compaction (PROTOCOL.md 11.6): the clean part of a compacted topic.
        "clean": bool(m.clean_end is not None and m.clean_end >= m.next_offset) if m else None,
        # A typed topic's objects each hold one value schema version (PROTOCOL.md 11.8); None when untyped.
        "value_schema_version": m.value_schema_version if m else None,
        "created": m.created_ms if m else None,
        "below_start": (m.next_offset <= start_offset) if m else None,
        "on_chain": position is not None,
        "key": key,
    }


def segments_frame(log: PartitionLog, view: LogView, superseded: bool) -> pd.DataFrame:
    """The frame of :func:`segments` for one partition snapshot."""
    rows = [
        _segment_row(i, ref.key, ref.size, log.index(ref), view.start_offset, ref.generation)
        for i, ref in enumerate(view.segments)
    ]
    if superseded:
        for info, _ in view.superseded:
            parsed = parse_segment_name(object_name(info.key))
            try:
                idx: SegmentIndex | None = read_index(log.store, info.key, info.size)
            except PlogError:  # already deleted, or damaged: verify() says which
                idx = None
            rows.append(
                _segment_row(None, info.key, info.size, idx, view.start_offset, parsed.generation if parsed else 0)
            )
    frame = pd.DataFrame(rows, columns=_SEGMENT_COLUMNS)
    for column in (
        "segment",
        "base_offset",
        "last_offset",
        "end_offset",
        "record_count",
        "batch_count",
        "uncompressed_bytes",
        "value_schema_version",
    ):
        frame[column] = frame[column].astype("Int64")
    for column in ("min_timestamp", "max_timestamp", "created"):
        frame[column] = pd.to_datetime(frame[column].astype("Int64"), unit="ms", utc=True)
    frame["below_start"] = frame["below_start"].astype("boolean")
    frame["clean"] = frame["clean"].astype("boolean")
    return frame


def segments(root: Any, topic: str, partition: int, *, superseded: bool = False) -> pd.DataFrame:
    """One row per segment object of the partition's chain, in offset order.

    Columns: chain position (``segment``), object name, base offset, last offset,
    end offset (exclusive), records, batches, bytes on storage and uncompressed,
    min/max timestamp, compression, kind (appended, rewritten or compacted), generation,
    whether all its records passed a compaction (``clean``), creation time,
    whether it lies wholly below the log start, and the full key.
    With ``superseded=True`` objects off the chain (awaiting deletion) are
    listed too, with ``segment`` null and ``on_chain`` False.
    """
    log = refreshed_partition_log(as_root(root), topic, partition)
    return segments_frame(log, log.view(), superseded)


def select_segment(log: PartitionLog, view: LogView, segment: int | str) -> tuple[SegmentRef, bool]:
    """The chain element at position ``segment``, or the object named (or keyed) ``segment``."""
    if isinstance(segment, (int, np.integer)) and not isinstance(segment, bool):
        n = len(view.segments)
        if not -n <= int(segment) < n:
            raise IndexError(f"{log.name} has {n} segment(s) on its chain; there is no segment {segment}")
        return view.segments[int(segment)], True
    if isinstance(segment, str):
        for ref in view.segments:
            if segment in (ref.key, object_name(ref.key)):
                return ref, True
        for info, _ in view.superseded:
            if segment in (info.key, object_name(info.key)):
                parsed = parse_segment_name(object_name(info.key))
                if parsed is not None:
                    return SegmentRef(
                        info.key, parsed.base_offset, parsed.end_offset, parsed.generation, info.size
                    ), False
        raise KeyError(f"no segment object {segment!r} in {log.name}")
    raise TypeError(f"segment must be a chain position (int) or an object name (str), not {type(segment).__name__}")


def segment_at(log: PartitionLog, view: LogView, offset: int) -> int:
    """The chain position of the segment holding ``offset``; :class:`OffsetOutOfRangeError` outside the log."""
    if not view.start_offset <= offset < view.end_offset:
        holds = (
            f"valid offsets are {view.start_offset}..{view.end_offset - 1}"
            if view.end_offset > view.start_offset
            else "it is empty"
        )
        raise OffsetOutOfRangeError(f"offset {offset} is out of range for {log.name}: {holds}")
    return view.segment_for(offset)


def segment_index(log: PartitionLog, ref: SegmentRef, on_chain: bool) -> SegmentIndex:
    """The verified index of a segment: through the log's cache when on the chain, read directly when superseded."""
    return log.index(ref) if on_chain else read_index(log.store, ref.key, ref.size)


def index_frame(idx: SegmentIndex) -> pd.DataFrame:
    """The frame of :func:`index_entries`: the index table as stored, a ``batch`` column first, UTC datetimes."""
    frame = idx.table.to_pandas()
    frame.insert(0, "batch", np.arange(idx.batch_count))
    for column in ("first_timestamp", "max_timestamp"):
        frame[column] = timestamps(frame[column].to_numpy())
    return frame


def index_entries(root: Any, topic: str, partition: int, segment: int | str) -> pd.DataFrame:
    """The index of one segment, one row per batch, exactly as stored (timestamps shown as UTC datetimes).

    ``segment`` is a chain position (0 is the oldest; negative counts from the end) or an object name.
    """
    log = refreshed_partition_log(as_root(root), topic, partition)
    view = log.view()
    ref, on_chain = select_segment(log, view, segment)
    return index_frame(segment_index(log, ref, on_chain))


_BATCH_COLUMNS = [
    "batch",
    "base_offset",
    "last_offset",
    "record_count",
    "first_timestamp",
    "max_timestamp",
    "position",
    "length",
    "uncompressed_bytes",
    "compression_ratio",
    "producer_id",
    "producer_epoch",
    "base_sequence",
    "transactional",
    "control",
    "timestamp_type",
    "attributes",
    "crc32c",
    "checksum",
]


def batches_frame(store: Store, idx: SegmentIndex, check: bool) -> pd.DataFrame:
    """The frame of :func:`batches` for one segment index (``check``: read the data and check every CRC)."""
    t = idx.table
    uncompressed = t.column("uncompressed_bytes").to_numpy()
    attributes = idx.attributes.astype(np.int64)
    frame = pd.DataFrame(
        {
            "batch": np.arange(idx.batch_count),
            "base_offset": idx.base_offsets,
            "last_offset": idx.last_offsets,
            "record_count": idx.record_counts,
            "first_timestamp": timestamps(t.column("first_timestamp").to_numpy()),
            "max_timestamp": timestamps(idx.max_timestamps),
            "position": idx.positions,
            "length": idx.lengths,
            "uncompressed_bytes": uncompressed,
            "compression_ratio": np.round(uncompressed / np.maximum(idx.lengths, 1), 2),
            "producer_id": idx.producer_ids,
            "producer_epoch": idx.producer_epochs,
            "base_sequence": idx.base_sequences,
            "transactional": (attributes & ATTR_TRANSACTIONAL) != 0,
            "control": (attributes & ATTR_CONTROL) != 0,
            "timestamp_type": np.where((attributes & ATTR_LOG_APPEND_TIME) != 0, "LogAppendTime", "CreateTime"),
            "attributes": idx.attributes,
            "crc32c": [f"{int(c):08x}" for c in idx.crcs],
            "checksum": "not checked",
        },
        columns=_BATCH_COLUMNS,
    )
    if check and idx.batch_count:
        start = int(idx.positions[0])
        end = int(idx.positions[-1] + idx.lengths[-1])
        data = store.get_range(idx.data_key, start, end)  # a run's bytes are its shared object's (7.3)
        status = []
        for i, (pos, length) in enumerate(zip(idx.positions, idx.lengths, strict=True)):
            lo = int(pos) - start
            message = data[lo : lo + int(length)]
            if len(message) != int(length):
                status.append("truncated")
                continue
            try:
                check_batch_checksum(idx, i, message)  # the reader's own check
                status.append("ok")
            except CorruptRecordError:
                status.append("mismatch")
        frame["checksum"] = status
    return frame


def batches(root: Any, topic: str, partition: int, segment: int | str, *, check: bool = True) -> pd.DataFrame:
    """The batches of one segment with their metadata, one row per batch.

    Offsets, record count, timestamps, position and stored length, uncompressed
    size and ratio, producer id / epoch / base sequence, the transactional,
    control and LogAppendTime flags, the CRC32C, and ``checksum``: ``ok``,
    ``mismatch`` or ``truncated`` after checking every batch against its CRC
    (one range read of the segment's data), or ``not checked`` with ``check=False``.
    """
    log = refreshed_partition_log(as_root(root), topic, partition)
    ref, on_chain = select_segment(log, log.view(), segment)
    return batches_frame(log.store, segment_index(log, ref, on_chain), check)
