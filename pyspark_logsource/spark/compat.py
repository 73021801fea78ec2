"""What the installed PySpark's Python Data Source API offers plog, detected once, never failing at import.

Every other module of the connector takes the version-dependent names from here, so one place knows
which PySpark has what. Features are detected by looking the names up (never by comparing version
numbers), so a back-port or a vendor build (Databricks Runtime) gets whatever it really has.

===============================================  ========  ====================================================
API (``pyspark.sql.``...)                        first in  what plog does without it
-----------------------------------------------  --------  ----------------------------------------------------
``datasource.DataSource``, readers, writers      4.0       nothing: PySpark 3.x has no Python data sources.
(and Spark's lookup of ``pyspark_*`` packages)             Importing :mod:`pyspark_logsource.spark.source`
                                                           raises :class:`UnsupportedSparkError` naming the
                                                           version; nothing of plog can be skipped silently,
                                                           as Spark 3.x never looks in Python for a format.
``DataSourceReader.read`` yielding Arrow         4.0       (there from 4.0 on)
``datasource.DataSourceArrowWriter``             4.0       (there from 4.0 on)
``datasource.DataSourceStreamArrowWriter``       4.1       the stream writer is also a ``DataSourceArrowWriter``:
                                                           PySpark 4.0's write worker feeds Arrow batches to any
                                                           ``DataSourceArrowWriter``, stream writers included,
                                                           so the sink still gets whole Arrow batches.
``datasource.Filter`` (``EqualNullSafe``...),    4.1       no filter pushdown: Spark filters every row of the
``DataSourceReader.pushFilters``                           ranges the options select (``startingOffsets`` /
                                                           ``endingOffsets`` still bound the read).
``DataSourceStreamReader.latestOffset(start,     4.2       Spark calls ``latestOffset()``: the reader keeps the
limit)``, ``getDefaultReadLimit``,                         last offsets it returned or was handed as the start,
``reportLatestOffset``,                                    and every micro-batch reads all available;
``streaming.datasource.ReadLimit`` and kinds               ``maxOffsetsPerTrigger``, ``maxBytesPerTrigger`` and
                                                           ``minOffsetsPerTrigger`` fail the query when it
                                                           starts, naming the version (never silently ignored).
``streaming.datasource.``                        4.2       Spark's own AvailableNow wrapper: everything there
``SupportsTriggerAvailableNow``                            when the query starts, as ONE micro-batch.
===============================================  ========  ====================================================

The versions were found by diffing each release's ``pyspark/sql/datasource.py`` and workers;
``tests/test_spark_compat.py`` checks this table against the installed PySpark (``.ci/compat`` runs it
on 4.0, 4.1 and 4.2; the project's own venv runs it on 4.3).
"""

from __future__ import annotations

import inspect
from abc import ABC
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyspark

from segment_format.errors import InvalidConfigError, PlogError

#: The installed PySpark's version string, e.g. ``"4.0.5"``.
SPARK_VERSION: str = pyspark.__version__

#: The oldest PySpark plog's connector serves.
MINIMUM_SPARK = "4.0"


class UnsupportedSparkError(PlogError, ImportError):
    """The installed PySpark lacks an API plog's Spark connector cannot do without."""


try:
    from pyspark.sql import datasource as _ds
except ImportError:  # PySpark 3.x: no Python data sources at all
    _ds = None  # type: ignore[assignment]


def _lookup(module: Any, name: str) -> Any:
    return getattr(module, name, None) if module is not None else None


#: Whether ``pyspark.sql.datasource.DataSource`` exists at all (4.0 and later).
HAS_DATA_SOURCES: bool = _lookup(_ds, "DataSource") is not None

#: The classes a data source cannot be built without; missing ones are named by :func:`missing_essentials`.
_ESSENTIAL = (
    "DataSource",
    "DataSourceReader",
    "DataSourceStreamReader",
    "DataSourceWriter",
    "DataSourceArrowWriter",
    "DataSourceStreamWriter",
    "InputPartition",
    "WriterCommitMessage",
)


def missing_essentials() -> list[str]:
    """The essential ``pyspark.sql.datasource`` names the installed PySpark lacks (empty from 4.0 on)."""
    if _ds is None:
        return ["pyspark.sql.datasource (the Python Data Source API)"]
    return [f"pyspark.sql.datasource.{name}" for name in _ESSENTIAL if _lookup(_ds, name) is None]


