"""The Spark source: ``spark.readStream.format("plog")`` and ``spark.read.format("plog")``.

:class:`DefaultSource` is a PySpark Python data source. Spark (4.2 and later)
registers installed ``pyspark_*`` packages that expose a ``DefaultSource``, so
after ``pip install`` nothing needs ``spark.dataSource.register``::

    df = (spark.readStream.format("plog")
          .option("subscribe", "events")
          .option("startingOffsets", "earliest")
          .load("s3://bucket/plog"))

The options and the schema are those of Spark's Kafka source (see
:mod:`pyspark_logsource.spark.options`). The streaming offset is a JSON object
``{"topic": {"partition": next_offset}}`` kept in Spark's checkpoint, so a
restarted query re-reads exactly the ranges of a batch that did not commit.
Tasks read with :meth:`PartitionLog.read` and hand Spark Arrow record batches
converted with pyarrow compute: no Python object is made per record.

``isolationLevel=read_committed`` (the default) ends every batch at the last
stable offset (the first transaction not yet decided) and skips aborted
transactions; since decisions never change, a re-run batch reads the same
records. ``read_uncommitted`` reads every record up to the log end.

Batch reads push filters on ``topic``, ``partition``, ``offset`` and
``timestamp`` down to the offset and time indexes when Spark's
``spark.sql.python.filterPushdown.enabled`` is true (without it Spark filters
every row itself). Spark 4.3 keeps the read plan of a pushed-down query on the
DataFrame's source and reuses it for a later action of *the same DataFrame*
that pushes no filter at all (fixed upstream by scoping it to the scan), so on
4.3 call ``load()`` again rather than reuse a filtered DataFrame's parent.

Spark only runs the source on the driver and in Python workers, so a
``memory://`` root (one process) is refused; local directories must be
reachable at the same path from every executor.
"""

from __future__ import annotations

import datetime as dt
import math
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from coordinator.transactions import TransactionCoordinator
from pyspark_logsource.spark.options import (
    BATCH_START_KEY,
    SourceOptions,
    offsets_from_json,
    offsets_to_json,
    option_error,
    parse_options,
)
from pyspark_logsource.spark.planning import (
    TP,
    DataLossError,
    GroupOffsetsWriter,
    OffsetRange,
    allocate_rows,
    cut_by_bytes,
    data_loss,
    discover,
    log,
    partition_log,
    resolve_offsets,
    split_ranges,
    tail_view,
)
from pyspark_logsource.spark.workers import executor_root
from segment_format.errors import (
    ObjectNotFoundError,
    OffsetOutOfRangeError,
    PlogError,
    UnknownTopicOrPartitionError,
)
from segment_format.log import READ_COMMITTED, PartitionLog
from segment_format.root import METADATA_MAX_AGE_S, LogRoot
from segment_format.segment import ATTR_LOG_APPEND_TIME
from segment_format.topic import TopicMetadata

__all__ = [
    "DataLossError",
    "DefaultSource",
    "PlogBatchReader",
    "PlogInputPartition",
    "PlogStreamReader",
    "arrow_schema",
    "spark_schema",
]

#: Stored bytes a task asks the log for at a time (a soft bound: whole batches are read). Small
#: ranges keep each batch in the CPU caches between decompression and Spark's Arrow writer.
READ_CHUNK_BYTES = 4 * 1024 * 1024
#: Batches a task reads ahead of Spark in a background thread (0: read in the task's own thread).
PREFETCH_BATCHES = 16

_HEADER_STRUCT = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
_SPARK_FIELDS = [
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
]
_HEADERS_FIELD = StructField("headers", ArrayType(_HEADER_STRUCT))

