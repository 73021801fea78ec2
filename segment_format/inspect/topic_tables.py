"""Listings of a root's topics and of a topic's partitions (offsets, records, bytes)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..errors import ObjectNotFoundError, UnknownTopicOrPartitionError
from ..log.chain import LogView
from ..log.partition_log import PartitionLog
from ..parallel import io_map
from ..segment import (
    SegmentIndex,
)
from ..topic import TOPIC_CONFIG_DEFAULTS, TopicMetadata, default_layout
from .tables import as_root, timestamps, utc_datetime


def _uncompressed(idx: SegmentIndex) -> int:
    return int(idx.table.column("uncompressed_bytes").to_numpy().sum())


# --------------------------------------------------------------------------- topics


def topics(root: Any) -> pd.DataFrame:
    """One row per topic: partitions, topic id, metadata version, creation time, and every config key."""
    r = as_root(root)
    rows = []
    config_keys = list(TOPIC_CONFIG_DEFAULTS)
    # The catalog's listing names every topic's newest metadata version: one GET each, in parallel,
    # instead of a listing and a GET per topic one after the other.
    newest = r.catalog.newest_versions()

    def read(name: str) -> TopicMetadata | None:
        try:
            return r.catalog.read_version(name, newest[name])
        except ObjectNotFoundError:  # collected or deleted since the listing: as a reader would, look again
            try:
                return r.topic(name, refresh=True)
            except UnknownTopicOrPartitionError:  # deleted since the listing
                return None

    names = sorted(newest)
    for name, meta in zip(names, io_map(read, names), strict=True):
        if meta is None:
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
    frame["created"] = timestamps(frame["created"].to_numpy(dtype=np.int64))
    return frame


def topic_config(root: Any, topic: str) -> pd.DataFrame:
    """The topic's configuration, one row per key: value, default, whether it is the default."""
    opened = as_root(root)
    meta = opened.topic(topic, refresh=True)
    defaults = {**TOPIC_CONFIG_DEFAULTS, "storage.layout": default_layout(opened.protocol)}
    keys = list(defaults) + [k for k in meta.config if k not in defaults]
    rows = []
    for key in keys:
        default = defaults.get(key)
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
    # One listing of the topic (a LIST per 1,000 objects) instead of one per partition.
    views = r.partition_views(topic, meta)
    summaries = io_map(
        lambda p: partition_summary(r.partition(topic, p, meta), p, views[p]), list(range(meta.partitions))
    )
    return _partitions_frame(summaries)
