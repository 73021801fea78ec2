"""Records read from a partition or one segment object, as Arrow tables (keys and values stay bytes)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import OffsetOutOfRangeError
from ..log.partition_log import PartitionLog
from ..records import RECORD_SCHEMA
from ..segment import (
    SegmentIndex,
    read_batches,
)
from .segment_tables import segment_index, select_segment
from .tables import as_root, object_name, partition_log


def decode_text(table: pa.Table) -> pa.Table:
    """Keys and values as UTF-8 text (undecodable bytes replaced), for reading in a notebook."""
    for name in ("key", "value"):
        i = table.schema.get_field_index(name)
        if not pa.types.is_binary(table.schema.field(i).type):
            continue  # a typed topic's value is a struct of its fields (PROTOCOL.md 11.8): already readable
        texts = [None if b is None else b.decode("utf-8", "replace") for b in table.column(i).to_pylist()]
        table = table.set_column(i, pa.field(name, pa.string()), pa.array(texts, pa.string()))
    return table


def read_records(log: PartitionLog, start: int | None, end: int | None, limit: int | None) -> pa.Table:
    """The table of :func:`records` for one partition log."""
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
    projection = log.default_projection()
    return pa.Table.from_batches(out, schema=RECORD_SCHEMA if projection is None else projection.logical_schema)


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
    table = read_records(partition_log(as_root(root), topic, partition), start, end, limit)
    return decode_text(table) if decode else table


def segment_records(log: PartitionLog, idx: SegmentIndex, batch: int | None) -> pa.Table:
    """The table of :func:`batch_records` for one segment index (batch ``None``: every batch)."""
    layout = idx.meta.layout
    schema = RECORD_SCHEMA if layout is None else layout.logical_schema  # a typed object's own version (11.8)
    if idx.batch_count == 0:
        return schema.empty_table()
    if batch is None:
        first, last = 0, idx.batch_count - 1
    else:
        if not -idx.batch_count <= batch < idx.batch_count:
            raise IndexError(f"{object_name(idx.key)} has {idx.batch_count} batch(es); there is no batch {batch}")
        first = last = batch % idx.batch_count
    return pa.Table.from_batches(read_batches(log.store, idx, first, last), schema=schema)


def batch_records(
    root: Any, topic: str, partition: int, segment: int | str, batch: int | None = None, *, decode: bool = False
) -> pa.Table:
    """The records of one batch of a segment (all batches if ``batch`` is None) as an Arrow table.

    Unlike :func:`records` this includes records below the log start that the
    segment still holds.
    """
    log = partition_log(as_root(root), topic, partition)
    ref, on_chain = select_segment(log, log.view(), segment)
    table = segment_records(log, segment_index(log, ref, on_chain), batch)
    return decode_text(table) if decode else table
