"""``plog``: the command line of plog (topics, produce, consume, inspect, maintain, groups, demo).

Every command works on a plog root named by ``--url`` (any fsspec URL or a
local directory; default ``./plog-data``, or ``$PLOG_URL`` when set) with
backend options given as repeatable ``--storage-option KEY=VALUE``.

Records go to stdout untouched by any formatting; tables, progress bars and
summaries are drawn with ``rich`` (progress bars and notes on stderr, so
``plog consume ... | jq`` stays clean). Exit codes: 0 success, 1 the demo's
verification failed, 2 bad usage or a plog error (printed as one red line
``error: ...``), 130 interrupted.

Examples::

    plog topics create clicks --partitions 3 --config retention.ms=86400000
    printf 'a\\nb\\n' | plog produce clicks
    plog consume clicks --from-beginning --format json
    plog inspect clicks --partition 0 --batch 42
    plog groups describe my-group
    plog demo
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import time
import uuid
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from coordinator.groups import GroupClient, list_groups
from pyspark_logsource.client.admin import LogStore
from pyspark_logsource.client.consumer import Consumer
from pyspark_logsource.client.fetcher import ARROW_SCHEMA
from pyspark_logsource.client.futures import FutureRecordMetadata
from pyspark_logsource.client.producer import Producer
from pyspark_logsource.client.types import TopicPartition
from segment_format.errors import (
    OffsetOutOfRangeError,
    PlogError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from segment_format.log import PartitionLog
from segment_format.segment import read_batches
from segment_format.topic import TOPIC_CONFIG_DEFAULTS, TopicMetadata

#: The root used when neither ``--url`` nor ``$PLOG_URL`` is given: a directory in the working directory.
DEFAULT_URL = "./plog-data"
#: Exit codes.
EXIT_OK, EXIT_FAILED, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class CliError(Exception):
    """A usage error the CLI detects itself; reported like a :class:`PlogError` (exit code 2)."""


# --------------------------------------------------------------------------- small helpers


def format_ms(ms: int | None) -> str:
    """Epoch milliseconds as ISO 8601 in UTC with millisecond precision (``-`` for none or negative)."""
    if ms is None or ms < 0:
        return "-"
    stamp = _EPOCH + timedelta(milliseconds=int(ms))
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_timestamp(text: str) -> int:
    """Epoch milliseconds from ``text``: digits are milliseconds, anything else ISO 8601.

    An ISO date/time without a UTC offset is taken as UTC (the zone ``plog inspect``
    prints), so a timestamp copied from its output round-trips.
    """
    value = text.strip()
    if value.isdigit():
        return int(value)
    iso = value[:-1] + "+00:00" if value[-1:] in ("Z", "z") else value
    try:
        stamp = datetime.fromisoformat(iso)
    except ValueError:
        raise CliError(
            f"timestamp {text!r} is neither epoch milliseconds nor ISO 8601 (e.g. 2024-05-01T12:00:00Z)"
        ) from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    ms = (stamp - _EPOCH) // timedelta(milliseconds=1)
    if ms < 0:
        raise CliError(f"timestamp {text!r} is before 1970")
    return ms


def _key_value(text: str) -> tuple[str, str]:
    """argparse type of ``KEY=VALUE`` options."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key.strip(), value


def storage_options(pairs: Sequence[tuple[str, str]] | None) -> dict[str, Any]:
    """Storage options from ``KEY=VALUE`` pairs; values that parse as JSON (true, 3, {...}) are decoded."""
    options: dict[str, Any] = {}
    for key, raw in pairs or ():
        try:
            options[key] = json.loads(raw)
        except ValueError:
            options[key] = raw
    return options


def _text(value: object, style: str = "") -> Text:
    """A table cell that is never parsed as rich markup (user data may contain ``[...]``)."""
    return Text(str(value), style=style)


def _num(value: int | float) -> Text:
    return Text(f"{value:,}", justify="right")


def _decode(data: bytes | None, limit: int | None = None) -> str:
    if data is None:
        return "null"
    text = data.decode("utf-8", errors="replace")
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def _records(n: int) -> str:
    return f"{n:,} record" + ("" if n == 1 else "s")


def _rate(count: float, seconds: float) -> str:
    return f"{count / seconds:,.0f}" if seconds > 0 else "-"


def _make_console(stream: IO[str]) -> Console:
    """A console on ``stream``; wide when not a terminal so tables are not squeezed in pipes and logs."""
    width = None
    if not stream.isatty() and "COLUMNS" not in os.environ:
        width = 160
    return Console(file=stream, width=width, highlight=False)


class _RateColumn(ProgressColumn):
    """Progress column: items per second."""

    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        """Render the current speed of ``task``."""
        speed = task.finished_speed or task.speed
        return Text("-" if speed is None else f"{speed:,.0f} {self.unit}/s", style="progress.data.speed")


def _progress(console: Console, enabled: bool, unit: str = "records", auto_refresh: bool = True) -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,.0f} " + unit),
        _RateColumn(unit),
        TimeElapsedColumn(),
        console=console,
        disable=not enabled,
        auto_refresh=auto_refresh,
    )


@dataclass
class _Env:
    """What every command gets: its arguments and the two consoles."""

    args: argparse.Namespace
    out: Console
    err: Console

    @property
    def url(self) -> str:
        """The root URL."""
        return str(self.args.url)

    @property
    def options(self) -> dict[str, Any]:
        """The storage options."""
        return storage_options(self.args.storage_option)

    def note(self, message: str, style: str = "dim") -> None:
        """A remark on stderr."""
        self.err.print(_text(message, style), soft_wrap=True)


# --------------------------------------------------------------------------- topics


def cmd_topics_create(env: _Env) -> int:
    """``plog topics create NAME``: create a topic."""
    args = env.args
    config = dict(args.config or ())
    with LogStore(env.url, env.options) as store:
        meta = store.create_topic(args.name, args.partitions, config)
    noun = "partition" if meta.partitions == 1 else "partitions"
    env.out.print(_text(f"created topic {meta.name!r} with {meta.partitions} {noun}"), soft_wrap=True)
    return EXIT_OK


def cmd_topics_list(env: _Env) -> int:
    """``plog topics list``: topic names, one per line."""
    with LogStore(env.url, env.options) as store:
        names = store.list_topics()
    for name in names:
        env.out.print(_text(name), soft_wrap=True)
    if not names:
        env.note(f"no topics under {env.url}")
    return EXIT_OK


def cmd_topics_describe(env: _Env) -> int:
    """``plog topics describe NAME``: partitions (offsets, bytes, segments) and configuration."""
    with LogStore(env.url, env.options) as store:
        info = store.describe_topic(env.args.name)
        meta = store.root.topic(env.args.name)
    env.out.print(
        Text.assemble(
            ("topic ", "bold"),
            (info["name"], "bold cyan"),
            f"  id {info['topic_id']} · metadata version {meta.version} · "
            f"{meta.partitions} partition{'s' if meta.partitions != 1 else ''}",
        ),
        soft_wrap=True,
    )
    table = Table(title="partitions", title_justify="left")
    for column in ("partition", "start", "end", "records", "bytes", "segments"):
        table.add_column(column, justify="right")
    totals = {"records": 0, "bytes": 0, "segments": 0}
    for part in info["partitions"]:
        records = part["end_offset"] - part["start_offset"]
        totals["records"] += records
        totals["bytes"] += part["bytes"]
        totals["segments"] += part["segments"]
        table.add_row(
            _num(part["partition"]),
            _num(part["start_offset"]),
            _num(part["end_offset"]),
            _num(records),
            _num(part["bytes"]),
            _num(part["segments"]),
        )
    table.add_section()
    table.add_row(
        _text("total", "bold"), "", "", _num(totals["records"]), _num(totals["bytes"]), _num(totals["segments"])
    )
    env.out.print(table)
    config = Table(title="config", title_justify="left")
    config.add_column("key")
    config.add_column("value")
    config.add_column("source")
    for key, value in sorted(info["config"].items()):
        overridden = TOPIC_CONFIG_DEFAULTS.get(key) != value
        config.add_row(
            _text(key),
            _text(value, "bold" if overridden else ""),
            _text("set" if overridden else "default", "cyan" if overridden else "dim"),
        )
    env.out.print(config)
    return EXIT_OK


