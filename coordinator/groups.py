"""Consumer groups without a broker (PROTOCOL.md 11.4, argued in 13, I11).

A group is a handful of small JSON objects under ``groups/<group>/``; every
decision a Kafka group coordinator makes is made here by one put-if-absent:

``members/<member_id>/<seq:020d>.json``
    heartbeats. A member creates ``seq + 1`` every ``heartbeat_interval_ms`` and
    deletes ``seq``. The newest one carries its subscription, its assignment
    protocols, its timeouts, the generation it has adopted and the generation
    it is ready to join (its acknowledgement of a rebalance).
``rebalances/<generation:020d>.json``
    "generation g is being replaced": created (once, put-if-absent) by any member
    that sees the live members or their subscriptions differ from generation g.
    Members then prepare: with an eager protocol they commit and revoke every
    partition, with a cooperative one they keep fetching; either way they
    acknowledge by heartbeating ``joined = g + 1``.
``generations/<generation:020d>.json``
    the membership and assignment of a generation, and a snapshot of the
    committed offsets. Generation g + 1 is created by whichever member first
    sees every live member acknowledge (or the rebalance timeout pass): it
    *seals* generation g's commit log, runs the assignor, and creates the object
    with put-if-absent, so exactly one proposal wins.
``commits/<generation:020d>/<seq:020d>.json``
    the commit log of a generation. Entries are numbered contiguously, each
    created with put-if-absent from a listing, each holding the whole committed
    state of the group after it (so the newest entry is all a reader needs).
    The last entry of a replaced generation is its *seal*; after it no commit
    can be created in that generation (its number is taken), which is what
    fences a member that lost its partitions (``CommitFailedError``).

Liveness is judged by each member on its own monotonic clock: a member is dead
when its newest heartbeat has not changed for its ``session_timeout_ms``. Wall
clocks are compared only for a first impression of a heartbeat and by one-shot
observers (the CLI, standalone commits), within :data:`MAX_CLOCK_SKEW_MS`.
Safety (one owner per partition per generation, commits fenced by generation)
does not depend on any clock; see PROTOCOL.md 13, I11.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from segment_format import numbered
from segment_format.errors import (
    CommitFailedError,
    ConcurrentCreateError,
    InvalidConfigError,
    ObjectNotFoundError,
    PlogError,
)
from segment_format.layout import TOPIC_NAME
from segment_format.numbered import parse_number
from segment_format.records import now_ms
from segment_format.storage import Store

from .assignors import COOPERATIVE, STRATEGIES, TP, compute_assignment
from .keys import (  # noqa: F401 - re-exported: group keys used to live here
    GROUPS,
    commit_key,
    commits_prefix,
    generation_key,
    generations_prefix,
    group_prefix,
    heartbeat_key,
    lag_offsets_prefix,
    materialized_key,
    members_prefix,
    rebalance_key,
    rebalances_prefix,
    validate_group_id,
)

log = logging.getLogger(__name__)


#: ε: how far apart the wall clocks of the machines using a group are assumed to be. Used only where a
#: heartbeat's ``sent_ms`` is compared with a local clock (first impressions, the CLI, standalone commits).
MAX_CLOCK_SKEW_MS = 1_000
#: D for groups: a sealed generation's objects, and the heartbeats of long-dead members, are deleted only
#: this long after they stopped mattering (the role ``file.delete.delay.ms`` plays for segments, A4).
GC_DELAY_MS = 20 * 60 * 1000
#: W for commit logs: a commit entry is never created from a listing older than this (A4).
MAX_STALENESS_MS = 10_000
#: Commit-log entries are garbage-collected every this many commits (the newest two always stay).
_LOG_GC_EVERY = 64
#: How often (in heartbeat cycles) a member collects the group's garbage besides after a rebalance.
_GC_EVERY_CYCLES = 1000
#: Retry budget for re-reading a commit log that changes under us and for following sealed generations
#: (creates themselves use segment_format.numbered.MAX_CREATE_ATTEMPTS).
_COMMIT_ATTEMPTS = 1000


# ------------------------------------------------------------------------------------------- keys


def _number(key: str) -> int | None:
    return parse_number(key)


class _SealedLog(Exception):
    """Raised inside a commit-log create to stop it: the log is sealed at entry ``seq`` with ``state``."""

    def __init__(self, seq: int, state: dict[TP, int]) -> None:
        super().__init__(seq)
        self.seq, self.state = seq, state


def make_member_id(client_id: str = "") -> str:
    """A new member id: the client id's safe characters, a random suffix (Kafka: ``<client.id>-<uuid>``)."""
    base = re.sub(r"[^a-zA-Z0-9._-]", "", client_id)[:64] or "consumer"
    return f"{base}-{uuid.uuid4().hex[:16]}"


# ------------------------------------------------------------------------------------------- documents


