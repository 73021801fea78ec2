"""Inspecting a plog root: topics, partitions, segments, batches and records as tables.

Everything here returns data, not printed text: pandas DataFrames for
listings (one row per topic, partition, segment, index entry or batch) and
Arrow tables for records (keys and values stay bytes). The same facts the
``plog inspect`` command prints, but for notebooks and code::

    from segment_format.inspect import inspect_topic

    topic = inspect_topic("plog-data", "clicks")
    topic                              # in a notebook: a table of partitions
    part = topic.partition(0)          # a snapshot of the partition's chain
    part.segments()                    # DataFrame: one row per segment object
    seg = part.segment(0)
    seg.index()                        # the index entries, as stored
    seg.batches()                      # per batch: producer fields, flags, checksum status
    seg.records(batch=0)               # pyarrow Table of the batch's records
    topic.verify()                     # every checksum and index, checked; nothing changed

The module-level functions (``topics``, ``partitions``, ``segments``,
``index_entries``, ``batches``, ``records``, ``batch_records``, ``verify`` ...)
take a *root*: a :class:`~segment_format.root.LogRoot`, a URL or local path,
or anything with a ``root`` attribute holding one (``LogStore``).

Reading goes through the same verified paths as any reader, so damaged bytes
raise :class:`~segment_format.errors.CorruptRecordError`; :func:`verify`
instead reads every object of a topic and lists every problem it finds,
without writing or deleting anything. Plots live in
``pyspark_logsource.views.plots`` (matplotlib is presentation, not storage).
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.ipc as ipc

from .chain import LogView, PartitionListing, SegmentRef, parse_listing, resolve_chain
from .errors import CorruptRecordError, OffsetOutOfRangeError, PlogError, UnknownTopicOrPartitionError
from .layout import parse_segment_name, partition_prefix, topic_meta_prefix
from .log import PartitionLog
from .records import RECORD_SCHEMA
from .root import LogRoot
from .segment import (
    ATTR_CONTROL,
    ATTR_LOG_APPEND_TIME,
    ATTR_TRANSACTIONAL,
    END_OF_STREAM,
    FORMAT_VERSION,
    INDEX_SCHEMA,
    MAGIC,
    TAIL,
    SegmentIndex,
    SegmentMeta,
    crc32c,
    read_batches,
    read_index,
)
from .storage import ObjectInfo, Store
from .topic import TOPIC_CONFIG_DEFAULTS, TopicMetadata

#: Rows shown by the notebook display of a view before it elides the middle.
DISPLAY_ROWS = 20

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


def _timestamps(ms: Any) -> pd.Series:
    """Epoch milliseconds as a UTC datetime column."""
    values = np.asarray(ms, dtype=np.int64)
    return pd.Series(pd.to_datetime(values, unit="ms", utc=True))


def _ms_to_datetime(ms: int | None) -> pd.Timestamp | None:
    return None if ms is None else pd.Timestamp(int(ms), unit="ms", tz="UTC")


def _name(key: str) -> str:
    return key.rsplit("/", 1)[-1]


def _uncompressed(idx: SegmentIndex) -> int:
    return int(idx.table.column("uncompressed_bytes").to_numpy().sum())


def _log(root: LogRoot, topic: str, partition: int) -> PartitionLog:
    meta = root.topic(topic, refresh=True)
    return root.partition(topic, partition, meta)


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover - the loop always returns


def _fmt_time(ts: Any) -> str:
    if ts is None or (isinstance(ts, float) and np.isnan(ts)) or ts is pd.NaT:
        return "–"
    return pd.Timestamp(ts).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


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


def _partition_row(log: PartitionLog, partition: int, view: LogView) -> dict[str, Any]:
    indexes = [log.index(ref) for ref in view.segments]
    return {
        "partition": partition,
        "start_offset": view.start_offset,
        "end_offset": view.end_offset,
        "records": view.end_offset - view.start_offset,
        "segments": len(view.segments),
        "bytes": sum(ref.size for ref in view.segments),
        "uncompressed_bytes": sum(_uncompressed(idx) for idx in indexes),
        "min_timestamp": _ms_to_datetime(min((i.meta.min_timestamp for i in indexes), default=None)),
        "max_timestamp": _ms_to_datetime(max((i.meta.max_timestamp for i in indexes), default=None)),
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
        rows.append(_partition_row(log, p, log.view()))
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
        "object": _name(key),
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
        "kind": "appended" if generation == 0 else "rewritten",
        "generation": generation,
        "created": m.created_ms if m else None,
        "below_start": (m.next_offset <= start_offset) if m else None,
        "on_chain": position is not None,
        "key": key,
    }


def _segments_frame(log: PartitionLog, view: LogView, superseded: bool) -> pd.DataFrame:
    rows = [
        _segment_row(i, ref.key, ref.size, log.index(ref), view.start_offset, ref.generation)
        for i, ref in enumerate(view.segments)
    ]
    if superseded:
        for info, _ in view.superseded:
            parsed = parse_segment_name(_name(info.key))
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
    ):
        frame[column] = frame[column].astype("Int64")
    for column in ("min_timestamp", "max_timestamp", "created"):
        frame[column] = pd.to_datetime(frame[column].astype("Int64"), unit="ms", utc=True)
    frame["below_start"] = frame["below_start"].astype("boolean")
    return frame


def segments(root: Any, topic: str, partition: int, *, superseded: bool = False) -> pd.DataFrame:
    """One row per segment object of the partition's chain, in offset order.

    Columns: chain position (``segment``), object name, base offset, last offset,
    end offset (exclusive), records, batches, bytes on storage and uncompressed,
    min/max timestamp, compression, kind (appended or rewritten), generation,
    creation time, whether it lies wholly below the log start, and the full key.
    With ``superseded=True`` objects off the chain (awaiting deletion) are
    listed too, with ``segment`` null and ``on_chain`` False.
    """
    log = _log(as_root(root), topic, partition)
    return _segments_frame(log, log.view(), superseded)


def _select_segment(log: PartitionLog, view: LogView, segment: int | str) -> tuple[SegmentRef, bool]:
    """The chain element at position ``segment``, or the object named (or keyed) ``segment``."""
    if isinstance(segment, (int, np.integer)) and not isinstance(segment, bool):
        n = len(view.segments)
        if not -n <= int(segment) < n:
            raise IndexError(f"{log.name} has {n} segment(s) on its chain; there is no segment {segment}")
        return view.segments[int(segment)], True
    if isinstance(segment, str):
        for ref in view.segments:
            if segment in (ref.key, _name(ref.key)):
                return ref, True
        for info, _ in view.superseded:
            if segment in (info.key, _name(info.key)):
                parsed = parse_segment_name(_name(info.key))
                if parsed is not None:
                    return SegmentRef(
                        info.key, parsed.base_offset, parsed.end_offset, parsed.generation, info.size
                    ), False
        raise KeyError(f"no segment object {segment!r} in {log.name}")
    raise TypeError(f"segment must be a chain position (int) or an object name (str), not {type(segment).__name__}")


def _index_of(log: PartitionLog, ref: SegmentRef, on_chain: bool) -> SegmentIndex:
    return log.index(ref) if on_chain else read_index(log.store, ref.key, ref.size)


def _index_frame(idx: SegmentIndex) -> pd.DataFrame:
    frame = idx.table.to_pandas()
    frame.insert(0, "batch", np.arange(idx.batch_count))
    for column in ("first_timestamp", "max_timestamp"):
        frame[column] = _timestamps(frame[column].to_numpy())
    return frame


def index_entries(root: Any, topic: str, partition: int, segment: int | str) -> pd.DataFrame:
    """The index of one segment, one row per batch, exactly as stored (timestamps shown as UTC datetimes).

    ``segment`` is a chain position (0 is the oldest; negative counts from the end) or an object name.
    """
    log = _log(as_root(root), topic, partition)
    view = log.view()
    ref, on_chain = _select_segment(log, view, segment)
    return _index_frame(_index_of(log, ref, on_chain))


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


def _batches_frame(store: Store, idx: SegmentIndex, check: bool) -> pd.DataFrame:
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
        for pos, length, crc in zip(idx.positions, idx.lengths, idx.crcs, strict=True):
            lo = int(pos) - start
            message = data[lo : lo + int(length)]
            if len(message) != int(length):
                status.append("truncated")
            else:
                status.append("ok" if crc32c(message) == int(crc) else "mismatch")
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
    log = _log(as_root(root), topic, partition)
    ref, on_chain = _select_segment(log, log.view(), segment)
    return _batches_frame(log.store, _index_of(log, ref, on_chain), check)


# --------------------------------------------------------------------------- records


def _decode_table(table: pa.Table) -> pa.Table:
    """Keys and values as UTF-8 text (undecodable bytes replaced), for reading in a notebook."""
    for name in ("key", "value"):
        i = table.schema.get_field_index(name)
        texts = [None if b is None else b.decode("utf-8", "replace") for b in table.column(i).to_pylist()]
        table = table.set_column(i, pa.field(name, pa.string()), pa.array(texts, pa.string()))
    return table


def _records_from(log: PartitionLog, start: int | None, end: int | None, limit: int | None) -> pa.Table:
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
    return pa.Table.from_batches(out, schema=RECORD_SCHEMA)


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
    table = _records_from(_log(as_root(root), topic, partition), start, end, limit)
    return _decode_table(table) if decode else table


def _segment_records(log: PartitionLog, idx: SegmentIndex, batch: int | None) -> pa.Table:
    if idx.batch_count == 0:
        return RECORD_SCHEMA.empty_table()
    if batch is None:
        first, last = 0, idx.batch_count - 1
    else:
        if not -idx.batch_count <= batch < idx.batch_count:
            raise IndexError(f"{_name(idx.key)} has {idx.batch_count} batch(es); there is no batch {batch}")
        first = last = batch % idx.batch_count
    return pa.Table.from_batches(read_batches(log.store, idx, first, last), schema=RECORD_SCHEMA)


def batch_records(
    root: Any, topic: str, partition: int, segment: int | str, batch: int | None = None, *, decode: bool = False
) -> pa.Table:
    """The records of one batch of a segment (all batches if ``batch`` is None) as an Arrow table.

    Unlike :func:`records` this includes records below the log start that the
    segment still holds.
    """
    log = _log(as_root(root), topic, partition)
    ref, on_chain = _select_segment(log, log.view(), segment)
    table = _segment_records(log, _index_of(log, ref, on_chain), batch)
    return _decode_table(table) if decode else table


# --------------------------------------------------------------------------- time and lag


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


# --------------------------------------------------------------------------- verify

#: Kinds of problem :func:`verify` reports, in the ``problem`` column.
PROBLEMS = {
    "truncated": "the object is shorter than its contents say (or has no plog tail at all)",
    "tail": "the 24-byte tail is damaged: magic, format version or index position",
    "index checksum": "the index fails its CRC32C",
    "index unreadable": "the index passes its CRC but does not parse, or has the wrong schema",
    "schema message": "the Arrow schema message at the start of the data is damaged",
    "framing": "batch positions, lengths or the end-of-stream marker do not fit together",
    "batch checksum": "a record batch fails its CRC32C",
    "batch unreadable": "a record batch passes its CRC but does not decode",
    "index mismatch": "the index disagrees with the data: record counts, offsets or timestamps",
    "name mismatch": "the object's name disagrees with the offsets or generation in its index",
    "chain gap": "offsets of the partition that no segment object holds",
    "chain overlap": "offsets that two consecutive segment objects of the chain both claim",
    "start marker": "a log start marker that does not parse or points outside the log",
    "stray object": "an object under log/ whose name is not a segment object name",
    "topic metadata": "a topic metadata object that does not parse or disagrees with the others",
}

_PROBLEM_COLUMNS = ["topic", "partition", "object", "offset", "problem", "detail", "on_chain"]


@dataclass
class _Problem:
    topic: str
    partition: int | None
    object: str | None
    offset: int | None
    problem: str
    detail: str
    on_chain: bool = True


@dataclass
class VerifyReport:
    """What :func:`verify` found: a DataFrame of problems plus what was checked.

    ``problems`` has one row per problem: topic, partition, object (key),
    offset (of the damaged batch or the start of a gap, when there is one),
    problem (one of :data:`PROBLEMS`), a human-readable detail, and whether
    the object is on a chain (damage to a superseded object loses nothing).
    """

    problems: pd.DataFrame
    topics: list[str]
    partitions: int = 0
    objects: int = 0
    batches: int = 0
    bytes: int = 0
    records: int = 0

    @property
    def ok(self) -> bool:
        """True when nothing is wrong."""
        return self.problems.empty

    def to_frame(self) -> pd.DataFrame:
        """The problems, as a DataFrame (a copy)."""
        return self.problems.copy()

    def raise_for_problems(self) -> None:
        """Raise :class:`CorruptRecordError` naming the first problem, if there is any."""
        if not self.ok:
            first = self.problems.iloc[0]
            offset = first["offset"]
            raise CorruptRecordError(
                f"verify found {len(self.problems)} problem(s); first: {first['problem']}: {first['detail']}",
                key=first["object"],
                offset=None if pd.isna(offset) else int(offset),
            )

    def summary(self) -> str:
        """One line: what was checked and how many problems were found."""
        checked = (
            f"{len(self.topics)} topic(s), {self.partitions} partition(s), {self.objects} object(s), "
            f"{self.batches:,} batch(es), {self.records:,} record(s), {_human_bytes(self.bytes)}"
        )
        verdict = "no problems" if self.ok else f"{len(self.problems)} problem(s)"
        return f"verified {checked}: {verdict}"

    def __repr__(self) -> str:
        if self.ok:
            return self.summary()
        with pd.option_context("display.max_colwidth", 100, "display.width", 200):
            return self.summary() + "\n" + self.problems.to_string(index=False)

    def _repr_html_(self) -> str:
        color = "#1a7f37" if self.ok else "#cf222e"
        head = f'<p style="color:{color}"><b>{html.escape(self.summary())}</b></p>'
        if self.ok:
            return f'<div class="plog-inspect">{head}</div>'
        return f'<div class="plog-inspect">{head}{_frame_html(self.problems, DISPLAY_ROWS * 5)}</div>'


class _Verifier:
    """Reads every object of a topic (read-only: get, get_range and list only) and records problems."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.problems: list[_Problem] = []
        self.objects = self.batches = self.bytes = self.records = 0

    def add(
        self,
        topic: str,
        partition: int | None,
        key: str | None,
        offset: int | None,
        problem: str,
        detail: str,
        on_chain: bool = True,
    ) -> None:
        assert problem in PROBLEMS, problem
        self.problems.append(_Problem(topic, partition, key, offset, problem, detail, on_chain))

    # ---------------------------------------------------------------- one segment object

    def check_object(self, topic: str, partition: int, info: ObjectInfo) -> SegmentMeta | None:
        """Check every byte of one segment object; returns its header when the index is readable."""
        key = info.key

        def report(problem: str, detail: str, offset: int | None = None) -> None:
            self.add(topic, partition, key, offset, problem, detail)

        data = self.store.get(key)
        self.objects += 1
        self.bytes += len(data)
        if len(data) != info.size:
            report("truncated", f"object is {len(data):,} bytes but was listed with {info.size:,}")
        if len(data) < TAIL.size:
            report("truncated", f"object is {len(data)} bytes, smaller than the {TAIL.size}-byte tail")
            return None
        index_position, index_crc, version, magic = TAIL.unpack(data[-TAIL.size :])
        if magic != MAGIC:
            near = sum(a != b for a, b in zip(magic, MAGIC, strict=True)) <= 2
            if near:
                report("tail", f"tail magic is {magic!r}, not {MAGIC!r}")
            else:
                report("truncated", "no plog tail at the end: the object is truncated, or is not a segment")
            return None
        if not 1 <= version <= FORMAT_VERSION:
            report("tail", f"format version {version} is not one this reader knows (1..{FORMAT_VERSION})")
            return None
        index_end = len(data) - TAIL.size
        if not 0 < index_position < index_end:
            report("tail", f"tail says the index starts at byte {index_position}, outside [1, {index_end})")
            return None
        index_bytes = data[index_position:index_end]
        if crc32c(index_bytes) != index_crc:
            report(
                "index checksum",
                f"index bytes [{index_position:,}, {index_end:,}) fail their CRC32C "
                f"({crc32c(index_bytes):08x} != {index_crc:08x})",
            )
            return None
        try:
            table = ipc.open_stream(pa.py_buffer(index_bytes)).read_all()
            meta = SegmentMeta.from_json(table.schema.metadata[b"plog.segment"])
        except (pa.ArrowException, KeyError, TypeError, ValueError, CorruptRecordError) as exc:
            report("index unreadable", f"index does not parse: {exc}")
            return None
        if table.schema.remove_metadata() != INDEX_SCHEMA:
            report("index unreadable", "index has an unexpected schema")
            return None
        idx = SegmentIndex(key, len(data), meta, table)
        self._check_name(topic, partition, key, meta)
        self._check_header(report, idx)
        self._check_batches(report, idx, data, index_position)
        return meta

    def _check_name(self, topic: str, partition: int, key: str, meta: SegmentMeta) -> None:
        parsed = parse_segment_name(_name(key))
        if parsed is None:  # pragma: no cover - callers only pass parsed names
            return
        claims = f"[{parsed.base_offset}, {'…' if parsed.end_offset is None else parsed.end_offset})"
        holds = f"[{meta.base_offset}, {meta.next_offset})"
        if parsed.base_offset != meta.base_offset or (
            parsed.end_offset is not None and parsed.end_offset != meta.next_offset
        ):
            self.add(
                topic,
                partition,
                key,
                meta.base_offset,
                "name mismatch",
                f"name claims offsets {claims} but the index holds {holds}",
            )
        if parsed.generation != meta.generation:
            self.add(
                topic,
                partition,
                key,
                meta.base_offset,
                "name mismatch",
                f"name says generation {parsed.generation}, index says {meta.generation}",
            )

    def _check_header(self, report: Any, idx: SegmentIndex) -> None:
        m = idx.meta
        n = idx.batch_count
        wrong = []
        if n == 0:
            report("index mismatch", "index lists no batches")
            return
        if m.batch_count != n:
            wrong.append(f"batch_count {m.batch_count} but the index has {n} rows")
        if m.record_count != int(idx.record_counts.sum()):
            wrong.append(f"record_count {m.record_count} but the batches hold {int(idx.record_counts.sum())}")
        if m.base_offset > int(idx.base_offsets[0]):
            wrong.append(f"base_offset {m.base_offset} is after the first batch's {int(idx.base_offsets[0])}")
        if m.next_offset <= int(idx.last_offsets[-1]):
            wrong.append(
                f"next_offset {m.next_offset} is not after the last batch's last offset {int(idx.last_offsets[-1])}"
            )
        first_ts = idx.table.column("first_timestamp").to_numpy()
        if m.min_timestamp != int(first_ts.min()) or m.max_timestamp != int(idx.max_timestamps.max()):
            wrong.append(
                f"timestamps [{m.min_timestamp}, {m.max_timestamp}] but the batches span "
                f"[{int(first_ts.min())}, {int(idx.max_timestamps.max())}]"
            )
        if m.running_max_timestamp < m.max_timestamp:
            wrong.append(f"running_max_timestamp {m.running_max_timestamp} is below max_timestamp {m.max_timestamp}")
        for problem in wrong:
            report("index mismatch", f"segment header says {problem}", m.base_offset)
        for i in range(n):
            base, last, count = int(idx.base_offsets[i]), int(idx.last_offsets[i]), int(idx.record_counts[i])
            if count < 1 or last < base or last - base + 1 < count:
                report("index mismatch", f"batch {i} claims offsets {base}..{last} with {count} record(s)", base)
            if i and base <= int(idx.last_offsets[i - 1]):
                report(
                    "index mismatch",
                    f"batch {i} starts at {base}, not after the previous batch's last "
                    f"offset {int(idx.last_offsets[i - 1])}",
                    base,
                )

    def _check_batches(self, report: Any, idx: SegmentIndex, data: bytes, index_position: int) -> None:
        view = memoryview(data)
        positions, lengths = idx.positions, idx.lengths
        first = int(positions[0])
        expected_schema = idx.meta.schema_crc32c
        if not 0 < first < index_position:
            report("framing", f"first batch is said to start at byte {first}, outside the data")
            return
        if expected_schema is not None:
            schema_ok = crc32c(view[:first]) == expected_schema
        else:
            try:
                schema_ok = ipc.read_schema(pa.py_buffer(data[:first])).equals(RECORD_SCHEMA)
            except (pa.ArrowException, OSError, ValueError):
                schema_ok = False
        if not schema_ok:
            report("schema message", f"schema message (bytes [0, {first})) is damaged")
        for i in range(idx.batch_count):
            base = int(idx.base_offsets[i])
            lo, length = int(positions[i]), int(lengths[i])
            hi = lo + length
            self.batches += 1
            if i + 1 < idx.batch_count and hi != int(positions[i + 1]):
                report(
                    "framing",
                    f"batch {i} ends at byte {hi:,} but batch {i + 1} starts at {int(positions[i + 1]):,}",
                    base,
                )
            if length <= 0 or hi > index_position - len(END_OF_STREAM):
                report("framing", f"batch {i} bytes [{lo:,}, {hi:,}) lie outside the data part", base)
                continue
            message = view[lo:hi]
            if crc32c(message) != int(idx.crcs[i]):
                report(
                    "batch checksum",
                    f"batch {i} (offsets {base}..{int(idx.last_offsets[i])}) fails its "
                    f"CRC32C ({crc32c(message):08x} != {int(idx.crcs[i]):08x})",
                    base,
                )
                continue
            try:
                batch = ipc.read_record_batch(ipc.read_message(pa.py_buffer(message)), RECORD_SCHEMA)
            except (pa.ArrowException, OSError, ValueError) as exc:
                report("batch unreadable", f"batch {i} does not decode: {exc}", base)
                continue
            self.records += batch.num_rows
            self._check_batch_content(report, idx, i, batch)
        end = int(positions[-1] + lengths[-1])
        if end + len(END_OF_STREAM) != index_position:
            report(
                "framing",
                f"batches end at byte {end:,} but the index starts at {index_position:,} "
                f"(expected {end + len(END_OF_STREAM):,})",
            )
        elif data[end:index_position] != END_OF_STREAM:
            report("framing", "end-of-stream marker is damaged")

    @staticmethod
    def _check_batch_content(report: Any, idx: SegmentIndex, i: int, batch: pa.RecordBatch) -> None:
        base, last = int(idx.base_offsets[i]), int(idx.last_offsets[i])
        count = int(idx.record_counts[i])
        if batch.num_rows != count:
            report("index mismatch", f"batch {i} holds {batch.num_rows} record(s), the index says {count}", base)
        if batch.num_rows == 0:
            return
        offsets = batch.column(0).to_numpy()
        if int(offsets[0]) != base or int(offsets[-1]) != last:
            report(
                "index mismatch",
                f"batch {i} holds offsets {int(offsets[0])}..{int(offsets[-1])}, the index says {base}..{last}",
                base,
            )
        if batch.num_rows > 1 and not bool(np.all(np.diff(offsets) > 0)):
            report("index mismatch", f"batch {i} offsets are not strictly increasing", base)
        if batch.column(0).null_count or batch.column(1).null_count:
            report("index mismatch", f"batch {i} has null offsets or timestamps", base)
            return
        stamps = batch.column(1).cast(pa.int64()).to_numpy()
        first_ts = int(idx.table.column("first_timestamp")[i].as_py())
        max_ts = int(idx.max_timestamps[i])
        if int(stamps[0]) != first_ts or int(stamps.max()) != max_ts:
            report(
                "index mismatch",
                f"batch {i} timestamps start at {int(stamps[0])} with max "
                f"{int(stamps.max())}; the index says {first_ts} and {max_ts}",
                base,
            )

    # ---------------------------------------------------------------- one partition

    def check_partition(self, topic: str, partition: int, prefix: str) -> None:
        def unparsed(info: ObjectInfo, folder: str, name: str) -> None:
            if folder == "log":
                self.add(
                    topic,
                    partition,
                    info.key,
                    None,
                    "stray object",
                    f"{name!r} is not a segment object name",
                    on_chain=False,
                )
            else:
                self.add(topic, partition, info.key, None, "start marker", f"{name!r} is not a marker name")

        listing = parse_listing(
            prefix,
            self.store.list(prefix),
            on_unparsed=unparsed,
            on_marker=lambda offset, key: self._check_marker(topic, partition, key, offset),
        )
        metas = {}
        for info in [i for _, i in listing.appended] + [r[3] for r in listing.rewritten]:
            metas[info.key] = self.check_object(topic, partition, info)
        chain = self._resolve(topic, partition, prefix, listing, metas)
        on_chain = set(chain)
        for problem in self.problems:
            if (
                problem.topic == topic
                and problem.partition == partition
                and problem.object is not None
                and problem.problem not in ("start marker",)
                and "/log/" in problem.object
            ):
                problem.on_chain = problem.object in on_chain

    def _check_marker(self, topic: str, partition: int, key: str, offset: int) -> None:
        try:
            body = json.loads(self.store.get(key))
            ok = isinstance(body, dict) and body.get("offset") == offset
        except (ValueError, UnicodeDecodeError):
            ok = False
        if not ok:
            self.add(
                topic, partition, key, offset, "start marker", f'marker does not parse as {{"offset": {offset}, ...}}'
            )

    def _resolve(
        self, topic: str, partition: int, prefix: str, listing: PartitionListing, metas: dict[str, SegmentMeta | None]
    ) -> list[str]:
        """Resolve the chain with :func:`resolve_chain` (PROTOCOL.md 7.2), reporting every gap and overlap."""

        def gap(lo: int, hi: int, key: str | None, why: str) -> None:
            self.add(topic, partition, key, lo, "chain gap", f"offsets {lo}..{hi - 1} are in no segment object ({why})")

        resolved = resolve_chain(prefix, listing, lambda hole: gap(hole.lo, hole.hi, hole.key, hole.why))
        chain = resolved.segments
        if not chain:
            return []
        start = resolved.marker_offset
        # Readers accept a log with no start marker that begins above 0 (its start is its first object), so
        # resolve_chain does not call that a hole; but nothing should have left offsets below the first object
        # without a marker past them, so the verifier does.
        if start is None and chain[0].base_offset > 0:
            gap(0, chain[0].base_offset, chain[0].key, "below the first object, with no start marker past them")
        # Only appended objects get their end from their place; a rewritten object's end is in its name,
        # checked against its index already.
        for ref in chain[resolved.appended_from :]:
            key, place_end = ref.key, ref.end_offset
            meta = metas.get(key)
            if meta is None or place_end is None:
                continue
            if meta.next_offset < place_end:
                gap(
                    meta.next_offset,
                    place_end,
                    key,
                    f"{_name(key)} ends at {meta.next_offset}, the next object of the chain starts at {place_end}",
                )
            elif meta.next_offset > place_end:
                self.add(
                    topic,
                    partition,
                    key,
                    place_end,
                    "chain overlap",
                    f"{_name(key)} holds offsets up to {meta.next_offset - 1}, but the next object "
                    f"of the chain starts at {place_end}",
                )
        last_meta = metas.get(chain[-1].key)
        if start is not None and last_meta is not None and start > last_meta.next_offset:
            self.add(
                topic,
                partition,
                resolved.marker_key,
                start,
                "start marker",
                f"log start {start} is beyond the log end {last_meta.next_offset}",
            )
        return [ref.key for ref in chain]

    # ---------------------------------------------------------------- topic metadata

    def check_topic_metadata(self, topic: str) -> None:
        topic_ids = set()
        for info in self.store.list(topic_meta_prefix(topic)):
            try:
                meta = TopicMetadata.from_json(self.store.get(info.key))
            except (ValueError, TypeError, UnicodeDecodeError) as exc:
                self.add(topic, None, info.key, None, "topic metadata", f"does not parse: {exc}")
                continue
            topic_ids.add(meta.topic_id)
            version = info.key.rsplit("/", 1)[-1].split(".", 1)[0]
            if meta.name != topic or (version.isdigit() and int(version) != meta.version):
                self.add(
                    topic, None, info.key, None, "topic metadata", f"says topic {meta.name!r} version {meta.version}"
                )
        if len(topic_ids) > 1:
            self.add(
                topic,
                None,
                topic_meta_prefix(topic),
                None,
                "topic metadata",
                f"versions disagree on the topic id: {sorted(topic_ids)}",
            )