def cmd_topics_delete(env: _Env) -> int:
    """``plog topics delete NAME``: delete a topic and all its data."""
    with LogStore(env.url, env.options) as store:
        store.delete_topic(env.args.name)
    env.out.print(_text(f"deleted topic {env.args.name!r}"), soft_wrap=True)
    return EXIT_OK


# --------------------------------------------------------------------------- produce


def _stdin_lines() -> Iterator[bytes]:
    """Lines of stdin as bytes, without their line ending."""
    stream: Any = getattr(sys.stdin, "buffer", sys.stdin)
    for line in stream:
        raw = line if isinstance(line, bytes) else line.encode("utf-8")
        if raw.endswith(b"\n"):
            raw = raw[:-1]
            if raw.endswith(b"\r"):
                raw = raw[:-1]
        yield raw


@dataclass
class _SendTracker:
    """Keeps the futures of ``Producer.send`` until written, and where the records landed."""

    pending: list[FutureRecordMetadata] = field(default_factory=list)
    written: int = 0
    ranges: dict[int, list[int]] = field(default_factory=dict)  # partition -> [first, last, count]

    def add(self, future: FutureRecordMetadata) -> None:
        """Track one more future; settles finished ones now and then so memory stays bounded."""
        self.pending.append(future)
        if len(self.pending) >= 4096:
            self.settle(wait=False)

    def settle(self, wait: bool) -> None:
        """Collect finished futures (all of them if ``wait``); raises the first write error."""
        keep = []
        for future in self.pending:
            if not wait and not future.is_done():
                keep.append(future)
                continue
            meta = future.get()
            entry = self.ranges.setdefault(meta.partition, [meta.offset, meta.offset, 0])
            entry[0] = min(entry[0], meta.offset)
            entry[1] = max(entry[1], meta.offset)
            entry[2] += 1
            self.written += 1
        self.pending = keep

    def finish(self, producer: Producer) -> None:
        """Flush the producer and settle everything."""
        producer.flush()
        self.settle(wait=True)

    def describe(self) -> str:
        """``partition 0: offsets 3..9`` for each partition written."""
        return ", ".join(f"partition {p}: offsets {a}..{b}" for p, (a, b, _) in sorted(self.ranges.items()))


