"""Listings of a plog root: topics, partitions, segments, index entries, batches and records, as tables.

Everything here returns data, not printed text: pandas DataFrames for
listings (one row per topic, partition, segment, index entry or batch) and
Arrow tables for records (keys and values stay bytes)::

    from segment_format.inspect import listings

    listings.topics("plog-data")                       # one row per topic, every config key
    listings.partitions("plog-data", "clicks")         # offsets, records, bytes per partition
    listings.segments("plog-data", "clicks", 0)        # one row per segment object of the chain
    listings.index_entries("plog-data", "clicks", 0, -1)
    listings.batches("plog-data", "clicks", 0, -1)     # producer fields, flags, checksum status
    listings.records("plog-data", "clicks", 0, 100, 200)
    listings.offset_timeline("plog-data", "clicks")    # offsets against time, from indexes only

The module-level functions take a *root*: a :class:`~segment_format.root.LogRoot`,
a URL or local path, or anything with a ``root`` attribute holding one
(``LogStore``). Each is built from a public function of one partition
snapshot (``log``, ``view``: :func:`partition_summary`, :func:`segments_frame`,
:func:`index_frame`, :func:`batches_frame`, ...), which the notebook cards
(``pyspark_logsource.views.cards``) and the ``plog inspect`` tables
(``pyspark_logsource.views.terminal``) render; they show, they do not compute.

Reading goes through the same verified paths as any reader, so damaged bytes
raise :class:`~segment_format.errors.CorruptRecordError`; nothing is written.
Checking a whole topic and listing every problem is the verifier's job
(:mod:`segment_format.inspect.verify`).

This module is over 600 lines because it is one concept, the read-only tables
of a root, whose functions share the same few column builders; it reads best whole.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from ..errors import CorruptRecordError, OffsetOutOfRangeError, PlogError, UnknownTopicOrPartitionError
from ..layout import parse_segment_name
from ..log.chain import LogView, SegmentRef
from ..log.partition_log import PartitionLog
from ..records import RECORD_SCHEMA
from ..root import LogRoot
from ..segment import (
    ATTR_CONTROL,
    ATTR_LOG_APPEND_TIME,
    ATTR_TRANSACTIONAL,
    SegmentIndex,
    check_batch_checksum,
    read_batches,
    read_index,
)
from ..stores.base import Store
from ..topic import TOPIC_CONFIG_DEFAULTS

# --------------------------------------------------------------------------- helpers


def as_root(target: Any, storage_options: dict[str, Any] | None = None) -> LogRoot:
    """A :class:`LogRoot` for ``target``: a LogRoot, a URL or path, or a LogStore (it has ``.root``)."""
    if isinstance(target, LogRoot):
        return target
    root = getattr(target, "root", None)
    if isinstance(root, LogRoot):
        return root
    if isinstance(target, (str, os.PathLike)):
        return LogRoot(os.fspath(target), storage_options)
    raise TypeError(f"expected a LogRoot, a URL or path, or a LogStore, not {type(target).__name__}")


def partition_log(root: LogRoot, topic: str, partition: int) -> PartitionLog:
    """The log of one partition, with the topic's metadata read afresh (partitions may have been added)."""
    meta = root.topic(topic, refresh=True)
    return root.partition(topic, partition, meta)


def _timestamps(ms: Any) -> pd.Series:
    """Epoch milliseconds as a UTC datetime column."""
    values = np.asarray(ms, dtype=np.int64)
    return pd.Series(pd.to_datetime(values, unit="ms", utc=True))


def utc_datetime(ms: int | None) -> pd.Timestamp | None:
    """Epoch milliseconds as a UTC timestamp (None stays None)."""
    return None if ms is None else pd.Timestamp(int(ms), unit="ms", tz="UTC")


def object_name(key: str) -> str:
    """The last part of an object key: a segment object's file name."""
    return key.rsplit("/", 1)[-1]


