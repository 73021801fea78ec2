"""``plog maintain``: compact or merge small segments, apply retention and delete garbage, for one topic or all.

Writers maintain their topics themselves (PROTOCOL.md 10.1); ``--watch SECONDS`` is for those who want a
separate process as well: a pass every SECONDS until Ctrl-C or SIGTERM, which end it with exit code 0.
With ``--metrics-port PORT`` a watching process serves OpenMetrics on 127.0.0.1:PORT (``plog_maintain_*``:
passes, what they merged and deleted, the last pass's seconds, the store's requests and their cost).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING, Any

from pyspark_logsource.cli.common import EXIT_OK, CliError, Env
from pyspark_logsource.client.admin import LogStore
from pyspark_logsource.client.metrics import store_metrics
from pyspark_logsource.views.terminal import cell_text

if TYPE_CHECKING:
    from pyspark_logsource.cli.common import Commands


def register(commands: Commands, common: argparse.ArgumentParser) -> None:
    """Add ``plog maintain`` to ``commands``."""
    maintain = commands.add_parser(
        "maintain", parents=[common], help="compact, merge small segments, apply retention, delete garbage"
    )
    maintain.add_argument("topic", nargs="?", help="only this topic (default: all)")
    maintain.add_argument(
        "--watch",
        type=float,
        metavar="SECONDS",
        help="run a pass every SECONDS until interrupted (Ctrl-C or SIGTERM end it cleanly)",
    )
    maintain.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="with --watch: serve OpenMetrics (Prometheus) on 127.0.0.1:PORT (needs prometheus-client)",
    )
    maintain.add_argument(
        "--log.cleaner.dedupe.buffer.size",
        dest="dedupe_buffer_size",
        type=int,
        metavar="BYTES",
        help="the compaction offset map's size limit (Kafka's name; default 134217728, 24 bytes a key)",
    )
    maintain.set_defaults(handler=cmd_maintain)


def cmd_maintain(env: Env) -> int:
    """``plog maintain [TOPIC] [--watch SECONDS]``: compact or merge, apply retention, delete garbage."""
    topic = env.args.topic
    watch = env.args.watch
    if watch is not None and not watch > 0:
        raise CliError(f"--watch takes a positive number of seconds, got {watch}")
    metrics_port = env.args.metrics_port
    if metrics_port is not None and watch is None:
        raise CliError("--metrics-port goes with --watch (a single pass ends before anyone could scrape it)")
    stop = threading.Event()
    previous: dict[signal.Signals, Any] = {}
    stack = contextlib.ExitStack()
    if watch is not None:

        def interrupted(signum: int, frame: FrameType | None) -> None:
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, interrupted)
    try:
        with LogStore(env.url, env.options) as store:
            if env.args.dedupe_buffer_size is not None:
                store.root.dedupe_buffer_size = env.args.dedupe_buffer_size
            if topic is not None:
                store.root.topic(topic, refresh=True)
            passes: dict[str, float] = {}
            if metrics_port is not None:
                from pyspark_logsource.client.openmetrics import serve_registry

                endpoint = serve_registry(
                    {"maintain": lambda: {**passes, **store_metrics(store.root.store)}}, metrics_port
                )
                stack.callback(endpoint.close)
                env.note(f"plog maintain: metrics on http://127.0.0.1:{endpoint.port}/metrics", style="")
            while True:
                _one_pass(env, store, topic, passes)
                if watch is None or stop.wait(watch):
                    break
    finally:
        stack.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return EXIT_OK


def _one_pass(env: Env, store: LogStore, topic: str | None, passes: dict[str, float]) -> None:
    """Maintain once and print one line saying what was done; add it to ``passes`` (the metrics)."""
    started = time.perf_counter()
    counts = store.maintain(topic)
    seconds = time.perf_counter() - started
    passes["plog-passes-total"] = passes.get("plog-passes-total", 0) + 1
    passes["plog-last-pass-seconds"] = seconds
    for key, value in counts.items():
        name = f"plog-{key.replace('_', '-')}-total"
        passes[name] = passes.get(name, 0) + value
    scope = f"topic {topic!r}" if topic else "all topics"
    summary = ", ".join(f"{key.replace('_', ' ')}: {value:,}" for key, value in counts.items())
    env.out.print(cell_text(f"maintained {scope} in {seconds:.2f} s — {summary}"), soft_wrap=True)
