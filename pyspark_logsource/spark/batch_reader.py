"""``spark.read.format("plog")``: batch reads, with filters pushed down to the offset and time indexes."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from coordinator.transactions import TransactionCoordinator
from pyspark_logsource.spark.compat import (  # filter classes differ by PySpark version
    HAS_FILTER_PUSHDOWN,
    DataSourceReader,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
)
from pyspark_logsource.spark.option_schema import option_error
from pyspark_logsource.spark.options import SourceOptions
from pyspark_logsource.spark.partition_reader import input_partitions, read_partition, stable_end
from pyspark_logsource.spark.planning import (
    TP,
    OffsetRange,
    discover,
    resolve_offsets,
)
from pyspark_logsource.spark.typed import ReaderSchema, current_reader_schema
from segment_format.log.partition_log import PartitionLog
from segment_format.root import LogRoot
from segment_format.typed.layout import FieldFilter

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
    #: Conditions on a typed topic's value fields: batches whose statistics rule them out are skipped
    #: undecoded (PROTOCOL.md 11.8); Spark still checks every row.
    value_filters: list[FieldFilter] = field(default_factory=list)
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


#: Spark's own ``pushFilters`` (PySpark 4.0 has none, and never pushes filters to Python readers).
_BASE_PUSH_FILTERS: Any = getattr(DataSourceReader, "pushFilters", None)


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
        __func__ = staticmethod(_BASE_PUSH_FILTERS)  # the base function itself, not bound

        def __init__(self, reader: PlogBatchReader) -> None:
            self._reader = reader

        def __call__(self, filters: list[Filter]) -> list[Filter]:
            return self._reader.push_filters(filters)

    def __get__(self, obj: PlogBatchReader | None, objtype: type | None = None) -> Any:
        return self if obj is None else self._Bound(obj)


class PlogBatchReader(DataSourceReader):
    """``spark.read.format("plog")``: offsets ``[startingOffsets, endingOffsets)`` of each partition."""

    if HAS_FILTER_PUSHDOWN:  # PySpark 4.0 pushes no filters to Python readers: Spark filters every row
        pushFilters = _OptionalPushdown()  # type: ignore[assignment]

    def __init__(self, options: SourceOptions, reading: ReaderSchema | None = None) -> None:
        self.opts = options
        self.constraints = _Constraints()
        #: The value schema typed topics are read as (None: the current one, found when planning).
        self.reading = reading

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
            field_filter = self._value_filter(f)
            if field_filter is not None:
                c.value_filters.append(field_filter)
            if exact:
                c.pushed.append(repr(f))
            else:
                remaining.append(f)
        return remaining

    def _value_filter(self, f: Filter) -> FieldFilter | None:
        """``f`` as a condition on a value field, when it is one statistics can judge (else None).

        The field is ``value.<name>``, or ``<name>`` with ``flattenValue``; a name that is no field of
        the schema read is dropped when the partitions are planned."""
        attribute = getattr(f, "attribute", None)
        if not isinstance(attribute, tuple):
            return None
        if len(attribute) == 2 and attribute[0] == "value" and not self.opts.flatten_value:
            name = attribute[1]
        elif len(attribute) == 1 and self.opts.flatten_value and attribute[0] not in _METADATA_COLUMNS:
            name = attribute[0]
        else:
            return None
        value: Any = getattr(f, "value", None)
        if isinstance(f, IsNull):
            return (name, "is_null", None)
        if isinstance(f, IsNotNull):
            return (name, "is_not_null", None)
        if value is None:
            return None
        if isinstance(f, In):
            return (name, "in", list(value))
        for kind, op in _COMPARISONS:
            if isinstance(f, kind):
                return (name, op, value)
        return None

    def partitions(self) -> Sequence[InputPartition]:
        """Resolve partitions and offsets now, narrowed by the pushed filters; split by ``minPartitions``."""
        opts, c = self.opts, self.constraints
        root = LogRoot(opts.url, opts.storage_options)
        try:
            latest = stable_end(opts, TransactionCoordinator(root.store))
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
            reading = self.reading if self.reading is not None else current_reader_schema(root, opts)
            return input_partitions(opts, root, ranges, reading, tuple(c.value_filters))
        finally:
            root.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        """Read one range (runs on an executor)."""
        return read_partition(partition)


#: Spark's filters that statistics judge, as :class:`~segment_format.typed.layout.Projection` names them.
_COMPARISONS: tuple[tuple[type, str], ...] = (
    (EqualTo, "=="),
    (EqualNullSafe, "=="),  # with a non-null value: the same rows
    (GreaterThan, ">"),
    (GreaterThanOrEqual, ">="),
    (LessThan, "<"),
    (LessThanOrEqual, "<="),
)
#: Top-level columns that are the record's, not value fields, when the fields are flattened.
_METADATA_COLUMNS = frozenset({"key", "topic", "partition", "offset", "timestamp", "timestampType", "headers"})


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
