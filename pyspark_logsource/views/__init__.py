"""Presentation: what the CLI and notebooks show of a plog root (cards, terminal tables, plots).

* ``cards``: notebook views of a root, topic, partition and segment (HTML and text cards);
* ``terminal``: rich tables that the ``plog`` command prints, rendered from the listings' frames;
* ``plots``: matplotlib figures (partition sizes, offsets over time, consumer lag).

The data they show comes from ``segment_format.listings`` and ``segment_format.verify``; this
package re-exports that inspection API for notebooks (``from pyspark_logsource import views as pi``).

May import segment_format, coordinator and pyspark_logsource.client; never the Spark connector or the CLI.
"""

from pyspark_logsource.views.cards import PartitionView, RootView, SegmentView, TopicView, inspect_root, inspect_topic
from pyspark_logsource.views.plots import plot_consumer_lag, plot_offsets_over_time, plot_partition_sizes
from segment_format.listings import (
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
from segment_format.verify import PROBLEMS, VerifyReport, verify

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
