"""``plog topics``: create, list, describe and delete topics, and evolve a typed topic's value schema.

A typed topic (PROTOCOL.md 11.8) is created with ``--value-schema SPEC``: a Spark DDL string
(``"user string, n int NOT NULL, ts timestamp"``) or the path of a file holding DDL, an Avro record
schema (``.avsc``) or a JSON Schema (``.json``). ``plog topics evolve`` adds a version, checked under
the topic's compatibility mode; ``plog topics describe`` shows the schema and its history.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from rich.table import Table
from rich.text import Text

from pyspark_logsource.cli.common import EXIT_OK, ROOT_CREATED, CliError, Env, key_value
from pyspark_logsource.client.admin import LogStore
from pyspark_logsource.views.terminal import cell_number, cell_text, schema_history_table, schema_table
from pyspark_logsource.views.values import field_ddl, schema_ddl
from segment_format.errors import InvalidConfigError
from segment_format.topic import TOPIC_CONFIG_DEFAULTS, TopicMetadata
from segment_format.typed.value_schema import COMPATIBILITY_MODES, evolution_problems

#: What ``--value-schema`` takes, for the help texts.
_SPEC_HELP = (
    "a Spark DDL string ('user string, n int NOT NULL, ts timestamp') or the path of a file holding DDL, "
    "an Avro record schema (.avsc) or a JSON Schema (.json)"
)


def _mode(text: str) -> str:
    """argparse type of a compatibility mode: one of Confluent's names, any case."""
    if text.upper() not in COMPATIBILITY_MODES:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(COMPATIBILITY_MODES)}")
    return text.upper()


if TYPE_CHECKING:
    from pyspark_logsource.cli.common import Commands


def register(commands: Commands, common: argparse.ArgumentParser) -> None:
    """Add ``plog topics create|list|describe|evolve|delete`` to ``commands``."""
    topics = commands.add_parser("topics", help="create, list, describe, evolve and delete topics")
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
    create.add_argument(
        "--value-schema", metavar="SPEC", help=f"make a typed topic whose values are rows of this schema: {_SPEC_HELP}"
    )
    create.add_argument(
        "--value-schema-compatibility",
        metavar="MODE",
        type=_mode,
        help=f"with --value-schema: how the schema may evolve, one of {', '.join(COMPATIBILITY_MODES)} "
        "(default BACKWARD)",
    )
    create.set_defaults(handler=cmd_topics_create, root=ROOT_CREATED)
    listing = topic_commands.add_parser("list", parents=[common], help="list topic names")
    listing.set_defaults(handler=cmd_topics_list)
    describe = topic_commands.add_parser(
        "describe", parents=[common], help="partitions, offsets and config (and a typed topic's value schema)"
    )
    describe.add_argument("name")
    describe.set_defaults(handler=cmd_topics_describe)
    evolve = topic_commands.add_parser(
        "evolve",
        parents=[common],
        help="give a typed topic a new value schema version",
        description="Add a value schema version to a typed topic, checked against its history under the "
        "topic's compatibility mode (the mode in force before this change). With --compatibility alone, "
        "change only the mode.",
    )
    evolve.add_argument("name")
    evolve.add_argument("--value-schema", metavar="SPEC", help=f"the new value schema: {_SPEC_HELP}")
    evolve.add_argument(
        "--compatibility",
        metavar="MODE",
        type=_mode,
        help=f"also set the mode for later changes, one of {', '.join(COMPATIBILITY_MODES)}",
    )
    evolve.set_defaults(handler=cmd_topics_evolve)
    delete = topic_commands.add_parser("delete", parents=[common], help="delete a topic and its data")
    delete.add_argument("name")
    delete.set_defaults(handler=cmd_topics_delete)


def cmd_topics_create(env: Env) -> int:
    """``plog topics create NAME``: create a topic; typed with ``--value-schema``."""
    args = env.args
    if args.value_schema_compatibility is not None and args.value_schema is None:
        raise CliError("--value-schema-compatibility needs --value-schema (an untyped topic has no schema to evolve)")
    config = dict(args.config or ())
    with LogStore(env.url, env.options) as store:
        meta = store.create_topic(
            args.name,
            args.partitions,
            config,
            value_schema=args.value_schema,
            value_schema_compatibility=args.value_schema_compatibility,
        )
    noun = "partition" if meta.partitions == 1 else "partitions"
    env.out.print(cell_text(f"created topic {meta.name!r} with {meta.partitions} {noun}"), soft_wrap=True)
    history = meta.schema_history
    if history is not None:
        env.out.print(
            cell_text(
                f"typed: value schema v{history.current.version} ({schema_ddl(history.current.schema)}), "
                f"compatibility {history.compatibility}"
            ),
            soft_wrap=True,
        )
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
    """``plog topics describe NAME``: partitions (offsets, bytes, segments), configuration, and for a
    typed topic its value schema, compatibility mode and schema history."""
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
    if "value_schema" in info:
        _print_value_schema(env, info)
    return EXIT_OK


