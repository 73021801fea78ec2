"""Notebook cards of a plog root: views of a root, a topic, a partition and a segment.

Each view shows itself as a card: a title, a few facts and a table, as HTML
in a notebook (``_repr_html_``) and as text elsewhere (``__repr__``); its
methods return the data-only listings of :mod:`segment_format.inspect.listings` for
the same snapshot. Views render, they do not compute::

    from pyspark_logsource import views as pi

    topic = pi.inspect_topic("plog-data", "clicks")
    topic                              # in a notebook: a card with a table of partitions
    part = topic.partition(0)          # a snapshot of the partition's chain
    part.segments()                    # DataFrame: one row per segment object
    seg = part.segment(0)
    seg.index()                        # the index entries, as stored
    seg.batches()                      # per batch: producer fields, flags, checksum status
    seg.records(batch=0)               # pyarrow Table of the batch's records
    topic.verify()                     # every checksum and index, checked; nothing changed

Nothing here writes to storage.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from pyspark_logsource.views.values import schema_ddl
from segment_format.inspect.listings import (
    as_root,
    batches_frame,
    consumer_lag,
    decode_text,
    human_bytes,
    index_frame,
    object_name,
    offset_timeline,
    partition_summary,
    partition_timeline,
    partitions,
    read_records,
    refreshed_partition_log,
    segment_at,
    segment_index,
    segment_records,
    segments_frame,
    select_segment,
    shared_objects,
    topic_config,
    topics,
    utc_datetime,
)
from segment_format.inspect.verify import VerifyReport, verify
from segment_format.log.chain import LogView, SegmentRef
from segment_format.segment import SegmentIndex, SegmentMeta
from segment_format.topic import TOPIC_CONFIG_DEFAULTS, TopicMetadata

#: Rows shown by the notebook display of a view before it elides the middle.
DISPLAY_ROWS = 20


def _fmt_time(ts: Any) -> str:
    if ts is None or (isinstance(ts, float) and np.isnan(ts)) or ts is pd.NaT:
        return "–"
    return pd.Timestamp(ts).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


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

    def shared_objects(self) -> pd.DataFrame:
        """A shared topic's shared objects, each once with the partitions it holds (empty when partitioned)."""
        return shared_objects(self.root, self.name)

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
            ("bytes", human_bytes(float(frame["bytes"].sum()))),
            ("created", _fmt_time(utc_datetime(m.created_ms))),
            ("metadata version", m.version),
            ("config (non-default)", ", ".join(f"{k}={v}" for k, v in overrides.items()) or "all defaults"),
        ]
        history = m.schema_history
        if history is not None:  # a typed topic (PROTOCOL.md 11.8): its values are rows of this schema
            facts.append(
                (
                    "value schema",
                    f"v{history.current.version} of {len(history.entries)}, {history.compatibility}: "
                    f"{schema_ddl(history.current.schema)}",
                )
            )
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
        self.log = refreshed_partition_log(self.root, topic, partition)
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
        return partition_summary(self.log, self.partition, self.view)

    def segments(self, *, superseded: bool = False) -> pd.DataFrame:
        """One row per segment of the chain (see :func:`segments`)."""
        return segments_frame(self.log, self.view, superseded)

    def segment(self, segment: int | str) -> SegmentView:
        """Inspect a segment: chain position (0 oldest, -1 newest) or object name."""
        ref, on_chain = select_segment(self.log, self.view, segment)
        return SegmentView(self, ref, on_chain)

    def segment_for(self, offset: int) -> SegmentView:
        """Inspect the segment holding ``offset``."""
        return self.segment(segment_at(self.log, self.view, offset))

    def records(
        self, start: int | None = None, end: int | None = None, *, limit: int | None = None, decode: bool = False
    ) -> pa.Table:
        """Records of offsets ``[start, end)`` as an Arrow table (see :func:`records`)."""
        table = read_records(self.log, start, end, limit)
        return decode_text(table) if decode else table

    def offset_timeline(self) -> pd.DataFrame:
        """One row per batch of the chain: offsets against timestamps."""
        return partition_timeline(self.log, self.view, self.partition)

    def _card(self) -> tuple[str, list[tuple[str, Any]], pd.DataFrame | None, str]:
        row = self.summary()
        facts: list[tuple[str, Any]] = [
            ("start offset", f"{row['start_offset']:,}"),
            ("end offset", f"{row['end_offset']:,}"),
            ("records", f"{row['records']:,}"),
            ("segments", row["segments"]),
            (
                "bytes",
                f"{human_bytes(row['bytes'])} on storage, {human_bytes(row['uncompressed_bytes'])} uncompressed",
            ),
            ("timestamps", f"{_fmt_time(row['min_timestamp'])} … {_fmt_time(row['max_timestamp'])}"),
        ]
        if row["superseded_objects"]:
            facts.append(
                (
                    "superseded",
                    f"{row['superseded_objects']} object(s), {human_bytes(row['superseded_bytes'])}, awaiting deletion",
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
        self.index_data: SegmentIndex = segment_index(partition.log, ref, on_chain)

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
        return index_frame(self.index_data)

    def batches(self, *, check: bool = True) -> pd.DataFrame:
        """The batches with metadata and checksum status (see :func:`batches`)."""
        return batches_frame(self.partition.log.store, self.index_data, check)

    def records(self, batch: int | None = None, *, decode: bool = False) -> pa.Table:
        """Records of one batch (all batches when ``batch`` is None) as an Arrow table."""
        table = segment_records(self.partition.log, self.index_data, batch)
        return decode_text(table) if decode else table

    def _card(self) -> tuple[str, list[tuple[str, Any]], pd.DataFrame | None, str]:
        m = self.meta
        uncompressed = int(self.index_data.table.column("uncompressed_bytes").to_numpy().sum())
        facts: list[tuple[str, Any]] = [
            ("object", self.key),
            ("offsets", f"{m.base_offset:,} … {m.next_offset - 1:,} (end {m.next_offset:,})"),
            ("records", f"{m.record_count:,} in {m.batch_count} batch(es)"),
            ("bytes", f"{human_bytes(self.ref.size)} on storage, {human_bytes(uncompressed)} uncompressed"),
            ("compression", m.compression),
            (
                "timestamps",
                f"{_fmt_time(utc_datetime(m.min_timestamp))} … {_fmt_time(utc_datetime(m.max_timestamp))}",
            ),
            (
                "kind",
                f"{'appended' if m.generation == 0 else 'rewritten'} (generation {m.generation})"
                + ("" if self.on_chain else ", superseded: off the chain"),
            ),
            ("created", f"{_fmt_time(utc_datetime(m.created_ms))} by writer {m.writer}"),
        ]
        if m.value_schema_version is not None:  # a typed object: every batch has this one version (11.8)
            facts.append(("value schema version", m.value_schema_version))
        frame = self.batches(check=False).drop(columns=["checksum", "attributes"])
        return (
            f"segment {object_name(self.key)}",
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
    "DISPLAY_ROWS",
    "PartitionView",
    "RootView",
    "SegmentView",
    "TopicView",
    "inspect_root",
    "inspect_topic",
]