def verify(root: Any, topic: str | Iterable[str] | None = None) -> VerifyReport:
    """Check every checksum and every index of ``topic`` (several, or all when None) against the data.

    Reads each segment object whole and checks, without trusting anything:
    the tail, the index CRC and schema, the schema message and end-of-stream
    marker, each batch's CRC32C, that each batch decodes and holds the
    records, offsets and timestamps its index row claims, that each object's
    name agrees with its index, start markers, topic metadata, and that the
    chain of each partition has no gap or overlap. Superseded objects (off the
    chain, awaiting deletion) are checked too, flagged ``on_chain=False``.

    Nothing is written, changed or deleted: only ``list``, ``get`` and
    ``get_range`` are called. Returns a :class:`VerifyReport`.
    """
    r = as_root(root)
    names = r.catalog.names() if topic is None else [topic] if isinstance(topic, str) else list(topic)
    checker = _Verifier(r.store)
    partition_count = 0
    for name in names:
        meta = r.catalog.get(name)  # raises UnknownTopicOrPartitionError for an unknown topic
        checker.check_topic_metadata(name)
        for p in range(meta.partitions):
            checker.check_partition(name, p, partition_prefix(name, meta.topic_id, p))
            partition_count += 1
    frame = pd.DataFrame([p.__dict__ for p in checker.problems], columns=_PROBLEM_COLUMNS)
    frame["partition"] = frame["partition"].astype("Int64")
    frame["offset"] = frame["offset"].astype("Int64")
    frame["on_chain"] = frame["on_chain"].astype(bool)
    return VerifyReport(frame, names, partition_count, checker.objects, checker.batches, checker.bytes, checker.records)


