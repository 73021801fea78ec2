"""GroupClient: one process's view of a group's objects, and the writes any process may make (PROTOCOL.md 11.4).

Generations, rebalance markers, heartbeats read back, commit logs (each entry
the next numbered object, :mod:`segment_format.numbered`), administration and
garbage collection; also :func:`list_groups`.
A live member's protocol is in :mod:`coordinator.groups.member`.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from segment_format import numbered
from segment_format.errors import (
    CommitFailedError,
    ConcurrentCreateError,
    CorruptRecordError,
    ObjectNotFoundError,
)
from segment_format.layout import TOPIC_NAME
from segment_format.numbered import parse_number
from segment_format.records import now_ms
from segment_format.stores.base import Store

from ..keys import (
    GROUPS,
    assignment_key,
    assignments_prefix,
    commit_key,
    commits_prefix,
    generation_key,
    generations_prefix,
    group_prefix,
    lag_offsets_prefix,
    members_prefix,
    rebalance_key,
    rebalances_prefix,
    validate_group_id,
)
from .assignors import TP
from .description import describe_group
from .documents import (
    ClientAssignment,
    CommitEntry,
    Generation,
    GenerationSealed,
    GroupDescription,
    Heartbeat,
    offsets_from_json,
    offsets_to_json,
)

log = logging.getLogger(__name__)

#: D for groups: a sealed generation's objects, and the heartbeats of long-dead members, are deleted only
#: this long after they stopped mattering (the role ``file.delete.delay.ms`` plays for segments, assumption A4).
GC_DELAY_MS = 20 * 60 * 1000
#: W for commit logs: a commit entry is never created from a listing older than this (assumption A4).
MAX_STALENESS_MS = 10_000
#: Commit-log entries are garbage-collected every this many commits (the newest two always stay).
_LOG_GC_EVERY = 64
#: How long a member waits for a listing another member of its process began (then it lists itself).
_SHARED_LISTING_WAIT_S = 5.0
#: Retry budget for re-reading a commit log that changes under us and for following sealed generations
#: (creates themselves use segment_format.numbered.MAX_CREATE_ATTEMPTS).
COMMIT_ATTEMPTS = 1000


class _SealedLog(Exception):
    """Raised inside a commit-log create to stop it: the log is sealed at entry ``seq`` with ``state``."""

    def __init__(self, seq: int, state: dict[TP, int]) -> None:
        super().__init__(seq)
        self.seq, self.state = seq, state


@dataclass
class GroupListing:
    """What one listing of a group's prefix (past its commit logs) shows (PROTOCOL.md 11.4, *One listing per cycle*)."""

    #: member id -> its heartbeat keys, oldest first
    heartbeat_keys: dict[str, list[str]] = field(default_factory=dict)
    #: numbers of the generation objects, ascending
    generations: list[int] = field(default_factory=list)
    #: generations whose rebalance marker exists
    markers: set[int] = field(default_factory=set)


