"""Terminal tables: what the ``plog`` command prints, drawn with ``rich`` from the listings' frames.

The tables of ``plog inspect`` render the DataFrames of
:mod:`segment_format.inspect.listings` (:func:`~segment_format.inspect.listings.segments_frame`,
:func:`~segment_format.inspect.listings.index_frame`, :func:`~segment_format.inspect.listings.batches_frame`)
and the Arrow records of a batch, so the terminal and a notebook show the same
facts from one computation. Also here: the small cell and time formatters
every command's tables share.

Cells are :class:`rich.text.Text`, never markup, because user data (keys,
values, topic names) may contain ``[...]``. Times are ISO 8601 in UTC with
millisecond precision, the form ``plog`` also accepts as input.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from rich.table import Table
from rich.text import Text

from pyspark_logsource.views.values import field_ddl, type_ddl, value_to_json

if TYPE_CHECKING:  # pandas costs a second at start-up, and every plog command imports this module
    import pandas as pd

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

# --------------------------------------------------------------------------- cells


def format_ms(ms: int | None) -> str:
    """Epoch milliseconds as ISO 8601 in UTC with millisecond precision (``-`` for none or negative)."""
    if ms is None or ms < 0:
        return "-"
    stamp = _EPOCH + timedelta(milliseconds=int(ms))
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def format_time(ts: Any) -> str:
    """A timestamp of a listing's datetime column (UTC) like :func:`format_ms` (``-`` for a missing one)."""
    if not isinstance(ts, datetime) or ts != ts:  # None, or pandas' NaT, the one datetime unequal to itself
        return "-"
    return format_ms((ts - _EPOCH) // timedelta(milliseconds=1))


def cell_text(value: object, style: str = "") -> Text:
    """A table cell that is never parsed as rich markup (user data may contain ``[...]``)."""
    return Text(str(value), style=style)


def cell_number(value: int | float) -> Text:
    """A right-aligned number with thousands separators."""
    return Text(f"{value:,}", justify="right")


def bytes_text(data: bytes | None, limit: int | None = None) -> str:
    """A key or value as text: UTF-8 with undecodable bytes replaced, ``null`` for None, cut to ``limit`` chars."""
    if data is None:
        return "null"
    text = data.decode("utf-8", errors="replace")
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def value_text(value: Any, kind: pa.DataType, limit: int | None = None) -> str:
    """A record's value as text: an untyped (binary) one as :func:`bytes_text`, a typed topic's (a dict of
    its fields, ``kind`` a struct) as compact JSON (:func:`~pyspark_logsource.views.values.value_to_json`)."""
    if value is None or not pa.types.is_struct(kind):
        return bytes_text(value, limit)
    text = json.dumps(value_to_json(value, kind), ensure_ascii=False, separators=(",", ":"))
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


# --------------------------------------------------------------------------- plog inspect


def segments_table(
    frame: pd.DataFrame,
    title: str,
    start_offset: int,
    end_offset: int,
    compacted: bool = False,
    schema_versions: Sequence[int | None] | None = None,
) -> Table:
    """The segment objects of a partition's chain, from :func:`~segment_format.inspect.listings.segments_frame`.

    Objects wholly below the log start (awaiting retention) are dimmed. For a ``compacted`` topic a
    column says which part each object is in: clean (every record passed a compaction) or dirty.
    ``schema_versions`` (a typed topic's, one per row): the value schema version of each object's
    batches (PROTOCOL.md 11.8), shown in a ``schema`` column.
    """
    table = Table(
        title=Text(f"{title}  start {start_offset:,}  end {end_offset:,}  ({len(frame)} segments)"),
        caption="end offsets are exclusive; timestamps are UTC",
    )
    table.add_column("object", no_wrap=True)
    for column in ("base", "end", "records", "batches", "bytes"):
        table.add_column(column, justify="right")
    table.add_column("min timestamp", no_wrap=True)
    table.add_column("max timestamp", no_wrap=True)
    table.add_column("compression")
    table.add_column("gen", justify="right")
    if compacted:
        table.add_column("part")
    if schema_versions is not None:
        table.add_column("schema", justify="right")
    for i, row in enumerate(frame.itertuples(index=False)):
        clean = isinstance(row.clean, (bool, np.bool_)) and bool(row.clean)
        part = [cell_text("clean" if clean else "dirty", "green" if clean else "yellow")]
        version = None if schema_versions is None else schema_versions[i]
        schema = [cell_text("-" if version is None else f"v{version}")]
        table.add_row(
            cell_text(row.object, "dim" if isinstance(row.below_start, (bool, np.bool_)) and row.below_start else ""),
            cell_number(row.base_offset),
            cell_number(row.end_offset),
            cell_number(row.record_count),
            cell_number(row.batch_count),
            cell_number(row.bytes),
            cell_text(format_time(row.min_timestamp)),
            cell_text(format_time(row.max_timestamp)),
            cell_text(row.compression),
            cell_number(row.generation),
            *(part if compacted else []),
            *(schema if schema_versions is not None else []),
        )
    return table


def shared_objects_table(frame: pd.DataFrame, title: str, typed: bool = False) -> Table:
    """A shared topic's shared objects, each once with the commits and partitions naming it, from
    :func:`~segment_format.inspect.listings.shared_objects`; a ``typed`` topic's with the value schema
    versions of its runs in each (PROTOCOL.md 11.8)."""
    table = Table(title=Text(f"{title}  ({len(frame)} shared objects)"), caption="records and bytes: this topic's runs")
    table.add_column("object", no_wrap=True)
    table.add_column("created", no_wrap=True)
    table.add_column("commits")
    table.add_column("partitions")
    for column in ("records", "bytes"):
        table.add_column(column, justify="right")
    if typed:
        table.add_column("schema", justify="right")
    for row in frame.itertuples(index=False):
        schema = [cell_text(", ".join(f"v{v}" for v in row.schema_versions) or "-")] if typed else []
        table.add_row(
            cell_text(row.object.rsplit("/", 1)[-1]),
            cell_text(format_time(row.created)),
            cell_text(_numbers(row.commits)),
            cell_text(_numbers(row.partitions)),
            cell_number(row.records),
            cell_number(row.bytes),
            *schema,
        )
    return table


def _numbers(values: Sequence[int]) -> str:
    """``0-3, 7``: runs of consecutive numbers joined."""
    spans: list[list[int]] = []
    for value in values:
        if spans and value == spans[-1][1] + 1:
            spans[-1][1] = value
        else:
            spans.append([value, value])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def index_table(frame: pd.DataFrame, title: str) -> Table:
    """A segment's batch index, from :func:`~segment_format.inspect.listings.index_frame`."""
    table = Table(title=Text(title), title_justify="left")
    for column in ("batch", "base offset", "last offset", "records", "position", "length"):
        table.add_column(column, justify="right")
    table.add_column("max timestamp", no_wrap=True)
    table.add_column("crc32c")
    for row in frame.itertuples(index=False):
        table.add_row(
            cell_number(row.batch),
            cell_number(row.base_offset),
            cell_number(row.last_offset),
            cell_number(row.record_count),
            cell_number(row.position),
            cell_number(row.length),
            cell_text(format_time(row.max_timestamp)),
            cell_text(f"{int(row.crc32c):08x}"),
        )
    return table


def batch_table(row: pd.Series, title: str, key: str, compression: str, schema_version: int | None = None) -> Table:
    """One batch's fields, as a two-column table, from its row of
    :func:`~segment_format.inspect.listings.batches_frame`.

    ``schema_version``: a typed topic's object's value schema version (PROTOCOL.md 11.8), shown when given.
    """
    table = Table(title=Text(title), show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value")
    table.add_row("object", cell_text(key))
    table.add_row("compression", cell_text(compression))
    if schema_version is not None:
        table.add_row("value schema version", cell_text(f"v{schema_version}"))
    for column in ("base_offset", "last_offset", "record_count", "position", "length", "uncompressed_bytes"):
        table.add_row(column.replace("_", " "), cell_number(int(row[column])))
    table.add_row("crc32c", cell_text(row["crc32c"]))
    table.add_row("first timestamp", cell_text(format_time(row["first_timestamp"])))
    table.add_row("max timestamp", cell_text(format_time(row["max_timestamp"])))
    table.add_row(
        "producer id / epoch / base sequence",
        cell_text(f"{row['producer_id']} / {row['producer_epoch']} / {row['base_sequence']}"),
    )
    table.add_row("attributes", cell_text(f"0x{int(row['attributes']) & 0xFFFF:04x}"))
    return table


def records_table(records: pa.Table, title: str, highlight: int | None = None, width: int = 80) -> Table:
    """Records (the record schema of PROTOCOL.md 5), values cut to ``width``; ``highlight`` an offset.

    A typed topic's values (a struct column) are shown as compact JSON (:func:`value_text`)."""
    table = Table(title=Text(title), title_justify="left")
    table.add_column("offset", justify="right")
    table.add_column("timestamp", no_wrap=True)
    table.add_column("key")
    table.add_column("value", overflow="fold")
    table.add_column("headers", justify="right")
    offsets = records.column("offset").to_pylist()
    stamps = records.column("timestamp").cast(pa.int64()).to_pylist()
    keys = records.column("key").to_pylist()
    value_type = records.schema.field("value").type  # a struct for a typed topic (PROTOCOL.md 11.8)
    values = records.column("value").to_pylist()
    headers = records.column("headers").to_pylist()
    for i, offset in enumerate(offsets):
        style = "bold yellow" if offset == highlight else ""
        table.add_row(
            cell_text(f"{offset:,}", style),
            cell_text(format_ms(stamps[i])),
            cell_text(bytes_text(keys[i], 40)),
            cell_text(value_text(values[i], value_type, width), style),
            cell_number(len(headers[i] or ())),
        )
    return table


# --------------------------------------------------------------------------- typed topics


def schema_table(schema: pa.Schema, title: str) -> Table:
    """A value schema (PROTOCOL.md 11.8): one row per field with its type in DDL and Arrow's words."""
    table = Table(title=Text(title), title_justify="left")
    table.add_column("field")
    table.add_column("type")
    table.add_column("arrow type", style="dim")
    table.add_column("nullable")
    for field in schema:
        table.add_row(
            cell_text(field.name, "bold"),
            cell_text(type_ddl(field.type)),
            cell_text(str(field.type)),
            cell_text("yes" if field.nullable else "NOT NULL", "" if field.nullable else "yellow"),
        )
    return table


def schema_history_table(history: Sequence[dict[str, Any]], title: str = "value schema history") -> Table:
    """A typed topic's value schema versions, oldest first: ``describe_topic()["value_schema_history"]``."""
    table = Table(title=Text(title), title_justify="left")
    table.add_column("version", justify="right")
    table.add_column("created", no_wrap=True)
    table.add_column("fields", overflow="fold")
    for entry in history:
        table.add_row(
            cell_text(f"v{entry['version']}"),
            cell_text(format_ms(entry["created_ms"]) if entry["created_ms"] else "-"),
            cell_text(", ".join(field_ddl(field) for field in entry["schema"])),
        )
    return table


# --------------------------------------------------------------------------- checks


def checks_table(title: str, checks: Sequence[tuple[str, bool, str]]) -> Table:
    """Checks, ``(name, passed, detail)`` each, as a table of ✓ and ✗ rows."""
    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column("")
    table.add_column("check")
    table.add_column("detail", style="dim")
    for name, passed, detail in checks:
        table.add_row(
            cell_text("✓" if passed else "✗", "green" if passed else "bold red"), cell_text(name), cell_text(detail)
        )
    return table


__all__ = [
    "batch_table",
    "bytes_text",
    "cell_number",
    "cell_text",
    "checks_table",
    "format_ms",
    "format_time",
    "index_table",
    "records_table",
    "schema_history_table",
    "schema_table",
    "segments_table",
    "value_text",
]