# --------------------------------------------------------------------------- views (notebook display)


def _frame_html(frame: pd.DataFrame, max_rows: int = DISPLAY_ROWS) -> str:
    return frame.to_html(index=False, max_rows=max_rows, border=0, na_rep="–", classes="plog-table")


def _card_html(title: str, facts: list[tuple[str, Any]], frame: pd.DataFrame | None, hint: str = "") -> str:
    rows = "".join(
        f'<tr><th style="text-align:left;padding-right:1em">{html.escape(k)}</th>'
        f'<td style="text-align:left">{html.escape(str(v))}</td></tr>'
        for k, v in facts
    )
    parts = [
        f'<div class="plog-inspect"><h4 style="margin:0.2em 0">{html.escape(title)}</h4>',
        f'<table style="margin-bottom:0.6em">{rows}</table>',
    ]
    if frame is not None:
        parts.append(_frame_html(frame))
    if hint:
        parts.append(f'<p style="font-size:smaller;opacity:0.7">{html.escape(hint)}</p>')
    parts.append("</div>")
    return "".join(parts)


def _card_text(title: str, facts: list[tuple[str, Any]], frame: pd.DataFrame | None) -> str:
    width = max((len(k) for k, _ in facts), default=0)
    lines = [title] + [f"  {k.ljust(width)}  {v}" for k, v in facts]
    if frame is not None:
        with pd.option_context("display.max_rows", DISPLAY_ROWS, "display.width", 160):
            lines.append(frame.to_string(index=False, max_rows=DISPLAY_ROWS))
    return "\n".join(lines)