def unsupported_message(version: str, missing: list[str]) -> str:
    """The error a user of an unsupported PySpark reads: the version, what is missing, what to install."""
    return (
        f"plog's Spark connector (format('plog')) needs pyspark>={MINIMUM_SPARK}; the installed pyspark "
        f"{version} lacks {', '.join(missing)}. Install pyspark>={MINIMUM_SPARK} (Databricks Runtime 17 or "
        "later), or use plog's Python client (pyspark_logsource.Producer / Consumer) without Spark."
    )


def require_supported() -> None:
    """Raise :class:`UnsupportedSparkError` when the installed PySpark cannot run plog's data source."""
    missing = missing_essentials()
    if missing:
        raise UnsupportedSparkError(unsupported_message(SPARK_VERSION, missing))


# ---------------------------------------------------------------------------- base classes

#: Stand-ins for a PySpark without Python data sources, so that the connector's modules import
#: (and :func:`require_supported` can say what is missing) instead of failing with a bare ImportError.


class _Missing(ABC):  # noqa: B024 - a base that only stands in for a missing class
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        require_supported()


#: Whether PySpark hands a stream writer Arrow batches through a class of its own (4.1 and later).
HAS_STREAM_ARROW_WRITER: bool = _lookup(_ds, "DataSourceStreamArrowWriter") is not None

if TYPE_CHECKING:  # mypy checks against the newest PySpark, where every name exists
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceArrowWriter,
        DataSourceReader,
        DataSourceStreamArrowWriter,
        DataSourceStreamReader,
        DataSourceStreamWriter,
        DataSourceWriter,
        InputPartition,
        WriterCommitMessage,
    )
else:
    DataSource = _lookup(_ds, "DataSource") or _Missing
    DataSourceReader = _lookup(_ds, "DataSourceReader") or _Missing
    DataSourceStreamReader = _lookup(_ds, "DataSourceStreamReader") or _Missing
    DataSourceWriter = _lookup(_ds, "DataSourceWriter") or _Missing
    DataSourceArrowWriter = _lookup(_ds, "DataSourceArrowWriter") or DataSourceWriter
    DataSourceStreamWriter = _lookup(_ds, "DataSourceStreamWriter") or _Missing
    InputPartition = _lookup(_ds, "InputPartition") or _Missing
    WriterCommitMessage = _lookup(_ds, "WriterCommitMessage") or _Missing

    if HAS_STREAM_ARROW_WRITER:
        DataSourceStreamArrowWriter = _ds.DataSourceStreamArrowWriter
    elif DataSourceArrowWriter is not DataSourceWriter and DataSourceStreamWriter is not _Missing:

        class DataSourceStreamArrowWriter(DataSourceStreamWriter, DataSourceArrowWriter):
            """A stream writer PySpark 4.0 feeds Arrow batches: its write worker checks
            ``isinstance(writer, DataSourceArrowWriter)`` for stream writers as for batch ones."""

    else:
        DataSourceStreamArrowWriter = DataSourceStreamWriter


# ---------------------------------------------------------------------------- filter pushdown

#: Whether Spark pushes filters to a Python batch reader (``DataSourceReader.pushFilters``, 4.1 and later).
HAS_FILTER_PUSHDOWN: bool = (
    _lookup(_lookup(_ds, "DataSourceReader"), "pushFilters") is not None and _lookup(_ds, "EqualNullSafe") is not None
)


class _NoFilter:
    """A filter kind this PySpark does not have: no filter Spark hands over is ever one."""


def _filter(name: str) -> Any:
    found = _lookup(_ds, name)
    return found if found is not None else type(name, (_NoFilter,), {"__doc__": _NoFilter.__doc__})


if TYPE_CHECKING:
    from pyspark.sql.datasource import (
        EqualNullSafe,
        EqualTo,
        Filter,
        GreaterThan,
        GreaterThanOrEqual,
        In,
        IsNotNull,
        IsNull,
        LessThan,
        LessThanOrEqual,
    )
else:
    Filter = _filter("Filter")
    EqualTo = _filter("EqualTo")
    EqualNullSafe = _filter("EqualNullSafe")
    GreaterThan = _filter("GreaterThan")
    GreaterThanOrEqual = _filter("GreaterThanOrEqual")
    LessThan = _filter("LessThan")
    LessThanOrEqual = _filter("LessThanOrEqual")
    In = _filter("In")
    IsNull = _filter("IsNull")
    IsNotNull = _filter("IsNotNull")


