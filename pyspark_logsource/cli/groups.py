"""``plog groups``: list and describe consumer groups, and reset their committed offsets."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from coordinator.groups import GroupClient, list_groups
from coordinator.groups.documents import CONSUMER, GroupDescription
from coordinator.keys import GROUPS
from pyspark_logsource.cli.common import EXIT_OK, CliError, Env, parse_timestamp
from pyspark_logsource.client.admin import LogStore
from pyspark_logsource.views.terminal import cell_number, cell_text
from segment_format.errors import UnknownTopicOrPartitionError

if TYPE_CHECKING:
    from pyspark_logsource.cli.common import Commands


def register(commands: Commands, common: argparse.ArgumentParser) -> None:
    """Add ``plog groups list|describe|reset-offsets`` to ``commands``."""
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


def _age(ms: int | None) -> str:
    if ms is None:
        return "-"
    return f"{max(0, int(time.time() * 1000) - ms) / 1000:,.1f} s ago"


def _end_offset(store: LogStore, topic: str, partition: int) -> int | None:
    try:
        return store.root.partition(topic, partition).view().end_offset  # metadata read once per command, cached
    except UnknownTopicOrPartitionError:
        return None


def cmd_groups_list(env: Env) -> int:
    """``plog groups list``: every group with its state, generation, protocol and live members."""
    with LogStore(env.url, env.options) as store:
        names = list_groups(store.root.store)
        table = Table(title="consumer groups", title_justify="left")
        for column in ("group", "state", "generation", "protocol", "live members"):
            table.add_column(column, justify="right" if column in ("generation", "live members") else "left")
        for name in names:
            info = GroupClient(store.root.store, name).describe()
            table.add_row(
                cell_text(name, "bold"),
                cell_text(info.state),
                cell_number(info.generation),
                cell_text(info.protocol or "-"),
                cell_number(sum(m.alive for m in info.members)),
            )
    if names:
        env.out.print(table)
    else:
        env.note(f"no consumer groups under {env.url}")
    return EXIT_OK


def cmd_groups_describe(env: Env) -> int:
    """``plog groups describe GROUP``: members; per partition its owner, committed and end offsets, lag."""
    with LogStore(env.url, env.options) as store:
        if not store.root.store.list(f"{GROUPS}{env.args.group}/"):
            raise CliError(f"consumer group {env.args.group!r} does not exist under {env.url} (plog groups list)")
        info = GroupClient(store.root.store, env.args.group).describe()
        env.out.print(
            Text.assemble(
                ("group ", "bold"),
                (info.group, "bold cyan"),
                f"  state {info.state} · generation {info.generation} · protocol {info.protocol or '-'}",
                f" · type {info.protocol_type} · assigned by its leader {info.leader}" if info.client_assigned else "",
            ),
            soft_wrap=True,
        )
        shares = _client_shares(info)
        members = Table(title="members", title_justify="left")
        columns = ("member", "client id", "alive", "last heartbeat", "generation", "topics", "partitions")
        for column in columns:
            members.add_column(column)
        for m in info.members:
            members.add_row(
                cell_text(m.member_id),
                cell_text(m.client_id or "-"),
                cell_text("yes" if m.alive else "left" if m.left else "no", "green" if m.alive else "red"),
                cell_text(_age(m.last_heartbeat_ms)),
                cell_text(m.generation),
                cell_text(",".join(m.topics) or "-"),
                cell_text(shares.get(m.member_id) or " ".join(f"{t}-{p}" for t, p in m.assignment) or "-"),
            )
        env.out.print(members)
        for key in info.damaged_heartbeats:
            # reported, not fatal: the group goes on without it (PROTOCOL.md 11.4, *Damaged heartbeats*)
            env.note(f"damaged heartbeat ignored (taken as absent): {key}", "yellow")
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
                cell_text(topic),
                cell_number(partition),
                cell_text(info.owners.get((topic, partition), "-")),
                cell_number(committed) if committed is not None else cell_text("-"),
                cell_number(end) if end is not None else cell_text("-"),
                cell_number(lag) if lag is not None else cell_text("-"),
            )
        partitions.add_section()
        partitions.add_row(cell_text("total", "bold"), "", "", "", "", cell_number(total_lag))
        env.out.print(partitions)
    return EXIT_OK


def _client_shares(info: GroupDescription) -> dict[str, str]:
    """A client-assigned generation's shares as text: a consumer group's partitions (its owners join the
    description's), any other protocol type's byte counts, which only its clients can read."""
    out: dict[str, str] = {}
    if not info.client_assignment:
        return out
    try:  # the gateway's extra (kio) reads Kafka's encoding; without it, the byte counts
        from pyspark_logsource.gateway.group_bridge import InconsistentProtocolError, decode_assignment
    except ImportError:
        return {member: f"{len(data)} bytes" for member, data in info.client_assignment.items()}
    for member, data in info.client_assignment.items():
        if info.protocol_type != CONSUMER:
            out[member] = f"{len(data)} bytes"
            continue
        try:
            partitions = decode_assignment(data)
        except InconsistentProtocolError:
            out[member] = f"{len(data)} bytes (not a consumer assignment)"
            continue
        out[member] = " ".join(f"{t}-{p}" for t, p in partitions)
        if any(m.member_id == member and m.alive for m in info.members):
            info.owners.update(dict.fromkeys(partitions, member))
    return out


def _reset_targets(env: Env, store: LogStore, client: GroupClient) -> list[tuple[str, int]]:
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


def cmd_groups_reset_offsets(env: Env) -> int:
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
            table.add_row(
                cell_text(topic),
                cell_number(p),
                cell_number(before) if before is not None else cell_text("-"),
                cell_number(target),
            )
        env.out.print(table)
        if not args.execute:
            env.note("dry run: nothing changed; add --execute to reset these offsets")
            return EXIT_OK
        gen = client.reset_offsets(plan, by="plog-cli")
    env.out.print(
        cell_text(
            f"reset {len(plan)} partition offset(s) of group {args.group!r} (generation {gen.number})", "bold green"
        ),
        soft_wrap=True,
    )
    return EXIT_OK