class _Card:
    """Shared display: a title, a few facts, and a table; ``_repr_html_`` in notebooks, text elsewhere."""

    def _card(self) -> tuple[str, list[tuple[str, Any]], pd.DataFrame | None, str]:
        raise NotImplementedError

    def _repr_html_(self) -> str:
        title, facts, frame, hint = self._card()
        return _card_html(title, facts, frame, hint)

    def __repr__(self) -> str:
        title, facts, frame, _ = self._card()
        return _card_text(title, facts, frame)


class RootView(_Card):
    """A plog root: its topics. ``.topic(name)`` inspects one."""

    def __init__(self, root: Any, storage_options: dict[str, Any] | None = None) -> None:
        self.root = as_root(root, storage_options)

    def topics(self) -> pd.DataFrame:
        """One row per topic with its configuration (see :func:`topics`)."""
        return topics(self.root)

    def topic(self, name: str) -> TopicView:
        """Inspect one topic."""
        return TopicView(self.root, name)

    def verify(self, topic: str | Iterable[str] | None = None) -> VerifyReport:
        """Verify every topic (or those named); see :func:`verify`."""
        return verify(self.root, topic)

    def _card(self) -> tuple[str, list[tuple[str, Any]], pd.DataFrame | None, str]:
        frame = self.topics()
        shown = frame[["topic", "partitions", "created", "compression.type", "retention.ms", "cleanup.policy"]]
        return (
            f"plog root {self.root.url}",
            [("topics", len(frame))],
            shown,
            "root.topic(name) inspects a topic; root.topics() has every config key",
        )


