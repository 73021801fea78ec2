"""Presentation: what the CLI and notebooks show of a plog root (cards, terminal tables, plots).

* ``cards``: notebook views of a root, topic, partition and segment (HTML and text cards);
* ``terminal``: rich tables that the ``plog`` command prints, rendered from the listings' frames;
* ``plots``: matplotlib figures (partition sizes, offsets over time, consumer lag).
* ``values``: typed topics' values as JSON and their schemas as DDL (``plog produce``/``consume``/``describe``).

The data they show comes from ``segment_format.inspect.listings`` and ``segment_format.inspect.verify``; this
package re-exports that inspection API for notebooks (``from pyspark_logsource import views as pi``).
The re-exports are imported on first use: they bring pandas, which the ``plog`` command, importing
``views.terminal`` for every command, should not pay for at start-up.

May import segment_format, coordinator and pyspark_logsource.client; never the Spark connector or the CLI.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark_logsource.views.cards import (
        PartitionView,
        RootView,
        SegmentView,
        TopicView,
        inspect_root,
        inspect_topic,
    )
    from pyspark_logsource.views.plots import plot_consumer_lag, plot_offsets_over_time, plot_partition_sizes
    from segment_format.inspect.listings import (
        as_root,
        batch_records,
        batches,
        consumer_lag,
        index_entries,
        lag_frame,
        offset_timeline,
        partitions,
        records,
        segments,
        throughput,
        topic_config,
        topics,
    )
    from segment_format.inspect.verify import PROBLEMS, VerifyReport, verify

#: Each re-exported name and the module it lives in.
_HOMES = {
    **dict.fromkeys(
        ("PartitionView", "RootView", "SegmentView", "TopicView", "inspect_root", "inspect_topic"),
        "pyspark_logsource.views.cards",
    ),
    **dict.fromkeys(
        ("plot_consumer_lag", "plot_offsets_over_time", "plot_partition_sizes"), "pyspark_logsource.views.plots"
    ),
    **dict.fromkeys(
        (
            "as_root",
            "batch_records",
            "batches",
            "consumer_lag",
            "index_entries",
            "lag_frame",
            "offset_timeline",
            "partitions",
            "records",
            "segments",
            "throughput",
            "topic_config",
            "topics",
        ),
        "segment_format.inspect.listings",
    ),
    **dict.fromkeys(("PROBLEMS", "VerifyReport", "verify"), "segment_format.inspect.verify"),
}


def __getattr__(name: str) -> object:
    """The inspection API, imported from its home on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])


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
    "plot_consumer_lag",
    "plot_offsets_over_time",
    "plot_partition_sizes",
    "records",
    "segments",
    "throughput",
    "topic_config",
    "topics",
    "verify",
]
