"""Consumer groups nobody runs (PROTOCOL.md 11.4, *Expiry*): expired whole after ``offsets.retention.minutes``.

Live members collect their group's garbage themselves (11.4, *Garbage*); a group whose members are all
gone has nobody to do it. For such a group the collector applies the same garbage rules, and once its
newest dated object is older than ``offsets.retention.minutes`` (Kafka's name and default, 7 days) it
deletes the group whole: its committed offsets expire, as Kafka's do. A group with a live member is
never touched. ``offsets/`` (a Spark query's progress for lag tools) is left to its writer, which keeps
only the newest few.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from typing import Any

from segment_format.errors import InvalidConfigError, ObjectNotFoundError
from segment_format.numbered import parse_number

from ..groups import GroupClient, Heartbeat
from ..keys import GROUPS, validate_group_id
from .base import CollectionContext, NamespaceCollector

log = logging.getLogger(__name__)

#: Kafka's ``offsets.retention.minutes`` default: a group without live members keeps its offsets this long.
OFFSETS_RETENTION_MS = 7 * 24 * 60 * 60 * 1000


def _created_ms(body: bytes, field: str) -> int | None:
    """The timestamp ``field`` of a JSON document; None if it has none or does not decode."""
    try:
        value: Any = json.loads(body).get(field)
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class GroupsCollector(NamespaceCollector):
    """``groups/<group>/``: garbage of groups without live members, and whole groups past the retention."""

    namespace = "groups"
    #: Hourly at the default interval: a group nobody runs does not grow, so its collection can wait.
    every = 6

    def __init__(self, retention_ms: int = OFFSETS_RETENTION_MS) -> None:
        self.retention_ms = retention_ms

    def collect(self, context: CollectionContext) -> int:
        """One listing of ``groups/`` names the groups and their objects; each group is one step."""
        store = context.store
        by_group: dict[str, list[str]] = defaultdict(list)
        for info in store.list(GROUPS):
            by_group[info.key[len(GROUPS) :].split("/", 1)[0]].append(info.key)
        deleted = 0
        for group in list_groups_from(by_group):
            if context.spent():
                break
            deleted += self._one(context, group, by_group[group])
        return deleted

    def _one(self, context: CollectionContext, group: str, keys: list[str]) -> int:
        store, now = context.store, context.now_ms
        client = GroupClient(store, group)
        prefix = f"{GROUPS}{group}/"
        members, generations = _parts(keys, prefix)
        heartbeats = client.heartbeats(members)
        if any(hb.alive_at(now) for hb in heartbeats.values()):
            return 0  # a live member collects its own group (11.4, Garbage)
        newest: int | None = now  # a damaged heartbeat is undated: never expired whole, garbage only
        if not client.damaged_heartbeats():
            newest = self._newest_dated(client, heartbeats, generations, keys, prefix)
        if newest is not None and now - newest > self.retention_ms:
            return self._expire(context, group, keys, prefix)
        latest = client.latest_of(generations)
        try:
            return client.collect_garbage(latest, at_ms=now)
        except ObjectNotFoundError:
            return 0  # collected concurrently; the next pass sees what is left

    def _newest_dated(
        self,
        client: GroupClient,
        heartbeats: dict[str, Heartbeat],
        generations: list[int],
        keys: list[str],
        prefix: str,
    ) -> int | None:
        """The newest timestamp among the group's dated objects; None if it has none (offsets/ only)."""
        store = client.store
        stamps = [hb.sent_ms for hb in heartbeats.values()]
        if generations:
            latest = client.latest_of(generations)
            if latest.number:
                stamps.append(latest.created_ms)
        newest_entry: dict[str, str] = {}
        for key in keys:
            rest = key[len(prefix) :]
            if rest.startswith("commits/") and parse_number(key) is not None:
                log_prefix = key.rsplit("/", 1)[0]
                newest_entry[log_prefix] = max(newest_entry.get(log_prefix, key), key)
            elif rest.startswith("rebalances/") and parse_number(key) is not None:
                newest_entry["rebalances"] = max(newest_entry.get("rebalances", key), key)
        for key in newest_entry.values():
            try:
                stamp = _created_ms(store.get(key), "created_ms")
            except ObjectNotFoundError:
                continue  # collected meanwhile: something newer took its place
            if stamp is None:
                return None  # an undated entry: the group is not expired whole
            stamps.append(stamp)
        return max(stamps) if stamps else None

    def _expire(self, context: CollectionContext, group: str, keys: list[str], prefix: str) -> int:
        """Delete the group's objects but ``offsets/``: generations (newest last), markers, logs, heartbeats."""
        order = {"generations/": 0, "rebalances/": 1, "commits/": 2, "members/": 3}
        doomed = sorted((order[part], key) for key in keys for part in order if key[len(prefix) :].startswith(part))
        if context.spent():
            return 0
        for _, key in doomed:
            context.store.delete(key)
        log.info(
            "group %s: no live member and nothing newer than the retention: expired (%d objects)", group, len(doomed)
        )
        return len(doomed)


def _parts(keys: list[str], prefix: str) -> tuple[dict[str, list[str]], list[int]]:
    """(member id -> heartbeat keys oldest first, generation numbers ascending) from a group's keys."""
    members: dict[str, list[str]] = defaultdict(list)
    generations = []
    for key in keys:
        rest = key[len(prefix) :]
        if parse_number(key) is None:
            continue
        if rest.startswith("members/"):
            members[rest[len("members/") :].split("/", 1)[0]].append(key)
        elif rest.startswith("generations/") and rest.count("/") == 1:
            generations.append(parse_number(key) or 0)
    return {m: sorted(ks) for m, ks in members.items()}, sorted(generations)


def list_groups_from(by_group: dict[str, list[str]]) -> list[str]:
    """The valid group names among the first key segments of a listing of ``groups/``, sorted."""
    names = []
    for name in sorted(by_group):
        try:
            validate_group_id(name)
        except InvalidConfigError:
            continue  # not a group id: not ours to collect
        names.append(name)
    return names