class TopicView(_Card):
    """One topic: metadata, configuration, partitions. ``.partition(p)`` inspects one partition.

    Metadata is read when the view is made; partition listings are read on each call.
    """

    def __init__(self, root: Any, name: str, storage_options: dict[str, Any] | None = None) -> None:
        self.root = as_root(root, storage_options)
        self.name = name
        self.meta: TopicMetadata = self.root.topic(name, refresh=True)

    @property
    def topic_id(self) -> str:
        """The topic's id (fixed at creation)."""
        return self.meta.topic_id

    @property
    def num_partitions(self) -> int:
        """How many partitions the topic has."""
        return self.meta.partitions

    def config(self) -> pd.DataFrame:
        """Configuration keys with values and defaults (see :func:`topic_config`)."""
        return topic_config(self.root, self.name)

    def partitions(self) -> pd.DataFrame:
        """One row per partition (see :func:`partitions`)."""
        return partitions(self.root, self.name)

    def partition(self, partition: int) -> PartitionView:
        """Inspect one partition (a snapshot of its chain)."""
        return PartitionView(self.root, self.name, partition)

    def offset_timeline(self, partitions: Iterable[int] | None = None) -> pd.DataFrame:
        """One row per batch: offsets against timestamps (see :func:`offset_timeline`)."""
        return offset_timeline(self.root, self.name, partitions)

    def consumer_lag(self, committed: Mapping[int, int | None]) -> pd.DataFrame:
        """Lag of committed offsets against the end offsets (see :func:`consumer_lag`)."""
        return consumer_lag(self.root, self.name, committed)

    def verify(self) -> VerifyReport:
        """Check every checksum and index of the topic; changes nothing (see :func:`verify`)."""
        return verify(self.root, self.name)

    def _card(self) -> tuple[str, list[tuple[str, Any]], pd.DataFrame | None, str]:
        m = self.meta
        overrides = {k: v for k, v in m.config.items() if TOPIC_CONFIG_DEFAULTS.get(k) != v}
        frame = self.partitions()
        facts: list[tuple[str, Any]] = [
            ("topic id", m.topic_id),
            ("partitions", m.partitions),
            ("records", f"{int(frame['records'].sum()):,}"),
            ("bytes", _human_bytes(float(frame["bytes"].sum()))),
            ("created", _fmt_time(_ms_to_datetime(m.created_ms))),
            ("metadata version", m.version),
            ("config (non-default)", ", ".join(f"{k}={v}" for k, v in overrides.items()) or "all defaults"),
        ]
        shown = frame.drop(columns=["superseded_bytes"])
        return (f"topic {self.name}", facts, shown, "topic.partition(p) inspects a partition; topic.verify() checks it")


