"""The record schema, and turning user data into record batches.

A record has the fields of a Kafka record (PROTOCOL.md 5):

==========  =================================================  ========
field       Arrow type                                          nullable
==========  =================================================  ========
offset      int64                                               no
timestamp   timestamp[ms, tz=UTC]                               no
key         binary                                              yes
value       binary (null is a tombstone)                        yes
headers     list<struct<key: string not null, value: binary>>   yes
==========  =================================================  ========
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import InvalidRecordError

HEADER_TYPE = pa.struct([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())])
HEADERS_TYPE = pa.list_(pa.field("item", HEADER_TYPE))
TIMESTAMP_TYPE = pa.timestamp("ms", tz="UTC")

RECORD_SCHEMA = pa.schema(
    [
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", TIMESTAMP_TYPE, nullable=False),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", HEADERS_TYPE),
    ]
)

#: The columns a producer supplies; ``offset`` is assigned when the batch is appended.
PAYLOAD_SCHEMA = pa.schema([RECORD_SCHEMA.field(n) for n in ("timestamp", "key", "value", "headers")])

Header = tuple[str, bytes | None]


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch (the CreateTime of a record sent now)."""
    return time.time_ns() // 1_000_000


def as_bytes(obj: Any, what: str) -> bytes | None:
    """Coerce a key or value to bytes: bytes-likes pass, ``str`` is UTF-8 encoded, None stays None."""
    if obj is None or isinstance(obj, bytes):
        return obj
    if isinstance(obj, (bytearray, memoryview)):
        return bytes(obj)
    if isinstance(obj, str):
        return obj.encode("utf-8")
    raise InvalidRecordError(f"{what} must be bytes, str or None, not {type(obj).__name__}")


def check_headers(headers: Any) -> list[Header] | None:
    """Validate headers: a sequence of ``(str, bytes|None)`` pairs (values may be str)."""
    if headers is None:
        return None
    if not isinstance(headers, (list, tuple)):
        raise InvalidRecordError(f"headers must be a list of (str, bytes) pairs, not {type(headers).__name__}")
    checked: list[Header] = []
    for item in headers:
        if not (isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], str)):
            raise InvalidRecordError(f"each header must be a (str, bytes) pair, got {item!r}")
        checked.append((item[0], as_bytes(item[1], f"header {item[0]!r} value")))
    return checked


_NO_HEADER = pa.nulls(0, HEADER_TYPE)  # an empty header struct array, its children one offset each


def null_headers(n: int) -> pa.Array:
    """``n`` null header lists, equal to ``pa.nulls(n, HEADERS_TYPE)`` but without its oversized buffers.

    ``pa.nulls`` gives the (empty) key and value arrays inside the lists offset
    buffers of ``n + 1`` entries each. The IPC writer stores those whole with
    every batch cut from the column -- 8 bytes per row of the *whole* column,
    per batch -- and every reader decompresses them again.
    """
    return pa.Array.from_buffers(
        HEADERS_TYPE,
        n,
        [pa.py_buffer(bytes((n + 7) // 8)), pa.py_buffer(bytes(4 * (n + 1)))],
        null_count=n,
        children=[_NO_HEADER],
    )


def payload_batch(
    timestamps: Sequence[int] | np.ndarray,
    keys: Sequence[bytes | None],
    values: Sequence[bytes | None],
    headers: Sequence[list[Header] | None] | None = None,
) -> pa.RecordBatch:
    """Build a payload batch (no offsets yet) from already-validated Python columns."""
    n = len(values)
    header_array = (
        null_headers(n)
        if headers is None
        else pa.array([None if h is None else [{"key": k, "value": v} for k, v in h] for h in headers], HEADERS_TYPE)
    )
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.asarray(timestamps, dtype=np.int64), pa.int64()).cast(TIMESTAMP_TYPE),
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            header_array,
        ],
        schema=PAYLOAD_SCHEMA,
    )