_ARROW_TIMESTAMP = pa.timestamp("us", tz="UTC")
_ARROW_HEADERS = pa.list_(
    pa.field("element", pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
)
_ARROW_FIELDS = [
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", _ARROW_TIMESTAMP),
    pa.field("timestampType", pa.int32()),
]
_ARROW_SCHEMAS = {
    False: pa.schema(_ARROW_FIELDS),
    True: pa.schema([*_ARROW_FIELDS, pa.field("headers", _ARROW_HEADERS)]),
}


def spark_schema(include_headers: bool = False) -> StructType:
    """The schema of Spark's Kafka source; ``headers`` only with ``includeHeaders``."""
    return StructType([*_SPARK_FIELDS, _HEADERS_FIELD] if include_headers else list(_SPARK_FIELDS))


def arrow_schema(include_headers: bool = False) -> pa.Schema:
    """The Arrow schema Spark expects from ``read()`` for :func:`spark_schema`."""
    return _ARROW_SCHEMAS[include_headers]


# ---------------------------------------------------------------------------- reading (executors)


@dataclass(frozen=True)
class PlogInputPartition(InputPartition):
    """What one Spark task reads: offsets ``[start, until)`` of one partition, and how to reach the root."""

    url: str
    storage_options: dict[str, Any]
    topic: str
    topic_id: str
    partition: int
    start: int
    until: int
    fail_on_data_loss: bool = True
    include_headers: bool = False
    isolation_level: str = "read_committed"

    def __repr__(self) -> str:  # storage options may hold credentials: never show them
        return (
            f"PlogInputPartition({self.topic}-{self.partition} [{self.start}, {self.until}) topic_id={self.topic_id})"
        )


def _past_removed(fail: bool, where: str, position: int, until: int, log_start: int) -> int:
    """Offsets from ``position`` were removed (retention, delete_records): report it, return where to go on."""
    skip_to = min(log_start, until)
    data_loss(fail, f"offsets [{position}, {skip_to}) of {where} are gone: the log now starts at {log_start}")
    return skip_to


_CONSTANTS: dict[tuple[str, object], pa.Array] = {}


def _constant(kind: str, value: str | int, n: int) -> pa.Array:
    """``n`` copies of ``value``: a zero-copy slice of a cached array, grown as needed (no per-batch fill)."""
    key = (kind, value)
    cached = _CONSTANTS.get(key)
    if cached is None or len(cached) < n:
        size = max(n, 2 * len(cached) if cached is not None else 65536)
        if len(_CONSTANTS) > 256:
            _CONSTANTS.clear()
        if kind == "int32":
            cached = pa.array(np.full(size, value, np.int32))
        else:
            data = str(value).encode()
            if not data or size * len(data) >= 2**31 - 1:
                return pa.array([value] * n, pa.string())
            offsets = np.arange(0, (size + 1) * len(data), len(data), dtype=np.int32)
            cached = pa.Array.from_buffers(pa.string(), size, [None, pa.py_buffer(offsets), pa.py_buffer(data * size)])
        _CONSTANTS[key] = cached
    return cached.slice(0, n)


def to_spark_batch(
    batch: pa.RecordBatch, topic: str, partition: int, timestamp_type: int, include_headers: bool
) -> pa.RecordBatch:
    """A stored batch (``RECORD_SCHEMA``) as the source's Arrow schema, with pyarrow only."""
    n = batch.num_rows
    columns = [
        batch.column(2),
        batch.column(3),
        _constant("string", topic, n),
        _constant("int32", partition, n),
        batch.column(0),
        batch.column(1).cast(_ARROW_TIMESTAMP),
        _constant("int32", timestamp_type, n),
    ]
    if include_headers:
        columns.append(batch.column(4).cast(_ARROW_HEADERS))
    return pa.RecordBatch.from_arrays(columns, schema=_ARROW_SCHEMAS[include_headers])


def _clip(batch: pa.RecordBatch, until: int) -> pa.RecordBatch:
    """Drop records at or after offset ``until`` (only needed where compaction left gaps)."""
    offsets = batch.column(0)
    if offsets[-1].as_py() < until:
        return batch
    keep = int(np.searchsorted(offsets.to_numpy(), until, side="left"))
    return batch.slice(0, keep)


def _timestamp_type(plog: PartitionLog, offset: int, default: int) -> int:
    """1 (LogAppendTime) or 0 (CreateTime) for the stored batch holding ``offset``, from its index."""
    try:
        view = plog.view(refresh=False)
        s = view.segment_for(offset)
        if s < 0:
            return default
        idx = plog.index(view.segments[s])
        b = idx.batch_for_offset(offset)
        if b >= idx.batch_count:
            return default
        return 1 if int(idx.attributes[b]) & ATTR_LOG_APPEND_TIME else 0
    except (PlogError, IndexError):
        return default


class _Raised:
    """An exception carried from the prefetch thread to the task's generator."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


_DONE = object()


def _prefetched(batches: Iterator[pa.RecordBatch], depth: int) -> Generator[pa.RecordBatch, None, None]:
    """Run ``batches`` in a thread, ``depth`` batches ahead of the consumer.

    Reading, checking and decompressing the next segment range (pyarrow and
    the stores release the GIL) then overlaps with the Python worker writing
    the current batches to Spark, instead of Spark waiting for each range.
    """
    ready: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for batch in batches:
                if not put(batch):
                    return
            put(_DONE)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            put(_Raised(exc))

    thread = threading.Thread(target=run, name="plog-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = ready.get()
            if item is _DONE:
                return
            if isinstance(item, _Raised):
                raise item.error
            yield item
    finally:
        stop.set()


def read_partition(part: InputPartition) -> Iterator[pa.RecordBatch]:
    """Yield the records of one input partition as Arrow batches of the source's schema."""
    if not isinstance(part, PlogInputPartition):  # Spark's placeholder when a batch read has nothing to read
        return iter(())
    if PREFETCH_BATCHES:
        return _prefetched(_read_partition(part), PREFETCH_BATCHES)
    return _read_partition(part)


def _read_partition(part: PlogInputPartition) -> Iterator[pa.RecordBatch]:
    root, transactions = executor_root(part.url, part.storage_options)
    resolver = transactions.resolve if part.isolation_level == READ_COMMITTED else None
    where = f"{part.topic}-{part.partition}"
    fail = part.fail_on_data_loss
    try:
        meta = root.topic(part.topic)
        if meta.topic_id != part.topic_id:
            meta = root.topic(part.topic, refresh=True)
    except UnknownTopicOrPartitionError:
        data_loss(
            fail,
            f"topic {part.topic!r} no longer exists: offsets [{part.start}, {part.until}) of {where} cannot be read",
        )
        return
    if meta.topic_id != part.topic_id:
        data_loss(
            fail,
            f"topic {part.topic!r} was deleted and re-created: offsets "
            f"[{part.start}, {part.until}) of {where} cannot be read",
        )
        return
    plog = root.partition(part.topic, part.partition, meta)
    default_type = 1 if meta.config.get("message.timestamp.type") == "LogAppendTime" else 0
    position = part.start
    # Resolve afresh once per task: the worker's cached view may predate retention or delete_records.
    view = plog.view()
    if position < view.start_offset:
        position = _past_removed(fail, where, position, part.until, view.start_offset)
    while position < part.until:
        try:
            batches, next_offset = plog.read(
                position,
                max_records=part.until - position,
                max_bytes=READ_CHUNK_BYTES,
                isolation=part.isolation_level,
                resolver=resolver,
            )
        except OffsetOutOfRangeError:
            view = plog.view()
            if position < view.start_offset:
                position = _past_removed(fail, where, position, part.until, view.start_offset)
                continue
            data_loss(
                fail, f"offsets [{position}, {part.until}) of {where} are gone: the log now ends at {view.end_offset}"
            )
            return
        if not batches:
            if next_offset <= position:  # at the log's end, or (read_committed) at an undecided transaction
                end = plog.view().end_offset
                if position < end:
                    raise DataLossError(
                        f"offset {position} of {where} belongs to a transaction that is not "
                        f"decided, below the range [{part.start}, {part.until}) planned as "
                        "stable: its decision object is missing"
                    )
                data_loss(fail, f"offsets [{position}, {part.until}) of {where} are gone: the log now ends at {end}")
                return
            position = next_offset
            continue
        for batch in batches:
            batch = _clip(batch, part.until)
            if batch.num_rows:
                first = int(batch.column(0)[0].as_py())
                yield to_spark_batch(
                    batch, part.topic, part.partition, _timestamp_type(plog, first, default_type), part.include_headers
                )
        position = next_offset


def _input_partitions(opts: SourceOptions, root: LogRoot, ranges: list[OffsetRange]) -> list[PlogInputPartition]:
    """One input partition per range piece, stamped with its topic's id (a vanished topic is data loss)."""
    out: list[PlogInputPartition] = []
    for r in split_ranges(ranges, opts.min_partitions):
        try:
            topic_id = root.topic(r.topic).topic_id
        except UnknownTopicOrPartitionError:
            data_loss(
                opts.fail_on_data_loss,
                f"topic {r.topic!r} no longer exists: offsets [{r.start}, "
                f"{r.until}) of {r.topic}-{r.partition} cannot be read",
            )
            continue
        out.append(
            PlogInputPartition(
                opts.url,
                opts.storage_options,
                r.topic,
                topic_id,
                r.partition,
                r.start,
                r.until,
                opts.fail_on_data_loss,
                opts.include_headers,
                opts.isolation_level,
            )
        )
    return out


def _stable_end(opts: SourceOptions, transactions: TransactionCoordinator) -> Callable[[PartitionLog], int] | None:
    """What "latest" means: the log end, or for read_committed the last stable offset (Kafka's LSO)."""
    if opts.isolation_level != READ_COMMITTED:
        return None
    return lambda plog: plog.last_stable_offset(transactions.resolve)


def _check_schema(schema: StructType, opts: SourceOptions) -> None:
    expected = spark_schema(opts.include_headers)
    if schema != expected:
        raise option_error(
            "schema",
            f"the plog source has a fixed schema ({expected.simpleString()}) and "
            f"cannot be read with a custom one ({schema.simpleString()})",
        )


# ---------------------------------------------------------------------------- batch reads and filter pushdown


@dataclass
class _Constraints:
    """What pushed filters allow: topics, partitions, an offset range and a time range (ms, inclusive)."""

    topics: set[str] | None = None
    partitions: set[int] | None = None
    partition_lo: int = 0
    partition_hi: int | None = None  # exclusive
    offset_lo: int = 0
    offset_hi: int | None = None  # exclusive
    time_lo_ms: int | None = None
    time_hi_ms: int | None = None
    pushed: list[str] = field(default_factory=list)

    def allows(self, tp: TP) -> bool:
        topic, p = tp
        return (
            (self.topics is None or topic in self.topics)
            and (self.partitions is None or p in self.partitions)
            and p >= self.partition_lo
            and (self.partition_hi is None or p < self.partition_hi)
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _micros(value: object) -> int | None:
    """A timestamp filter value as microseconds since the epoch (None if its zone is unknown)."""
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return (value - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) // dt.timedelta(microseconds=1)
    return None


class _OptionalPushdown:
    """``pushFilters`` that Spark uses when filter pushdown is on and ignores when it is off.

    Spark refuses to plan a reader that overrides ``pushFilters`` while
    ``spark.sql.python.filterPushdown.enabled`` is false (the default), which
    would make every plain ``spark.read.format("plog")`` fail. Spark detects
    the override through ``reader.pushFilters.__func__``; the bound object
    here answers with the base method there, and does the pushdown when
    called. With pushdown off, Spark then evaluates every filter itself over
    the ranges the options select.
    """

    class _Bound:
        __func__ = staticmethod(DataSourceReader.pushFilters)  # the base function itself, not bound

        def __init__(self, reader: PlogBatchReader) -> None:
            self._reader = reader

        def __call__(self, filters: list[Filter]) -> list[Filter]:
            return self._reader.push_filters(filters)

    def __get__(self, obj: PlogBatchReader | None, objtype: type | None = None) -> Any:
        return self if obj is None else self._Bound(obj)


class PlogBatchReader(DataSourceReader):
    """``spark.read.format("plog")``: offsets ``[startingOffsets, endingOffsets)`` of each partition."""

    pushFilters = _OptionalPushdown()  # type: ignore[assignment]

    def __init__(self, options: SourceOptions) -> None:
        self.opts = options
        self.constraints = _Constraints()

    def push_filters(self, filters: list[Filter]) -> list[Filter]:
        """Narrow the read by topic, partition, offset and timestamp; return what Spark must still check.

        Topic, partition and offset comparisons are applied exactly to the
        ranges and not returned. Timestamp bounds narrow the ranges through
        the time index (records can be out of time order, so the ranges are a
        superset) and are returned so Spark filters the rows.
        """
        c = self.constraints
        remaining: list[Filter] = []
        for f in filters:
            attribute = getattr(f, "attribute", None)
            column = attribute[0] if isinstance(attribute, tuple) and len(attribute) == 1 else None
            value: Any = getattr(f, "value", None)
            exact = False
            if column == "topic":
                if isinstance(f, (EqualTo, EqualNullSafe)) and isinstance(value, str):
                    c.topics = (c.topics if c.topics is not None else {value}) & {value}
                    exact = True
                elif isinstance(f, In) and all(isinstance(v, str) for v in value):
                    c.topics = set(value) if c.topics is None else c.topics & set(value)
                    exact = True
            elif column == "partition":
                if isinstance(f, (EqualTo, EqualNullSafe)) and _is_int(value):
                    c.partitions = {value} if c.partitions is None else c.partitions & {value}
                    exact = True
                elif isinstance(f, In) and all(_is_int(v) for v in value):
                    c.partitions = set(value) if c.partitions is None else c.partitions & set(value)
                    exact = True
                elif (
                    isinstance(f, (GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual))
                    and isinstance(value, (int, float))
                    and not isinstance(value, bool)
                ):
                    lo, hi = _bounds(f, value)
                    c.partition_lo = max(c.partition_lo, lo)
                    c.partition_hi = (
                        hi if c.partition_hi is None else min(c.partition_hi, hi) if hi is not None else c.partition_hi
                    )
                    exact = True
            elif column == "offset":
                if isinstance(f, In) and value and all(_is_int(v) for v in value):
                    c.offset_lo = max(c.offset_lo, min(value))
                    hi = max(value) + 1
                    c.offset_hi = hi if c.offset_hi is None else min(c.offset_hi, hi)
                elif (
                    isinstance(f, (EqualTo, EqualNullSafe, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual))
                    and isinstance(value, (int, float))
                    and not isinstance(value, bool)
                ):
                    lo, hi = _bounds(f, value)
                    c.offset_lo = max(c.offset_lo, lo)
                    if hi is not None:
                        c.offset_hi = hi if c.offset_hi is None else min(c.offset_hi, hi)
                    exact = True
            elif column == "timestamp":
                micros = _micros(value)
                if micros is not None:
                    if isinstance(f, (GreaterThan, GreaterThanOrEqual, EqualTo, EqualNullSafe)):
                        lo_ms = micros // 1000
                        c.time_lo_ms = lo_ms if c.time_lo_ms is None else max(c.time_lo_ms, lo_ms)
                    if isinstance(f, (LessThan, LessThanOrEqual, EqualTo, EqualNullSafe)):
                        hi_ms = micros // 1000
                        c.time_hi_ms = hi_ms if c.time_hi_ms is None else min(c.time_hi_ms, hi_ms)
            if exact:
                c.pushed.append(repr(f))
            else:
                remaining.append(f)
        return remaining

    def partitions(self) -> list[PlogInputPartition]:
        """Resolve partitions and offsets now, narrowed by the pushed filters; split by ``minPartitions``."""
        opts, c = self.opts, self.constraints
        root = LogRoot(opts.url, opts.storage_options)
        try:
            latest = _stable_end(opts, TransactionCoordinator(root.store))
            found = discover(root, opts.subscription, refresh=True, require=True)
            starts = resolve_offsets(
                root,
                opts.starting,
                found,
                ending=False,
                fail_on_data_loss=opts.fail_on_data_loss,
                timestamp_strategy=opts.starting_timestamp_strategy,
                latest=latest,
            )
            assert opts.ending is not None
            ends = resolve_offsets(
                root, opts.ending, found, ending=True, fail_on_data_loss=opts.fail_on_data_loss, latest=latest
            )
            ranges = []
            for tp, meta in sorted(found.items()):
                start, until = starts[tp], ends[tp]
                if start > until and opts.ending.kind == "latest":
                    start = until  # starts inside a transaction still open: nothing stable to read yet
                if start > until:
                    raise option_error(
                        opts.starting.option,
                        f"{tp[0]}-{tp[1]} would start at offset {start}, after its end "
                        f"{until} (from {opts.ending.option})",
                    )
                if not c.allows(tp):
                    continue
                start = max(start, c.offset_lo)
                if c.offset_hi is not None:
                    until = min(until, c.offset_hi)
                if start < until and (c.time_lo_ms is not None or c.time_hi_ms is not None):
                    start, until = _time_range(
                        root.partition(tp[0], tp[1], meta), start, until, c.time_lo_ms, c.time_hi_ms
                    )
                if start < until:
                    ranges.append(OffsetRange(tp[0], tp[1], start, until))
            return _input_partitions(opts, root, ranges)
        finally:
            root.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        """Read one range (runs on an executor)."""
        return read_partition(partition)


def _bounds(f: Filter, value: int | float) -> tuple[int, int | None]:
    """The integer range ``[lo, hi)`` a comparison with ``value`` allows."""
    if isinstance(f, (EqualTo, EqualNullSafe)):
        if float(value) != math.floor(value):
            return 0, 0
        return int(value), int(value) + 1
    if isinstance(f, GreaterThan):
        return math.floor(value) + 1, None
    if isinstance(f, GreaterThanOrEqual):
        return math.ceil(value), None
    if isinstance(f, LessThan):
        return 0, max(0, math.ceil(value))
    return 0, max(0, math.floor(value) + 1)  # LessThanOrEqual


def _time_range(plog: PartitionLog, start: int, until: int, lo_ms: int | None, hi_ms: int | None) -> tuple[int, int]:
    """Narrow ``[start, until)`` to where records with ``lo_ms <= timestamp <= hi_ms`` can be.

    The lower bound comes from the time index (the first offset at or after
    ``lo_ms``: every earlier record is older). The upper bound drops whole
    segments whose oldest record is newer than ``hi_ms``.
    """
    if lo_ms is not None:
        first = plog.offset_for_timestamp(lo_ms)
        start = until if first is None else max(start, first)
    if hi_ms is not None and start < until:
        view = plog.view(refresh=False)
        cut = start
        for ref in view.segments:
            end = ref.end_offset if ref.end_offset is not None else view.end_offset
            if end <= start:
                continue
            if ref.base_offset >= until:
                break
            if plog.index(ref).meta.min_timestamp <= hi_ms:
                cut = min(until, end)
        until = cut
    return start, until


# ---------------------------------------------------------------------------- streaming


class PlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("plog")``: micro-batches of offset ranges, offsets in Spark's checkpoint.

    One instance lives on the driver for the whole query run and answers
    ``latestOffset`` / ``partitions`` / ``commit``; copies of it are pickled
    to executors only to call :meth:`read`, which uses nothing but the input
    partition it is given.
    """

    def __init__(self, options: SourceOptions) -> None:
        self.opts = options
        self._root: LogRoot | None = None
        self._started = False
        self._latest: dict[TP, int] | None = None
        self._target: dict[TP, int] | None = None
        self._initial: dict[str, Any] | None = None  # what initialOffset() returned, to pin the first batch
        self._last_trigger = time.monotonic()
        self._names: list[str] = []
        self._names_at = -math.inf
        self._group: GroupOffsetsWriter | None = None
        self._transactions: TransactionCoordinator | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_root"] = None
        state["_group"] = None
        state["_transactions"] = None
        return state

    # -------------------------------------------------------------- helpers

    @property
    def root(self) -> LogRoot:
        """The driver's handle on the plog root (opened on first use)."""
        if self._root is None:
            self._root = LogRoot(self.opts.url, self.opts.storage_options)
        return self._root

    def _stable(self, plog: PartitionLog) -> int:
        """The newest offset a batch may end at: the log end, or for read_committed the last stable offset."""
        if self.opts.isolation_level != READ_COMMITTED:
            return tail_view(plog).end_offset
        if self._transactions is None:
            self._transactions = TransactionCoordinator(self.root.store)
        return plog.last_stable_offset(self._transactions.resolve)

    def _start(self) -> None:
        """Checks that need the log, once per query run: the subscription's topics and partitions exist."""
        if not self._started:
            discover(self.root, self.opts.subscription, refresh=True, require=True)
            self._started = True

    def _discover(self, refresh: bool = False) -> dict[TP, TopicMetadata]:
        sub = self.opts.subscription
        if sub.kind != "subscribePattern":
            return discover(self.root, sub, refresh=refresh, require=False)
        # Listing every topic lists the whole root: do it at most once per metadata age.
        if refresh or time.monotonic() - self._names_at >= METADATA_MAX_AGE_S:
            self._names = [n for n in self.root.catalog.names() if sub.matches(n)]
            self._names_at = time.monotonic()
        out: dict[TP, TopicMetadata] = {}
        for name in self._names:
            try:
                meta = self.root.topic(name, refresh=refresh)
            except UnknownTopicOrPartitionError:
                continue
            out.update({(name, p): meta for p in range(meta.partitions)})
        return out

    def _earliest(self, tp: TP) -> int | None:
        try:
            return partition_log(self.root, tp).view().start_offset
        except UnknownTopicOrPartitionError:
            return None

    # -------------------------------------------------------------- Spark's calls (driver)

    def initialOffset(self) -> dict:
        """Where a new query starts: ``startingOffsets`` (or a starting timestamp) for every partition."""
        self._start()
        found = self._discover(refresh=True)
        offsets = resolve_offsets(
            self.root,
            self.opts.starting,
            found,
            ending=False,
            fail_on_data_loss=self.opts.fail_on_data_loss,
            timestamp_strategy=self.opts.starting_timestamp_strategy,
            latest=self._stable,
        )
        self._initial = offsets_to_json(_nested(offsets))
        return dict(self._initial)

    def getDefaultReadLimit(self) -> ReadLimit:
        """The limit the options ask for; ``latestOffset`` applies all of them unless told to read all."""
        self._start()
        o = self.opts
        if o.max_offsets_per_trigger is not None:
            return ReadMaxRows(o.max_offsets_per_trigger)
        if o.max_bytes_per_trigger is not None:
            return ReadMaxBytes(o.max_bytes_per_trigger)
        if o.min_offsets_per_trigger is not None:
            return ReadMinRows(o.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """``Trigger.AvailableNow``: read up to the offsets that exist now, and no further."""
        self._start()
        target = {}
        for tp, meta in self._discover(refresh=True).items():
            target[tp] = self._stable(partition_log(self.root, tp, meta))
        self._target = target

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """The next batch's end: the latest offsets, bounded by the read limits and AvailableNow's target."""
        self._start()
        opts = self.opts
        self._record_group_offsets(start)
        begin = _flat(offsets_from_json(start))
        found = self._discover()
        latest: dict[TP, int] = {}
        eff_start: dict[TP, int] = {}
        logs: dict[TP, PartitionLog] = {}
        views = {}
        for tp in sorted(set(begin) | set(found)):
            try:
                plog = partition_log(self.root, tp, found.get(tp))
                view = tail_view(plog)
            except UnknownTopicOrPartitionError:
                if tp in begin:
                    data_loss(
                        opts.fail_on_data_loss,
                        f"partition {tp[0]}-{tp[1]} no longer exists (its topic was deleted) at offset {begin[tp]}",
                    )
                continue
            end = view.end_offset
            if tp in begin and end < begin[tp]:
                view = plog.view()
                data_loss(
                    opts.fail_on_data_loss,
                    f"{tp[0]}-{tp[1]} ends at offset {view.end_offset}, "
                    f"before the query's position {begin[tp]} (was the topic "
                    "re-created?)",
                )
                latest[tp] = eff_start[tp] = view.start_offset  # go on from the new log's start
                continue
            if tp in begin:
                eff_start[tp] = begin[tp]
            else:  # a new partition or topic: read it from its start
                eff_start[tp] = view.start_offset if view.start_offset <= end else end
            # read_committed: never past the first undecided transaction (a start inside one waits for it).
            latest[tp] = max(eff_start[tp], self._stable(plog))
            logs[tp], views[tp] = plog, view
        self._latest = dict(latest)

        if self._target is not None:  # AvailableNow: never past the offsets that existed when it began
            for tp in list(latest):
                if tp in self._target:
                    latest[tp] = max(eff_start[tp], min(latest[tp], self._target[tp]))
                elif tp in begin:
                    latest[tp] = eff_start[tp]
                else:
                    del latest[tp]

        if not isinstance(limit, ReadAllAvailable):
            max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else opts.max_offsets_per_trigger
            max_bytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else opts.max_bytes_per_trigger
            min_rows = limit.min_rows if isinstance(limit, ReadMinRows) else opts.min_offsets_per_trigger
            growing = {tp: latest[tp] - eff_start[tp] for tp in latest if latest[tp] > eff_start[tp]}
            if (
                min_rows is not None
                and self._target is None
                and sum(growing.values()) < min_rows
                and (time.monotonic() - self._last_trigger) * 1000 < opts.max_trigger_delay_ms
            ):
                return start
            if max_rows is not None:
                for tp, n in allocate_rows(growing, max_rows).items():
                    latest[tp] = eff_start[tp] + n
            if max_bytes is not None:
                grow = [tp for tp in growing if tp in logs]
                starts, ends = {tp: eff_start[tp] for tp in grow}, {tp: latest[tp] for tp in grow}
                try:
                    cut = cut_by_bytes(
                        {tp: logs[tp] for tp in grow}, {tp: views[tp] for tp in grow}, starts, ends, max_bytes
                    )
                except ObjectNotFoundError:  # a cached view named segments merged or deleted since: resolve
                    cut = cut_by_bytes(
                        {tp: logs[tp] for tp in grow}, {tp: logs[tp].view() for tp in grow}, starts, ends, max_bytes
                    )
                for tp in grow:
                    latest[tp] = min(latest[tp], cut[tp])

        # ``latest`` is the batch's end; partitions of deleted topics (failOnDataLoss=false) drop out here.
        if latest == begin:
            return start
        self._last_trigger = time.monotonic()
        batch_end: dict[str, Any] = offsets_to_json(_nested(latest))
        if self._initial is not None and start == self._initial:
            # The first batch's end carries its start. Spark does not log a start offset: if the driver dies
            # before the first batch commits, the re-run starts from ``initialOffset()`` called again, which
            # for "latest" or a timestamp now resolves later; ``partitions`` takes the start from here instead.
            batch_end[BATCH_START_KEY] = dict(start)
        return batch_end

    def reportLatestOffset(self) -> dict | None:
        """The newest offsets seen (no limits applied), shown as ``latestOffset`` in the query progress."""
        return offsets_to_json(_nested(self._latest)) if self._latest is not None else None

    def partitions(self, start: dict, end: dict) -> list[PlogInputPartition]:
        """The batch's offset ranges, a task each (more with ``minPartitions``); deterministic for replays."""
        if start == end:
            return []
        pinned = end.get(BATCH_START_KEY)  # a first batch's own start (see ``latestOffset``) wins over ``start``
        begin = _flat(offsets_from_json(pinned if pinned is not None else start))
        until = _flat(offsets_from_json(end))
        fail = self.opts.fail_on_data_loss
        ranges = []
        for tp, stop in sorted(until.items()):
            first = begin.get(tp)
            if first is None:  # first seen in this batch: from its log start
                first = self._earliest(tp)
                if first is None:
                    data_loss(fail, f"partition {tp[0]}-{tp[1]} no longer exists")
                    continue
                if first > stop:
                    data_loss(fail, f"offsets [0, {first}) of new partition {tp[0]}-{tp[1]} are gone")
                    continue
            if stop < first:
                data_loss(fail, f"{tp[0]}-{tp[1]} went back from offset {first} to {stop}")
                continue
            ranges.append(OffsetRange(tp[0], tp[1], first, stop))
        return _input_partitions(self.opts, self.root, ranges)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        """Read one range (runs on an executor)."""
        return read_partition(partition)

    def commit(self, end: dict) -> None:
        """Spark committed the batch ending at ``end``; with ``groupIdForLag``, record it for lag tools."""
        self._record_group_offsets(end)

    def _record_group_offsets(self, processed: dict) -> None:
        """Write ``processed`` under ``groups/<groupIdForLag>/offsets/`` (best effort: lag is only a report).

        Spark calls ``commit`` for a batch only when it plans the next one, so
        ``latestOffset`` records its ``start`` too: by then the previous batch
        has been committed to the sink, and lag tools see it at once.
        """
        group = self.opts.group_id_for_lag
        if group is None:
            return
        try:
            if self._group is None:
                self._group = GroupOffsetsWriter(self.root.store, group)
            self._group.commit(offsets_to_json(offsets_from_json(processed)))
        except (PlogError, OSError) as exc:
            log.warning("could not record the offsets of group %r: %s", group, exc)

    def stop(self) -> None:
        """Release the root when the query stops."""
        if self._root is not None:
            self._root.close()
            self._root = None


def _flat(offsets: Mapping[str, Mapping[int, int]]) -> dict[TP, int]:
    return {(t, p): o for t, per in offsets.items() for p, o in per.items()}


def _nested(offsets: Mapping[TP, int]) -> dict[str, dict[int, int]]:
    out: dict[str, dict[int, int]] = {}
    for (t, p), o in offsets.items():
        out.setdefault(t, {})[p] = o
    return out


# ---------------------------------------------------------------------------- the data source


class DefaultSource(DataSource):
    """The ``plog`` data source; Spark finds it in the ``pyspark_logsource`` package by its name."""

    @classmethod
    def name(cls) -> str:
        """The format name: ``spark.read.format("plog")``."""
        return "plog"

    def schema(self) -> StructType:
        """Kafka's schema; checks the options first, so a bad one fails when the query is defined."""
        opts = parse_options(self.options, streaming=None)
        return spark_schema(opts.include_headers)

    def reader(self, schema: StructType) -> DataSourceReader:
        """A batch reader (``spark.read``)."""
        opts = parse_options(self.options, streaming=False)
        _check_schema(schema, opts)
        return PlogBatchReader(opts)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """A batch writer (``df.write``): one Spark job is one transaction."""
        from pyspark_logsource.spark.sink import PlogBatchWriter

        return PlogBatchWriter(dict(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """The exactly-once streaming sink (``df.writeStream``): one micro-batch is one transaction."""
        from pyspark_logsource.spark.sink import PlogStreamWriter

        return PlogStreamWriter(dict(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """A streaming reader (``spark.readStream``); bad options fail the query when it starts."""
        try:
            opts = parse_options(self.options, streaming=True)
            _check_schema(schema, opts)
        except PlogError as exc:
            # Raised from here, PySpark 4.3's stream runner hides it behind an UnboundLocalError of its
            # own; raised from the first call of the query instead, it is the query's error as is.
            return _FailedStreamReader(exc)
        return PlogStreamReader(opts)


class _FailedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Stands in for a stream reader whose options are bad: every call raises the options error."""

    def __init__(self, error: PlogError) -> None:
        self.error = error

    def _fail(self) -> Any:
        raise self.error

    def initialOffset(self) -> dict:
        return self._fail()

    def getDefaultReadLimit(self) -> ReadLimit:
        return self._fail()

    def prepareForTriggerAvailableNow(self) -> None:
        self._fail()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        return self._fail()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return self._fail()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return self._fail()
