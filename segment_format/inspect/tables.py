"""Helpers the listings share: a root from what the caller gave, a partition's log, times, names, sizes."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pandas as pd

from ..log.partition_log import PartitionLog
from ..root import LogRoot


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


def refreshed_partition_log(root: LogRoot, topic: str, partition: int) -> PartitionLog:
    """The log of one partition, with the topic's metadata read afresh (partitions may have been added)."""
    meta = root.topic(topic, refresh=True)
    return root.partition(topic, partition, meta)


def timestamps(ms: Any) -> pd.Series:
    """Epoch milliseconds as a UTC datetime column."""
    values = np.asarray(ms, dtype=np.int64)
    return pd.Series(pd.to_datetime(values, unit="ms", utc=True))


def utc_datetime(ms: int | None) -> pd.Timestamp | None:
    """Epoch milliseconds as a UTC timestamp (None stays None)."""
    return None if ms is None else pd.Timestamp(int(ms), unit="ms", tz="UTC")


def object_name(key: str) -> str:
    """The last part of an object key: a segment object's file name."""
    return key.rsplit("/", 1)[-1]


def element_name(key: str, index: Any) -> str:
    """What to call a chain element: its object's file name, or a shared topic's run by its shared object's."""
    return object_name(index.data_key if getattr(index, "is_run", False) else key)


def human_bytes(n: float) -> str:
    """A byte count with a binary unit: ``512 B``, ``1.5 KiB``, ``3.2 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover - the loop always returns
