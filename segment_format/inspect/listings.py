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
    listings.shared_objects("plog-data", "clicks")     # a shared topic's shared objects, each once

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

This module is the facade: the functions live by concern in ``tables`` (shared
helpers), ``topic_tables`` (topics and partitions), ``segment_tables``
(segments, index entries, batches), ``record_tables`` (records) and
``activity`` (offsets over time, consumer lag, throughput), and are all
re-exported here.
"""

from __future__ import annotations

from .activity import consumer_lag, lag_frame, offset_timeline, partition_timeline, throughput
from .record_tables import batch_records, decode_text, read_records, records, segment_records
from .segment_tables import (
    batches,
    batches_frame,
    index_entries,
    index_frame,
    segment_at,
    segment_index,
    segments,
    segments_frame,
    select_segment,
)
from .shared_tables import shared_objects
from .tables import as_root, element_name, human_bytes, object_name, refreshed_partition_log, utc_datetime
from .topic_tables import partition_summary, partitions, topic_config, topics

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
    "element_name",
    "object_name",
    "offset_timeline",
    "refreshed_partition_log",
    "partition_summary",
    "partition_timeline",
    "partitions",
    "read_records",
    "records",
    "segment_at",
    "segment_index",
    "segment_records",
    "shared_objects",
    "segments",
    "segments_frame",
    "select_segment",
    "throughput",
    "topic_config",
    "topics",
    "utc_datetime",
]