def human_bytes(n: float) -> str:
    """A byte count with a binary unit: ``512 B``, ``1.5 KiB``, ``3.2 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover - the loop always returns


def _uncompressed(idx: SegmentIndex) -> int:
    return int(idx.table.column("uncompressed_bytes").to_numpy().sum())


# --------------------------------------------------------------------------- topics


def topics(root: Any) -> pd.DataFrame:
    """One row per topic: partitions, topic id, metadata version, creation time, and every config key."""
    r = as_root(root)
    rows = []
    config_keys = list(TOPIC_CONFIG_DEFAULTS)
    for name in r.catalog.names():
        try:
            meta = r.topic(name, refresh=True)
        except UnknownTopicOrPartitionError:  # deleted since the listing
            continue
        config_keys.extend(k for k in meta.config if k not in config_keys)
        rows.append(
            {
                "topic": name,
                "partitions": meta.partitions,
                "topic_id": meta.topic_id,
                "version": meta.version,
                "created": meta.created_ms,
                **meta.config,
            }
        )
    columns = ["topic", "partitions", "topic_id", "version", "created", *config_keys]
    frame = pd.DataFrame(rows, columns=columns)
    frame["created"] = _timestamps(frame["created"].to_numpy(dtype=np.int64))
    return frame


def topic_config(root: Any, topic: str) -> pd.DataFrame:
    """The topic's configuration, one row per key: value, default, whether it is the default."""
    meta = as_root(root).topic(topic, refresh=True)
    keys = list(TOPIC_CONFIG_DEFAULTS) + [k for k in meta.config if k not in TOPIC_CONFIG_DEFAULTS]
    rows = []
    for key in keys:
        default = TOPIC_CONFIG_DEFAULTS.get(key)
        value = meta.config.get(key, default)
        rows.append({"key": key, "value": value, "default": default, "is_default": value == default})
    return pd.DataFrame(rows, columns=["key", "value", "default", "is_default"])


# --------------------------------------------------------------------------- partitions

_PARTITION_COLUMNS = [
    "partition",
    "start_offset",
    "end_offset",
    "records",
    "segments",
    "bytes",
    "uncompressed_bytes",
    "min_timestamp",
    "max_timestamp",
    "superseded_objects",
    "superseded_bytes",
]


def partition_summary(log: PartitionLog, partition: int, view: LogView) -> dict[str, Any]:
    """The row of :func:`partitions` for one partition snapshot, as a dict."""
    indexes = [log.index(ref) for ref in view.segments]
    return {
        "partition": partition,
        "start_offset": view.start_offset,
        "end_offset": view.end_offset,
        "records": view.end_offset - view.start_offset,
        "segments": len(view.segments),
        "bytes": sum(ref.size for ref in view.segments),
        "uncompressed_bytes": sum(_uncompressed(idx) for idx in indexes),
        "min_timestamp": utc_datetime(min((i.meta.min_timestamp for i in indexes), default=None)),
        "max_timestamp": utc_datetime(max((i.meta.max_timestamp for i in indexes), default=None)),
        "superseded_objects": len(view.superseded),
        "superseded_bytes": sum(info.size for info, _ in view.superseded),
    }


def _partitions_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=_PARTITION_COLUMNS)
    for column in ("min_timestamp", "max_timestamp"):
        frame[column] = pd.to_datetime(frame[column], utc=True)
    return frame


def partitions(root: Any, topic: str) -> pd.DataFrame:
    """One row per partition: start and end offsets, records, segments, bytes on storage and
    uncompressed, timestamp range, and objects off the chain awaiting deletion.

    ``records`` is ``end_offset - start_offset`` (offsets in range; compaction, once it
    exists, may leave fewer actual records).
    """
    r = as_root(root)
    meta = r.topic(topic, refresh=True)
    rows = []
    for p in range(meta.partitions):
        log = r.partition(topic, p, meta)
        rows.append(partition_summary(log, p, log.view()))
    return _partitions_frame(rows)