class PartitionView(_Card):
    """One partition, as resolved when the view was made: its chain of segments, start and end offsets.

    ``.segment(i)`` inspects the ``i``-th segment of the chain (or one named by
    its object name); ``.refresh()`` resolves the partition again.
    """

    def __init__(self, root: Any, topic: str, partition: int) -> None:
        self.root = as_root(root)
        self.topic = topic
        self.partition = partition
        self.log = _log(self.root, topic, partition)
        self.view: LogView = self.log.view()

    def refresh(self) -> PartitionView:
        """A new view of the same partition, resolved now."""
        return PartitionView(self.root, self.topic, self.partition)

    @property
    def start_offset(self) -> int:
        """The log start offset."""
        return self.view.start_offset

    @property
    def end_offset(self) -> int:
        """The log end offset (the offset the next record gets)."""
        return self.view.end_offset

    def __len__(self) -> int:
        return len(self.view.segments)

    def summary(self) -> dict[str, Any]:
        """The partition's row of :func:`partitions`, as a dict."""
        return _partition_row(self.log, self.partition, self.view)

    def segments(self, *, superseded: bool = False) -> pd.DataFrame:
        """One row per segment of the chain (see :func:`segments`)."""
        return _segments_frame(self.log, self.view, superseded)

    def segment(self, segment: int | str) -> SegmentView:
        """Inspect a segment: chain position (0 oldest, -1 newest) or object name."""
        ref, on_chain = _select_segment(self.log, self.view, segment)
        return SegmentView(self, ref, on_chain)

    def segment_for(self, offset: int) -> SegmentView:
        """Inspect the segment holding ``offset``."""
        if not self.view.start_offset <= offset < self.view.end_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} is out of range for {self.log.name}: valid offsets "
                f"are {self.view.start_offset}..{self.view.end_offset - 1}"
            )
        return self.segment(self.view.segment_for(offset))

    def records(
        self, start: int | None = None, end: int | None = None, *, limit: int | None = None, decode: bool = False
    ) -> pa.Table:
        """Records of offsets ``[start, end)`` as an Arrow table (see :func:`records`)."""
        table = _records_from(self.log, start, end, limit)
        return _decode_table(table) if decode else table

    def offset_timeline(self) -> pd.DataFrame:
        """One row per batch of the chain: offsets against timestamps."""
        return _timeline_frame(_timeline_rows(self.log, self.view, self.partition))

    def _card(self) -> tuple[str, list[tuple[str, Any]], pd.DataFrame | None, str]:
        row = self.summary()
        facts: list[tuple[str, Any]] = [
            ("start offset", f"{row['start_offset']:,}"),
            ("end offset", f"{row['end_offset']:,}"),
            ("records", f"{row['records']:,}"),
            ("segments", row["segments"]),
            (
                "bytes",
                f"{_human_bytes(row['bytes'])} on storage, {_human_bytes(row['uncompressed_bytes'])} uncompressed",
            ),
            ("timestamps", f"{_fmt_time(row['min_timestamp'])} … {_fmt_time(row['max_timestamp'])}"),
        ]
        if row["superseded_objects"]:
            facts.append(
                (
                    "superseded",
                    f"{row['superseded_objects']} object(s), "
                    f"{_human_bytes(row['superseded_bytes'])}, awaiting deletion",
                )
            )
        frame = self.segments().drop(columns=["key", "on_chain"])
        return (
            f"partition {self.topic}-{self.partition}",
            facts,
            frame,
            "partition.segment(i) inspects a segment; end offsets are exclusive",
        )


