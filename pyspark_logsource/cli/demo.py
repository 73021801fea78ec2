"""``plog demo``: produce a synthetic click stream, read it back, verify it, and summarise.

A run tags its records with a random run id, so a later run in the same root
appends and checks only its own: every record read back exactly once, at the
offset the producer reported, keyed by user, in per-user order. The Spark part
(a streaming query counting clicks per user, exactly once) is
:mod:`pyspark_logsource.cli.demo_spark`; ``--no-spark`` skips it.
"""

from __future__ import annotations

import argparse
import random
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from pyspark_logsource.cli.common import (
    DEFAULT_URL,
    EXIT_FAILED,
    EXIT_OK,
    ROOT_CREATED,
    CliError,
    Env,
    progress_bar,
    rate_text,
    records_text,
)
from pyspark_logsource.cli.demo_spark import DEMO_SPARK_TOPIC, run_spark_demo
from pyspark_logsource.client.admin import LogStore
from pyspark_logsource.client.consumer import Consumer
from pyspark_logsource.client.fetcher import ARROW_SCHEMA
from pyspark_logsource.client.producer import Producer
from pyspark_logsource.client.types import TopicPartition
from pyspark_logsource.views.terminal import cell_number, cell_text, checks_table
from segment_format.errors import TopicAlreadyExistsError

if TYPE_CHECKING:
    from pyspark_logsource.cli.common import Commands


def register(commands: Commands, common: argparse.ArgumentParser) -> None:
    """Add ``plog demo`` to ``commands``."""
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
    demo.set_defaults(handler=cmd_demo, root=ROOT_CREATED)


DEMO_TOPIC = "clicks"
DEMO_PARTITIONS = 3
_ACTIONS = ("view", "click", "purchase")
_ACTION_WEIGHTS = (0.72, 0.24, 0.04)
_SECTIONS = ("/", "/search", "/cart", "/checkout", "/account")


@dataclass
class ClickStream:
    """One demo run's generated events, column-wise."""

    run: str
    users: list[str]
    pages: list[str]
    actions: list[str]
    timestamps: np.ndarray
    values: list[bytes]


def generate_clicks(run: str, count: int, start_ms: int) -> ClickStream:
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
    return ClickStream(run, users, pages, actions, timestamps, values)


@dataclass
class _Phase:
    name: str
    records: int
    nbytes: int
    seconds: float


def _demo_produce(env: Env, stream: ClickStream, progress: Progress) -> tuple[list[_Phase], dict[int, set[int]]]:
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


def _demo_consume(env: Env, begin: dict[int, int], end: dict[int, int], progress: Progress) -> tuple[pa.Table, _Phase]:
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


def parse_clicks(table: pa.Table, run: str) -> pa.Table:
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


def verify_clicks(stream: ClickStream, got: pa.Table, written: dict[int, set[int]]) -> list[tuple[str, bool, str]]:
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
        table.add_row(cell_text(name), cell_number(n), cell_text(f"{100 * n / max(total, 1):.1f} %"))
    return table


def _value_counts(column: pa.ChunkedArray) -> list[tuple[str, int]]:
    counts = pc.value_counts(column).to_pylist()
    return sorted(((c["values"], c["counts"]) for c in counts), key=lambda item: (-item[1], item[0]))


def cmd_demo(env: Env) -> int:
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
    out.print(cell_text(topic_note, "dim"), soft_wrap=True)

    stream = generate_clicks(run, count, int(time.time() * 1000))
    with progress_bar(env.err, env.err.is_terminal or bool(env.args.progress)) as progress:
        phases, written = _demo_produce(env, stream, progress)
        with LogStore(env.url, env.options) as store:
            after = {p["partition"]: p["end_offset"] for p in store.describe_topic(DEMO_TOPIC)["partitions"]}
        table, consume_phase = _demo_consume(env, before, after, progress)
    got = parse_clicks(table, run)
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
            cell_text(phase.name, "bold" if phase is produce_total else ""),
            cell_number(phase.records),
            cell_text(f"{phase.seconds:.3f}"),
            cell_text(rate_text(phase.records, phase.seconds)),
            cell_text(f"{phase.nbytes / 1e6 / phase.seconds:.1f}" if phase.seconds > 0 else "-"),
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
            cell_number(p),
            cell_number(before[p]),
            cell_number(after[p]),
            cell_number(n),
            cell_text(span),
            cell_number(len(set(user_col[mine].tolist())) if n else 0),
        )
    parts.add_section()
    parts.add_row(
        cell_text("total", "bold"),
        cell_number(sum(before.values())),
        cell_number(sum(after.values())),
        cell_number(got.num_rows),
        "",
        cell_number(len(set(user_col.tolist()))),
    )

    out.print(timing)
    out.print(parts)
    if got.num_rows:
        actions = _value_counts(got.column("action"))
        out.print(_share_table("events per action", "action", actions, got.num_rows))
        out.print(_share_table("top 5 pages", "page", _value_counts(got.column("page"))[:5], got.num_rows))

    out.print(checks_table("verification", checks))
    if not all(passed for _, passed, _ in checks):
        out.print(cell_text(f"✗ verification failed for run {run}", "bold red"), soft_wrap=True)
        return EXIT_FAILED
    out.print(
        cell_text(
            f"✓ {records_text(count)} produced and read back exactly once, in per-user order (run {run})", "bold green"
        ),
        soft_wrap=True,
    )
    if not env.args.no_spark and not run_spark_demo(env, DEMO_TOPIC):
        return EXIT_FAILED
    hint = (
        f"next: plog topics describe {DEMO_TOPIC} · plog inspect {DEMO_TOPIC} --partition 0 · "
        f"plog consume {DEMO_TOPIC} --from-beginning --max-records 5"
    )
    if not env.args.no_spark:
        hint += f" · plog consume {DEMO_SPARK_TOPIC} --from-beginning --max-records 5"
    if env.args.url != DEFAULT_URL:
        hint += f" (with --url {env.args.url})"
    out.print(cell_text(hint, "dim"), soft_wrap=True)
    return EXIT_OK
