"""``plog quotas describe|alter``: a root's client quotas, in the shape of ``kafka-configs`` (PROTOCOL.md 11.10).

::

    plog quotas alter --add-config 'producer_byte_rate=1048576,consumer_byte_rate=2097152' \\
        --entity-type users --entity-name alice --entity-type clients --entity-name ingest
    plog quotas alter --delete-config consumer_byte_rate --entity-type clients --entity-default
    plog quotas describe                                  # every entity that has quotas
    plog quotas describe --entity-type users --entity-name alice

``--entity-type`` and ``--entity-name``/``--entity-default`` pair up in the order given, as
``kafka-configs`` reads them: users first when both are named. Running processes pick a change up
within their refresh interval (5 s by default), nothing restarts.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from rich.table import Table

from coordinator.quotas import DEFAULT, QUOTA_KEYS, Entity, QuotaReader, alter_quota, read_entity
from pyspark_logsource.cli.common import EXIT_OK, CliError, Env
from segment_format.stores import open_store

if TYPE_CHECKING:
    from pyspark_logsource.cli.common import Commands


class _EntityPart(argparse.Action):
    """Collects ``--entity-type``, ``--entity-name`` and ``--entity-default`` in the order given."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: Any = None
    ) -> None:
        parts = list(getattr(namespace, "entity_parts", None) or [])
        if option == "--entity-type":
            parts.append(("type", values))
        else:
            parts.append(("name", DEFAULT if option == "--entity-default" else values))
        namespace.entity_parts = parts


def _entity_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--entity-type", action=_EntityPart, choices=("users", "clients"), help="users or clients; repeatable"
    )
    parser.add_argument("--entity-name", action=_EntityPart, metavar="NAME", help="the name of the entity-type before")
    parser.add_argument(
        "--entity-default", action=_EntityPart, nargs=0, help="Kafka's <default> entity of the entity-type before"
    )
    parser.set_defaults(entity_parts=[])


def register(commands: Commands, common: argparse.ArgumentParser) -> None:
    """Add ``plog quotas`` to ``commands``."""
    quotas = commands.add_parser(
        "quotas",
        parents=[common],
        help="describe and alter client quotas (Kafka's kafka-configs for users and clients)",
        description="Byte-rate and store-request-rate quotas for (user, client-id), user and client-id "
        "entities, with <default>s and Kafka's order of precedence. Running producers, consumers and gateways "
        "apply a change within their refresh interval.",
    )
    actions = quotas.add_subparsers(dest="quotas_command", required=True, metavar="ACTION")
    describe = actions.add_parser("describe", parents=[common], help="show the quotas of entities")
    _entity_options(describe)
    describe.add_argument("--json", action="store_true", help="print one JSON array of {entity, quotas}")
    describe.set_defaults(handler=cmd_describe)
    alter = actions.add_parser("alter", parents=[common], help="set or delete quotas of one entity")
    _entity_options(alter)
    alter.add_argument(
        "--add-config",
        default="",
        metavar="K=V,...",
        help=f"quotas to set, comma-separated (keys: {', '.join(QUOTA_KEYS)}; rates per second)",
    )
    alter.add_argument("--delete-config", default="", metavar="K,...", help="quotas to remove, comma-separated")
    alter.set_defaults(handler=cmd_alter)


def entity_from_parts(parts: list[tuple[str, str]], *, required: bool) -> Entity | None:
    """The entity the ``--entity-*`` options name (types and names paired in order); None if none and not required."""
    types = [value for kind, value in parts if kind == "type"]
    names = [value for kind, value in parts if kind == "name"]
    if not types:
        if names or required:
            raise CliError(
                "name the entity with --entity-type users|clients and --entity-name NAME or --entity-default"
            )
        return None
    if len(names) != len(types) or len(set(types)) != len(types):
        raise CliError("give each --entity-type once, each followed by --entity-name NAME or --entity-default")
    by_type = dict(zip(types, names, strict=True))
    return Entity(by_type.get("users"), by_type.get("clients"))


def _parse_add(text: str) -> dict[str, str]:
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise CliError(f"--add-config item {item!r} is not KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def _entity_dict(entity: Entity) -> dict[str, Any]:
    return {"user": entity.user, "client_id": entity.client_id, "path": entity.path()}


def cmd_alter(env: Env) -> int:
    """``plog quotas alter``: set (``--add-config``) and remove (``--delete-config``) one entity's quotas."""
    args = env.args
    entity = entity_from_parts(args.entity_parts, required=True)
    assert entity is not None
    add = _parse_add(args.add_config)
    delete = [k.strip() for k in args.delete_config.split(",") if k.strip()]
    if not add and not delete:
        raise CliError("nothing to change: give --add-config and/or --delete-config")
    store = open_store(env.url, env.options)
    try:
        after = alter_quota(store, entity, add, delete)
    finally:
        store.close()
    env.note(f"quotas of {entity.path()} are now {json.dumps(after, sort_keys=True)}")
    return EXIT_OK


def cmd_describe(env: Env) -> int:
    """``plog quotas describe``: one entity's quotas, or every entity's (filtered by ``--entity-type``)."""
    args = env.args
    parts = args.entity_parts
    store = open_store(env.url, env.options)
    try:
        names = [value for kind, value in parts if kind == "name"]
        if names:
            entity = entity_from_parts(parts, required=True)
            assert entity is not None
            found = {entity: read_entity(store, entity)}
        else:
            types = {value for kind, value in parts if kind == "type"}
            found = {
                e: q
                for e, q in QuotaReader(store, refresh_s=0).configs().items()
                if ("users" not in types or e.user is not None) and ("clients" not in types or e.client_id is not None)
            }
    finally:
        store.close()
    rows = sorted(found.items(), key=lambda item: item[0].path())
    if args.json:
        env.out.print_json(json.dumps([{"entity": _entity_dict(e), "quotas": q} for e, q in rows]))
        return EXIT_OK
    table = Table("entity", *QUOTA_KEYS)
    for entity, quotas in rows:
        table.add_row(entity.path(), *(_rate(quotas.get(key)) for key in QUOTA_KEYS))
    env.out.print(table)
    return EXIT_OK


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    return str(int(value)) if value == int(value) else str(value)