# --------------------------------------------------------------------------- segments

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
    return {
        "segment": position,
        "object": object_name(key),
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
        "kind": "appended" if generation == 0 else ("compacted" if m and m.compacted_ms is not None else "rewritten"),
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
    log = partition_log(as_root(root), topic, partition)
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
        frame[column] = _timestamps(frame[column].to_numpy())
    return frame


def index_entries(root: Any, topic: str, partition: int, segment: int | str) -> pd.DataFrame:
    """The index of one segment, one row per batch, exactly as stored (timestamps shown as UTC datetimes).

    ``segment`` is a chain position (0 is the oldest; negative counts from the end) or an object name.
    """
    log = partition_log(as_root(root), topic, partition)
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
            "first_timestamp": _timestamps(t.column("first_timestamp").to_numpy()),
            "max_timestamp": _timestamps(idx.max_timestamps),
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
        data = store.get_range(idx.key, start, end)
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
    log = partition_log(as_root(root), topic, partition)
    ref, on_chain = select_segment(log, log.view(), segment)
    return batches_frame(log.store, segment_index(log, ref, on_chain), check)


# --------------------------------------------------------------------------- records


def decode_text(table: pa.Table) -> pa.Table:
    """Keys and values as UTF-8 text (undecodable bytes replaced), for reading in a notebook."""
    for name in ("key", "value"):
        i = table.schema.get_field_index(name)
        if not pa.types.is_binary(table.schema.field(i).type):
            continue  # a typed topic's value is a struct of its fields (PROTOCOL.md 11.8): already readable
        texts = [None if b is None else b.decode("utf-8", "replace") for b in table.column(i).to_pylist()]
        table = table.set_column(i, pa.field(name, pa.string()), pa.array(texts, pa.string()))
    return table


def read_records(log: PartitionLog, start: int | None, end: int | None, limit: int | None) -> pa.Table:
    """The table of :func:`records` for one partition log."""
    view = log.view()
    first = view.start_offset if start is None else start
    stop = view.end_offset if end is None else min(end, view.end_offset)
    if first < view.start_offset or first > view.end_offset:
        raise OffsetOutOfRangeError(
            f"offset {first} is out of range for {log.name}: valid offsets are {view.start_offset}..{view.end_offset}"
        )
    out: list[pa.RecordBatch] = []
    count = 0
    position = first
    while position < stop and (limit is None or count < limit):
        want = stop - position if limit is None else min(stop - position, limit - count)
        got, position = log.read(position, max_records=want)
        if not got:
            break
        for batch in got:
            offsets = batch.column(0).to_numpy()
            keep = int(np.searchsorted(offsets, stop, side="left"))
            if keep < batch.num_rows:
                batch = batch.slice(0, keep)
            if batch.num_rows:
                out.append(batch)
                count += batch.num_rows
    projection = log.default_projection()
    return pa.Table.from_batches(out, schema=RECORD_SCHEMA if projection is None else projection.logical_schema)


def records(
    root: Any,
    topic: str,
    partition: int,
    start: int | None = None,
    end: int | None = None,
    *,
    limit: int | None = None,
    decode: bool = False,
) -> pa.Table:
    """The records of offsets ``[start, end)`` of a partition as an Arrow table (RECORD_SCHEMA).

    ``start`` defaults to the log start, ``end`` to the log end; ``limit`` caps
    the number of records. ``decode=True`` turns keys and values into UTF-8
    text. Call ``.to_pandas()`` for a DataFrame.
    """
    table = read_records(partition_log(as_root(root), topic, partition), start, end, limit)
    return decode_text(table) if decode else table


def segment_records(log: PartitionLog, idx: SegmentIndex, batch: int | None) -> pa.Table:
    """The table of :func:`batch_records` for one segment index (batch ``None``: every batch)."""
    layout = idx.meta.layout
    schema = RECORD_SCHEMA if layout is None else layout.logical_schema  # a typed object's own version (11.8)
    if idx.batch_count == 0:
        return schema.empty_table()
    if batch is None:
        first, last = 0, idx.batch_count - 1
    else:
        if not -idx.batch_count <= batch < idx.batch_count:
            raise IndexError(f"{object_name(idx.key)} has {idx.batch_count} batch(es); there is no batch {batch}")
        first = last = batch % idx.batch_count
    return pa.Table.from_batches(read_batches(log.store, idx, first, last), schema=schema)


def batch_records(
    root: Any, topic: str, partition: int, segment: int | str, batch: int | None = None, *, decode: bool = False
) -> pa.Table:
    """The records of one batch of a segment (all batches if ``batch`` is None) as an Arrow table.

    Unlike :func:`records` this includes records below the log start that the
    segment still holds.
    """
    log = partition_log(as_root(root), topic, partition)
    ref, on_chain = select_segment(log, log.view(), segment)
    table = segment_records(log, segment_index(log, ref, on_chain), batch)
    return decode_text(table) if decode else table


# --------------------------------------------------------------------------- time and lag


def partition_timeline(log: PartitionLog, view: LogView, partition: int) -> pd.DataFrame:
    """The rows of :func:`offset_timeline` for one partition snapshot."""
    return _timeline_frame(_timeline_rows(log, view, partition))


def _timeline_rows(log: PartitionLog, view: LogView, partition: int) -> list[pd.DataFrame]:
    frames = []
    for i, ref in enumerate(view.segments):
        idx = log.index(ref)
        t = idx.table
        frames.append(
            pd.DataFrame(
                {
                    "partition": partition,
                    "segment": i,
                    "base_offset": idx.base_offsets,
                    "last_offset": idx.last_offsets,
                    "record_count": idx.record_counts,
                    "bytes": idx.lengths,
                    "first_timestamp": t.column("first_timestamp").to_numpy(),
                    "max_timestamp": idx.max_timestamps,
                }
            )
        )
    return frames


def offset_timeline(root: Any, topic: str, partitions: Iterable[int] | None = None) -> pd.DataFrame:
    """Where offsets and timestamps fall: one row per batch on the chain of each partition.

    Columns: partition, segment, base and last offset, record count, stored
    bytes, first and max timestamp (UTC). Offsets against ``max_timestamp`` is
    a partition's growth over time; its slope is the throughput. Read from
    indexes only, no record data.
    """
    r = as_root(root)
    meta = r.topic(topic, refresh=True)
    wanted = range(meta.partitions) if partitions is None else [meta.check_partition(p) for p in partitions]
    frames: list[pd.DataFrame] = []
    for p in wanted:
        log = r.partition(topic, p, meta)
        frames.extend(_timeline_rows(log, log.view(), p))
    return _timeline_frame(frames)


def _timeline_frame(frames: list[pd.DataFrame]) -> pd.DataFrame:
    columns = [
        "partition",
        "segment",
        "base_offset",
        "last_offset",
        "record_count",
        "bytes",
        "first_timestamp",
        "max_timestamp",
    ]
    frame = (
        pd.concat(frames, ignore_index=True)
        if frames
        else pd.DataFrame({c: pd.Series(dtype=np.int64) for c in columns})
    )
    frame = frame[columns]
    for column in ("first_timestamp", "max_timestamp"):
        frame[column] = _timestamps(frame[column].to_numpy(dtype=np.int64))
    return frame


def lag_frame(lag: Mapping[Any, Any] | pd.DataFrame) -> pd.DataFrame:
    """Normalise consumer positions to a lag table: partition, committed, end_offset, lag.

    ``lag`` is either a mapping ``{partition: (committed, end)}`` (keys may be
    ints or ``TopicPartition``-like pairs; ``committed`` may be None when a
    group has no committed offset, giving an unknown lag) or a DataFrame with
    columns ``partition``, ``committed`` and ``end_offset`` (or ``end``), and
    optionally ``topic``. This is what a consumer group's committed offsets and
    the partitions' end offsets give, once groups exist.
    """
    if isinstance(lag, pd.DataFrame):
        frame = lag.copy()
        if "end_offset" not in frame.columns and "end" in frame.columns:
            frame = frame.rename(columns={"end": "end_offset"})
        missing = {"partition", "committed", "end_offset"} - set(frame.columns)
        if missing:
            raise ValueError(
                f"lag DataFrame lacks column(s) {sorted(missing)}; "
                "expected partition, committed and end_offset (or end)"
            )
    else:
        rows = []
        for key, value in lag.items():
            topic = None
            if isinstance(key, tuple) and len(key) == 2:
                topic, key = key
            partition = getattr(key, "partition", key)
            try:
                committed, end = value
            except (TypeError, ValueError):
                raise ValueError(
                    f"lag for partition {partition!r} must be a (committed, end) pair, got {value!r}"
                ) from None
            rows.append({"topic": topic, "partition": int(partition), "committed": committed, "end_offset": end})
        frame = pd.DataFrame(rows, columns=["topic", "partition", "committed", "end_offset"])
        if frame["topic"].isna().all():
            frame = frame.drop(columns="topic")
    frame["partition"] = frame["partition"].astype(np.int64)
    frame["committed"] = frame["committed"].astype("Int64")
    frame["end_offset"] = frame["end_offset"].astype("Int64")
    frame["lag"] = (frame["end_offset"] - frame["committed"]).clip(lower=0)
    sort = ["topic", "partition"] if "topic" in frame.columns else ["partition"]
    return frame.sort_values(sort, kind="stable").reset_index(drop=True)


def consumer_lag(root: Any, topic: str, committed: Mapping[int, int | None]) -> pd.DataFrame:
    """Lag of committed offsets ``{partition: offset}`` against each partition's current end offset.

    Partitions missing from ``committed`` get an unknown (null) lag.
    """
    r = as_root(root)
    meta = r.topic(topic, refresh=True)
    positions = {getattr(k, "partition", k): v for k, v in committed.items()}
    data = {p: (positions.get(p), r.partition(topic, p, meta).view().end_offset) for p in range(meta.partitions)}
    return lag_frame(data)


#: Candidate widths of a throughput bucket, smallest first; the first giving at most ~60 buckets wins.
_BUCKETS = [
    ("1s", 1),
    ("5s", 5),
    ("10s", 10),
    ("30s", 30),
    ("1min", 60),
    ("5min", 300),
    ("15min", 900),
    ("1h", 3600),
    ("6h", 6 * 3600),
    ("1D", 86400),
    ("7D", 7 * 86400),
]


def _bucket(span_s: float, max_buckets: int = 60) -> tuple[str, int]:
    for freq, seconds in _BUCKETS:
        if span_s / seconds <= max_buckets:
            return freq, seconds
    return _BUCKETS[-1]


def throughput(timeline: pd.DataFrame, freq: str | None = None) -> pd.DataFrame:
    """Records per second per partition, in time buckets, from :func:`offset_timeline`.

    Each batch counts at its max timestamp (indexes only, no record data), so a
    bucket much narrower than a batch's time span looks spiky. Returns a
    DataFrame indexed by bucket start with one column per partition.
    """
    if timeline.empty:
        return pd.DataFrame()
    times = timeline["max_timestamp"]
    span = (times.max() - times.min()).total_seconds()
    if freq is None:
        freq, seconds = _bucket(span)
    else:
        seconds = pd.Timedelta(freq).total_seconds()
    counts = (
        timeline.set_index("max_timestamp")
        .groupby("partition")["record_count"]
        .resample(freq)
        .sum()
        .unstack("partition", fill_value=0)
        .fillna(0)
    )
    if isinstance(counts, pd.Series):  # one partition, one bucket
        counts = counts.to_frame()
    return counts / seconds


__all__ = [
    "as_root",
    "batch_records",
    "batches",
    "batches_frame",
    "consumer_lag",
    "decode_text",
    "human_bytes",
    "index_entries",
    "index_frame",
    "lag_frame",
    "object_name",
    "offset_timeline",
    "partition_log",
    "partition_summary",
    "partition_timeline",
    "partitions",
    "read_records",
    "records",
    "segment_at",
    "segment_index",
    "segment_records",
    "segments",
    "segments_frame",
    "select_segment",
    "throughput",
    "topic_config",
    "topics",
    "utc_datetime",
]
