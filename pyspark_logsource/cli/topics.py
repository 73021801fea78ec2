"""``plog topics``: create, list, describe and delete topics."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from pyspark_logsource.cli.common import EXIT_OK, Env, key_value
from pyspark_logsource.client.admin import LogStore
from pyspark_logsource.views.terminal import cell_number, cell_text
from segment_format.topic import TOPIC_CONFIG_DEFAULTS

if TYPE_CHECKING:
    from pyspark_logsource.cli.common import Commands


def register(commands: Commands, common: argparse.ArgumentParser) -> None:
    """Add ``plog topics create|list|describe|delete`` to ``commands``."""
    topics = commands.add_parser("topics", help="create, list, describe and delete topics")
    topic_commands = topics.add_subparsers(dest="topics_command", required=True, metavar="ACTION")
    create = topic_commands.add_parser("create", parents=[common], help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=1, help="number of partitions (default 1)")
    create.add_argument(
        "--config",
        metavar="KEY=VALUE",
        type=key_value,
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


def cmd_topics_create(env: Env) -> int:
    """``plog topics create NAME``: create a topic."""
    args = env.args
    config = dict(args.config or ())
    with LogStore(env.url, env.options) as store:
        meta = store.create_topic(args.name, args.partitions, config)
    noun = "partition" if meta.partitions == 1 else "partitions"
    env.out.print(cell_text(f"created topic {meta.name!r} with {meta.partitions} {noun}"), soft_wrap=True)
    return EXIT_OK


def cmd_topics_list(env: Env) -> int:
    """``plog topics list``: topic names, one per line."""
    with LogStore(env.url, env.options) as store:
        names = store.list_topics()
    for name in names:
        env.out.print(cell_text(name), soft_wrap=True)
    if not names:
        env.note(f"no topics under {env.url}")
    return EXIT_OK


def cmd_topics_describe(env: Env) -> int:
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
            cell_number(part["partition"]),
            cell_number(part["start_offset"]),
            cell_number(part["end_offset"]),
            cell_number(records),
            cell_number(part["bytes"]),
            cell_number(part["segments"]),
        )
    table.add_section()
    table.add_row(
        cell_text("total", "bold"),
        "",
        "",
        cell_number(totals["records"]),
        cell_number(totals["bytes"]),
        cell_number(totals["segments"]),
    )
    env.out.print(table)
    config = Table(title="config", title_justify="left")
    config.add_column("key")
    config.add_column("value")
    config.add_column("source")
    for key, value in sorted(info["config"].items()):
        overridden = TOPIC_CONFIG_DEFAULTS.get(key) != value
        config.add_row(
            cell_text(key),
            cell_text(value, "bold" if overridden else ""),
            cell_text("set" if overridden else "default", "cyan" if overridden else "dim"),
        )
    env.out.print(config)
    return EXIT_OK


def cmd_topics_delete(env: Env) -> int:
    """``plog topics delete NAME``: delete a topic and all its data."""
    with LogStore(env.url, env.options) as store:
        store.delete_topic(env.args.name)
    env.out.print(cell_text(f"deleted topic {env.args.name!r}"), soft_wrap=True)
    return EXIT_OK