class SegmentView(_Card):
    """One segment object: its header, index, batches and records."""

    def __init__(self, partition: PartitionView, ref: SegmentRef, on_chain: bool = True) -> None:
        self.partition = partition
        self.ref = ref
        self.on_chain = on_chain
        self.index_data: SegmentIndex = _index_of(partition.log, ref, on_chain)

    @property
    def key(self) -> str:
        """The object's key under the root."""
        return self.ref.key

    @property
    def meta(self) -> SegmentMeta:
        """The segment header (offsets, counts, timestamps, compression, writer...)."""
        return self.index_data.meta

    def __len__(self) -> int:
        return self.index_data.batch_count

    def index(self) -> pd.DataFrame:
        """The index entries, one row per batch (see :func:`index_entries`)."""
        return _index_frame(self.index_data)

    def batches(self, *, check: bool = True) -> pd.DataFrame:
        """The batches with metadata and checksum status (see :func:`batches`)."""
        return _batches_frame(self.partition.log.store, self.index_data, check)

    def records(self, batch: int | None = None, *, decode: bool = False) -> pa.Table:
        """Records of one batch (all batches when ``batch`` is None) as an Arrow table."""
        table = _segment_records(self.partition.log, self.index_data, batch)
        return _decode_table(table) if decode else table

    def _card(self) -> tuple[str, list[tuple[str, Any]], pd.DataFrame | None, str]:
        m = self.meta
        uncompressed = int(self.index_data.table.column("uncompressed_bytes").to_numpy().sum())
        facts: list[tuple[str, Any]] = [
            ("object", self.key),
            ("offsets", f"{m.base_offset:,} … {m.next_offset - 1:,} (end {m.next_offset:,})"),
            ("records", f"{m.record_count:,} in {m.batch_count} batch(es)"),
            ("bytes", f"{_human_bytes(self.ref.size)} on storage, {_human_bytes(uncompressed)} uncompressed"),
            ("compression", m.compression),
            (
                "timestamps",
                f"{_fmt_time(_ms_to_datetime(m.min_timestamp))} … {_fmt_time(_ms_to_datetime(m.max_timestamp))}",
            ),
            (
                "kind",
                f"{'appended' if m.generation == 0 else 'rewritten'} (generation {m.generation})"
                + ("" if self.on_chain else ", superseded: off the chain"),
            ),
            ("created", f"{_fmt_time(_ms_to_datetime(m.created_ms))} by writer {m.writer}"),
        ]
        frame = self.batches(check=False).drop(columns=["checksum", "attributes"])
        return (
            f"segment {_name(self.key)}",
            facts,
            frame,
            "segment.records(batch=i) reads a batch; segment.batches() also checks every CRC",
        )


def inspect_root(root: Any, storage_options: dict[str, Any] | None = None) -> RootView:
    """Inspect a plog root (URL, path, LogRoot or LogStore)."""
    return RootView(root, storage_options)


def inspect_topic(root: Any, name: str, storage_options: dict[str, Any] | None = None) -> TopicView:
    """Inspect one topic of a plog root (URL, path, LogRoot or LogStore)."""
    return TopicView(root, name, storage_options)


__all__ = [
    "PROBLEMS",
    "PartitionView",
    "RootView",
    "SegmentView",
    "TopicView",
    "VerifyReport",
    "as_root",
    "batch_records",
    "batches",
    "consumer_lag",
    "index_entries",
    "inspect_root",
    "inspect_topic",
    "lag_frame",
    "offset_timeline",
    "partitions",
    "records",
    "segments",
    "throughput",
    "topic_config",
    "topics",
    "verify",
]