def offsets_to_json(offsets: Mapping[TP, int]) -> dict[str, dict[str, int]]:
    """``{(t, p): o}`` as ``{"t": {"p": o}}``."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = int(offset)
    return out


def offsets_from_json(doc: Mapping[str, Mapping[str, int]] | None) -> dict[TP, int]:
    """Inverse of :func:`offsets_to_json`."""
    return {(topic, int(p)): int(o) for topic, per in (doc or {}).items() for p, o in per.items()}


def _tps_to_json(tps: Iterable[TP]) -> list[list[Any]]:
    return [[t, int(p)] for t, p in tps]


def _tps_from_json(doc: Iterable[Sequence[Any]]) -> tuple[TP, ...]:
    return tuple((str(t), int(p)) for t, p in doc)


@dataclass(frozen=True)
class Heartbeat:
    """One heartbeat object: a member's announcement of itself at ``sent_ms``."""

    member_id: str
    seq: int
    sent_ms: int
    client_id: str = ""
    topics: tuple[str, ...] = ()
    protocols: tuple[str, ...] = ()
    session_timeout_ms: int = 10_000
    rebalance_timeout_ms: int = 300_000
    generation: int = -1
    joined: int = -1
    leaving: bool = False

    def to_json(self) -> bytes:
        """The object's bytes."""
        return json.dumps(
            {
                "member_id": self.member_id,
                "seq": self.seq,
                "sent_ms": self.sent_ms,
                "client_id": self.client_id,
                "topics": list(self.topics),
                "protocols": list(self.protocols),
                "session_timeout_ms": self.session_timeout_ms,
                "rebalance_timeout_ms": self.rebalance_timeout_ms,
                "generation": self.generation,
                "joined": self.joined,
                "leaving": self.leaving,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Heartbeat:
        """Parse a heartbeat object."""
        d = json.loads(data)
        return cls(
            str(d["member_id"]),
            int(d["seq"]),
            int(d["sent_ms"]),
            str(d.get("client_id", "")),
            tuple(d.get("topics", ())),
            tuple(d.get("protocols", ())),
            int(d.get("session_timeout_ms", 10_000)),
            int(d.get("rebalance_timeout_ms", 300_000)),
            int(d.get("generation", -1)),
            int(d.get("joined", -1)),
            bool(d.get("leaving", False)),
        )

    def alive_at(self, at_ms: int, skew_ms: int = MAX_CLOCK_SKEW_MS) -> bool:
        """One-shot judgement by wall clock: not leaving and sent within the session timeout (+ ε)."""
        return not self.leaving and at_ms - self.sent_ms <= self.session_timeout_ms + skew_ms


@dataclass(frozen=True)
class Generation:
    """A generation: members, their assignment and the committed offsets when it began.

    Generation 0 is implicit (no object): no members, nothing committed.
    ``revoking`` lists, per member, partitions a cooperative rebalance took
    away from it and gave to nobody yet: that member may still commit them in
    this generation. ``rejected`` lists members left out for an assignment
    protocol the group does not use.
    """

    number: int
    protocol: str | None = None
    members: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    assignment: Mapping[str, tuple[TP, ...]] = field(default_factory=dict)
    revoking: Mapping[str, tuple[TP, ...]] = field(default_factory=dict)
    rejected: Mapping[str, str] = field(default_factory=dict)
    partitions: Mapping[str, int] = field(default_factory=dict)
    committed: Mapping[TP, int] = field(default_factory=dict)
    created_ms: int = 0
    proposer: str = ""
    reason: str = ""

    def partitions_of(self, member_id: str) -> list[TP]:
        """The partitions ``member_id`` owns in this generation, in assignor order."""
        return list(self.assignment.get(member_id, ()))

    def owners(self) -> dict[TP, str]:
        """Partition -> owning member."""
        return {tp: m for m, tps in self.assignment.items() for tp in tps}

    def may_commit(self, member_id: str | None, tp: TP) -> bool:
        """Whether ``member_id`` may commit ``tp`` in this generation (anyone, if it has no members)."""
        if not self.members:
            return True
        if member_id is None:
            return False
        return tp in self.assignment.get(member_id, ()) or tp in self.revoking.get(member_id, ())

    def to_json(self) -> bytes:
        """The object's bytes."""
        return json.dumps(
            {
                "generation": self.number,
                "protocol": self.protocol,
                "members": {m: dict(v) for m, v in self.members.items()},
                "assignment": {m: _tps_to_json(tps) for m, tps in self.assignment.items()},
                "revoking": {m: _tps_to_json(tps) for m, tps in self.revoking.items()},
                "rejected": dict(self.rejected),
                "partitions": dict(self.partitions),
                "committed": offsets_to_json(self.committed),
                "created_ms": self.created_ms,
                "proposer": self.proposer,
                "reason": self.reason,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Generation:
        """Parse a generation object."""
        d = json.loads(data)
        return cls(
            int(d["generation"]),
            d.get("protocol"),
            d.get("members", {}),
            {m: _tps_from_json(tps) for m, tps in d.get("assignment", {}).items()},
            {m: _tps_from_json(tps) for m, tps in d.get("revoking", {}).items()},
            d.get("rejected", {}),
            {t: int(n) for t, n in d.get("partitions", {}).items()},
            offsets_from_json(d.get("committed")),
            int(d.get("created_ms", 0)),
            str(d.get("proposer", "")),
            str(d.get("reason", "")),
        )


class GenerationSealed(PlogError):
    """The commit log of a generation is sealed: the group has moved (or is moving) to the next one."""

    def __init__(self, generation: int) -> None:
        super().__init__(f"generation {generation} is sealed")
        self.generation = generation


@dataclass
class MemberInfo:
    """One member as ``describe`` sees it."""

    member_id: str
    client_id: str
    alive: bool
    last_heartbeat_ms: int | None
    generation: int
    topics: tuple[str, ...]
    assignment: list[TP]
    left: bool = False


@dataclass
class GroupDescription:
    """What ``plog groups describe`` shows."""

    group: str
    state: str
    generation: int
    protocol: str | None
    members: list[MemberInfo]
    owners: dict[TP, str]
    committed: dict[TP, int]
    rebalancing: bool
    committed_source: str


# --------------------------------------------------------------------------------------- the group's objects


class GroupClient:
    """Reads and writes one group's objects. Stateless apart from a cache of immutable generations."""

    def __init__(self, store: Store, group: str) -> None:
        self.store = store
        self.group = validate_group_id(group)
        self._generations: dict[int, Generation] = {}
        self._heartbeats: dict[str, Heartbeat] = {}
        self._lock = threading.Lock()

    # -------------------------------------------------------------- generations

    def generation_numbers(self) -> list[int]:
        """The numbers of the generation objects that exist, ascending."""
        return numbered.numbers(self.store, generations_prefix(self.group))

    def generation(self, number: int) -> Generation | None:
        """Generation ``number`` (0 is implicit when absent); None if it does not exist (or was collected)."""
        with self._lock:
            cached = self._generations.get(number)
        if cached is not None:
            return cached
        try:
            gen = Generation.from_json(self.store.get(generation_key(self.group, number)))
        except ObjectNotFoundError:
            return Generation(0) if number == 0 else None
        with self._lock:
            self._generations[number] = gen
        return gen

    def latest_generation(self) -> Generation:
        """The newest generation (generation 0 if none was ever created)."""
        for number in reversed(self.generation_numbers()):
            gen = self.generation(number)
            if gen is not None:
                return gen
        return Generation(0)

    def create_generation(self, gen: Generation) -> bool:
        """Create ``gen`` with put-if-absent; False if it already exists (another proposal won)."""
        created = numbered.create(self.store, generations_prefix(self.group), gen.number, gen.to_json())
        if created:
            with self._lock:
                self._generations[gen.number] = gen
        return created

    # -------------------------------------------------------------- rebalance markers

    def rebalance_marker_exists(self, generation: int) -> bool:
        """Whether generation ``generation`` is being replaced."""
        return self.store.exists(rebalance_key(self.group, generation))

    def create_rebalance_marker(self, generation: int, by: str, reason: str) -> bool:
        """Start replacing ``generation`` (put-if-absent; False if someone already did)."""
        body = json.dumps({"generation": generation, "by": by, "reason": reason, "created_ms": now_ms()})
        return numbered.create(self.store, rebalances_prefix(self.group), generation, body.encode(), durable=False)

    # -------------------------------------------------------------- heartbeats

    def heartbeat_keys(self) -> dict[str, list[str]]:
        """Member id -> its heartbeat keys, oldest first."""
        prefix = members_prefix(self.group)
        out: dict[str, list[str]] = {}
        for info in self.store.list(prefix):
            member, _, name = info.key[len(prefix) :].partition("/")
            if _number(name) is not None:
                out.setdefault(member, []).append(info.key)
        return out

    def heartbeats(self) -> dict[str, Heartbeat]:
        """The newest heartbeat of every member that has one."""
        out: dict[str, Heartbeat] = {}
        keys = self.heartbeat_keys()
        for member, member_keys in keys.items():
            for key in reversed(member_keys):
                cached = self._heartbeats.get(key)
                if cached is not None:
                    out[member] = cached
                    break
                try:
                    hb = Heartbeat.from_json(self.store.get(key))
                except ObjectNotFoundError:
                    continue  # its member moved on and deleted it: the previous one (or next listing) counts
                except (ValueError, KeyError, TypeError):
                    log.warning("group %s: ignoring unreadable heartbeat %s", self.group, key)
                    continue
                self._heartbeats[key] = hb
                out[member] = hb
                break
        live_keys = {k for ks in keys.values() for k in ks}
        for key in [k for k in self._heartbeats if k not in live_keys]:
            del self._heartbeats[key]
        return out

    def active_members(self, at_ms: int | None = None) -> list[str]:
        """Members alive by the wall-clock rule (one-shot observers): not leaving, heard from recently."""
        at = now_ms() if at_ms is None else at_ms
        return sorted(m for m, hb in self.heartbeats().items() if hb.alive_at(at))

    # -------------------------------------------------------------- commit logs

    def _log(self, generation: int) -> list[tuple[int, str]]:
        entries = []
        for info in self.store.list(commits_prefix(self.group, generation)):
            n = _number(info.key)
            if n is not None:
                entries.append((n, info.key))
        return sorted(entries)

    def log_state(self, gen: Generation) -> tuple[int, dict[TP, int], bool]:
        """(next entry number, committed state, sealed) of ``gen``'s commit log."""
        for _ in range(_COMMIT_ATTEMPTS):
            entries = self._log(gen.number)
            if not entries:
                return 0, dict(gen.committed), False
            seq, key = entries[-1]
            try:
                doc = json.loads(self.store.get(key))
            except ObjectNotFoundError:
                continue  # collected under us: list again
            return seq + 1, offsets_from_json(doc.get("state")), bool(doc.get("sealed", False))
        raise CommitFailedError(f"group {self.group}: the commit log of generation {gen.number} keeps changing")

    def append_commit(
        self, gen: Generation, member_id: str | None, offsets: Mapping[TP, int], seal: bool = False
    ) -> tuple[int, dict[TP, int]]:
        """Create the next entry of ``gen``'s commit log with ``offsets`` merged into the state.

        Returns (entry number, state after it). Raises :class:`GenerationSealed`
        if the log is sealed (with ``seal=True``, returns the seal instead).
        Ownership is the caller's business (:meth:`Generation.may_commit`).
        """
        prefix = commits_prefix(self.group, gen.number)

        def make_body(seq: int) -> bytes | None:
            previous = self._entry_before(gen, seq)
            if previous is None:
                return None  # entry seq - 1 was collected under us: list again
            state, sealed = previous
            if sealed:
                raise _SealedLog(seq - 1, state)
            new_state = {**state, **{(t, int(p)): int(o) for (t, p), o in offsets.items()}}
            doc: dict[str, Any] = {
                "generation": gen.number,
                "seq": seq,
                "member": member_id,
                "offsets": offsets_to_json(offsets),
                "state": offsets_to_json(new_state),
                "created_ms": now_ms(),
            }
            if seal:
                doc["sealed"] = True
            return json.dumps(doc, sort_keys=True).encode()

        try:
            seq, body = numbered.create_next(self.store, prefix, make_body, max_staleness_ms=MAX_STALENESS_MS)
        except _SealedLog as sealed_log:
            if seal:
                return sealed_log.seq, sealed_log.state
            raise GenerationSealed(gen.number) from None
        except ConcurrentCreateError:
            raise CommitFailedError(
                f"group {self.group}: too many concurrent commits in generation {gen.number}"
            ) from None
        if seq and seq % _LOG_GC_EVERY == 0:
            self._collect_log(gen.number)
        return seq, offsets_from_json(json.loads(body)["state"])

    def _entry_before(self, gen: Generation, seq: int) -> tuple[dict[TP, int], bool] | None:
        """(state, sealed) after entry ``seq - 1`` of ``gen``'s log; None if that entry is gone."""
        if seq == 0:
            return dict(gen.committed), False
        try:
            doc = json.loads(self.store.get(commit_key(self.group, gen.number, seq - 1)))
        except ObjectNotFoundError:
            return None
        return offsets_from_json(doc.get("state")), bool(doc.get("sealed", False))

    def seal(self, gen: Generation, by: str) -> dict[TP, int]:
        """Seal ``gen``'s commit log (idempotent) and return its final committed state."""
        return self.append_commit(gen, by, {}, seal=True)[1]

    def commit_entries(self, generation: int) -> list[dict[str, Any]]:
        """Every entry of a generation's commit log, in order (for tests and tools)."""
        out = []
        for _, key in self._log(generation):
            try:
                out.append(json.loads(self.store.get(key)))
            except ObjectNotFoundError:
                continue
        return out

    def _lag_offsets(self) -> dict[TP, int] | None:
        prefix = lag_offsets_prefix(self.group)
        keys = sorted(info.key for info in self.store.list(prefix) if _number(info.key) is not None)
        for key in reversed(keys):
            try:
                return offsets_from_json(json.loads(self.store.get(key)))
            except ObjectNotFoundError:
                continue
        return None

    def committed_with_source(self, gen: Generation | None = None) -> tuple[dict[TP, int], str]:
        """The group's committed offsets and where they came from (``generations`` or ``spark-lag``)."""
        gen = gen if gen is not None else self.latest_generation()
        seq, state, _ = self.log_state(gen)
        if gen.number == 0 and seq == 0:
            lag = self._lag_offsets()
            if lag is not None:
                return lag, "spark-lag"
        return state, "generations"

    def committed(self, gen: Generation | None = None) -> dict[TP, int]:
        """The group's committed offsets: the newest entry of the newest generation's log, or its snapshot."""
        return self.committed_with_source(gen)[0]

    # -------------------------------------------------------------- administration (no live members)

    def _require_inactive(self, what: str) -> None:
        active = self.active_members()
        if active:
            raise CommitFailedError(
                f"group {self.group!r} has {len(active)} active member(s) ({', '.join(active)}): {what} is "
                "only possible when the group has no live members (stop its consumers, or wait "
                "session_timeout_ms after they died)"
            )

    def new_empty_generation(
        self, latest: Generation, by: str, reason: str, overrides: Mapping[TP, int] | None = None
    ) -> Generation:
        """Seal ``latest`` and create the next generation with no members (and ``overrides`` committed)."""
        state = self.seal(latest, by)
        state.update(overrides or {})
        gen = Generation(
            latest.number + 1, latest.protocol, committed=state, created_ms=now_ms(), proposer=by, reason=reason
        )
        if not self.create_generation(gen):
            raise CommitFailedError(
                f"group {self.group!r} changed concurrently (generation {gen.number} was "
                "created by someone else); try again"
            )
        return gen

    def reset_offsets(self, offsets: Mapping[TP, int], by: str = "plog-cli") -> Generation:
        """Set committed offsets (Kafka's ``--reset-offsets --execute``): only when no member is alive."""
        self._require_inactive("resetting offsets")
        latest = self.latest_generation()
        return self.new_empty_generation(latest, by, "reset-offsets", offsets)

    def standalone_commit(self, offsets: Mapping[TP, int], by: str) -> None:
        """Commit for a consumer that uses ``assign()``: allowed only while the group has no live members.

        Dead members of the current generation are expired first (a new, empty
        generation), as Kafka's coordinator expires them after their session.
        """
        for _ in range(100):
            latest = self.latest_generation()
            if latest.members:
                self._require_inactive("committing without a subscription")
                latest = self.new_empty_generation(latest, by, "expired members for a standalone commit")
            try:
                self.append_commit(latest, by, offsets)
                return
            except GenerationSealed:
                continue
        raise CommitFailedError(f"group {self.group!r} keeps changing; commit not done")

    # -------------------------------------------------------------- describe, list, garbage

    def describe(self, at_ms: int | None = None) -> GroupDescription:
        """Members, their liveness and assignment, the owners and the committed offsets."""
        at = now_ms() if at_ms is None else at_ms
        latest = self.latest_generation()
        heartbeats = self.heartbeats()
        rebalancing = self.rebalance_marker_exists(latest.number)
        committed, source = self.committed_with_source(latest)
        members = []
        for member in sorted(set(latest.members) | set(heartbeats)):
            hb = heartbeats.get(member)
            if member not in latest.members and (hb is None or not hb.alive_at(at)):
                continue  # a departed member not yet collected
            info = latest.members.get(member, {})
            members.append(
                MemberInfo(
                    member,
                    str(hb.client_id if hb else info.get("client_id", "")),
                    bool(hb and hb.alive_at(at)),
                    hb.sent_ms if hb else None,
                    hb.generation if hb else -1,
                    tuple(hb.topics if hb else info.get("topics", ())),
                    latest.partitions_of(member),
                    bool(hb and hb.leaving),
                )
            )
        alive = any(m.alive for m in members)
        live = {m.member_id for m in members if m.alive}
        if rebalancing and alive:
            state = "PreparingRebalance"
        elif not alive:
            state = "Empty"
        else:
            state = "Stable"
        owners = {tp: m for tp, m in latest.owners().items() if m in live}  # a dead member owns nothing
        return GroupDescription(
            self.group, state, latest.number, latest.protocol, members, owners, committed, rebalancing, source
        )

    def collect_garbage(self, latest: Generation | None = None, at_ms: int | None = None) -> int:
        """Delete old generations, their markers and commit logs, and long-dead members' heartbeats.

        A generation older than the previous one goes once its successor is
        older than :data:`GC_DELAY_MS` (so no delayed commit can land in a
        collected log, A4); the newest two generations always stay.
        """
        at = now_ms() if at_ms is None else at_ms
        latest = latest or self.latest_generation()
        deleted = 0
        numbers = self.generation_numbers()
        for number in [0, *numbers]:
            if number >= latest.number - 1:
                break
            successor = self.generation(number + 1)
            if successor is None or at - successor.created_ms <= GC_DELAY_MS:
                continue
            deleted += self.store.delete_prefix(commits_prefix(self.group, number))
            for key in (rebalance_key(self.group, number), generation_key(self.group, number)):
                self.store.delete(key)  # absent keys (generation 0 has no object) are not an error
            with self._lock:
                self._generations.pop(number, None)
        for member, keys in self.heartbeat_keys().items():
            try:
                hb = Heartbeat.from_json(self.store.get(keys[-1]))
            except (ObjectNotFoundError, ValueError, KeyError):
                continue
            if at - hb.sent_ms > GC_DELAY_MS and member not in latest.members:
                for key in keys:
                    self.store.delete(key)
                    deleted += 1
        return deleted

    def _collect_log(self, generation: int) -> None:
        entries = self._log(generation)
        at = now_ms()
        for _seq, key in entries[:-2]:
            try:
                created = int(json.loads(self.store.get(key)).get("created_ms", at))
            except ObjectNotFoundError:
                continue
            if at - created <= GC_DELAY_MS:
                break
            self.store.delete(key)


def list_groups(store: Store) -> list[str]:
    """Names of the groups under a root."""
    names = set()
    for info in store.list(GROUPS):
        name = info.key[len(GROUPS) :].split("/", 1)[0]
        if TOPIC_NAME.match(name) and name not in (".", ".."):
            names.add(name)
    return sorted(names)


# ------------------------------------------------------------------------------------------- a live member


class RebalanceHooks(Protocol):
    """What a member asks of its consumer during a rebalance (all called from ``poll``)."""

    def commit_before_revoke(self) -> None:
        """Commit consumed positions if auto-commit is on (before partitions are revoked)."""

    def revoke(self, partitions: list[TP]) -> None:
        """The consumer stops reading ``partitions`` and calls ``on_partitions_revoked``."""

    def assign(self, generation: Generation, assigned: list[TP], added: list[TP], retained: list[TP]) -> None:
        """The consumer reads ``assigned`` from now on and calls ``on_partitions_assigned``."""


def choose_protocol(protocols: Mapping[str, Sequence[str]], previous: str | None) -> str | None:
    """The protocol most members support; ties: most first preferences, then the previous, then by name."""
    support = Counter(p for ps in protocols.values() for p in set(ps))
    if not support:
        return None
    best = max(support.values())
    candidates = {p for p, n in support.items() if n == best}
    votes = Counter(next(p for p in ps if p in candidates) for ps in protocols.values() if set(ps) & candidates)
    return sorted(candidates, key=lambda p: (-votes[p], p != previous, p))[0]


class GroupMember:
    """A consumer's membership in a group: a heartbeat thread, and the rebalance steps ``poll`` runs.

    The heartbeat thread writes heartbeats, watches the members, starts
    rebalances and completes them (creates the next generation). ``on_poll``,
    called by the consumer's ``poll``, acknowledges rebalances and adopts new
    generations, running the consumer's :class:`RebalanceHooks` (and so the
    user's listener) on the polling thread, as Kafka does.
    """

    def __init__(
        self,
        store: Store,
        group: str,
        *,
        client_id: str,
        strategies: Sequence[str],
        session_timeout_ms: int,
        heartbeat_interval_ms: int,
        max_poll_interval_ms: int,
        partitions_for: Callable[[Iterable[str]], dict[str, int]],
        metadata_max_age_ms: int = 5000,
    ) -> None:
        for strategy in strategies:
            if strategy not in STRATEGIES:
                raise InvalidConfigError(
                    f"partition_assignment_strategy {strategy!r} is unknown; known: {', '.join(STRATEGIES)}"
                )
        if not strategies:
            raise InvalidConfigError("partition_assignment_strategy needs at least one strategy")
        self.client = GroupClient(store, group)
        self.group = self.client.group
        self.member_id = make_member_id(client_id)
        self.client_id = client_id
        self.strategies = tuple(strategies)
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.max_poll_interval_ms = max_poll_interval_ms
        self.metadata_max_age_ms = metadata_max_age_ms
        self._partitions_for = partitions_for
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seq = -1
        self._last_key: str | None = None
        self._topics: tuple[str, ...] = ()
        # state owned by the polling thread (read by the heartbeat thread under the lock)
        self.adopted: Generation | None = None
        self.joined = -1
        self.owned: list[TP] = []
        self._left: str | None = None
        self._last_poll = time.monotonic()
        # observations of the heartbeat thread
        self._latest: Generation | None = None
        self._marker_for: int | None = None
        self._seen: dict[str, tuple[int, float]] = {}
        self._marker_seen: dict[int, float] = {}
        self._counts: dict[str, int] | None = None
        self._counts_key: tuple[str, ...] = ()
        self._counts_at = 0.0
        self._cycles = 0
        self.last_error: Exception | None = None
        self._failing_since: float | None = None

    # -------------------------------------------------------------- lifecycle

    def start(self, topics: Iterable[str]) -> None:
        """Join: announce the subscription and start heartbeating."""
        with self._lock:
            self._topics = tuple(sorted(set(topics)))
            self._last_poll = time.monotonic()
        self._write_heartbeat()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"plog-heartbeat-{self.member_id}", daemon=True)
            self._thread.start()

    def set_topics(self, topics: Iterable[str]) -> None:
        """Change the subscription (a rebalance follows)."""
        new = tuple(sorted(set(topics)))
        with self._lock:
            changed = new != self._topics
            self._topics = new
        if changed:
            self._wake.set()

    @property
    def topics(self) -> tuple[str, ...]:
        """The subscribed topics announced in heartbeats."""
        return self._topics

    def close(self) -> None:
        """Leave the group: stop heartbeating, announce it, and start the rebalance that replaces us."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, self.heartbeat_interval_ms / 1000 * 3))
            self._thread = None
        if self._left is None:
            self._leave("closed")

    def _leave(self, reason: str) -> None:
        with self._lock:
            self._left = reason
        try:
            self._write_heartbeat(leaving=True)
            latest = self.client.latest_generation()
            if self.member_id in latest.members:
                self.client.create_rebalance_marker(latest.number, self.member_id, f"{self.member_id} left: {reason}")
        except (PlogError, OSError) as exc:
            log.warning("group %s: member %s could not announce leaving: %s", self.group, self.member_id, exc)

    # -------------------------------------------------------------- heartbeat thread

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._cycle()
                self.last_error, self._failing_since = None, None
            except Exception as exc:  # noqa: BLE001 - the thread must survive storage hiccups; retried next cycle
                self.last_error = exc
                if self._failing_since is None:
                    self._failing_since = time.monotonic()
                log.warning("group %s: heartbeat of %s failed: %s", self.group, self.member_id, exc)
            self._wake.wait(self.heartbeat_interval_ms / 1000)
            self._wake.clear()

    def _own_heartbeat(self, leaving: bool = False) -> Heartbeat:
        with self._lock:
            return Heartbeat(
                self.member_id,
                self._seq,
                now_ms(),
                self.client_id,
                self._topics,
                self.strategies,
                self.session_timeout_ms,
                self.max_poll_interval_ms,
                self.adopted.number if self.adopted is not None else -1,
                self.joined,
                leaving,
            )

    def _write_heartbeat(self, leaving: bool = False) -> None:
        while True:
            with self._lock:
                self._seq += 1
            hb = self._own_heartbeat(leaving)
            key = heartbeat_key(self.group, self.member_id, hb.seq)
            if self.client.store.put_if_absent(key, hb.to_json(), durable=False):
                break
        if self._last_key is not None:
            self.client.store.delete(self._last_key)
        self._last_key = key

    def _cycle(self) -> None:
        with self._lock:
            if self._left is not None:
                return  # left (max.poll.interval.ms); the next poll rejoins
            idle = time.monotonic() - self._last_poll
        if idle * 1000 > self.max_poll_interval_ms:
            log.warning(
                "group %s: member %s did not poll for %.1f s > max_poll_interval_ms; leaving the group",
                self.group,
                self.member_id,
                idle,
            )
            self._leave("max_poll_interval_ms exceeded")
            return
        self._write_heartbeat()
        self._cycles += 1
        live = self._live(self.client.heartbeats())
        latest = self.client.latest_generation()
        marker = self.client.rebalance_marker_exists(latest.number)
        if not marker:
            reason = self._rebalance_reason(latest, live)
            if reason is not None:
                if self.client.create_rebalance_marker(latest.number, self.member_id, reason):
                    log.info("group %s: rebalancing generation %d: %s", self.group, latest.number, reason)
                marker = True
        if marker:
            first = self._marker_seen.setdefault(latest.number, time.monotonic())
            created = self._maybe_complete(latest, live, first)
            if created is not None:
                latest, marker = created, False
                self.client.collect_garbage(created)
        elif self._cycles % _GC_EVERY_CYCLES == 0:
            self.client.collect_garbage(latest)
        for number in [n for n in self._marker_seen if n < latest.number]:
            del self._marker_seen[number]
        with self._lock:
            if self._latest is None or latest.number >= self._latest.number:
                self._latest = latest
                self._marker_for = latest.number if marker else None

    def _live(self, heartbeats: Mapping[str, Heartbeat]) -> dict[str, Heartbeat]:
        """Members alive by local observation: their newest heartbeat changed within their session timeout."""
        now = time.monotonic()
        wall = now_ms()
        live: dict[str, Heartbeat] = {}
        for member, hb in heartbeats.items():
            if member == self.member_id:
                continue
            seen = self._seen.get(member)
            if seen is None:
                # first impression from the wall clock (ε): a heartbeat already too old counts as expired
                age_s = max(0.0, (wall - hb.sent_ms - MAX_CLOCK_SKEW_MS) / 1000)
                seen = (hb.seq, now - age_s)
            elif seen[0] != hb.seq:
                seen = (hb.seq, now)
            self._seen[member] = seen
            if not hb.leaving and now - seen[1] <= hb.session_timeout_ms / 1000:
                live[member] = hb
        for member in [m for m in self._seen if m not in heartbeats]:
            del self._seen[member]
        live[self.member_id] = self._own_heartbeat()
        return live

    def _counts_for(self, topics: Iterable[str], fresh: bool = False) -> dict[str, int]:
        """Partition counts of the existing ``topics`` (cached ``metadata_max_age_ms`` unless ``fresh``)."""
        wanted = tuple(sorted(set(topics)))
        now = time.monotonic()
        if (
            fresh
            or self._counts is None
            or self._counts_key != wanted
            or (now - self._counts_at) * 1000 > self.metadata_max_age_ms
        ):
            self._counts = dict(self._partitions_for(wanted))
            self._counts_key, self._counts_at = wanted, now
        return dict(self._counts)

    def _rebalance_reason(self, latest: Generation, live: Mapping[str, Heartbeat]) -> str | None:
        subscribed = {
            m: hb
            for m, hb in live.items()
            if hb.topics and not (m in latest.rejected and latest.protocol not in hb.protocols)
        }
        joined = sorted(set(subscribed) - set(latest.members))
        left = sorted(set(latest.members) - set(subscribed))
        if joined or left:
            return f"members joined {joined} left {left}"
        for member, hb in subscribed.items():
            if tuple(sorted(latest.members[member].get("topics", ()))) != tuple(sorted(hb.topics)):
                return f"{member} changed its subscription to {list(hb.topics)}"
            if latest.protocol is not None and latest.protocol not in hb.protocols:
                return f"{member} no longer supports {latest.protocol}"
        if subscribed:
            topics = {t for hb in subscribed.values() for t in hb.topics}
            counts = self._counts_for(topics)
            if counts != dict(latest.partitions):
                counts = self._counts_for(topics, fresh=True)  # a cached answer may be stale: ask again
                if counts != dict(latest.partitions):
                    return f"partitions changed: {dict(latest.partitions)} -> {counts}"
        if latest.revoking and all(
            subscribed[m].generation >= latest.number for m in latest.revoking if m in subscribed
        ):
            return "cooperative follow-up: the revoked partitions can be assigned"
        return None

    def _maybe_complete(
        self, latest: Generation, live: Mapping[str, Heartbeat], first_seen: float
    ) -> Generation | None:
        """Create generation ``latest + 1`` once every live member acknowledged (or the rebalance timeout)."""
        subscribed = {m: hb for m, hb in live.items() if hb.topics}
        acked = {m: hb for m, hb in subscribed.items() if hb.joined == latest.number + 1}
        waiting = set(subscribed) - set(acked)
        if waiting:
            timeout_s = max(hb.rebalance_timeout_ms for hb in subscribed.values()) / 1000
            if time.monotonic() - first_seen < timeout_s:
                return None
            log.warning(
                "group %s: members %s did not join generation %d within the rebalance timeout",
                self.group,
                sorted(waiting),
                latest.number + 1,
            )
        state = self.client.seal(latest, self.member_id)
        protocol = choose_protocol({m: hb.protocols for m, hb in acked.items()}, latest.protocol)
        members = {m: hb for m, hb in acked.items() if protocol in hb.protocols}
        rejected = {
            m: f"supports {list(hb.protocols)}; the group uses {protocol}"
            for m, hb in acked.items()
            if m not in members
        }
        counts = self._counts_for((t for hb in members.values() for t in hb.topics), fresh=True)
        owned = {m: latest.partitions_of(m) for m in members}
        if members and protocol is not None:
            subscriptions = {m: hb.topics for m, hb in members.items()}
            assignment, withheld = compute_assignment(protocol, counts, subscriptions, owned)
        else:
            assignment, withheld = {}, {}
        revoking: dict[str, list[TP]] = {}
        for tp, owner in sorted(withheld.items()):
            revoking.setdefault(owner, []).append(tp)
        gen = Generation(
            latest.number + 1,
            protocol,
            {
                m: {
                    "topics": list(hb.topics),
                    "client_id": hb.client_id,
                    "protocols": list(hb.protocols),
                    "session_timeout_ms": hb.session_timeout_ms,
                }
                for m, hb in sorted(members.items())
            },
            {m: tuple(tps) for m, tps in sorted(assignment.items())},
            {m: tuple(tps) for m, tps in revoking.items()},
            rejected,
            counts,
            state,
            now_ms(),
            self.member_id,
            f"rebalance of generation {latest.number}",
        )
        if self.client.create_generation(gen):
            log.info(
                "group %s: generation %d: %s",
                self.group,
                gen.number,
                {m: len(tps) for m, tps in gen.assignment.items()},
            )
            return gen
        return self.client.generation(latest.number + 1)

    # -------------------------------------------------------------- the polling thread

    def on_poll(self, hooks: RebalanceHooks) -> None:
        """Run from ``poll``: rejoin after leaving, adopt a new generation, acknowledge a rebalance.

        Raises the heartbeat thread's error once it has failed for longer than
        the session timeout (the group cannot work; the caller should know).
        """
        failing_since, error = self._failing_since, self.last_error
        if (
            error is not None
            and failing_since is not None
            and (time.monotonic() - failing_since) * 1000 > self.session_timeout_ms
        ):
            raise error
        with self._lock:
            self._last_poll = time.monotonic()
            left = self._left
        if left is not None:
            if self.owned:
                hooks.revoke(list(self.owned))
            with self._lock:
                self.owned, self.adopted, self.joined, self._left = [], None, -1, None
                self._latest, self._marker_for = None, None
            log.info("group %s: member %s rejoins after leaving (%s)", self.group, self.member_id, left)
            self._wake.set()
            return
        with self._lock:
            latest, marker_for = self._latest, self._marker_for
        if latest is None:
            return
        if self.adopted is None or latest.number > self.adopted.number:
            self._adopt(latest, hooks)
        adopted = self.adopted
        if adopted is not None and marker_for == adopted.number and self.joined != adopted.number + 1:
            if adopted.protocol not in COOPERATIVE and self.owned:
                hooks.commit_before_revoke()
                hooks.revoke(list(self.owned))
                self.owned = []
            with self._lock:
                self.joined = adopted.number + 1
            self._wake.set()

    def _adopt(self, gen: Generation, hooks: RebalanceHooks) -> None:
        previous = self.adopted
        member = self.member_id in gen.members
        if self.member_id in gen.rejected:
            raise InvalidConfigError(
                f"group {self.group!r}: partition_assignment_strategy {list(self.strategies)} is "
                f"inconsistent with the group's protocol {gen.protocol!r} (InconsistentGroupProtocol)"
            )
        mine = gen.partitions_of(self.member_id) if member else []
        revoked = [tp for tp in self.owned if tp not in mine]
        if revoked:
            hooks.revoke(revoked)
        added = [tp for tp in mine if tp not in self.owned]
        retained: list[TP] = []
        if previous is not None and gen.number == previous.number + 1 and self.member_id in previous.members:
            before = set(previous.partitions_of(self.member_id))
            retained = [tp for tp in mine if tp in before]
        with self._lock:
            self.adopted = gen
            self.owned = list(mine)
        if member:
            hooks.assign(gen, list(mine), added, retained)
        self._wake.set()

    @property
    def cooperative(self) -> bool:
        """Whether the adopted generation uses a cooperative protocol."""
        return self.adopted is not None and self.adopted.protocol in COOPERATIVE

    @property
    def left_reason(self) -> str | None:
        """Why the member left the group (and will rejoin on the next poll), or None."""
        return self._left

    def generation_wait(self, number: int, timeout_s: float) -> Generation | None:
        """Generation ``number`` once it exists, waiting up to ``timeout_s``; None if it does not appear."""
        deadline = time.monotonic() + timeout_s
        while True:
            gen = self.client.generation(number)
            if gen is not None or time.monotonic() >= deadline:
                return gen
            time.sleep(0.02)

    def commit(self, offsets: Mapping[TP, int]) -> None:
        """Commit ``offsets`` in the adopted generation; ``CommitFailedError`` if it lost a partition."""
        if self._left is not None:
            raise CommitFailedError(
                f"group {self.group!r}: member {self.member_id} left the group ({self._left}); its "
                "partitions may have been reassigned. Poll again to rejoin; records since the last commit "
                "will be redelivered"
            )
        gen = self.adopted
        if gen is None or self.member_id not in gen.members:
            raise CommitFailedError(
                f"group {self.group!r}: member {self.member_id} is not in the current "
                "generation (a rebalance is in progress); commit after it completes"
            )
        for _ in range(100):
            for tp in offsets:
                if not gen.may_commit(self.member_id, tp):
                    raise CommitFailedError(
                        f"group {self.group!r}: {tp[0]}-{tp[1]} is not assigned to member {self.member_id} "
                        f"in generation {gen.number}; the group has rebalanced and another member owns it"
                    )
            try:
                self.client.append_commit(gen, self.member_id, offsets)
                return
            except GenerationSealed:
                nxt = self.generation_wait(gen.number + 1, self.session_timeout_ms / 1000)
                if nxt is None:
                    raise CommitFailedError(
                        f"group {self.group!r}: generation {gen.number} ended and the next one is not ready "
                        "(rebalance in progress); commit again after the next poll"
                    ) from None
                if self.member_id not in nxt.members:
                    raise CommitFailedError(
                        f"group {self.group!r}: member {self.member_id} is not in generation {nxt.number}; "
                        "its partitions were reassigned"
                    ) from None
                gen = nxt
        raise CommitFailedError(f"group {self.group!r}: the group keeps rebalancing; commit not done")

    def wake(self) -> None:
        """Run a heartbeat cycle now."""
        self._wake.set()


def materialize_offsets(store: Store, decision: Any) -> None:
    """Write a committed transaction's consumer offsets into each group's commit log, once.

    The decision object is the atomic record (PROTOCOL.md 11.2); this copies
    its offsets where ``committed()`` reads them, and leaves a marker so that a
    later call (``init_transactions`` after a crash) does not apply them again.
    """
    marker = materialized_key(decision.producer_id, decision.txn)
    if store.exists(marker):
        return
    member = f"txn:{decision.producer_id}:{decision.txn}"
    for group, topics in decision.offsets.items():
        offsets = {(topic, int(p)): int(o) for topic, parts in topics.items() for p, o in parts.items()}
        client = GroupClient(store, group)
        for _ in range(_COMMIT_ATTEMPTS):
            try:
                client.append_commit(client.latest_generation(), member, offsets)
                break
            except GenerationSealed:
                continue  # a rebalance sealed it: the next generation takes the commit
        else:
            raise CommitFailedError(f"group {group}: could not record the offsets of transaction {decision.txn}")
    store.put_if_absent(marker, b"{}")