def _print_value_schema(env: Env, info: dict[str, Any]) -> None:
    """A typed topic's part of ``describe``: the current schema, its mode, its DDL, and every version."""
    schema = info["value_schema"]
    versions = len(info["value_schema_history"])
    env.out.print(
        Text.assemble(
            ("value schema ", "bold"),
            (f"v{info['value_schema_version']}", "bold cyan"),
            f"  compatibility {info['value_schema_compatibility']} · "
            f"{len(schema)} field{'s' if len(schema) != 1 else ''}"
            f" · {versions} version{'s' if versions != 1 else ''}",
        ),
        soft_wrap=True,
    )
    env.out.print(schema_table(schema, "fields"))
    # The DDL round-trips through --value-schema: copy it, edit it, pass it to `plog topics evolve`.
    env.out.print(Text.assemble(("DDL: ", "dim"), schema_ddl(schema)), soft_wrap=True)
    env.out.print(schema_history_table(info["value_schema_history"]))


def cmd_topics_evolve(env: Env) -> int:
    """``plog topics evolve NAME --value-schema SPEC``: add a checked value schema version; print it."""
    args = env.args
    if args.value_schema is None and args.compatibility is None:
        raise CliError("give --value-schema SPEC (a new version), --compatibility MODE, or both")
    with LogStore(env.url, env.options) as store:
        before = store.root.topic(args.name, refresh=True)
        old = before.schema_history
        if old is None:
            raise CliError(f"topic {args.name!r} is untyped: a topic is typed from its creation or never")
        # Without --value-schema the current schema again: a change of the mode only (no new version).
        spec = args.value_schema if args.value_schema is not None else old.current.schema
        try:
            meta = store.evolve_value_schema(args.name, spec, args.compatibility)
        except InvalidConfigError as exc:
            if args.compatibility is None or args.compatibility == old.compatibility or args.value_schema is None:
                raise
            # A common surprise: --compatibility governs later changes; this one is checked under the old mode.
            raise CliError(
                f"{exc} (the change is checked under the mode in force, {old.compatibility}; --compatibility "
                f"{args.compatibility} applies to later changes: set it first with `plog topics evolve "
                f"{args.name} --compatibility {args.compatibility}`)"
            ) from None
    new = meta.schema_history
    assert new is not None  # evolving keeps a typed topic typed
    if new.current.version == old.current.version:
        env.out.print(
            cell_text(
                f"topic {args.name!r}: value schema unchanged at v{new.current.version}, "
                f"compatibility {new.compatibility}"
            ),
            soft_wrap=True,
        )
    else:
        env.out.print(
            cell_text(
                f"topic {args.name!r}: value schema v{new.current.version} "
                f"({_changes(old.current.schema, new.current.schema)}), compatibility {new.compatibility}"
            ),
            soft_wrap=True,
        )
        if old.compatibility == "NONE":
            _warn_unchecked(env, before, new.current.schema)
    if new.compatibility == "NONE" and old.compatibility != "NONE":
        env.note("compatibility is now NONE: later changes are not checked", "yellow")
    return EXIT_OK


def _changes(old: pa.Schema, new: pa.Schema) -> str:
    """What changed between two schema versions: ``added x STRING; changed n INT -> n BIGINT NOT NULL``."""
    old_fields = {f.name: f for f in old}
    new_fields = {f.name: f for f in new}
    parts = []
    added = [field_ddl(f) for f in new if f.name not in old_fields]
    removed = [f.name for f in old if f.name not in new_fields]
    changed = [
        f"{field_ddl(old_fields[f.name])} -> {field_ddl(f)}"
        for f in new
        if f.name in old_fields and not f.equals(old_fields[f.name])
    ]
    if added:
        parts.append("added " + ", ".join(added))
    if removed:
        parts.append("removed " + ", ".join(removed))
    if changed:
        parts.append("changed " + ", ".join(changed))
    if [f.name for f in new if f.name in old_fields] != [f.name for f in old if f.name in new_fields]:
        parts.append("fields reordered")
    return "; ".join(parts) or "no field changes"


def _warn_unchecked(env: Env, before: TopicMetadata, schema: pa.Schema) -> None:
    """The confirmation of an unchecked change says so (PROTOCOL.md 11.8), with what a check would have found."""
    assert before.schema_history is not None
    env.note(
        "warning: compatibility NONE: nothing was checked; records of earlier versions that the new schema "
        "cannot read will fail to read (an error, never skipped)",
        "bold yellow",
    )
    # Readers read all history as the newest schema, so the backward direction is what decides readability.
    problems = evolution_problems([e.schema for e in before.schema_history.entries], schema, "BACKWARD")
    if problems:
        env.note("  under BACKWARD this change would have been refused: " + "; ".join(problems), "yellow")


def cmd_topics_delete(env: Env) -> int:
    """``plog topics delete NAME``: delete a topic and all its data."""
    with LogStore(env.url, env.options) as store:
        store.delete_topic(env.args.name)
    env.out.print(cell_text(f"deleted topic {env.args.name!r}"), soft_wrap=True)
    return EXIT_OK