def _column_as(table: pa.Table, name: str, target: pa.DataType) -> pa.ChunkedArray:
    column = table.column(name)
    if column.type == target:
        return column
    binary_like = (
        pa.types.is_string,
        pa.types.is_large_string,
        pa.types.is_large_binary,
        pa.types.is_binary_view,
        pa.types.is_string_view,
    )
    if target == pa.binary() and any(check(column.type) for check in binary_like):
        return pc.cast(column, pa.binary())
    if target == TIMESTAMP_TYPE and (pa.types.is_integer(column.type) or pa.types.is_timestamp(column.type)):
        if pa.types.is_timestamp(column.type):
            return pc.cast(column, TIMESTAMP_TYPE)
        return pc.cast(pc.cast(column, pa.int64()), TIMESTAMP_TYPE)
    if target == HEADERS_TYPE and pa.types.is_list(column.type):
        try:
            return pc.cast(column, HEADERS_TYPE)
        except pa.ArrowException as exc:  # ArrowInvalid, ArrowNotImplementedError, ArrowTypeError...
            raise InvalidRecordError(f"column {name!r} of type {column.type} is not {HEADERS_TYPE}") from exc
    raise InvalidRecordError(f"column {name!r} has type {column.type}; expected {target}")


def table_from_user_data(data: Any) -> pa.Table:
    """Accept a pyarrow Table / RecordBatch or a pandas DataFrame, and return a pyarrow Table."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas is a dependency
        pd = None
    if pd is not None and isinstance(data, pd.DataFrame):
        return pa.Table.from_pandas(data, preserve_index=False)
    raise InvalidRecordError(
        f"send_batch takes a pyarrow Table, RecordBatch or pandas DataFrame, not {type(data).__name__}"
    )


def normalize_payload(table: pa.Table, default_timestamp_ms: int | None = None) -> pa.Table:
    """Turn a user table (``value`` plus optional key/timestamp/headers) into the payload schema.

    Extra columns other than ``partition`` and ``topic`` are an error, so a typo
    (``vaule``) is reported instead of silently dropped.
    """
    allowed = {"value", "key", "timestamp", "headers", "partition", "topic"}
    unknown = [n for n in table.column_names if n not in allowed]
    if unknown:
        raise InvalidRecordError(f"unexpected column(s) {unknown}; allowed are {sorted(allowed)}")
    if "value" not in table.column_names:
        raise InvalidRecordError("the data has no 'value' column")
    n = table.num_rows
    value = _column_as(table, "value", pa.binary())
    key = _column_as(table, "key", pa.binary()) if "key" in table.column_names else pa.nulls(n, pa.binary())
    if "timestamp" in table.column_names:
        ts = _column_as(table, "timestamp", TIMESTAMP_TYPE)
        if ts.null_count:
            ts = pc.fill_null(ts, pa.scalar(default_timestamp_ms or now_ms(), TIMESTAMP_TYPE))
        stamps = ts.cast(pa.int64())
        if n and pc.min(stamps).as_py() < 0:  # refused as send() and Kafka refuse it
            row = pc.index(pc.less(stamps, 0), True).as_py()
            raise InvalidRecordError(
                f"column 'timestamp' holds {stamps[row].as_py()} ms at row {row}; "
                "timestamps must be non-negative ms since the epoch"
            )
    else:
        ts = pa.array(np.full(n, default_timestamp_ms or now_ms(), dtype=np.int64)).cast(TIMESTAMP_TYPE)
    headers = _column_as(table, "headers", HEADERS_TYPE) if "headers" in table.column_names else null_headers(n)
    return pa.Table.from_arrays([ts, key, value, headers], schema=PAYLOAD_SCHEMA)


def with_offsets(payload: pa.RecordBatch, base_offset: int) -> pa.RecordBatch:
    """Prefix a payload batch with its ``offset`` column ``base_offset, base_offset+1, ...``."""
    offsets = pa.array(np.arange(base_offset, base_offset + payload.num_rows, dtype=np.int64))
    if payload.schema.field(2).type == pa.binary():  # untyped; a typed payload's value is a struct (11.8)
        return pa.RecordBatch.from_arrays([offsets, *payload.columns], schema=RECORD_SCHEMA)
    schema = pa.schema([RECORD_SCHEMA.field(0), *payload.schema])
    return pa.RecordBatch.from_arrays([offsets, *payload.columns], schema=schema)


def clip_before(batch: pa.RecordBatch, end: int) -> pa.RecordBatch:
    """The records of ``batch`` (offsets ascending in its first column) below offset ``end``: a read by record
    count runs past a range's end only across the gaps compaction leaves."""
    offsets = batch.column(0)
    if offsets[-1].as_py() < end:
        return batch
    return batch.slice(0, int(np.searchsorted(offsets.to_numpy(), end, side="left")))
