"""How far a streaming query is behind the latest offsets, from its progress, as Spark's Kafka source says it.

Spark's Kafka source reports ``minOffsetsBehindLatest``, ``maxOffsetsBehindLatest`` and
``avgOffsetsBehindLatest`` in each progress's ``sources[i].metrics``, through the DataSource V2 interface
``ReportsSourceMetrics``. A Python data source cannot: PySpark's Python Data Source API (4.0 to 4.3) has no
metrics hook, and the JVM stream wrapping a Python reader (``PythonMicroBatchStream``) does not implement
``ReportsSourceMetrics``, so ``sources[i].metrics`` stays empty. What it has is
``DataSourceStreamReader.reportLatestOffset`` (PySpark 4.2 and later), which the plog source implements
(``stream_reader.py``): every progress then carries the batch's ``endOffset`` and the ``latestOffset``
the source saw, both per partition. :func:`offsets_behind_latest` computes Kafka's three numbers from
those two, for a ``StreamingQueryListener``'s ``onQueryProgress`` or from ``query.lastProgress``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pyspark_logsource.spark.options import checkpoint_offsets

__all__ = ["offsets_behind_latest"]


def _offsets(value: Any) -> dict[tuple[str, int], int]:
    """Offsets by (topic, partition) from a progress's offset field (JSON text in a listener, a dict in
    ``lastProgress``; None or unparsable: none)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    if not isinstance(value, Mapping):
        return {}
    try:
        return checkpoint_offsets(value)
    except (AttributeError, TypeError, ValueError):  # not a plog source's offsets
        return {}


def offsets_behind_latest(source: Any) -> dict[str, float]:
    """``minOffsetsBehindLatest``, ``maxOffsetsBehindLatest`` and ``avgOffsetsBehindLatest`` of one source's
    progress (``query.lastProgress["sources"][i]`` or a listener's ``SourceProgress``), over the partitions
    in both its ``latestOffset`` and its ``endOffset``, as Spark's Kafka source computes them; empty when
    the progress has no ``latestOffset`` (PySpark before 4.2, or a batch before the source saw any)."""
    if isinstance(source, Mapping):
        end, latest = source.get("endOffset"), source.get("latestOffset")
    else:
        end, latest = getattr(source, "endOffset", None), getattr(source, "latestOffset", None)
    consumed, available = _offsets(end), _offsets(latest)
    behind = [max(0, available[tp] - consumed[tp]) for tp in available if tp in consumed]
    if not behind:
        return {}
    return {
        "minOffsetsBehindLatest": min(behind),
        "maxOffsetsBehindLatest": max(behind),
        "avgOffsetsBehindLatest": sum(behind) / len(behind),
    }