class GroupClient:
    """Reads and writes one group's objects. Stateless apart from a cache of immutable generations."""

    def __init__(self, store: Store, group: str) -> None:
        self.store = store
        self.group = validate_group_id(group)
        self._generations: dict[int, Generation] = {}
        self._assignments: dict[int, ClientAssignment] = {}
        #: the newest listing of the group and when it began (monotonic), for members sharing this client
        self._listing: tuple[float, GroupListing] | None = None
        #: the listing under way, if any: when it began and the event set when it ends
        self._in_flight: tuple[float, threading.Event] | None = None
        self._heartbeats: dict[str, Heartbeat] = {}
        #: heartbeat keys found damaged -> wall-clock ms when first found (objects never change, assumption A3:
        #: never re-read)
        self._damaged: dict[str, int] = {}
        self._lock = threading.Lock()

    # -------------------------------------------------------------- one listing

    def listing(self, began_after: float | None = None) -> GroupListing:
        """Heartbeats, generations and rebalance markers from ONE listing of the group's prefix.

        The listing starts after ``commits0``: every ``commits/`` key sorts before
        it (``/`` < ``0``) and the other parts after it, so the commit logs, the
        part of a group that grows with traffic, are never paged through. With
        ``began_after`` (monotonic seconds), the newest listing this client made
        is returned instead of a new one if it began no earlier: the members of
        one process share listings (PROTOCOL.md 11.4, *Members of one process
        share listings*). A listing is never changed once made.
        """
        if began_after is not None:
            shared = self._shared_listing(began_after)
            if shared is not None:
                return shared
        began = time.monotonic()
        done = threading.Event()
        with self._lock:
            self._in_flight = (began, done)
        try:
            out = self._list()
            with self._lock:
                if self._listing is None or began > self._listing[0]:
                    self._listing = (began, out)
        finally:
            done.set()  # a failed listing lets its waiters list for themselves
        return out

    def _shared_listing(self, began_after: float) -> GroupListing | None:
        """The newest listing begun no earlier than ``began_after``, waiting for one under way; None if none."""
        with self._lock:
            shared, in_flight = self._listing, self._in_flight
        if shared is not None and shared[0] >= began_after:
            return shared[1]
        if in_flight is None or in_flight[0] < began_after:
            return None
        # Many members starting their cycles together would otherwise all list at once, each as long as the group.
        in_flight[1].wait(_SHARED_LISTING_WAIT_S)
        with self._lock:
            shared = self._listing
        return shared[1] if shared is not None and shared[0] >= began_after else None

    def _list(self) -> GroupListing:
        prefix, members = group_prefix(self.group), members_prefix(self.group)
        keys = [info.key for info in self.store.list_after(prefix, prefix + "commits0")]
        out = GroupListing()
        out.generations = numbered.numbers_in(keys, generations_prefix(self.group))
        out.markers = set(numbered.numbers_in(keys, rebalances_prefix(self.group)))
        for key in keys:
            if key.startswith(members):
                member, _, name = key[len(members) :].partition("/")
                if member and parse_number(name) is not None:
                    out.heartbeat_keys.setdefault(member, []).append(key)
        return out

    def latest_of(self, numbers: list[int]) -> Generation:
        """The newest readable generation among ``numbers`` (generation 0 if none)."""
        for number in reversed(numbers):
            gen = self.generation(number)
            if gen is not None:
                return gen
        return Generation(0)

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
        key = generation_key(self.group, number)
        try:
            gen = Generation.from_json(self.store.get(key), what=key, keyed={"generation": number})
        except ObjectNotFoundError:
            return Generation(0) if number == 0 else None
        with self._lock:
            self._generations[number] = gen
        return gen

    def latest_generation(self) -> Generation:
        """The newest generation (generation 0 if none was ever created)."""
        return self.latest_of(self.generation_numbers())

    def create_generation(self, gen: Generation) -> bool:
        """Create ``gen`` with put-if-absent; False if it already exists (another proposal won)."""
        created = numbered.create(self.store, generations_prefix(self.group), gen.number, gen.to_json())
        if created:
            with self._lock:
                self._generations[gen.number] = gen
        return created

    # -------------------------------------------------------------- client-assigned generations

    def client_assignment(self, generation: int) -> ClientAssignment | None:
        """The leader's assignment of client-assigned generation ``generation``; None until it exists."""
        with self._lock:
            cached = self._assignments.get(generation)
        if cached is not None:
            return cached
        key = assignment_key(self.group, generation)
        try:
            found = ClientAssignment.from_json(self.store.get(key), what=key, keyed={"generation": generation})
        except ObjectNotFoundError:
            return None
        with self._lock:
            self._assignments[generation] = found
        return found

    def create_client_assignment(
        self, gen: Generation, leader: str, assignment: Mapping[str, bytes]
    ) -> ClientAssignment:
        """Store the leader's assignment of ``gen`` once (put-if-absent); the one stored, this or an earlier one.

        Only ``gen``'s leader may (PROTOCOL.md 11.4, *Client-assigned generations*): ``ValueError`` otherwise.
        """
        if not gen.client_assigned or gen.leader != leader:
            raise ValueError(f"group {self.group!r}: {leader} does not lead generation {gen.number}")
        doc = ClientAssignment(
            gen.number,
            leader,
            {m: base64.b64encode(bytes(data)).decode() for m, data in sorted(assignment.items())},
            now_ms(),
        )
        if numbered.create(self.store, assignments_prefix(self.group), gen.number, doc.to_json()):
            with self._lock:
                self._assignments[gen.number] = doc
            return doc
        found = self.client_assignment(gen.number)
        if found is None:  # created, then collected: only after its generation was long replaced
            raise ObjectNotFoundError(assignment_key(self.group, gen.number))
        return found

    # -------------------------------------------------------------- rebalance markers

    def rebalance_marker_exists(self, generation: int) -> bool:
        """Whether generation ``generation`` is being replaced."""
        return self.store.exists(rebalance_key(self.group, generation))

    def create_rebalance_marker(self, generation: int, by: str, reason: str) -> bool:
        """Start replacing ``generation`` (put-if-absent; False if someone already did)."""
        body = json.dumps({"generation": generation, "by": by, "reason": reason, "created_ms": now_ms()})
        return numbered.create(self.store, rebalances_prefix(self.group), generation, body.encode(), durable=False)

    # -------------------------------------------------------------- heartbeats

    def remember_heartbeat(self, key: str, hb: Heartbeat) -> None:
        """Cache a heartbeat this process wrote (objects never change), so reading the group skips its GET."""
        with self._lock:
            self._heartbeats[key] = hb

    def heartbeat_keys(self) -> dict[str, list[str]]:
        """Member id -> its heartbeat keys, oldest first."""
        prefix = members_prefix(self.group)
        out: dict[str, list[str]] = {}
        for info in self.store.list(prefix):
            member, _, name = info.key[len(prefix) :].partition("/")
            if parse_number(name) is not None:
                out.setdefault(member, []).append(info.key)
        return out

    def heartbeats(self, keys: Mapping[str, list[str]] | None = None) -> dict[str, Heartbeat]:
        """The newest readable heartbeat of every member that has one (from ``keys``, else a listing of them).

        Only heartbeats not read before are fetched: objects never change (assumption A3).
        A damaged heartbeat counts as absent (PROTOCOL.md 11.4, *Damaged
        heartbeats*): the member's newest heartbeat below it counts, so one
        member's damaged object never stops the others' liveness checks.
        """
        out: dict[str, Heartbeat] = {}
        keys = self.heartbeat_keys() if keys is None else keys
        for member, member_keys in keys.items():
            hb = self._newest_readable(member_keys)
            if hb is not None:
                out[member] = hb
        live_keys = {k for ks in keys.values() for k in ks}
        with self._lock:
            for key in [k for k in self._heartbeats if k not in live_keys]:
                del self._heartbeats[key]
            for key in [k for k in self._damaged if k not in live_keys]:
                del self._damaged[key]
        return out

    def _newest_readable(self, member_keys: list[str], found_ms: int | None = None) -> Heartbeat | None:
        """The heartbeat of the highest key in ``member_keys`` (oldest first) that exists and decodes.

        A key found damaged now is remembered as found at ``found_ms`` (default: now).
        """
        for key in reversed(member_keys):
            with self._lock:
                cached = self._heartbeats.get(key)
                damaged = key in self._damaged
            if cached is not None:
                return cached
            if damaged:
                continue  # already warned about; its bytes cannot have changed (assumption A3)
            try:
                hb = Heartbeat.from_json(self.store.get(key), what=key)
            except ObjectNotFoundError:
                continue  # its member moved on and deleted it: the previous one (or next listing) counts
            except CorruptRecordError as exc:
                # One member's damaged object must not stall the group: it is that member's missing heartbeat.
                log.warning("group %s: ignoring damaged heartbeat %s as if absent: %s", self.group, key, exc)
                with self._lock:
                    self._damaged.setdefault(key, now_ms() if found_ms is None else found_ms)
                continue
            with self._lock:
                self._heartbeats[key] = hb
            return hb
        return None

    def damaged_heartbeats(self) -> list[str]:
        """Keys of the heartbeats this client found damaged (and ignored) that were still listed last time."""
        with self._lock:
            return sorted(self._damaged)

    def active_members(self, at_ms: int | None = None) -> list[str]:
        """Members alive by the wall-clock rule (one-shot observers): not leaving, heard from recently."""
        at = now_ms() if at_ms is None else at_ms
        return sorted(m for m, hb in self.heartbeats().items() if hb.alive_at(at))

    # -------------------------------------------------------------- commit logs

    def _log(self, generation: int) -> list[tuple[int, str]]:
        entries = []
        for info in self.store.list(commits_prefix(self.group, generation)):
            n = parse_number(info.key)
            if n is not None:
                entries.append((n, info.key))
        return sorted(entries)

    def log_state(self, gen: Generation) -> tuple[int, dict[TP, int], bool]:
        """(next entry number, committed state, sealed) of ``gen``'s commit log."""
        for _ in range(COMMIT_ATTEMPTS):
            entries = self._log(gen.number)
            if not entries:
                return 0, dict(gen.committed), False
            seq, key = entries[-1]
            try:
                entry = self._entry(gen.number, seq, key)
            except ObjectNotFoundError:
                continue  # collected under us: list again
            return seq + 1, dict(entry.state), entry.sealed
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
            entry = self._entry(gen.number, seq - 1, commit_key(self.group, gen.number, seq - 1))
        except ObjectNotFoundError:
            return None
        return dict(entry.state), entry.sealed

    def _entry(self, generation: int, seq: int, key: str) -> CommitEntry:
        """Commit-log entry ``seq`` of ``generation``, stored at ``key``; corrupt unless it says it is that entry."""
        return CommitEntry.from_json(self.store.get(key), what=key, keyed={"generation": generation, "seq": seq})

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
        keys = sorted(info.key for info in self.store.list(prefix) if parse_number(info.key) is not None)
        for key in reversed(keys):
            try:
                body = self.store.get(key)
            except ObjectNotFoundError:
                continue
            try:
                return offsets_from_json(json.loads(body))
            except (ValueError, TypeError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
                raise CorruptRecordError(f"{key}: not offsets by partition: {exc}", key=key) from exc
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
        return describe_group(self, at_ms)

    def collect_garbage(self, latest: Generation | None = None, at_ms: int | None = None) -> int:
        """Delete old generations, their markers and commit logs, and long-dead members' heartbeats.

        A generation older than the previous one goes once its successor is
        older than :data:`GC_DELAY_MS` (so no delayed commit can land in a
        collected log, assumption A4); the newest two generations always stay.
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
            # One batch request; absent keys (generation 0 has no object) are not an error.
            self.store.delete_many(
                [
                    rebalance_key(self.group, number),
                    assignment_key(self.group, number),
                    generation_key(self.group, number),
                ]
            )
            with self._lock:
                self._generations.pop(number, None)
                self._assignments.pop(number, None)
        for member, keys in self.heartbeat_keys().items():
            if member in latest.members:
                continue
            hb = self._newest_readable(keys, at)
            if hb is not None:
                # judged by its newest readable heartbeat (a damaged one above it is absent, PROTOCOL.md 11.4)
                silent_since = hb.sent_ms
            else:
                with self._lock:
                    first_found = self._damaged.get(keys[-1])
                if first_found is None:
                    continue  # all gone since the listing
                # Nothing readable: the damaged newest key has stayed the newest since we first found it, and a
                # live member writes seq + 1 within R, so after D of that no live member's heartbeat is lost.
                silent_since = first_found
            if at - silent_since > GC_DELAY_MS:
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
