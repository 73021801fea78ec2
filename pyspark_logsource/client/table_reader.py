"""A topic as an Arrow table for other engines: committed records as a ``pyarrow.RecordBatchReader``.

Segment objects cannot be scanned as files by ``pyarrow.dataset``, DuckDB or Polars: an object is an
Arrow IPC *stream* followed by a checksummed index, it holds records of aborted and still open
transactions, and a merged object coexists with the objects it replaced until garbage collection. So
a file scan neither hides uncommitted records nor counts each record once. :func:`read_topic` reads
through the partition logs instead (PROTOCOL.md 9), as a consumer does, and hands the records out as
a stream of Arrow record batches that any Arrow engine takes::

    reader = read_topic("s3://bucket/root", "clicks", columns=["key", "value", "timestamp"])
    duckdb.sql("select key, count(*) from reader group by key")
    polars.from_arrow(reader.read_all())

What a reader returns is fixed when it is created (a snapshot): each partition's end is its last
stable offset then (read_committed; Kafka's LSO: no aborted record and no record of an open
transaction is ever returned) or its log end (read_uncommitted), and a typed topic's value type is its
newest value schema then (PROTOCOL.md 11.8). Records are read chunk by chunk while the caller pulls
batches, one partition after another in partition order, offsets ascending, so memory stays bounded
by a few chunks whatever the topic's size.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from coordinator.transactions import TransactionCoordinator
from pyspark_logsource.client.fetcher import RepeatedColumns
from segment_format.errors import InvalidConfigError, OffsetOutOfRangeError, PlogError
from segment_format.log.partition_log import PartitionLog
from segment_format.log.reader import READ_COMMITTED, READ_UNCOMMITTED
from segment_format.records import HEADERS_TYPE, TIMESTAMP_TYPE, clip_before
from segment_format.root import LogRoot
from segment_format.topic import TopicMetadata
from segment_format.typed.layout import Projection, entry_layout

__all__ = ["READ_CHUNK_BYTES", "TABLE_COLUMNS", "read_topic", "read_topic_from_root"]

#: The columns a reader can return, in Spark's Kafka source order (the default selection).
TABLE_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers")

#: Stored bytes read from a partition at a time (a soft bound: whole batches are read). Bounds the
#: memory a reader holds: this chunk, and the chunks decoded ahead of it.
READ_CHUNK_BYTES = 4 * 1024 * 1024

#: A start or end offset: one for every partition read, or one per partition number.
Offsets = int | Mapping[int, int] | None


@dataclass(frozen=True)
class PartitionRange:
    """Offsets ``[start, end)`` of one partition, as planned when the reader was created."""

    partition: int
    start: int
    end: int


def _field(name: str, value_type: pa.DataType) -> pa.Field:
    """The Arrow field of column ``name`` (the types ``poll_arrow`` gives, plus Spark's ``timestampType``)."""
    types: dict[str, tuple[pa.DataType, bool]] = {
        "key": (pa.binary(), True),
        "value": (value_type, True),
        "topic": (pa.string(), False),
        "partition": (pa.int32(), False),
        "offset": (pa.int64(), False),
        "timestamp": (TIMESTAMP_TYPE, False),
        "timestampType": (pa.int32(), False),
        "headers": (HEADERS_TYPE, True),
    }
    kind, nullable = types[name]
    return pa.field(name, kind, nullable=nullable)


def _check_columns(columns: Sequence[str] | None) -> tuple[str, ...]:
    if columns is None:
        return TABLE_COLUMNS
    if isinstance(columns, str):
        columns = [columns]
    chosen = tuple(columns)
    unknown = [c for c in chosen if c not in TABLE_COLUMNS]
    if unknown:
        raise InvalidConfigError(f"unknown column(s) {unknown}: a topic's columns are {list(TABLE_COLUMNS)}")
    if not chosen:
        raise InvalidConfigError(f"columns is empty: choose some of {list(TABLE_COLUMNS)}")
    repeated = sorted({c for c in chosen if chosen.count(c) > 1})
    if repeated:
        raise InvalidConfigError(f"column(s) {repeated} chosen more than once")
    return chosen


def _check_offset(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidConfigError(f"{what} {value!r} must be a non-negative int")
    return value


def _per_partition(offsets: Offsets, name: str, partitions: Sequence[int], topic: str) -> dict[int, int | None]:
    """``offsets`` (None, one int, or {partition: offset}) as one entry per partition read."""
    if offsets is None:
        return dict.fromkeys(partitions)
    if isinstance(offsets, Mapping):
        stray = sorted(p for p in offsets if p not in partitions)
        if stray:
            raise InvalidConfigError(f"{name} names partition(s) {stray} of topic {topic!r}, which are not read")
        return {p: _check_offset(offsets[p], f"{name} of {topic}-{p}") if p in offsets else None for p in partitions}
    offset = _check_offset(offsets, name)
    return dict.fromkeys(partitions, offset)


def _check_partitions(meta: TopicMetadata, partitions: int | Iterable[int] | None) -> list[int]:
    if partitions is None:
        return list(range(meta.partitions))
    if isinstance(partitions, int):
        partitions = [partitions]
    chosen: list[int] = []
    for p in partitions:
        meta.check_partition(p)  # UnknownTopicOrPartitionError naming it
        if p not in chosen:
            chosen.append(p)
    return chosen


def read_topic_from_root(
    root: LogRoot,
    topic: str,
    partitions: int | Iterable[int] | None = None,
    *,
    start: Offsets = None,
    end: Offsets = None,
    start_time_ms: int | None = None,
    end_time_ms: int | None = None,
    columns: Sequence[str] | None = None,
    value_fields: Sequence[str] | None = None,
    isolation_level: str = READ_COMMITTED,
    chunk_bytes: int = READ_CHUNK_BYTES,
    close_root: bool = False,
) -> pa.RecordBatchReader:
    """:func:`read_topic` on an open root (``LogStore.read_topic``); ``close_root``: close it when the
    reader is exhausted or dropped."""
    if isolation_level not in (READ_COMMITTED, READ_UNCOMMITTED):
        raise InvalidConfigError(
            f"isolation_level {isolation_level!r} must be {READ_COMMITTED!r} or {READ_UNCOMMITTED!r}"
        )
    if start is not None and start_time_ms is not None:
        raise InvalidConfigError("give start or start_time_ms, not both")
    if end is not None and end_time_ms is not None:
        raise InvalidConfigError("give end or end_time_ms, not both")
    for name, ms in (("start_time_ms", start_time_ms), ("end_time_ms", end_time_ms)):
        if ms is not None:
            _check_offset(ms, name)
    if start_time_ms is not None and end_time_ms is not None and start_time_ms > end_time_ms:
        raise InvalidConfigError(f"start_time_ms {start_time_ms} is after end_time_ms {end_time_ms}")
    if not isinstance(chunk_bytes, int) or chunk_bytes < 1:
        raise InvalidConfigError(f"chunk_bytes {chunk_bytes!r} must be a positive int")
    chosen = _check_columns(columns)
    meta = root.topic(topic, refresh=True)  # UnknownTopicOrPartitionError naming the topic
    read = _check_partitions(meta, partitions)
    starts = _per_partition(start, "start", read, topic)
    ends = _per_partition(end, "end", read, topic)

    # A typed topic is read as its newest value schema now, for the whole reader: a RecordBatchReader
    # has one schema, and a version added while it reads must not change it (PROTOCOL.md 11.8).
    projection = None
    if meta.schema_history is not None:
        projection = Projection(entry_layout(meta.schema_history.current), value_fields)
        value_type: pa.DataType = projection.value_type
    elif value_fields is not None:
        raise InvalidConfigError(f"value_fields {list(value_fields)}: topic {topic!r} is not typed")
    else:
        value_type = pa.binary()
    schema = pa.schema([_field(c, value_type) for c in chosen])

    resolver = (
        TransactionCoordinator(root.store, root.protocol).for_reader(root).resolve
        if isolation_level == READ_COMMITTED
        else None
    )
    ranges: list[PartitionRange] = []
    for p in read:
        log = root.partition(topic, p, meta)
        view = log.view()  # a fresh listing: the snapshot is the log as it is now
        # Kafka's last stable offset under read_committed: nothing at or past it is returned, so a
        # transaction open now never shows, even once it commits (11.2).
        stable = log.last_stable_offset(resolver, whole=0) if resolver is not None else view.end_offset
        lo, hi = starts[p], ends[p]
        if lo is not None and hi is not None and lo > hi:
            raise InvalidConfigError(f"{topic}-{p}: start offset {lo} is after end offset {hi}")
        if lo is None:
            found = None if start_time_ms is None else log.offset_for_timestamp(start_time_ms)
            lo = view.start_offset if start_time_ms is None else (stable if found is None else found)
        elif lo < view.start_offset:
            raise OffsetOutOfRangeError(
                f"{topic}-{p}: start offset {lo} is below the log start {view.start_offset} "
                "(records before it were deleted by retention or delete_records)"
            )
        if hi is None and end_time_ms is not None:
            hi = log.offset_for_timestamp(end_time_ms)
        hi = stable if hi is None else min(hi, stable)
        ranges.append(PartitionRange(p, max(lo, view.start_offset), hi))

    default_type = 1 if meta.config.get("message.timestamp.type") == "LogAppendTime" else 0
    release = _once(root.close) if close_root else None
    batches = _batches(
        root, meta, ranges, chosen, schema, isolation_level, resolver, projection, chunk_bytes, default_type, release
    )
    if release is not None:
        # A reader dropped before it was read to the end (or before it was read at all: a generator
        # never started runs no finally) still releases the root it opened.
        weakref.finalize(batches, release)
    return pa.RecordBatchReader.from_batches(schema, batches)


def _once(call: Callable[[], None]) -> Callable[[], None]:
    """``call``, run by the first of its callers only."""
    done: list[bool] = []

    def run() -> None:
        if not done:
            done.append(True)
            call()

    return run


def _batches(
    root: LogRoot,
    meta: TopicMetadata,
    ranges: list[PartitionRange],
    columns: tuple[str, ...],
    schema: pa.Schema,
    isolation_level: str,
    resolver: Any,
    projection: Projection | None,
    chunk_bytes: int,
    default_type: int,
    release: Callable[[], None] | None,
) -> Iterator[pa.RecordBatch]:
    """The planned ranges' records, chunk by chunk, as batches of ``schema``."""
    topic = meta.name
    repeated = RepeatedColumns()
    try:
        for r in ranges:
            log = root.partition(topic, r.partition, meta)
            where = f"{topic}-{r.partition}"
            position = r.start
            while position < r.end:
                try:
                    stored, next_offset = log.read(
                        position,
                        max_records=r.end - position,
                        max_bytes=chunk_bytes,
                        isolation=isolation_level,
                        resolver=resolver,
                        projection=projection,
                        decode_ahead=True,  # the next read starts where this one ends
                    )
                except OffsetOutOfRangeError:
                    start = log.view().start_offset
                    raise OffsetOutOfRangeError(
                        f"{where}: offsets [{position}, {start}) were deleted while the reader read them "
                        f"(retention or delete_records moved the log start to {start})"
                    ) from None
                if not stored and next_offset <= position:
                    # Below the stable end planned, every transaction was decided: its decision is lost.
                    raise PlogError(
                        f"{where}: offset {position} belongs to a transaction that is not decided, below the "
                        f"last stable offset {r.end} the reader was created with: its decision object is missing"
                    )
                for batch in stored:
                    batch = clip_before(batch, r.end)
                    if batch.num_rows:
                        yield _table_batch(batch, log, topic, r.partition, columns, schema, repeated, default_type)
                position = next_offset
    finally:
        if release is not None:
            release()


def _table_batch(
    batch: pa.RecordBatch,
    log: PartitionLog,
    topic: str,
    partition: int,
    columns: tuple[str, ...],
    schema: pa.Schema,
    repeated: RepeatedColumns,
    default_type: int,
) -> pa.RecordBatch:
    """A stored batch (``RECORD_SCHEMA``, a typed topic's value a struct) as the chosen columns."""
    n = batch.num_rows
    arrays: list[pa.Array] = []
    for name in columns:
        if name == "key":
            arrays.append(batch.column(2))
        elif name == "value":
            arrays.append(batch.column(3))
        elif name == "topic":
            arrays.append(repeated.topic(topic, n))
        elif name == "partition":
            arrays.append(repeated.partition(partition, n))
        elif name == "offset":
            arrays.append(batch.column(0))
        elif name == "timestamp":
            arrays.append(batch.column(1))
        elif name == "timestampType":
            kind = log.timestamp_type(int(batch.column(0)[0].as_py()), default_type)
            arrays.append(pa.array(np.full(n, kind, np.int32)))
        else:
            arrays.append(batch.column(4))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def read_topic(
    url: str,
    topic: str,
    partitions: int | Iterable[int] | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    start: Offsets = None,
    end: Offsets = None,
    start_time_ms: int | None = None,
    end_time_ms: int | None = None,
    columns: Sequence[str] | None = None,
    value_fields: Sequence[str] | None = None,
    isolation_level: str = READ_COMMITTED,
    chunk_bytes: int = READ_CHUNK_BYTES,
) -> pa.RecordBatchReader:
    """The records of ``topic`` under ``url`` as a ``pyarrow.RecordBatchReader``, for DuckDB, Polars,
    pandas or any Arrow engine.

    * ``partitions``: a partition number or several (default: all), read in turn, offsets ascending.
    * ``start`` / ``end``: offsets ``[start, end)``, one int for every partition or ``{partition:
      offset}``; by default the log start and the end. ``end`` past the end reads to the end; a
      ``start`` below the log start raises ``OffsetOutOfRangeError`` (those records were deleted).
    * ``start_time_ms`` / ``end_time_ms``: instead, from the first record with a timestamp at or after
      ``start_time_ms`` to (excluding) the first at or after ``end_time_ms``, per partition
      (``Consumer.offsets_for_times``, by the time index).
    * ``columns``: some of :data:`TABLE_COLUMNS` (``key``, ``value``, ``topic``, ``partition``,
      ``offset``, ``timestamp``, ``timestampType``, ``headers``; all by default), in the order given.
      The types are ``poll_arrow``'s; a typed topic's ``value`` is a struct of its value schema's
      fields, and ``value_fields`` keeps (and decodes) only those fields.
    * ``isolation_level``: ``read_committed`` (default: records of aborted and open transactions never
      appear, and each partition ends at its last stable offset) or ``read_uncommitted``.

    The ends, and a typed topic's value schema, are fixed now (a snapshot); records are read while the
    reader is consumed, ``chunk_bytes`` stored bytes at a time. Errors derive from ``PlogError``:
    ``UnknownTopicOrPartitionError`` (topic, partition), ``InvalidConfigError`` (a column, a range),
    ``OffsetOutOfRangeError`` (records deleted before or while they are read).
    """
    root = LogRoot(url, storage_options)
    try:
        return read_topic_from_root(
            root,
            topic,
            partitions,
            start=start,
            end=end,
            start_time_ms=start_time_ms,
            end_time_ms=end_time_ms,
            columns=columns,
            value_fields=value_fields,
            isolation_level=isolation_level,
            chunk_bytes=chunk_bytes,
            close_root=True,
        )
    except BaseException:
        root.close()
        raise
