"""``plog produce`` and ``plog consume``: records in from stdin, records out to stdout.

Records go to stdout untouched by any formatting (``plog consume ... | jq``
stays clean); progress bars and notes go to stderr.

A typed topic's values (PROTOCOL.md 11.8) are rows of its value schema: ``plog produce --json``
takes each JSON object as the value (timestamps and dates as ISO 8601 strings, binary fields as
base64, decimals as strings or numbers; :mod:`pyspark_logsource.views.values`), and ``plog
consume`` prints each value as a JSON object in the same form, so its output produces back.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pyspark_logsource.cli.common import EXIT_OK, CliError, Env, parse_timestamp, progress_bar, records_text
from pyspark_logsource.client.consumer import Consumer
from pyspark_logsource.client.futures import FutureRecordMetadata
from pyspark_logsource.client.producer import Producer
from pyspark_logsource.client.types import TopicPartition
from pyspark_logsource.views.terminal import bytes_text, cell_text, format_ms
from pyspark_logsource.views.values import schema_ddl, value_from_json, values_to_json
from segment_format.errors import InvalidRecordError, OffsetOutOfRangeError
from segment_format.typed.layout import TypedLayout, entry_layout

if TYPE_CHECKING:
    from pyspark_logsource.cli.common import Commands


def register(commands: Commands, common: argparse.ArgumentParser) -> None:
    """Add ``plog produce`` and ``plog consume`` to ``commands``."""
    produce = commands.add_parser(
        "produce",
        parents=[common],
        help="send the lines of stdin as records",
        description="Send each line of stdin as one record (the value). For a typed topic give --json: "
        "each object is the value, checked against the topic's value schema (timestamps and dates as "
        "ISO 8601 strings, UTC when no zone is given; binary fields as base64; decimals as strings or "
        "numbers). A line that fails stops the command: the lines before it are sent, none after it.",
    )
    produce.add_argument("topic")
    produce.add_argument(
        "--json", action="store_true", help="each line must be a JSON object (for a typed topic: the value's fields)"
    )
    produce.add_argument(
        "--key-field",
        metavar="FIELD",
        help="with --json: use this field as the record key (typed topic: kept in the value only if the schema has it)",
    )
    produce.add_argument(
        "--missing-key",
        choices=("refuse", "warn"),
        default="refuse",
        help="with --key-field, a line without that field: stops the command, the lines before it sent (refuse, "
        "the default, as Kafka's console producer refuses a line without its key), or is sent with a null key "
        "and counted in a warning (warn)",
    )
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
        help="value: the value as UTF-8 (a typed topic's as a compact JSON object); json: one object per "
        "record (default %(default)s)",
    )
    consume.add_argument("--progress", action="store_true", help="show a progress bar on stderr")
    consume.set_defaults(handler=cmd_consume)


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


#: Sends between two collections of finished futures.
SETTLE_EVERY = 4096


@dataclass
class _SendTracker:
    """Keeps the futures of ``Producer.send`` until written, and where the records landed."""

    pending: list[FutureRecordMetadata] = field(default_factory=list)
    written: int = 0
    ranges: dict[int, list[int]] = field(default_factory=dict)  # partition -> [first, last, count]
    settle_at: int = 4096

    def add(self, future: FutureRecordMetadata) -> None:
        """Track one more future; settles finished ones now and then so memory stays bounded."""
        self.pending.append(future)
        if len(self.pending) >= self.settle_at:
            self.settle(wait=False)
            # Settle again only after as many more sends: a slow store must not make every send walk the list.
            self.settle_at = len(self.pending) + SETTLE_EVERY

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


def _number(value: object) -> float:
    """``json.dumps`` default: a typed topic's lines are parsed with Decimal numbers, printed as plain JSON."""
    if isinstance(value, Decimal):
        return float(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _json_key(obj: dict[str, Any], key_field: str | None) -> bytes | None:
    if key_field is None or obj.get(key_field) is None:
        return None
    value = obj[key_field]
    if isinstance(value, str):
        return value.encode("utf-8")
    return json.dumps(value, separators=(",", ":"), default=_number).encode()


def _typed_value(obj: dict[str, Any], layout: TypedLayout, topic: str, key_field: str | None) -> dict[str, Any]:
    """A JSON object as a typed topic's value, checked as ``Producer.send`` checks it and then by Arrow.

    Raises :class:`InvalidRecordError` naming the field. The Arrow check matters: what ``send`` judges
    only when the batch is built (an int beyond int32's range) would otherwise fail a whole batch at
    flush, after later lines were read, and break the promise that lines before a bad one are sent.
    """
    if key_field is not None and key_field not in layout.names:
        obj = {k: v for k, v in obj.items() if k != key_field}  # the key's field, not one of the value's
    where = f"topic {topic!r} (value schema version {layout.version})"
    try:
        value = value_from_json(obj, layout.value_type)
    except InvalidRecordError as exc:
        raise InvalidRecordError(f"{where}: {exc}") from None
    layout.check_python_value(value, topic)  # the producer's own check: names the field, type and version
    layout.values_from_python([value], topic)  # and the sender's, which Arrow judges: the same error
    return value


def cmd_produce(env: Env) -> int:
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
        history = meta.schema_history
        layout = None if history is None else entry_layout(history.current)
        if layout is not None and not args.json:
            # A line of text is no row of fields: refuse before reading stdin, so nothing is sent.
            raise CliError(
                f"topic {args.topic!r} is typed (value schema v{layout.version}: {schema_ddl(layout.value_schema)}): "
                "give --json, one JSON object of its fields per line"
            )
        tracker = _SendTracker()
        sent = 0
        failure: str | None = None
        keyless: list[int] = []  # lines sent with a null key for want of --key-field (--missing-key warn)
        with progress_bar(env.err, show, auto_refresh=not interactive) as progress:
            task = progress.add_task(f"producing to {args.topic}", total=None)
            for lineno, line in enumerate(_stdin_lines(), 1):
                key: bytes | None = None
                value: bytes | dict[str, Any] = line
                if args.json:
                    if not line.strip():
                        continue
                    try:
                        # A typed topic's decimals must stay exact: numbers with a fraction parse as Decimal.
                        obj = json.loads(line) if layout is None else json.loads(line, parse_float=Decimal)
                    except ValueError as exc:
                        failure = f"line {lineno}: invalid JSON{_json_problem(exc)}: {bytes_text(line, 60)!r}"
                        break
                    if not isinstance(obj, dict):
                        failure = f"line {lineno}: expected a JSON object, got {type(obj).__name__}"
                        break
                    if args.key_field is not None and args.key_field not in obj:
                        if args.missing_key == "refuse":
                            failure = (
                                f"line {lineno}: no field {args.key_field!r} for the key (--key-field); give "
                                "--missing-key warn to send such lines with a null key"
                            )
                            break
                        keyless.append(lineno)
                    key = _json_key(obj, args.key_field)
                    if layout is not None:
                        try:
                            value = _typed_value(obj, layout, args.topic, args.key_field)
                        except InvalidRecordError as exc:
                            failure = f"line {lineno}: {exc}"
                            break
                tracker.add(producer.send(args.topic, value=value, key=key, partition=args.partition))
                sent += 1
                if interactive or sent % 256 == 0:
                    progress.update(task, completed=sent, refresh=interactive)
            progress.update(task, completed=sent)
            tracker.finish(producer)
    where = f" ({tracker.describe()})" if tracker.written else ""
    env.out.print(cell_text(f"produced {records_text(tracker.written)} to {args.topic!r}{where}"), soft_wrap=True)
    if keyless:
        lines = ", ".join(str(n) for n in keyless[:5]) + (", ..." if len(keyless) > 5 else "")
        env.note(
            f"warning: {len(keyless):,} line(s) had no field {args.key_field!r} and were sent with a null key "
            f"(line {lines})",
            style="yellow",
        )
    if failure is not None:
        before = f"the {records_text(sent)} before it {'was' if sent == 1 else 'were'} sent"
        raise CliError(f"{failure}; {before}, nothing after it")
    return EXIT_OK


# --------------------------------------------------------------------------- consume


def _record_lines(table: pa.Table, fmt: str) -> list[str]:
    """Render a ``poll_arrow`` table as output lines (``value`` or ``json`` format).

    A typed topic's value (a struct column) is a JSON object in both formats (compact in ``value``),
    in the form ``plog produce --json`` reads back; a tombstone is ``null``.
    """
    values: list[Any]
    if pa.types.is_struct(table.schema.field("value").type):
        values = values_to_json(table.column("value"))  # JSON-able already: dicts, None for a tombstone
        if fmt == "value":
            return [json.dumps(v, ensure_ascii=False, separators=(",", ":")) for v in values]
    else:
        values = [None if v is None else bytes_text(v) for v in table.column("value").to_pylist()]
        if fmt == "value":
            return ["null" if v is None else v for v in values]  # bytes_text's rendering of a null value
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
            "key": None if keys[i] is None else bytes_text(keys[i]),
            "value": values[i],
            "headers": [
                {"key": h["key"], "value": None if h["value"] is None else bytes_text(h["value"])}
                for h in headers[i] or ()
            ],
        }
        lines.append(json.dumps(record, ensure_ascii=False))
    return lines


def _position_consumer(env: Env, consumer: Consumer, tps: list[TopicPartition]) -> str:
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


def cmd_consume(env: Env) -> int:
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
        with progress_bar(env.err, bool(args.progress)) as progress:
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
    env.note(f"consumed {records_text(count)} from {args.topic!r}")
    if count == 0 and started_at == "the end":
        env.note("reading started at the end of the log; use --from-beginning to read the existing records")
    return EXIT_OK