def _json_problem(exc: ValueError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f" at column {exc.colno} ({exc.msg})"
    return f" ({exc})"


def _json_key(obj: dict[str, Any], key_field: str | None) -> bytes | None:
    if key_field is None or obj.get(key_field) is None:
        return None
    value = obj[key_field]
    if isinstance(value, str):
        return value.encode("utf-8")
    return json.dumps(value, separators=(",", ":")).encode()


def cmd_produce(env: _Env) -> int:
    """``plog produce TOPIC``: send the lines of stdin as records."""
    args = env.args
    if args.key_field is not None and not args.json:
        raise CliError("--key-field needs --json (plain lines have no fields)")
    # Typing at a terminal: redraw only when a line is sent, so a half-typed line is never erased.
    interactive = sys.stdin.isatty()
    show = bool(args.progress) or interactive
    with Producer(env.url, env.options) as producer:
        meta = producer.root.topic(args.topic, refresh=True)  # unknown topic: fail before reading stdin
        if args.partition is not None:
            meta.check_partition(args.partition)
        tracker = _SendTracker()
        sent = 0
        failure: str | None = None
        with _progress(env.err, show, auto_refresh=not interactive) as progress:
            task = progress.add_task(f"producing to {args.topic}", total=None)
            for lineno, line in enumerate(_stdin_lines(), 1):
                key: bytes | None = None
                if args.json:
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except ValueError as exc:
                        failure = f"line {lineno}: invalid JSON{_json_problem(exc)}: {_decode(line, 60)!r}"
                        break
                    if not isinstance(obj, dict):
                        failure = f"line {lineno}: expected a JSON object, got {type(obj).__name__}"
                        break
                    key = _json_key(obj, args.key_field)
                tracker.add(producer.send(args.topic, value=line, key=key, partition=args.partition))
                sent += 1
                if interactive or sent % 256 == 0:
                    progress.update(task, completed=sent, refresh=interactive)
            progress.update(task, completed=sent)
            tracker.finish(producer)
    where = f" ({tracker.describe()})" if tracker.written else ""
    env.out.print(_text(f"produced {_records(tracker.written)} to {args.topic!r}{where}"), soft_wrap=True)
    if failure is not None:
        before = f"the {_records(sent)} before it {'was' if sent == 1 else 'were'} sent"
        raise CliError(f"{failure}; {before}, nothing after it")
    return EXIT_OK


# --------------------------------------------------------------------------- consume


def _record_lines(table: pa.Table, fmt: str) -> list[str]:
    """Render a ``poll_arrow`` table as output lines (``value`` or ``json`` format)."""
    values = table.column("value").to_pylist()
    if fmt == "value":
        return [_decode(v) for v in values]
    topics = table.column("topic").to_pylist()
    partitions = table.column("partition").to_pylist()
    offsets = table.column("offset").to_pylist()
    stamps = table.column("timestamp").cast(pa.int64()).to_pylist()
    keys = table.column("key").to_pylist()
    headers = table.column("headers").to_pylist()
    lines = []
    for i in range(table.num_rows):
        record = {
            "topic": topics[i],
            "partition": partitions[i],
            "offset": offsets[i],
            "timestamp": stamps[i],
            "key": None if keys[i] is None else _decode(keys[i]),
            "value": None if values[i] is None else _decode(values[i]),
            "headers": [
                {"key": h["key"], "value": None if h["value"] is None else _decode(h["value"])}
                for h in headers[i] or ()
            ],
        }
        lines.append(json.dumps(record, ensure_ascii=False))
    return lines


def _position_consumer(env: _Env, consumer: Consumer, tps: list[TopicPartition]) -> str:
    """Seek the assigned partitions as the flags ask; returns a description of where reading starts."""
    args = env.args
    if args.from_beginning:
        consumer.seek_to_beginning()
        return "the beginning"
    if args.offset is not None:
        if len(tps) > 1:
            raise CliError(f"--offset needs --partition: topic {args.topic!r} has {len(tps)} partitions")
        tp = tps[0]
        start, end = consumer.beginning_offsets([tp])[tp], consumer.end_offsets([tp])[tp]
        if not start <= args.offset <= end:
            raise OffsetOutOfRangeError(
                f"offset {args.offset} is out of range for {tp.topic}-{tp.partition}: valid offsets are {start}..{end}"
            )
        consumer.seek(tp, args.offset)
        return f"offset {args.offset}"
    if args.from_timestamp is not None:
        ms = parse_timestamp(args.from_timestamp)
        found = consumer.offsets_for_times({tp: ms for tp in tps})
        for tp in tps:
            hit = found.get(tp)
            if hit is None:
                consumer.seek_to_end(tp)
            else:
                consumer.seek(tp, hit.offset)
        return f"timestamp {format_ms(ms)}"
    consumer.seek_to_end()
    return "the end"


def cmd_consume(env: _Env) -> int:
    """``plog consume TOPIC``: print records until ``--max-records`` or ``--timeout-ms`` of silence."""
    args = env.args
    if args.max_records is not None and args.max_records < 1:
        raise CliError(f"--max-records must be positive, got {args.max_records}")
    if args.offset is not None and args.offset < 0:
        raise CliError(f"--offset must be >= 0, got {args.offset}")
    if args.timeout_ms < 0:
        raise CliError(f"--timeout-ms must be >= 0, got {args.timeout_ms}")
    count = 0
    with Consumer(env.url, env.options, auto_offset_reset="earliest") as consumer:
        meta = consumer.root.topic(args.topic, refresh=True)
        if args.partition is not None:
            meta.check_partition(args.partition)
            tps = [TopicPartition(args.topic, args.partition)]
        else:
            tps = [TopicPartition(args.topic, p) for p in range(meta.partitions)]
        consumer.assign(tps)
        started_at = _position_consumer(env, consumer, tps)
        out = sys.stdout
        with _progress(env.err, bool(args.progress)) as progress:
            task = progress.add_task(f"consuming {args.topic}", total=args.max_records)
            while args.max_records is None or count < args.max_records:
                want = 5000 if args.max_records is None else min(5000, args.max_records - count)
                table = consumer.poll_arrow(timeout_ms=args.timeout_ms, max_records=want)
                if table.num_rows == 0:
                    break
                lines = _record_lines(table, args.format)
                out.write("\n".join(lines) + "\n")
                out.flush()
                count += table.num_rows
                progress.update(task, completed=count)
    env.note(f"consumed {_records(count)} from {args.topic!r}")
    if count == 0 and started_at == "the end":
        env.note("reading started at the end of the log; use --from-beginning to read the existing records")
    return EXIT_OK


# --------------------------------------------------------------------------- inspect


def _segments_table(log: PartitionLog, title: str) -> tuple[Table, int]:
    view = log.view()
    table = Table(
        title=Text(f"{title}  start {view.start_offset:,}  end {view.end_offset:,}  ({len(view.segments)} segments)"),
        caption="end offsets are exclusive; timestamps are UTC",
    )
    table.add_column("object", no_wrap=True)
    for column in ("base", "end", "records", "batches", "bytes"):
        table.add_column(column, justify="right")
    table.add_column("min timestamp", no_wrap=True)
    table.add_column("max timestamp", no_wrap=True)
    table.add_column("compression")
    table.add_column("gen", justify="right")
    for ref in log.view(refresh=False).segments:
        idx = log.index(ref)
        m = idx.meta
        below_start = m.next_offset <= view.start_offset
        table.add_row(
            _text(ref.key.rsplit("/", 1)[-1], "dim" if below_start else ""),
            _num(m.base_offset),
            _num(m.next_offset),
            _num(m.record_count),
            _num(m.batch_count),
            _num(ref.size),
            _text(format_ms(m.min_timestamp)),
            _text(format_ms(m.max_timestamp)),
            _text(m.compression),
            _num(ref.generation),
        )
    return table, len(view.superseded)


def _index_table(log: PartitionLog, ref_index: int) -> Table:
    ref = log.view(refresh=False).segments[ref_index]
    idx = log.index(ref)
    table = Table(title=Text(f"index of {ref.key.rsplit('/', 1)[-1]}"), title_justify="left")
    for column in ("batch", "base offset", "last offset", "records", "position", "length"):
        table.add_column(column, justify="right")
    table.add_column("max timestamp", no_wrap=True)
    table.add_column("crc32c")
    for i in range(idx.batch_count):
        table.add_row(
            _num(i),
            _num(int(idx.base_offsets[i])),
            _num(int(idx.last_offsets[i])),
            _num(int(idx.record_counts[i])),
            _num(int(idx.positions[i])),
            _num(int(idx.lengths[i])),
            _text(format_ms(int(idx.max_timestamps[i]))),
            _text(f"{int(idx.crcs[i]):08x}"),
        )
    return table


def _dump_batch(env: _Env, log: PartitionLog, name: str, offset: int) -> None:
    view = log.view()
    if not view.start_offset <= offset < view.end_offset:
        holds = (
            f"it holds offsets {view.start_offset}..{view.end_offset - 1}"
            if view.end_offset > view.start_offset
            else "it is empty"
        )
        raise OffsetOutOfRangeError(f"offset {offset} is out of range for {name}: {holds}")
    ref = view.segments[view.segment_for(offset)]
    idx = log.index(ref)
    b = idx.batch_for_offset(offset)
    if b >= idx.batch_count or int(idx.base_offsets[b]) > offset:
        raise OffsetOutOfRangeError(f"no record at offset {offset} in {name} (removed by compaction)")
    row = idx.table.slice(b, 1).to_pylist()[0]
    meta = Table(
        title=Text(f"{name}: batch {b} of {idx.batch_count} in {ref.key.rsplit('/', 1)[-1]}"),
        show_header=False,
        title_justify="left",
    )
    meta.add_column("field", style="bold")
    meta.add_column("value")
    meta.add_row("object", _text(ref.key))
    meta.add_row("compression", _text(idx.meta.compression))
    for key in ("base_offset", "last_offset", "record_count", "position", "length", "uncompressed_bytes"):
        meta.add_row(key.replace("_", " "), _num(int(row[key])))
    meta.add_row("crc32c", _text(f"{row['crc32c']:08x}"))
    meta.add_row("first timestamp", _text(format_ms(row["first_timestamp"])))
    meta.add_row("max timestamp", _text(format_ms(row["max_timestamp"])))
    meta.add_row(
        "producer id / epoch / base sequence",
        _text(f"{row['producer_id']} / {row['producer_epoch']} / {row['base_sequence']}"),
    )
    meta.add_row("attributes", _text(f"0x{row['attributes'] & 0xFFFF:04x}"))
    env.out.print(meta)

    batch = read_batches(log.store, idx, b, b)[0]
    offsets = batch.column(0).to_pylist()
    at = offsets.index(offset) if offset in offsets else 0
    limit = env.args.limit
    lo = max(0, min(at - limit // 2, batch.num_rows - limit))
    hi = min(batch.num_rows, lo + limit)
    shown = batch.slice(lo, hi - lo)
    records = Table(title=Text(f"records {lo + 1}..{hi} of {batch.num_rows} in the batch"), title_justify="left")
    records.add_column("offset", justify="right")
    records.add_column("timestamp", no_wrap=True)
    records.add_column("key")
    records.add_column("value", overflow="fold")
    records.add_column("headers", justify="right")
    stamps = shown.column(1).cast(pa.int64()).to_pylist()
    keys = shown.column(2).to_pylist()
    values = shown.column(3).to_pylist()
    headers = shown.column(4).to_pylist()
    width = env.args.width
    for i, record_offset in enumerate(offsets[lo:hi]):
        style = "bold yellow" if record_offset == offset else ""
        records.add_row(
            _text(f"{record_offset:,}", style),
            _text(format_ms(stamps[i])),
            _text(_decode(keys[i], 40)),
            _text(_decode(values[i], width), style),
            _num(len(headers[i] or ())),
        )
    env.out.print(records)


def cmd_inspect(env: _Env) -> int:
    """``plog inspect TOPIC``: the segment objects of one or all partitions; ``--index``, ``--batch``."""
    args = env.args
    with LogStore(env.url, env.options) as store:
        root = store.root
        meta = root.topic(args.topic, refresh=True)
        if args.partition is not None:
            meta.check_partition(args.partition)
        if args.batch is not None:
            partition = _single_partition(meta, args.partition, "--batch")
            log = root.partition(args.topic, partition, meta)
            _dump_batch(env, log, f"{args.topic}-{partition}", args.batch)
            return EXIT_OK
        partitions = [args.partition] if args.partition is not None else list(range(meta.partitions))
        for p in partitions:
            log = root.partition(args.topic, p, meta)
            table, superseded = _segments_table(log, f"{args.topic}-{p}")
            env.out.print(table)
            if superseded:
                env.out.print(_text(f"  {superseded} superseded object(s) off the chain, awaiting deletion", "dim"))
            if args.index:
                for i in range(len(log.view(refresh=False).segments)):
                    env.out.print(_index_table(log, i))
    return EXIT_OK


def _single_partition(meta: TopicMetadata, partition: int | None, flag: str) -> int:
    if partition is not None:
        return partition
    if meta.partitions == 1:
        return 0
    raise CliError(f"{flag} needs --partition: topic {meta.name!r} has {meta.partitions} partitions")


# --------------------------------------------------------------------------- maintain


def cmd_maintain(env: _Env) -> int:
    """``plog maintain [TOPIC]``: merge small segments, apply retention, delete garbage."""
    topic = env.args.topic
    with LogStore(env.url, env.options) as store:
        if topic is not None:
            store.root.topic(topic, refresh=True)
        started = time.perf_counter()
        counts = store.maintain(topic)
        seconds = time.perf_counter() - started
    scope = f"topic {topic!r}" if topic else "all topics"
    summary = ", ".join(f"{key.replace('_', ' ')}: {value:,}" for key, value in counts.items())
    env.out.print(_text(f"maintained {scope} in {seconds:.2f} s — {summary}"), soft_wrap=True)
    return EXIT_OK


# --------------------------------------------------------------------------- groups


def _age(ms: int | None) -> str:
    if ms is None:
        return "-"
    return f"{max(0, int(time.time() * 1000) - ms) / 1000:,.1f} s ago"


def _end_offset(store: LogStore, topic: str, partition: int) -> int | None:
    try:
        return store.root.partition(topic, partition, store.root.topic(topic, refresh=True)).view().end_offset
    except UnknownTopicOrPartitionError:
        return None


def cmd_groups_list(env: _Env) -> int:
    """``plog groups list``: every group with its state, generation, protocol and live members."""
    with LogStore(env.url, env.options) as store:
        names = list_groups(store.root.store)
        table = Table(title="consumer groups", title_justify="left")
        for column in ("group", "state", "generation", "protocol", "live members"):
            table.add_column(column, justify="right" if column in ("generation", "live members") else "left")
        for name in names:
            info = GroupClient(store.root.store, name).describe()
            table.add_row(
                _text(name, "bold"),
                _text(info.state),
                _num(info.generation),
                _text(info.protocol or "-"),
                _num(sum(m.alive for m in info.members)),
            )
    if names:
        env.out.print(table)
    else:
        env.note(f"no consumer groups under {env.url}")
    return EXIT_OK


def cmd_groups_describe(env: _Env) -> int:
    """``plog groups describe GROUP``: members; per partition its owner, committed and end offsets, lag."""
    with LogStore(env.url, env.options) as store:
        info = GroupClient(store.root.store, env.args.group).describe()
        env.out.print(
            Text.assemble(
                ("group ", "bold"),
                (info.group, "bold cyan"),
                f"  state {info.state} · generation {info.generation} · protocol {info.protocol or '-'}",
            ),
            soft_wrap=True,
        )
        members = Table(title="members", title_justify="left")
        columns = ("member", "client id", "alive", "last heartbeat", "generation", "topics", "partitions")
        for column in columns:
            members.add_column(column)
        for m in info.members:
            members.add_row(
                _text(m.member_id),
                _text(m.client_id or "-"),
                _text("yes" if m.alive else "left" if m.left else "no", "green" if m.alive else "red"),
                _text(_age(m.last_heartbeat_ms)),
                _text(m.generation),
                _text(",".join(m.topics) or "-"),
                _text(" ".join(f"{t}-{p}" for t, p in m.assignment) or "-"),
            )
        env.out.print(members)
        partitions = Table(
            title="partitions"
            + (" (offsets recorded by a Spark query)" if info.committed_source == "spark-lag" else ""),
            title_justify="left",
        )
        for column in ("topic", "partition", "owner", "committed", "end", "lag"):
            partitions.add_column(column, justify="left" if column in ("topic", "owner") else "right")
        total_lag = 0
        for topic, partition in sorted(set(info.committed) | set(info.owners)):
            committed = info.committed.get((topic, partition))
            end = _end_offset(store, topic, partition)
            lag = end - committed if end is not None and committed is not None else None
            total_lag += lag or 0
            partitions.add_row(
                _text(topic),
                _num(partition),
                _text(info.owners.get((topic, partition), "-")),
                _num(committed) if committed is not None else _text("-"),
                _num(end) if end is not None else _text("-"),
                _num(lag) if lag is not None else _text("-"),
            )
        partitions.add_section()
        partitions.add_row(_text("total", "bold"), "", "", "", "", _num(total_lag))
        env.out.print(partitions)
    return EXIT_OK


def _reset_targets(env: _Env, store: LogStore, client: GroupClient) -> list[tuple[str, int]]:
    args = env.args
    if args.all_topics:
        owned = client.latest_generation().owners()
        topics = sorted({t for t, _ in client.committed()} | {t for t, _ in owned})
        if not topics:
            raise CliError(f"group {client.group!r} has no committed offsets; name the topics with --topic")
        specs: list[tuple[str, list[int] | None]] = [(t, None) for t in topics]
    else:
        specs = []
        for spec in args.topic:
            topic, _, parts = spec.partition(":")
            try:
                chosen = [int(p) for p in parts.split(",")] if parts else None
            except ValueError:
                raise CliError(f"--topic {spec!r}: partitions must be numbers, like {topic}:0,1") from None
            specs.append((topic, chosen))
    out = []
    for topic, chosen in specs:
        meta = store.root.topic(topic, refresh=True)
        for p in chosen if chosen is not None else range(meta.partitions):
            meta.check_partition(p)
            out.append((topic, p))
    return out


def cmd_groups_reset_offsets(env: _Env) -> int:
    """``plog groups reset-offsets GROUP``: Kafka's ``--reset-offsets``, for a group without live members."""
    args = env.args
    with LogStore(env.url, env.options) as store:
        client = GroupClient(store.root.store, args.group)
        active = client.active_members()
        if active:
            raise CliError(
                f"group {args.group!r} has {len(active)} live member(s) ({', '.join(active)}); "
                "offsets can only be reset when the group has no live members (stop its consumers "
                "first, or wait session_timeout_ms after they died)"
            )
        stamp = parse_timestamp(args.to_datetime) if args.to_datetime is not None else None
        current = client.committed()
        plan: dict[tuple[str, int], int] = {}
        for topic, p in _reset_targets(env, store, client):
            log = store.root.partition(topic, p)
            view = log.view()
            if args.to_earliest:
                target = view.start_offset
            elif args.to_latest:
                target = view.end_offset
            elif args.to_offset is not None:
                target = min(max(args.to_offset, view.start_offset), view.end_offset)
            else:
                assert stamp is not None
                found = log.offset_for_timestamp(stamp)
                target = view.end_offset if found is None else found
            plan[(topic, p)] = target
        table = Table(
            title=f"new offsets of group {args.group}" + ("" if args.execute else " (dry run)"), title_justify="left"
        )
        for column in ("topic", "partition", "committed", "new offset"):
            table.add_column(column, justify="left" if column == "topic" else "right")
        for (topic, p), target in sorted(plan.items()):
            before = current.get((topic, p))
            table.add_row(_text(topic), _num(p), _num(before) if before is not None else _text("-"), _num(target))
        env.out.print(table)
        if not args.execute:
            env.note("dry run: nothing changed; add --execute to reset these offsets")
            return EXIT_OK
        gen = client.reset_offsets(plan, by="plog-cli")
    env.out.print(
        _text(f"reset {len(plan)} partition offset(s) of group {args.group!r} (generation {gen.number})", "bold green"),
        soft_wrap=True,
    )
    return EXIT_OK


# --------------------------------------------------------------------------- demo

DEMO_TOPIC = "clicks"
DEMO_PARTITIONS = 3
_ACTIONS = ("view", "click", "purchase")
_ACTION_WEIGHTS = (0.72, 0.24, 0.04)
_SECTIONS = ("/", "/search", "/cart", "/checkout", "/account")


@dataclass
class _ClickStream:
    """One demo run's generated events, column-wise."""

    run: str
    users: list[str]
    pages: list[str]
    actions: list[str]
    timestamps: np.ndarray
    values: list[bytes]


def generate_clicks(run: str, count: int, start_ms: int) -> _ClickStream:
    """A synthetic click stream: Zipf-ish popular users and pages, mostly views, a few purchases.

    Each value is a JSON object tagged with ``run`` and ``seq`` (its position in
    the stream) so a run can find and check its own records in a shared topic.
    """
    rng = np.random.default_rng(random.Random(run).getrandbits(64))
    n_users = max(10, min(1000, count // 25))
    user_weights = 1.0 / np.arange(1, n_users + 1) ** 0.7
    user_ids = rng.choice(n_users, size=count, p=user_weights / user_weights.sum()) + 1
    n_products = 300
    product_weights = 1.0 / np.arange(1, n_products + 1) ** 1.1
    products = rng.choice(n_products, size=count, p=product_weights / product_weights.sum()) + 1
    section = rng.choice(len(_SECTIONS), size=count)
    on_product = rng.random(count) < 0.65
    actions_idx = rng.choice(len(_ACTIONS), size=count, p=_ACTION_WEIGHTS)
    # Purchases happen on product pages or at checkout.
    actions_idx[(actions_idx == 2) & ~on_product & (section != 3)] = 1
    gaps = rng.integers(0, 10, size=count)
    timestamps = start_ms + np.cumsum(gaps) - int(gaps.sum())  # the stream ends at start_ms
    users = [f"user-{u}" for u in user_ids.tolist()]
    pages = [
        f"/products/{p}" if prod else _SECTIONS[s]
        for p, prod, s in zip(products.tolist(), on_product.tolist(), section.tolist(), strict=True)
    ]
    actions = [_ACTIONS[a] for a in actions_idx.tolist()]
    values = [
        f'{{"user":"{u}","page":"{p}","action":"{a}","ts":{t},"run":"{run}","seq":{i}}}'.encode()
        for i, (u, p, a, t) in enumerate(zip(users, pages, actions, timestamps.tolist(), strict=True))
    ]
    return _ClickStream(run, users, pages, actions, timestamps, values)


@dataclass
class _Phase:
    name: str
    records: int
    nbytes: int
    seconds: float


def _demo_produce(env: _Env, stream: _ClickStream, progress: Progress) -> tuple[list[_Phase], dict[int, set[int]]]:
    """Send the first half with ``send``, the rest with ``send_batch``; returns timings and offsets."""
    count = len(stream.values)
    n_send = count // 2
    written: dict[int, set[int]] = {}
    task = progress.add_task("producing", total=count)
    phases = []
    with Producer(env.url, env.options) as producer:
        started = time.perf_counter()
        futures = []
        stamps = stream.timestamps.tolist()
        for i in range(n_send):
            futures.append(
                producer.send(DEMO_TOPIC, value=stream.values[i], key=stream.users[i], timestamp_ms=stamps[i])
            )
            if i % 1000 == 999:
                progress.update(task, completed=i + 1)
        producer.flush()  # before send_batch, so each user's records stay in order
        for future in futures:
            meta = future.get()
            written.setdefault(meta.partition, set()).add(meta.offset)
        phases.append(
            _Phase("Producer.send", n_send, sum(map(len, stream.values[:n_send])), time.perf_counter() - started)
        )
        progress.update(task, completed=n_send)

        started = time.perf_counter()
        chunk = 5000
        for lo in range(n_send, count, chunk):
            hi = min(count, lo + chunk)
            table = pa.table(
                {
                    "key": pa.array(stream.users[lo:hi], pa.string()),
                    "value": pa.array(stream.values[lo:hi], pa.binary()),
                    "timestamp": pa.array(stream.timestamps[lo:hi], pa.int64()),
                }
            )
            result = producer.send_batch(DEMO_TOPIC, table)
            for p, (first, last) in result.offsets.items():
                written.setdefault(p, set()).update(range(first, last + 1))
            progress.update(task, completed=hi)
        phases.append(
            _Phase(
                "Producer.send_batch",
                count - n_send,
                sum(map(len, stream.values[n_send:])),
                time.perf_counter() - started,
            )
        )
    return phases, written


def _demo_consume(env: _Env, begin: dict[int, int], end: dict[int, int], progress: Progress) -> tuple[pa.Table, _Phase]:
    """Read every partition from ``begin`` to ``end`` with ``poll_arrow``."""
    total = sum(end[p] - begin[p] for p in end)
    task = progress.add_task("consuming", total=total)
    tables = []
    read = 0
    nbytes = 0
    with Consumer(env.url, env.options, auto_offset_reset="earliest") as consumer:
        tps = [TopicPartition(DEMO_TOPIC, p) for p in sorted(end)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, begin[tp.partition])
        started = time.perf_counter()
        while any(consumer.position(tp) < end[tp.partition] for tp in tps):
            table = consumer.poll_arrow(timeout_ms=1000, max_records=50_000)
            if table.num_rows == 0:
                break  # nothing more arrives: verification will say what is missing
            tables.append(table)
            read += table.num_rows
            nbytes += table.column("value").nbytes
            progress.update(task, completed=read)
        seconds = time.perf_counter() - started
    table = pa.concat_tables(tables) if tables else ARROW_SCHEMA.empty_table()
    return table, _Phase("Consumer.poll_arrow", read, nbytes, seconds)


_DEMO_VALUE_SCHEMA = pa.schema(
    [
        pa.field("user", pa.string()),
        pa.field("page", pa.string()),
        pa.field("action", pa.string()),
        pa.field("ts", pa.int64()),
        pa.field("run", pa.string()),
        pa.field("seq", pa.int64()),
    ]
)


def _demo_parse(table: pa.Table, run: str) -> pa.Table:
    """This run's records (found by their ``run`` tag), values parsed with ``pyarrow.json``."""
    mine = table.filter(pc.fill_null(pc.match_substring(table.column("value"), f'"run":"{run}"'), False))
    if mine.num_rows == 0:
        return pa.table(
            {
                "partition": pa.array([], pa.int32()),
                "offset": pa.array([], pa.int64()),
                "key": pa.array([], pa.binary()),
                "timestamp": pa.array([], pa.int64()),
                "value": pa.array([], pa.binary()),
                **{f.name: pa.array([], f.type) for f in _DEMO_VALUE_SCHEMA},
            }
        )
    lines = b"\n".join(mine.column("value").to_pylist())
    parsed = pa_json.read_json(
        pa.BufferReader(lines), parse_options=pa_json.ParseOptions(explicit_schema=_DEMO_VALUE_SCHEMA)
    )
    columns = {
        "partition": mine.column("partition"),
        "offset": mine.column("offset"),
        "key": mine.column("key"),
        "timestamp": mine.column("timestamp").cast(pa.int64()),
        "value": mine.column("value"),
    }
    for name in parsed.column_names:
        columns[name] = parsed.column(name)
    return pa.table(columns)


def verify_clicks(stream: _ClickStream, got: pa.Table, written: dict[int, set[int]]) -> list[tuple[str, bool, str]]:
    """Check a demo run: every record back exactly once, at its offset, keyed and ordered per user.

    Returns ``(check, passed, detail)`` rows.
    """
    expected = len(stream.values)
    checks: list[tuple[str, bool, str]] = []
    seq = got.column("seq").to_numpy(zero_copy_only=False)
    unique = np.unique(seq)
    checks.append(
        (
            "every record read back",
            got.num_rows == expected
            and unique.size == expected
            and (expected == 0 or (unique[0] == 0 and unique[-1] == expected - 1)),
            f"{got.num_rows:,} read, {unique.size:,} distinct, {expected:,} produced",
        )
    )
    duplicates = got.num_rows - unique.size
    checks.append(("no duplicates", duplicates == 0, f"{duplicates:,} duplicate records"))

    partitions = got.column("partition").to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = got.column("offset").to_numpy(zero_copy_only=False)
    read_at = {int(p): set(offsets[partitions == p].tolist()) for p in np.unique(partitions)}
    same = {p: read_at.get(p, set()) for p in written} == written and set(read_at) <= set(written)
    checks.append(
        (
            "offsets match what the producer reported",
            same,
            f"{sum(len(s) for s in written.values()):,} offsets reported",
        )
    )

    keys_ok = got.num_rows == 0 or bool(
        pc.all(pc.equal(got.column("key").cast(pa.string()), got.column("user"))).as_py()
    )
    checks.append(("key is the user id", keys_ok, "record key == value.user"))
    ts_ok = got.num_rows == 0 or bool(pc.all(pc.equal(got.column("timestamp"), got.column("ts"))).as_py())
    checks.append(("timestamps preserved", ts_ok, "record timestamp == value.ts"))
    values_ok = True
    if got.num_rows and unique.size == got.num_rows and (unique[0] >= 0 and unique[-1] < expected):
        original = pa.array([stream.values[i] for i in seq.tolist()], pa.binary())
        values_ok = bool(pc.all(pc.equal(got.column("value"), original)).as_py())
    checks.append(("values intact", values_ok, "byte-identical JSON"))

    users = got.column("user").dictionary_encode().combine_chunks()
    codes = users.indices.to_numpy(zero_copy_only=False)
    order = np.lexsort((offsets, partitions, codes))
    u, p, s = codes[order], partitions[order], seq[order]
    same_user = u[1:] == u[:-1]
    split = int(np.count_nonzero(same_user & (p[1:] != p[:-1])))
    checks.append(("each user on one partition", split == 0, f"{len(users.dictionary):,} users"))
    backwards = int(np.count_nonzero(same_user & (p[1:] == p[:-1]) & (s[1:] <= s[:-1])))
    checks.append(("per-user order kept", backwards == 0, f"{backwards:,} out-of-order pairs"))
    return checks


def _share_table(title: str, label: str, counts: list[tuple[str, int]], total: int) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column(label)
    table.add_column("events", justify="right")
    table.add_column("share", justify="right")
    for name, n in counts:
        table.add_row(_text(name), _num(n), _text(f"{100 * n / max(total, 1):.1f} %"))
    return table


def _value_counts(column: pa.ChunkedArray) -> list[tuple[str, int]]:
    counts = pc.value_counts(column).to_pylist()
    return sorted(((c["values"], c["counts"]) for c in counts), key=lambda item: (-item[1], item[0]))


# --------------------------------------------------------------------------- demo: the Spark part

DEMO_SPARK_TOPIC = "clicks-per-user"
DEMO_SPARK_PARTITIONS = 3
_DEMO_COUNTS_SCHEMA = pa.schema(
    [
        pa.field("user", pa.string()),
        pa.field("events", pa.int64()),
        pa.field("views", pa.int64()),
        pa.field("clicks", pa.int64()),
        pa.field("purchases", pa.int64()),
        pa.field("last_ts", pa.int64()),
    ]
)


def _spark_unavailable() -> str | None:
    """Why the demo's Spark part cannot run here (no pyspark, no Java), or None."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed"
    home = os.environ.get("JAVA_HOME")
    if not (home and os.access(os.path.join(home, "bin", "java"), os.X_OK)) and shutil.which("java") is None:
        return "Java is not installed (Spark needs a JVM)"
    return None


def _demo_checkpoint(url: str) -> str:
    """The streaming query's checkpoint: under the data directory when it is local, else in ~/.cache/plog."""
    local = url[len("file://") :] if url.startswith("file://") else url
    if "://" not in local:
        return os.path.join(os.path.abspath(local), "_spark", "checkpoints", DEMO_SPARK_TOPIC)
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return str(Path.home() / ".cache" / "plog" / "demo-checkpoints" / f"{digest}-{DEMO_SPARK_TOPIC}")


def _demo_spark_session() -> tuple[Any, bool]:
    """A quiet local[2] SparkSession whose Python workers run this interpreter and find ``format("plog")``.

    Returns it and whether it was made here (and is to be stopped); an active session is used as it is.
    """
    package_parent = str(Path(__file__).resolve().parents[2])  # finds an editable install, too
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    paths = [package_parent, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    # pyspark's warning that it does not yet fully support pandas 3 is about APIs this demo does not use.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    active = SparkSession.getActiveSession()
    if active is not None:  # plog demo called from a program with its own session: use it, leave it running
        return active, False
    conf = SparkConf().setAll(
        [
            ("spark.master", "local[2]"),
            ("spark.app.name", "plog-demo"),
            ("spark.ui.enabled", "false"),
            ("spark.ui.showConsoleProgress", "false"),
            ("spark.sql.shuffle.partitions", "2"),
            ("spark.sql.session.timeZone", "UTC"),
            ("spark.driver.host", "127.0.0.1"),
            ("spark.driver.bindAddress", "127.0.0.1"),
            ("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={DEMO_LOG4J2.as_uri()}"),
        ]
    )
    _start_quiet_jvm(conf)
    spark = SparkSession.builder.config(conf=conf).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark, True


#: Spark's errors only (the demo's log4j2 set-up); see the file.
DEMO_LOG4J2 = Path(__file__).with_name("log4j2-demo.properties")


def _start_quiet_jvm(conf: Any) -> None:
    """Start Spark's JVM with its stderr piped through :func:`_forward_jvm_stderr`, which drops JVM warnings.

    The JVM prints warnings of its own (``WARNING: Using incubator modules``) before log4j is set up, so no
    logging configuration can silence them; everything else on its stderr (Spark's errors, Python workers'
    tracebacks) is passed on. ``popen_kwargs`` is pyspark's hook for capturing the JVM's output.
    """
    import subprocess
    import threading

    from pyspark import SparkContext
    from pyspark.java_gateway import launch_gateway

    gateway = launch_gateway(conf, popen_kwargs={"stderr": subprocess.PIPE})
    if gateway.proc is not None and gateway.proc.stderr is not None:  # None: a gateway that was already running
        threading.Thread(target=_forward_jvm_stderr, args=(gateway.proc.stderr,), daemon=True).start()
    SparkContext(conf=conf, gateway=gateway)


def _forward_jvm_stderr(stream: IO[bytes]) -> None:
    """Copy the JVM's stderr to ours, without the JVM's own ``WARNING: ...`` lines (log4j lines look different)."""
    for line in iter(stream.readline, b""):
        if not line.startswith(b"WARNING: "):
            sys.stderr.buffer.write(line)
            sys.stderr.buffer.flush()


def _verdict_table(title: str, checks: list[tuple[str, bool, str]]) -> Table:
    """The demo's checks, (name, passed, detail) each, as a table of ✓ and ✗ rows."""
    verdict = Table(title=title, title_justify="left", show_header=False)
    verdict.add_column("")
    verdict.add_column("check")
    verdict.add_column("detail", style="dim")
    for name, passed, detail in checks:
        verdict.add_row(_text("✓" if passed else "✗", "green" if passed else "bold red"), _text(name), _text(detail))
    return verdict


def _read_all(env: _Env, topic: str) -> pa.Table:
    """Every committed record of ``topic`` (read_committed), ordered by partition and offset."""
    with Consumer(env.url, env.options, isolation_level="read_committed", auto_offset_reset="earliest") as c:
        c.assign([TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic))])
        return c.read_to_end()


def _demo_spark(env: _Env) -> bool:
    """Aggregate ``clicks`` into running counts per user in ``clicks-per-user``, exactly once; summarise.

    A Spark Structured Streaming query (``readStream.format("plog")`` -> group by user ->
    ``writeStream.format("plog")``, ``Trigger.AvailableNow``) with its checkpoint next to the data: a
    later run goes on from there and processes only new events. Python data source sinks take the
    append and complete output modes; in complete mode every micro-batch writes the counts of every user
    seen so far, so the newest record of a user (its key) holds its running count, as in a compacted
    Kafka topic. Returns False if a check fails.
    """
    out = env.out
    reason = _spark_unavailable()
    if reason is not None:
        env.note(f"skipping the Spark part of the demo: {reason} (or pass --no-spark)")
        return True
    checkpoint = _demo_checkpoint(env.url)
    with LogStore(env.url, env.options) as store:
        try:
            store.create_topic(DEMO_SPARK_TOPIC, DEMO_SPARK_PARTITIONS)
            shutil.rmtree(checkpoint, ignore_errors=True)  # a new output topic: the counts start over
        except TopicAlreadyExistsError:
            pass
        before = sum(p["end_offset"] for p in store.describe_topic(DEMO_SPARK_TOPIC)["partitions"])
    options = {f"storage.{k}": v if isinstance(v, str) else json.dumps(v) for k, v in env.options.items()}
    out.print(
        Text.assemble(
            ("Spark", "bold"),
            " — streaming query ",
            (DEMO_TOPIC, "cyan"),
            " → running counts per user → ",
            (DEMO_SPARK_TOPIC, "cyan"),
            " (exactly-once, Trigger.AvailableNow)",
        )
    )
    started = time.perf_counter()
    with env.err.status("starting Spark (local[2]) and running the streaming query ...", spinner="dots"):
        spark, own_session = _demo_spark_session()
        try:
            from pyspark.sql import functions as F  # noqa: N812 - Spark's convention

            event = F.from_json(F.col("value").cast("string"), "user string, page string, action string, ts long")
            clicks = (
                spark.readStream.format("plog")
                .options(**options)
                .option("subscribe", DEMO_TOPIC)
                .option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", "25000")
                .load(env.url)
            )
            counts = (
                clicks.select(event.alias("e"))
                .where(F.col("e.user").isNotNull())
                .groupBy("e.user")
                .agg(
                    F.count(F.lit(1)).alias("events"),
                    *[
                        F.sum(F.when(F.col("e.action") == a, 1).otherwise(0)).alias(f"{a}s")
                        for a in ("view", "click", "purchase")
                    ],
                    F.max("e.ts").alias("last_ts"),
                )
            )
            query = (
                counts.select(
                    F.col("user").alias("key"),
                    F.to_json(F.struct("user", "events", "views", "clicks", "purchases", "last_ts")).alias("value"),
                )
                .writeStream.format("plog")
                .options(**options)
                .option("topic", DEMO_SPARK_TOPIC)
                .option("checkpointLocation", checkpoint)
                .outputMode("complete")
                .trigger(availableNow=True)
                .start(env.url)
            )
            query.awaitTermination()
            batches = [p for p in query.recentProgress if p["numInputRows"]]
        except Exception as exc:  # noqa: BLE001 - Spark's errors (py4j, StreamingQueryException) as one line
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CliError(f"the Spark streaming query failed: {first}") from None
        finally:
            if own_session:
                spark.stop()
    seconds = time.perf_counter() - started

    # Read back with read_committed: the newest count of each user is its last record (a user is one partition).
    events_in = sum(p["numInputRows"] for p in batches)
    clicks_all = _read_all(env, DEMO_TOPIC).column("value")
    total = int(pc.sum(pc.fill_null(pc.match_substring(clicks_all, '"user":'), False).cast(pa.int64())).as_py() or 0)
    updates = _read_all(env, DEMO_SPARK_TOPIC)
    parsed = (
        pa_json.read_json(
            pa.BufferReader(b"\n".join(updates.column("value").to_pylist())),
            parse_options=pa_json.ParseOptions(explicit_schema=_DEMO_COUNTS_SCHEMA),
        )
        if updates.num_rows
        else _DEMO_COUNTS_SCHEMA.empty_table()
    )
    users = parsed.column("user").to_pylist()
    events = parsed.column("events").to_pylist()
    latest: dict[str, int] = {}
    growing = True
    for position, (user, n) in enumerate(zip(users, events, strict=True)):
        if user in latest and n < events[latest[user]]:
            growing = False
        latest[user] = position
    counted = sum(events[i] for i in latest.values())
    written = updates.num_rows - before

    summary = Table(
        title=f"running counts per user in {DEMO_SPARK_TOPIC!r} (top 5, read back read_committed)", title_justify="left"
    )
    for column in ("user", "events", "views", "clicks", "purchases", "last event"):
        summary.add_column(column, justify="left" if column == "user" else "right")
    rows = parsed.take(pa.array(sorted(latest.values(), key=lambda i: (-events[i], users[i]))[:5], pa.int64()))
    for row in rows.to_pylist():
        summary.add_row(
            _text(row["user"]),
            _num(row["events"]),
            _num(row["views"]),
            _num(row["clicks"]),
            _num(row["purchases"]),
            _text(format_ms(row["last_ts"])),
        )
    out.print(summary)
    checks = [
        (
            "every event counted once",
            counted == total,
            f"the users' counts add up to {counted:,}; {DEMO_TOPIC!r} holds {total:,} events",
        ),
        ("counts never go back", growing, "along the topic, each user's count only grows or stays"),
    ]
    out.print(_verdict_table("Spark verification", checks))
    ok = all(passed for _, passed, _ in checks)
    out.print(
        _text(
            f"{'✓' if ok else '✗'} Spark: {len(batches)} micro-batch(es), {events_in:,} new event(s) in, "
            f"{written:,} count record(s) out to {DEMO_SPARK_TOPIC!r} for {len(latest):,} users, "
            f"in {seconds:.1f} s (checkpoint {checkpoint})",
            "bold green" if ok else "bold red",
        ),
        soft_wrap=True,
    )
    return ok


def cmd_demo(env: _Env) -> int:
    """``plog demo``: produce a click stream, read it back, verify it, and summarise."""
    count = env.args.records
    if count < 1:
        raise CliError(f"--records must be positive, got {count}")
    run = uuid.uuid4().hex[:8]
    out = env.out
    with LogStore(env.url, env.options) as store:
        location = getattr(store.root.store, "url", env.url)
        try:
            store.create_topic(DEMO_TOPIC, DEMO_PARTITIONS)
            topic_note = f"created topic {DEMO_TOPIC!r} with {DEMO_PARTITIONS} partitions"
        except TopicAlreadyExistsError:
            info = store.describe_topic(DEMO_TOPIC)
            existing = sum(p["end_offset"] - p["start_offset"] for p in info["partitions"])
            topic_note = (
                f"topic {DEMO_TOPIC!r} already exists ({len(info['partitions'])} partitions, "
                f"{existing:,} records): reusing it, this run appends"
            )
        before = {p["partition"]: p["end_offset"] for p in store.describe_topic(DEMO_TOPIC)["partitions"]}
    out.print(
        Text.assemble(("plog demo", "bold"), f" — run {run}, {count:,} click events into ", (str(location), "cyan"))
    )
    out.print(_text(topic_note, "dim"), soft_wrap=True)

    stream = generate_clicks(run, count, int(time.time() * 1000))
    with _progress(env.err, env.err.is_terminal or bool(env.args.progress)) as progress:
        phases, written = _demo_produce(env, stream, progress)
        with LogStore(env.url, env.options) as store:
            after = {p["partition"]: p["end_offset"] for p in store.describe_topic(DEMO_TOPIC)["partitions"]}
        table, consume_phase = _demo_consume(env, before, after, progress)
    got = _demo_parse(table, run)
    checks = verify_clicks(stream, got, written)

    timing = Table(title="throughput", title_justify="left")
    for column, justify in (
        ("phase", "left"),
        ("records", "right"),
        ("seconds", "right"),
        ("records/s", "right"),
        ("MB/s", "right"),
    ):
        timing.add_column(column, justify=justify)  # type: ignore[arg-type]
    produce_total = _Phase(
        "produce total", sum(p.records for p in phases), sum(p.nbytes for p in phases), sum(p.seconds for p in phases)
    )
    for phase in [*phases, produce_total, consume_phase]:
        if phase is consume_phase:
            timing.add_section()
        timing.add_row(
            _text(phase.name, "bold" if phase is produce_total else ""),
            _num(phase.records),
            _text(f"{phase.seconds:.3f}"),
            _text(_rate(phase.records, phase.seconds)),
            _text(f"{phase.nbytes / 1e6 / phase.seconds:.1f}" if phase.seconds > 0 else "-"),
        )

    parts = Table(title=f"partitions of {DEMO_TOPIC!r}", title_justify="left")
    for column in ("partition", "end before", "end after", "this run", "this run's offsets", "users"):
        parts.add_column(column, justify="right")
    part_col = got.column("partition").to_numpy(zero_copy_only=False)
    user_col = np.asarray(got.column("user").to_pylist(), dtype=object)
    for p in sorted(after):
        mine = part_col == p
        n = int(np.count_nonzero(mine))
        span = f"{before[p]:,}..{after[p] - 1:,}" if after[p] > before[p] else "-"
        parts.add_row(
            _num(p),
            _num(before[p]),
            _num(after[p]),
            _num(n),
            _text(span),
            _num(len(set(user_col[mine].tolist())) if n else 0),
        )
    parts.add_section()
    parts.add_row(
        _text("total", "bold"),
        _num(sum(before.values())),
        _num(sum(after.values())),
        _num(got.num_rows),
        "",
        _num(len(set(user_col.tolist()))),
    )

    out.print(timing)
    out.print(parts)
    if got.num_rows:
        actions = _value_counts(got.column("action"))
        out.print(_share_table("events per action", "action", actions, got.num_rows))
        out.print(_share_table("top 5 pages", "page", _value_counts(got.column("page"))[:5], got.num_rows))

    out.print(_verdict_table("verification", checks))
    if not all(passed for _, passed, _ in checks):
        out.print(_text(f"✗ verification failed for run {run}", "bold red"), soft_wrap=True)
        return EXIT_FAILED
    out.print(
        _text(f"✓ {_records(count)} produced and read back exactly once, in per-user order (run {run})", "bold green"),
        soft_wrap=True,
    )
    if not env.args.no_spark and not _demo_spark(env):
        return EXIT_FAILED
    hint = (
        f"next: plog topics describe {DEMO_TOPIC} · plog inspect {DEMO_TOPIC} --partition 0 · "
        f"plog consume {DEMO_TOPIC} --from-beginning --max-records 5"
    )
    if not env.args.no_spark:
        hint += f" · plog consume {DEMO_SPARK_TOPIC} --from-beginning --max-records 5"
    if env.args.url != DEFAULT_URL:
        hint += f" (with --url {env.args.url})"
    out.print(_text(hint, "dim"), soft_wrap=True)
    return EXIT_OK


# --------------------------------------------------------------------------- the parser


def build_parser() -> argparse.ArgumentParser:
    """The ``plog`` argument parser (exposed for documentation and tests)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        default=os.environ.get("PLOG_URL", DEFAULT_URL),
        help="plog root: a local directory or any fsspec URL (default: $PLOG_URL or %(default)s)",
    )
    common.add_argument(
        "--storage-option",
        metavar="KEY=VALUE",
        type=_key_value,
        action="append",
        default=[],
        help="fsspec storage option, repeatable; JSON values (true, 3) are decoded",
    )

    parser = argparse.ArgumentParser(
        prog="plog",
        description="plog: a Kafka-style durable log as Arrow record batches on any fsspec filesystem.",
        epilog="Start with `plog demo`. Every command takes --url and --storage-option.",
    )
    try:
        from importlib.metadata import version

        parser.add_argument("--version", action="version", version=f"plog {version('pyspark-logsource')}")
    except Exception:  # noqa: BLE001 - not installed as a distribution: no --version
        pass
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    topics = commands.add_parser("topics", help="create, list, describe and delete topics")
    topic_commands = topics.add_subparsers(dest="topics_command", required=True, metavar="ACTION")
    create = topic_commands.add_parser("create", parents=[common], help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=1, help="number of partitions (default 1)")
    create.add_argument(
        "--config",
        metavar="KEY=VALUE",
        type=_key_value,
        action="append",
        default=[],
        help="topic config, Kafka names (retention.ms, segment.bytes, compression.type...)",
    )
    create.set_defaults(handler=cmd_topics_create)
    listing = topic_commands.add_parser("list", parents=[common], help="list topic names")
    listing.set_defaults(handler=cmd_topics_list)
    describe = topic_commands.add_parser("describe", parents=[common], help="partitions, offsets and config")
    describe.add_argument("name")
    describe.set_defaults(handler=cmd_topics_describe)
    delete = topic_commands.add_parser("delete", parents=[common], help="delete a topic and its data")
    delete.add_argument("name")
    delete.set_defaults(handler=cmd_topics_delete)

    produce = commands.add_parser(
        "produce",
        parents=[common],
        help="send the lines of stdin as records",
        description="Send each line of stdin as one record (the value).",
    )
    produce.add_argument("topic")
    produce.add_argument("--json", action="store_true", help="each line must be a JSON object")
    produce.add_argument("--key-field", metavar="FIELD", help="with --json: use this field as the record key")
    produce.add_argument("--partition", type=int, help="send every record to this partition")
    produce.add_argument("--progress", action="store_true", help="show a progress bar even when stdin is not a TTY")
    produce.set_defaults(handler=cmd_produce)

    consume = commands.add_parser(
        "consume",
        parents=[common],
        help="print records to stdout",
        description="Print records until --max-records or --timeout-ms of "
        "silence. Without a position flag, reading starts at the end "
        "(like Kafka).",
    )
    consume.add_argument("topic")
    consume.add_argument("--partition", type=int, help="read only this partition (default: all)")
    where = consume.add_mutually_exclusive_group()
    where.add_argument("--from-beginning", action="store_true", help="start at the log start")
    where.add_argument("--offset", type=int, help="start at this offset (needs --partition on multi-partition topics)")
    where.add_argument(
        "--from-timestamp",
        metavar="ISO8601_OR_MS",
        help="start at the first record at or after this time (ISO 8601, UTC if no zone; or epoch ms)",
    )
    consume.add_argument("--max-records", type=int, help="stop after this many records")
    consume.add_argument(
        "--timeout-ms", type=int, default=1000, help="stop after this long without new records (default %(default)s)"
    )
    consume.add_argument(
        "--format",
        choices=("value", "json"),
        default="value",
        help="value: the value as UTF-8; json: one object per record (default %(default)s)",
    )
    consume.add_argument("--progress", action="store_true", help="show a progress bar on stderr")
    consume.set_defaults(handler=cmd_consume)

    inspect = commands.add_parser("inspect", parents=[common], help="segment objects, indexes and batches")
    inspect.add_argument("topic")
    inspect.add_argument("--partition", type=int, help="only this partition (default: all)")
    inspect.add_argument("--index", action="store_true", help="also print each segment's batch index")
    inspect.add_argument("--batch", metavar="OFFSET", type=int, help="dump the batch holding this offset")
    inspect.add_argument("--limit", type=int, default=20, help="with --batch: records to show (default %(default)s)")
    inspect.add_argument(
        "--width",
        type=int,
        default=80,
        help="with --batch: truncate values to this many characters (default %(default)s)",
    )
    inspect.set_defaults(handler=cmd_inspect)

    maintain = commands.add_parser(
        "maintain", parents=[common], help="merge small segments, apply retention, delete garbage"
    )
    maintain.add_argument("topic", nargs="?", help="only this topic (default: all)")
    maintain.set_defaults(handler=cmd_maintain)

    groups = commands.add_parser("groups", help="list and describe consumer groups, reset their offsets")
    group_commands = groups.add_subparsers(dest="groups_command", required=True, metavar="ACTION")
    group_list = group_commands.add_parser("list", parents=[common], help="groups with state and live members")
    group_list.set_defaults(handler=cmd_groups_list)
    group_describe = group_commands.add_parser(
        "describe", parents=[common], help="members, assignment, committed offsets and lag"
    )
    group_describe.add_argument("group")
    group_describe.set_defaults(handler=cmd_groups_describe)
    reset = group_commands.add_parser(
        "reset-offsets",
        parents=[common],
        help="set a group's committed offsets (the group must have no live members)",
        description="Kafka's kafka-consumer-groups --reset-offsets: prints the plan, and applies it with "
        "--execute. Refused while the group has live members.",
    )
    reset.add_argument("group")
    scope = reset.add_mutually_exclusive_group(required=True)
    scope.add_argument(
        "--topic", action="append", metavar="TOPIC[:P,...]", help="topic (optionally only these partitions), repeatable"
    )
    scope.add_argument("--all-topics", action="store_true", help="every topic the group has offsets for")
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="the log start offset")
    to.add_argument("--to-latest", action="store_true", help="the log end offset")
    to.add_argument(
        "--to-datetime",
        metavar="ISO8601_OR_MS",
        help="the first offset at or after this time (the end if there is none)",
    )
    to.add_argument("--to-offset", type=int, metavar="N", help="this offset (clamped to the log's range)")
    reset.add_argument("--execute", action="store_true", help="apply the plan (default: dry run)")
    reset.set_defaults(handler=cmd_groups_reset_offsets)

    demo = commands.add_parser(
        "demo",
        parents=[common],
        help="produce, read back and verify a click stream; count it per user with Spark",
        description=f"Produce a synthetic click stream into topic {DEMO_TOPIC!r}, "
        "read it back and verify it, then run a Spark streaming query that "
        f"keeps running counts per user in {DEMO_SPARK_TOPIC!r}, exactly "
        "once, and read them back; safe to run again (each run checks its "
        "own records, and the query goes on from its checkpoint).",
    )
    demo.add_argument("--records", type=int, default=20_000, help="events to produce (default %(default)s)")
    demo.add_argument("--progress", action="store_true", help="show progress bars even when stderr is not a TTY")
    demo.add_argument(
        "--no-spark",
        action="store_true",
        help=f"skip the Spark part (a streaming query counting clicks per user into "
        f"{DEMO_SPARK_TOPIC!r}, exactly once)",
    )
    demo.set_defaults(handler=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``plog`` with ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version or a usage error: argparse already printed
        return exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None else EXIT_ERROR)
    env = _Env(args, _make_console(sys.stdout), _make_console(sys.stderr))
    try:
        return int(args.handler(env))
    except (PlogError, CliError) as exc:
        env.err.print(Text(f"error: {exc}", style="bold red"), soft_wrap=True)
        return EXIT_ERROR
    except KeyboardInterrupt:
        env.err.print(Text("interrupted", style="yellow"))
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (e.g. `plog consume ... | head`)
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
