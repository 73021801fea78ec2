"""``plog maintain``: merge small segments, apply retention and delete garbage, for one topic or all."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from pyspark_logsource.cli.common import EXIT_OK, Env
from pyspark_logsource.client.admin import LogStore
from pyspark_logsource.views.terminal import cell_text

if TYPE_CHECKING:
    from pyspark_logsource.cli.common import Commands


def register(commands: Commands, common: argparse.ArgumentParser) -> None:
    """Add ``plog maintain`` to ``commands``."""
    maintain = commands.add_parser(
        "maintain", parents=[common], help="merge small segments, apply retention, delete garbage"
    )
    maintain.add_argument("topic", nargs="?", help="only this topic (default: all)")
    maintain.set_defaults(handler=cmd_maintain)


def cmd_maintain(env: Env) -> int:
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
    env.out.print(cell_text(f"maintained {scope} in {seconds:.2f} s — {summary}"), soft_wrap=True)
    return EXIT_OK
