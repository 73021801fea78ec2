"""A shared topic's shared objects as a table (PROTOCOL.md 7.3): each object once, with the partitions it holds.

::

    listings.shared_objects("plog-data", "clicks")
    #   object                          created                   commits  partitions       records  bytes
    #   shared/1795...-9f3c....arrow    2026-11-28 16:39:32.390   [0]      [0, 1, 2, 3]     40       4,000

Built from the topic's commits alone (no shared object is read): what its current commit chain names, so
runs already moved into segments (10.2) are not listed.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..topic import is_shared
from .tables import as_root, utc_datetime

__all__ = ["shared_objects"]

_COLUMNS = ["object", "created", "commits", "partitions", "records", "bytes", "schema_versions"]


def shared_objects(root: Any, topic: str) -> pd.DataFrame:
    """One row per shared object the commit chain of ``topic`` names: when its first commit was made, the
    commits and partitions naming it, its runs' records and stored bytes for this topic, and the value schema
    versions they are written in (a typed topic's, PROTOCOL.md 11.8; empty otherwise). An empty table for a
    partitioned topic."""
    r = as_root(root)
    meta = r.topic(topic, refresh=True)
    if not is_shared(meta.config):
        return pd.DataFrame(columns=_COLUMNS)
    sequence = r.sequence(topic, meta)
    sequence.resolve()
    rows: dict[str, dict[str, Any]] = {}
    for element in sequence.elements:
        for entry in element.commit.entries:
            number = element.commit.sequence if entry.sequence is None else entry.sequence
            created = element.commit.created_ms if entry.created_ms is None else entry.created_ms
            row = rows.setdefault(
                entry.object,
                {
                    "object": entry.object,
                    "created": created,
                    "commits": set(),
                    "partitions": set(),
                    "records": 0,
                    "bytes": 0,
                    "schema_versions": set(),
                },
            )
            row["created"] = min(row["created"], created)
            row["commits"].add(number)
            row["partitions"].add(entry.partition)
            row["records"] += entry.record_count
            row["bytes"] += entry.stored_bytes
            if entry.value_schema_version is not None:
                row["schema_versions"].add(entry.value_schema_version)
    frame = pd.DataFrame(
        [
            {
                **row,
                "commits": sorted(row["commits"]),
                "partitions": sorted(row["partitions"]),
                "schema_versions": sorted(row["schema_versions"]),
            }
            for row in rows.values()
        ],
        columns=_COLUMNS,
    )
    frame["created"] = [utc_datetime(ms) for ms in frame["created"]]
    return frame.sort_values("created", kind="stable").reset_index(drop=True)
