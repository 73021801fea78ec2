"""GroupMember: a live member's heartbeat and polling threads, and the rebalance protocol (PROTOCOL.md 11.4, 13, I11).

It reads and writes the group through :class:`coordinator.groups.client.GroupClient`.
Kept whole (about 450 lines): the heartbeat cycle and the rebalance completion
are one state machine that reads best in one place.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from segment_format.errors import (
    CommitFailedError,
    InvalidConfigError,
    PlogError,
)
from segment_format.records import now_ms
from segment_format.stores.base import Store

from ..keys import (
    heartbeat_key,
)
from .assignors import COOPERATIVE, STRATEGIES, TP
from .client import GroupClient
from .completion import encoded_metadata, fits, next_generation
from .documents import CONSUMER, MAX_CLOCK_SKEW_MS, Generation, GenerationSealed, Heartbeat, make_member_id

log = logging.getLogger(__name__)

#: How often (in heartbeat cycles) a member collects the group's garbage besides after a rebalance.
_GC_EVERY_CYCLES = 1000
#: An idle member refreshes its heartbeat every session timeout / this (R, PROTOCOL.md 11.4): observers
#: expire it only after a whole session timeout without a new one, so it survives two missed refreshes
#: (Kafka's rule heartbeat.interval.ms <= session.timeout.ms / 3).
REFRESHES_PER_SESSION = 3
#: Δ at most: members of one process share a listing begun this long before a cycle (PROTOCOL.md 11.4).
LISTING_SHARED_MAX_S = 0.25
#: A member deletes its older heartbeats once it has more than this many, all in one request (PROTOCOL.md 11.4):
#: readers take the newest, so the others only lengthen the listing a little until then.
HEARTBEATS_KEPT = 16


class RebalanceHooks(Protocol):
    """What a member asks of its consumer during a rebalance (all called from ``poll``)."""

    def commit_before_revoke(self) -> None:
        """Commit consumed positions if auto-commit is on (before partitions are revoked)."""

    def revoke(self, partitions: list[TP]) -> None:
        """The consumer stops reading ``partitions`` and calls ``on_partitions_revoked``."""

    def assign(self, generation: Generation, assigned: list[TP], added: list[TP], retained: list[TP]) -> None:
        """The consumer reads ``assigned`` from now on and calls ``on_partitions_assigned``."""


class GroupMember:
    """A consumer's membership in a group: a heartbeat thread, and the rebalance steps ``poll`` runs.

    The heartbeat thread writes heartbeats (at once when what they announce
    changes, else every session timeout / 3 in place of a listing: one request
    per cycle when idle), watches the members, starts rebalances and completes
    them (creates the next generation). ``on_poll``,
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
        partitions_for: Callable[[Iterable[str], bool], dict[str, int]],
        metadata_max_age_ms: int = 5000,
        protocol_type: str = CONSUMER,
        metadata: Mapping[str, bytes] | None = None,
        client_assigns: bool = False,
        client: GroupClient | None = None,
    ) -> None:
        for strategy in strategies:
            if strategy not in STRATEGIES and not client_assigns:
                raise InvalidConfigError(
                    f"partition_assignment_strategy {strategy!r} is unknown; known: {', '.join(STRATEGIES)}"
                )
        if not strategies:
            raise InvalidConfigError("partition_assignment_strategy needs at least one strategy")
        # Members in one process may share a client: each heartbeat is then read once per process, not per member.
        self.client = client if client is not None else GroupClient(store, group)
        self.group = self.client.group
        self.member_id = make_member_id(client_id)
        self.client_id = client_id
        self.strategies = tuple(strategies)
        #: a member whose client may compute assignments announces its protocol type and metadata (11.4)
        self.protocol_type = protocol_type
        self.protocol_metadata = encoded_metadata(metadata or {})
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
        self._old_keys: list[str] = []  # our heartbeats older than the newest, not yet deleted
        self._last_key: str | None = None
        # the heartbeat schedule (PROTOCOL.md 11.4): what the newest heartbeat announced, when (monotonic) its
        # create began, and whether the last cycle refreshed it instead of listing the group
        self._refresh_s = session_timeout_ms / 1000 / REFRESHES_PER_SESSION
        #: at least two cycles fit into a refresh period: refreshes can replace listings (else both every cycle)
        self.sparse = 2 * heartbeat_interval_ms / 1000 <= self._refresh_s
        #: Δ: how much older than this cycle a listing another member of this process made may be (11.4)
        self.listing_shared_s = min(LISTING_SHARED_MAX_S, heartbeat_interval_ms / 1000 / 4)
        self._announced: tuple[object, ...] | None = None
        self._written_at = 0.0
        self._skipped_listing = False
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
        self.listings = 0  # cycles that listed the group
        self._gc_due = _GC_EVERY_CYCLES
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
                self.protocol_type,
                self.protocol_metadata,
            )

    def _announcement(self, hb: Heartbeat) -> tuple[object, ...]:
        """What a heartbeat tells the group besides being alive: a change is written at once."""
        return (hb.topics, hb.generation, hb.joined, hb.leaving, hb.protocol_type, tuple(sorted(hb.metadata.items())))

    def _plan(self) -> tuple[bool, bool]:
        """(create a heartbeat, list the group) for this cycle (PROTOCOL.md 11.4, *Heartbeats*).

        A change to what the heartbeat announces is written at once, followed by
        a listing; otherwise the heartbeat is refreshed so that consecutive ones
        begin at most R apart, in place of the listing unless the last cycle
        skipped it too. Without two cycles per R, both every cycle.
        """
        changed = self._announcement(self._own_heartbeat()) != self._announced
        interval_s = self.heartbeat_interval_ms / 1000
        due = time.monotonic() - self._written_at >= self._refresh_s - interval_s
        if changed or not self.sparse:
            write, listing = True, True
        elif due and not self._skipped_listing:
            write, listing = True, False
        else:
            write, listing = due, True
        self._skipped_listing = not listing
        return write, listing

    def _write_heartbeat(self, leaving: bool = False) -> None:
        started = time.monotonic()  # the schedule counts from the create's beginning (PROTOCOL.md 11.4)
        while True:
            with self._lock:
                self._seq += 1
            hb = self._own_heartbeat(leaving)
            key = heartbeat_key(self.group, self.member_id, hb.seq)
            if self.client.store.put_if_absent(key, hb.to_json(), durable=False):
                break
        self.client.remember_heartbeat(key, hb)  # our own: the next listing need not read it back
        self._announced, self._written_at = self._announcement(hb), started
        if self._last_key is not None:
            self._old_keys.append(self._last_key)
        self._last_key = key
        if self._old_keys and (leaving or len(self._old_keys) >= HEARTBEATS_KEPT):
            # One batch request instead of a DELETE per cycle; readers take the newest seq (11.4).
            old, self._old_keys = self._old_keys, []
            self.client.store.delete_many(old)

    def _cycle(self) -> None:
        began = time.monotonic()
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
        self._cycles += 1
        write, listing = self._plan()
        if write:
            self._write_heartbeat()
        if not listing:
            return  # a refresh only: one request this cycle, the next one lists
        self.listings += 1
        # One listing shows the heartbeats, the generations and the markers (PROTOCOL.md 11.4); only
        # heartbeats and generations not read before are fetched.
        # Another member of this process may have listed the group just before: at most Δ earlier (11.4).
        seen = self.client.listing(began_after=began - self.listing_shared_s)
        live = self._live(self.client.heartbeats(seen.heartbeat_keys))
        latest = self.client.latest_of(seen.generations)
        marker = latest.number in seen.markers
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
        elif self._cycles >= self._gc_due:
            self._gc_due = self._cycles + _GC_EVERY_CYCLES
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
            self._counts = dict(self._partitions_for(wanted, fresh))
            self._counts_key, self._counts_at = wanted, now
        return dict(self._counts)

    def _rebalance_reason(self, latest: Generation, live: Mapping[str, Heartbeat]) -> str | None:
        subscribed = {
            m: hb for m, hb in live.items() if hb.takes_part and not (m in latest.rejected and not fits(hb, latest))
        }
        joined = sorted(set(subscribed) - set(latest.members))
        left = sorted(set(latest.members) - set(subscribed))
        if joined or left:
            return f"members joined {joined} left {left}"
        if latest.client_assigned:
            # The leader's client watches the topics and rejoins (PROTOCOL.md 11.4, *Client-assigned generations*).
            for member, hb in subscribed.items():
                if not fits(hb, latest):
                    return f"{member} no longer supports {latest.protocol_type} protocol {latest.protocol}"
                if hb.metadata.get(str(latest.protocol)) != latest.members[member].get("metadata"):
                    return f"{member} changed its {latest.protocol} metadata"
            return None
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
        subscribed = {m: hb for m, hb in live.items() if hb.takes_part}
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
        gen = next_generation(latest, acked, state, self._counts_for, self.member_id)
        if self.client.create_generation(gen):
            log.info(
                "group %s: generation %d: %s",
                self.group,
                gen.number,
                {m: len(tps) for m, tps in gen.assignment.items()}
                if not gen.client_assigned
                else f"led by {gen.leader}",
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
