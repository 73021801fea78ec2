"""Offsets over time, consumer lag and throughput, from indexes and committed offsets only."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from ..log.chain import LogView
from ..log.partition_log import PartitionLog
from .tables import as_root, timestamps


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
        frame[column] = timestamps(frame[column].to_numpy(dtype=np.int64))
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
