"""Consumer groups nobody runs (PROTOCOL.md 11.4, *Expiry*): expired after ``offsets.retention.minutes``.

Live members collect their group's garbage themselves (11.4, *Garbage*); a group whose members are all
gone has nobody to do it. For such a group the collector applies the same garbage rules, and once its
newest dated object is older than ``offsets.retention.minutes`` (Kafka's name and default, 7 days) it
expires the group: its committed offsets are cleared, as Kafka's are, and all its objects but one go.
The one kept is an empty *expiry generation* numbered after everything the group had, created before
anything is deleted, so the group's generation numbering never restarts and no commit that lands late
in an old log can ever be read as the offsets of the group's next use. A group with a live member is
never touched. ``offsets/`` (a Spark query's progress for lag tools) is left to its writer, which keeps
only the newest few.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from typing import Any

from segment_format.errors import CommitFailedError, CorruptRecordError, InvalidConfigError, ObjectNotFoundError
from segment_format.numbered import parse_number

from ..groups import Generation, GroupClient, Heartbeat
from ..keys import GROUPS, commit_key, group_prefix, validate_group_id
from .base import CollectionContext, NamespaceCollector

log = logging.getLogger(__name__)

#: Kafka's ``offsets.retention.minutes`` default: a group without live members keeps its offsets this long.
OFFSETS_RETENTION_MS = 7 * 24 * 60 * 60 * 1000
#: ``proposer`` of an expiry generation (informational: no decision reads it).
EXPIRY_PROPOSER = "collector"
#: ``reason`` of an expiry generation (informational).
EXPIRY_REASON = "expired: no live member and nothing newer than offsets.retention.minutes"
#: The parts of a group an expiry deletes below its new generation (``offsets/`` is its writer's).
_EXPIRED_PARTS = ("commits/", "rebalances/", "generations/", "assignments/", "members/")


def _created_ms(body: bytes, field: str) -> int | None:
    """The timestamp ``field`` of a JSON document; None if it has none or does not decode."""
    try:
        value: Any = json.loads(body).get(field)
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class GroupsCollector(NamespaceCollector):
    """``groups/<group>/``: garbage of groups without live members, and expiry of those past the retention."""

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
        try:
            heartbeats = client.heartbeats(members)
            if any(hb.alive_at(now) for hb in heartbeats.values()):
                return 0  # a live member collects its own group (11.4, Garbage)
            if _only_an_empty_generation(client, keys, prefix, generations):
                return 0  # already expired (or emptied by a tool): nothing to clear, nothing to collect
            newest: int | None = now  # a damaged heartbeat is undated: never expired, garbage only
            if not client.damaged_heartbeats():
                newest = self._newest_dated(client, heartbeats, generations, keys, prefix)
            if newest is not None and now - newest > self.retention_ms:
                if context.spent():
                    return 0
                return expire_group(client, keys, at_ms=now)
            latest = client.latest_of(generations)
            return client.collect_garbage(latest, at_ms=now)
        except ObjectNotFoundError:
            return 0  # collected concurrently; the next pass sees what is left
        except (CorruptRecordError, CommitFailedError) as exc:
            # One damaged or contended group must not stop the others; it is never expired while it is.
            log.warning("group %s: not collected this pass: %s", group, exc)
            return 0

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


def expire_group(client: GroupClient, keys: list[str], *, at_ms: int, by: str = EXPIRY_PROPOSER) -> int:
    """Expire a group (PROTOCOL.md 11.4, *Expiry*) from ``keys``, a listing of its prefix the caller decided on.

    Seals the log of the highest generation number g the listing shows, creates the empty expiry
    generation g + 1 with put-if-absent, then deletes everything listed below it (and the seal) in one
    batch, keeping generation g + 1: numbering goes on from there, so a commit that lands late in a log
    numbered g or lower is never the newest generation's and is never read. Returns how many objects were
    deleted; 0 if generation g + 1 turned out to be someone else's (the group is in use again). The caller
    has checked that the group has no live member and nothing newer than the retention.
    """
    prefix = group_prefix(client.group)
    numbered = [k for k in keys if k.startswith(prefix) and parse_number(k) is not None]
    g = max((_generation_of(k[len(prefix) :]) for k in numbered), default=0)
    # Generation g's object may be gone while its log or marker is not (a pass cut short): seal it all the same.
    latest = client.generation(g) or Generation(g)
    seal_seq, _ = client.append_commit(latest, by, {}, seal=True)
    expiry = Generation(g + 1, None, created_ms=at_ms, proposer=by, reason=EXPIRY_REASON)
    if not client.create_generation(expiry):
        winner = client.generation(g + 1)
        if winner is None or winner.members or winner.committed:
            log.info("group %s: generation %d was created meanwhile: in use again, not expired", client.group, g + 1)
            return 0
        # another pass expired it first: deleting what this listing showed below g + 1 is the same work
    doomed = sorted(
        {k for k in numbered if k[len(prefix) :].startswith(_EXPIRED_PARTS)} | {commit_key(client.group, g, seal_seq)}
    )
    client.store.delete_many(doomed)
    log.info(
        "group %s: no live member and nothing newer than the retention: expired to empty generation %d "
        "(%d objects deleted)",
        client.group,
        g + 1,
        len(doomed),
    )
    return len(doomed)


def _generation_of(rest: str) -> int:
    """The generation number a group key (relative to the group's prefix) belongs to; 0 for other parts."""
    part, _, tail = rest.partition("/")
    if part in ("generations", "rebalances", "assignments"):
        return parse_number(rest) or 0
    if part == "commits":
        log_dir = tail.split("/", 1)[0]  # commits/<generation:020d>/<seq>.json
        return int(log_dir) if log_dir.isdigit() else 0
    return 0


def _only_an_empty_generation(client: GroupClient, keys: list[str], prefix: str, generations: list[int]) -> bool:
    """Whether the group's only object (``offsets/`` aside) is one generation with no members and no offsets."""
    rest = [k for k in keys if not k[len(prefix) :].startswith("offsets/")]
    if len(rest) != 1 or len(generations) != 1:
        return False
    gen = client.generation(generations[0])
    return gen is not None and not gen.members and not gen.committed


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