# ---------------------------------------------------------------------------- streaming admission control

try:
    from pyspark.sql.streaming import datasource as _sds
except ImportError:  # before 4.2
    _sds = None  # type: ignore[assignment]

#: Whether Spark calls ``latestOffset(start, limit)`` and ``getDefaultReadLimit()`` (4.2 and later); before,
#: it calls ``latestOffset()`` and every micro-batch reads all available.
HAS_ADMISSION_CONTROL: bool = (
    _sds is not None
    and _lookup(_sds, "ReadLimit") is not None
    and _lookup(_ds, "DataSourceStreamReader") is not None
    and len(inspect.signature(_ds.DataSourceStreamReader.latestOffset).parameters) > 1
)

#: Whether Spark calls ``prepareForTriggerAvailableNow`` on a Python stream reader (4.2 and later).
HAS_TRIGGER_AVAILABLE_NOW: bool = _lookup(_sds, "SupportsTriggerAvailableNow") is not None


class _ReadLimit:
    """Stand-in for ``pyspark.sql.streaming.datasource.ReadLimit`` before 4.2 (never given by Spark)."""


@dataclass
class _ReadAllAvailable(_ReadLimit):
    pass


@dataclass
class _ReadMinRows(_ReadLimit):
    min_rows: int


@dataclass
class _ReadMaxRows(_ReadLimit):
    max_rows: int


@dataclass
class _ReadMaxBytes(_ReadLimit):
    max_bytes: int


class _SupportsTriggerAvailableNow:
    """Stand-in mixin before 4.2: Spark wraps the reader in its own AvailableNow wrapper instead."""


if TYPE_CHECKING:
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxBytes,
        ReadMaxRows,
        ReadMinRows,
        SupportsTriggerAvailableNow,
    )
else:
    ReadLimit = _lookup(_sds, "ReadLimit") or _ReadLimit
    ReadAllAvailable = _lookup(_sds, "ReadAllAvailable") or _ReadAllAvailable
    ReadMinRows = _lookup(_sds, "ReadMinRows") or _ReadMinRows
    ReadMaxRows = _lookup(_sds, "ReadMaxRows") or _ReadMaxRows
    ReadMaxBytes = _lookup(_sds, "ReadMaxBytes") or _ReadMaxBytes
    SupportsTriggerAvailableNow = _lookup(_sds, "SupportsTriggerAvailableNow") or _SupportsTriggerAvailableNow

#: The source options that need admission control, by their attribute on ``SourceOptions``.
_LIMIT_OPTIONS = {
    "maxOffsetsPerTrigger": "max_offsets_per_trigger",
    "maxBytesPerTrigger": "max_bytes_per_trigger",
    "minOffsetsPerTrigger": "min_offsets_per_trigger",
}


def check_stream_options(opts: Any) -> None:
    """Refuse read-limit options a PySpark without admission control would silently ignore.

    Before 4.2 Spark never tells a Python stream reader where a micro-batch starts nor what limit
    applies, and runs ``Trigger.AvailableNow`` as one batch of what its own call of ``latestOffset()``
    returns: a limit applied there would end an AvailableNow run early. So plog reads all available
    per micro-batch and says so rather than pretending to honour the limit.
    """
    if HAS_ADMISSION_CONTROL:
        return
    for option, attribute in _LIMIT_OPTIONS.items():
        if getattr(opts, attribute, None) is not None:
            raise InvalidConfigError(
                f"option {option!r}: pyspark {SPARK_VERSION} gives Python streaming sources no admission "
                "control (it came in 4.2), so every micro-batch reads all available records; remove the "
                "option, or run on pyspark>=4.2"
            )


__all__ = [
    "HAS_DATA_SOURCES",
    "HAS_ADMISSION_CONTROL",
    "HAS_FILTER_PUSHDOWN",
    "HAS_STREAM_ARROW_WRITER",
    "HAS_TRIGGER_AVAILABLE_NOW",
    "MINIMUM_SPARK",
    "SPARK_VERSION",
    "UnsupportedSparkError",
    "check_stream_options",
    "missing_essentials",
    "require_supported",
    "unsupported_message",
]
