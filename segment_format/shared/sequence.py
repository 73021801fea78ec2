"""A shared topic's sequence of commits as one process knows it (PROTOCOL.md 7.3).

::

    commits/ 00..00-00..32.g1.json  00..32-00..48.g1.json  00..48.json  00..49.json  00..50.json
             [ commit range: 0..31 ][ commit range: 32..47 ][ 48 ]      [ 49 ]      [ 50 ]   <- head
             the commit frontier is 48: ranges up to it, plain commits from it on

:class:`TopicSequence` resolves that chain from one listing (ranges walked as 7.2 walks rewritten
objects, then the plain commits in order), reads each element once (they never change), follows the
head with one GET per check, and commits a flush's runs: ``commits/<head+1>`` with ``put_if_absent``,
re-reading the winner's commit after a lost race and retrying on its state, never rewriting the data.
"""

from __future__ import annotations

import collections
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .. import numbered
from ..errors import ConcurrentAppendError, CorruptRecordError, ObjectNotFoundError, StorageError
from ..records import now_ms
from ..stores.base import ObjectInfo, Store
from .commit import COMMITS, ROW_FIELDS, Commit, CommitEntry, commit_key, parse_commit_name
from .object import RunRows

__all__ = ["CommitElement", "TopicSequence", "COMMIT_DEADLINE_MS"]

#: ``C`` of PROTOCOL.md 7.3: no commit is issued for a shared object created longer ago than this.
COMMIT_DEADLINE_MS = 30 * 60 * 1000
#: How long a commit keeps retrying lost races before it fails for contention (PROTOCOL.md 8, step 5).
CONTENTION_TIMEOUT_S = 120.0
CONTENTION_BACKOFF_MAX_S = 0.05
#: The longest a writer waits, after a contended commit, before its next (two round trips of a create).
COURTESY_MAX_S = 0.2
#: Races a writer loses in a row before it backs off: the winners' courtesy waits take turns; this only
#: spreads out a storm of writers that keep missing them.
LOSSES_BEFORE_BACKOFF = 6
#: How many of the newest commits a writer looks at to count the other writers and its share.
RECENT_COMMITS = 64
#: How many of its own commits a writer remembers making: enough for a tier it completed to still count as its
#: own when a gateway, which spaces its tier merges, comes to merge it (PROTOCOL.md 10.2).
MADE_REMEMBERED = 1024
#: How far back (commit times, ms) a writer's share of the recent commits is counted.
SHARE_WINDOW_MS = 10_000
#: ``ε`` of assumption A4: a committer of objects another process wrote reads their ``created_ms`` off that
#: process's clock, and keeps this much more inside the commit deadline (PROTOCOL.md 7.3).
FOREIGN_CLOCK_SKEW_MS = 1_000
#: Store errors tolerated in one commit before giving up (each may or may not have created it).
MAX_AMBIGUOUS_FAILURES = 5


class ObjectKeeper(Protocol):
    """Whole objects kept in memory, bounded, each taken once (``log.object_bytes.ObjectBytesCache``)."""

    def put(self, key: str, data: bytes) -> None:
        """Keep ``data``, the whole object ``key`` (or drop it, over the bound)."""

    def take(self, key: str) -> bytes | None:
        """The object's bytes if kept, removing them."""


class CommitChainGapError(CorruptRecordError):
    """A listing of commits that does not join up: corruption, unless a new listing joins up."""


@dataclass(frozen=True)
class CommitElement:
    """One element of the commit chain: commits ``[first, end)``, its key, its document."""

    first: int
    end: int
    generation: int
    key: str
    commit: Commit


class TopicSequence:
    """One shared topic incarnation's commit chain, head and state, kept current cheaply; thread-safe."""

    def __init__(self, store: Store, incarnation: str, config: dict[str, Any], name: str) -> None:
        self.store = store
        #: ``topics/<topic>/<topic_id>/``.
        self.incarnation = incarnation
        self.prefix = incarnation + COMMITS
        self.config = config
        self.name = name
        self._lock = threading.RLock()
        self._docs: dict[str, Commit] = {}
        self.elements: list[CommitElement] = []
        #: Commit documents of the last listing that a range on the chain covers, by the key of that range
        #: (collected D after it, PROTOCOL.md 10.2).
        self.superseded: dict[str, str] = {}
        #: When the chain was last known current (monotonic s): its listing, its last head probe, or a commit
        #: this process created. Writers act only on knowledge younger than W (PROTOCOL.md 2, assumption A4).
        self.learned_monotonic = float("-inf")
        self.checked_monotonic = float("-inf")
        #: The commit number this process last tried to create: where a commit that failed ambiguously may be.
        self.last_tried: int | None = None
        #: Commits created by this process, and races for a number it lost to another writer (their ratio is
        #: the contention a topic's writers see, ``benchmarks/bench_contention.py``).
        self.commits_made = 0
        self.races_lost = 0
        #: How long this process waits before its next commit: two round trips of a create per other writer
        #: that committed in the last second (or that it lost to), so that they can take the next numbers
        #: before this one comes back for them (fairness, PROTOCOL.md 7.3, *Contention*).
        self.courtesy_s = 0.0
        #: The numbers of this process's recent commits, oldest first and as a set (whose commits are the others').
        self._made: collections.deque[int] = collections.deque(maxlen=MADE_REMEMBERED)
        self._made_set: set[int] = set()
        #: Small shared objects this process created, whole, for the copy of its own tier's merge (PROTOCOL.md
        #: 10.2, *A writer merges its small tier*): one cache per root, shared by its topics; None keeps none.
        self.own_objects: ObjectKeeper | None = None
        #: The tier end (``F + 16``) this process last merged or tried to: a failed merge is left to passes.
        self.tier_tried: int | None = None

    # ------------------------------------------------------------------ what is known

    @property
    def head(self) -> Commit | None:
        """The newest commit known, None for a topic that has none (or was not resolved yet)."""
        return self.elements[-1].commit if self.elements else None

    def made(self, sequence: int) -> bool:
        """Whether commit ``sequence`` is one of this process's recent commits."""
        return sequence in self._made_set

    def end_of(self, partition: int, chain_end: int = 0) -> int:
        """Partition ``partition``'s log end: the head's ``ends[p]``, else ``chain_end`` (no commit yet)."""
        head = self.head
        return chain_end if head is None or partition >= len(head.ends) else max(chain_end, head.ends[partition])

    def entries_for(self, partition: int, chain_end: int) -> list[tuple[CommitElement, CommitEntry]]:
        """Partition ``partition``'s commit part: its entries ending after ``chain_end``, in chain order, checked
        to join up from at most ``chain_end`` (PROTOCOL.md 7.3 step 3); :class:`CommitChainGapError` if not.

        The walk starts at the head and stops at the partition's first entry ending by ``chain_end``: along the
        chain a partition's runs only move forward (each commit's runs start where the commit before left the
        partition, 7.3), so none before it ends later. A writer's flush then costs the runs it adds, not the
        length of a chain that nothing collected yet. An entry ending out of order behind that point is refused
        as a gap, where a walk from the tail would have stepped over it."""
        out = self._entries_after(partition, chain_end)
        position: int | None = None
        for element, entry in out:
            expected = chain_end if position is None else position
            if (position is None and entry.base_offset > chain_end) or (
                position is not None and entry.base_offset != expected
            ):
                raise CommitChainGapError(
                    f"{self.name}-{partition}: a commit's run starts at {entry.base_offset}, expected "
                    f"{'at most ' if position is None else ''}{expected}",
                    key=element.key,
                )
            position = entry.next_offset
        return out

    def object_entries(self, data_key: str) -> list[CommitEntry]:
        """The entries of shared object ``data_key``: the runs it holds of this topic, from the newest element that
        names it. A flush's object is in one commit of a topic (PROTOCOL.md 7.3) and an element covers whole
        commits, so the walk stops there, and a followed topic's new objects are found at the head. Empty when no
        element the sequence holds names it."""
        for element in reversed(self.elements):
            entries = [entry for entry in element.commit.entries if entry.object == data_key]
            if entries:
                return entries
        return []

    def _entries_after(self, partition: int, chain_end: int) -> list[tuple[CommitElement, CommitEntry]]:
        """Partition ``partition``'s entries from the head back to the first one ending by ``chain_end``, in
        chain order (unchecked)."""
        found: list[tuple[CommitElement, CommitEntry]] = []
        for element in reversed(self.elements):
            for entry in reversed(element.commit.entries):
                if entry.partition != partition:
                    continue
                if entry.next_offset <= chain_end:
                    found.reverse()
                    return found
                found.append((element, entry))
        found.reverse()
        return found

    # ------------------------------------------------------------------ resolving

    def resolve(self, listing: Sequence[ObjectInfo] | None = None, listed_monotonic: float | None = None) -> None:
        """Resolve the chain from ``listing`` (a listing of the incarnation or of its commits taken at
        ``listed_monotonic``), or from a fresh listing of the commits."""
        with self._lock:
            checked = time.monotonic() if listing is None or listed_monotonic is None else listed_monotonic
            infos = self.store.list(self.prefix) if listing is None else listing
            elements, superseded = self._walk(infos)
            listed = {info.key for info in infos}
            self._docs = {key: doc for key, doc in self._docs.items() if key in listed}  # collected ones go
            if checked >= self.checked_monotonic or not self.elements or elements[-1:] != self.elements[-1:]:
                self.elements, self.superseded = elements, superseded
                self.checked_monotonic = self.learned_monotonic = checked

    def forget(self, count: int) -> None:
        """Drop the first ``count`` elements, collected (PROTOCOL.md 10.2); the head is never among them."""
        with self._lock:
            count = min(count, len(self.elements) - 1)
            for element in self.elements[:count]:
                self._docs.pop(element.key, None)
            self.elements = self.elements[max(count, 0) :]

    def _walk(self, infos: Sequence[ObjectInfo]) -> tuple[list[CommitElement], dict[str, str]]:
        parsed: list[tuple[int, int, int, str]] = []
        for info in infos:
            if not info.key.startswith(self.prefix):
                continue
            name = info.key[len(self.prefix) :]
            found = parse_commit_name(name)
            if found is not None:
                parsed.append((*found, info.key))
        if not parsed:
            return [], {}
        ranges = [p for p in parsed if p[2] >= 1]
        plain = sorted(p for p in parsed if p[2] == 0)
        chosen: list[tuple[int, int, int, str]] = []
        frontier = max((r[1] for r in ranges), default=None)
        position = min(p[0] for p in parsed)
        if frontier is not None:
            while position < frontier:
                covering = [r for r in ranges if r[0] <= position < r[1]]
                if not covering:
                    raise CommitChainGapError(f"{self.name}: no commit range covers commit {position}", key=self.prefix)
                best = max(covering, key=lambda r: (r[1], r[2]))
                chosen.append(best)
                position = best[1]
        for first, end, gen, key in plain:
            if end <= position:
                continue  # covered by a range
            if first != position:
                raise CommitChainGapError(
                    f"{self.name}: commit {first} follows commit {position - 1}: commits are missing", key=key
                )
            chosen.append((first, end, gen, key))
            position = end
        elements = [CommitElement(first, end, gen, key, self._read(key, first, end)) for first, end, gen, key in chosen]
        for before, after in zip(elements, elements[1:], strict=False):
            _check_follows(before, after.commit, after.key)
        on_chain = {key for _, _, _, key in chosen}
        superseded = {}
        for first, _end, _gen, key in parsed:
            cover = next((c for c in chosen if c[2] >= 1 and c[0] <= first < c[1]), None)
            if key not in on_chain and cover is not None:
                superseded[key] = cover[3]
        return elements, superseded

    def _read(self, key: str, first: int, end: int) -> Commit:
        found = self._docs.get(key)
        if found is None:
            found = Commit.parse(self.store.get(key), key, first, end)
            self._docs[key] = found
        return found

    def follow_head(self, unless_checked_after: float = float("inf")) -> bool:
        """Extend the chain with the commits after the head (one GET each, one more that finds none).

        A probe is trusted only while probes come less than D/2 apart (PROTOCOL.md 9): after a longer pause the
        chain is listed again. No request when the chain was checked after ``unless_checked_after`` (a
        :func:`time.monotonic` reading: what the caller's other knowledge dates from). Returns whether the chain
        grew.
        """
        with self._lock:
            now = time.monotonic()
            if self.checked_monotonic > unless_checked_after:
                return False
            if now - self.checked_monotonic >= self.config["file.delete.delay.ms"] / 2000:
                before = self.head.sequence if self.head is not None else -1
                self.resolve()
                return (self.head.sequence if self.head is not None else -1) > before
            self.checked_monotonic = now
            grew = False
            while True:
                # A chain listed empty less than D/2 ago: its first commit, when it comes, is commit 0 (7.3).
                sequence = self.elements[-1].end if self.elements else 0
                key = commit_key(self.incarnation, sequence)
                try:
                    commit = self._read(key, sequence, sequence + 1)
                except ObjectNotFoundError:
                    # The probe proves the next number absent now: the head is known as of this round (7.3).
                    self.learned_monotonic = max(self.learned_monotonic, now)
                    return grew
                if self.elements:
                    _check_follows(self.elements[-1], commit, key)
                self.elements.append(CommitElement(sequence, sequence + 1, 0, key, commit))
                grew = True

    # ------------------------------------------------------------------ committing

    def commit(
        self,
        runs: Sequence[RunRows],
        object_key: str,
        object_created_ms: int,
        *,
        partitions: int,
        log_append_time: bool = False,
        transaction_timeout_ms: int | None = None,
        before_create: Callable[[], None] | None = None,
        writer: str = "",
        run_objects: Sequence[str] | None = None,
    ) -> Commit:
        """Claim offsets for ``runs`` (this topic's runs of shared object ``object_key``): create the next commit.

        ``run_objects``: the object of each run, when the runs are in several objects that other processes wrote
        (the Spark sink's tasks, committed by its driver: PROTOCOL.md 7.3, *Committing other processes'
        objects*); ``object_created_ms`` is then the oldest's time from its key, read on another clock, and the
        deadline is ``C`` less the clock-skew bound.
        ``partitions``: the topic's partition count as the writer knows it (the state never shrinks).
        ``before_create`` runs before every try (a typed topic's schema check, 11.8). Raises
        :class:`ConcurrentAppendError` after 120 s of lost races, ``StorageError`` after repeated ambiguous
        failures (the commit may then exist: its records are not acknowledged).
        """
        staleness_s = self.config["writer.max.staleness.ms"] / 1000
        deadline_ms = COMMIT_DEADLINE_MS if run_objects is None else COMMIT_DEADLINE_MS - FOREIGN_CLOCK_SKEW_MS
        objects = [object_key] * len(runs) if run_objects is None else list(run_objects)
        if len(objects) != len(runs):
            raise ValueError("run_objects names one object per run")
        commit_id = secrets.token_hex(16)
        started = time.monotonic()
        lost = failures = 0
        with self._lock:
            if self.courtesy_s:
                time.sleep(self.courtesy_s)
                self.follow_head()  # one GET: the commit a writer that lost made meanwhile, if it did
            while True:
                if lost and time.monotonic() - started > CONTENTION_TIMEOUT_S:
                    raise ConcurrentAppendError(
                        f"commit to {self.name} lost the race for offsets {lost} times in {CONTENTION_TIMEOUT_S:.0f} s"
                    )
                if time.monotonic() - self.learned_monotonic > staleness_s:
                    self.resolve()  # no create is issued on knowledge older than W (assumption A4)
                if now_ms() - object_created_ms > deadline_ms:
                    raise StorageError(
                        f"{self.name}: shared object {object_key} is older than the commit deadline "
                        f"({deadline_ms / 60000:g} min): it is not committed"
                    )
                if before_create is not None:
                    before_create()
                head = self.head
                sequence = 0 if head is None else head.sequence + 1
                commit = self._build(
                    sequence, commit_id, runs, objects, partitions, log_append_time, transaction_timeout_ms, writer
                )
                key = commit_key(self.incarnation, sequence)
                self.last_tried = sequence
                errored = False
                create_started = time.monotonic()
                try:
                    with self.store.deadline(self.learned_monotonic + staleness_s):
                        created = self.store.put_if_absent(key, commit.to_json())
                except StorageError:
                    failures += 1
                    if failures > MAX_AMBIGUOUS_FAILURES:
                        raise
                    created, errored = False, True
                if not created:
                    try:
                        winner = self._read(key, sequence, sequence + 1)
                    except ObjectNotFoundError:
                        continue  # a failed create that did not land: try the same number again
                    if winner.commit_id == commit_id:
                        created, commit = True, winner  # an earlier try of ours landed (7.3, 11.1)
                    else:
                        if self.elements:
                            _check_follows(self.elements[-1], winner, key)
                        self.elements.append(CommitElement(sequence, sequence + 1, 0, key, winner))
                        lost += not errored
                        self.races_lost += not errored
                        # Catch up with GETs (one per commit made meanwhile, one more that finds none) rather
                        # than with creates, each of which would lose to a commit already there.
                        self.follow_head()
                        # The probe just proved the next number free: create at once, before the writer that won
                        # comes back for it. Only a writer that keeps losing backs off (full jitter), so that
                        # many writers spread out instead of storming the next number in step.
                        if lost >= LOSSES_BEFORE_BACKOFF:
                            numbered.backoff(lost - LOSSES_BEFORE_BACKOFF, cap_s=CONTENTION_BACKOFF_MAX_S)
                        # Among the losers racing for the next number, those behind their share go first.
                        ahead = self._share(winner.created_ms) - 1
                        if ahead > 0:
                            time.sleep(min(2 * (time.monotonic() - create_started) * ahead, COURTESY_MAX_S))
                            self.follow_head()
                        continue
                self._docs[key] = commit
                self.elements.append(CommitElement(sequence, sequence + 1, 0, key, commit))
                self.commits_made += 1
                if len(self._made) == self._made.maxlen:
                    self._made_set.discard(self._made[0])
                self._made.append(sequence)
                self._made_set.add(sequence)
                # The other writers that committed in the last second: a turn each before this process's next
                # commit (those that lose meanwhile follow the head and create first). A winner cannot see who
                # lost to it; whoever committed lately is still writing.
                # Plain commits only (a range is maintenance, not a writer racing for numbers), and none of this
                # process's (a range or a commit of it that this chain does not count among ``_made``).
                others = {
                    element.commit.writer or element.key
                    for element in self.elements[-RECENT_COMMITS:]
                    if element.end - element.first == 1
                    and element.first not in self._made_set
                    and not (writer and element.commit.writer == writer)
                    and commit.created_ms - element.commit.created_ms < 1000
                }
                round_trip = time.monotonic() - create_started
                turns = max(len(others), 1 if lost else 0)
                self.courtesy_s = min(2 * round_trip * turns, COURTESY_MAX_S) * self._share(commit.created_ms) ** 2
                return commit

    def _share(self, now_ms: int) -> float:
        """This process's share of the topic's commits of the last :data:`SHARE_WINDOW_MS` before ``now_ms``
        against an equal share of the writers seen making them (1: its due; 2: twice it). The courtesy wait
        grows with its square, and a loser ahead of its share lets the others race for the next number first,
        so that a writer the others outpace (a slower process) catches up (PROTOCOL.md 7.3, *Contention*)."""
        recent = [
            element
            for element in self.elements[-RECENT_COMMITS:]
            if element.end - element.first == 1 and now_ms - element.commit.created_ms < SHARE_WINDOW_MS
        ]
        writers = {element.commit.writer or element.key for element in recent if element.first not in self._made_set}
        mine = sum(1 for element in recent if element.first in self._made_set)
        if not writers or not mine:
            return 1.0
        return mine * (len(writers) + 1) / len(recent)

    def _build(
        self,
        sequence: int,
        commit_id: str,
        runs: Sequence[RunRows],
        objects: Sequence[str],
        partitions: int,
        log_append_time: bool,
        transaction_timeout_ms: int | None,
        writer: str,
    ) -> Commit:
        head = self.head
        size = max(partitions, 0 if head is None else len(head.ends))
        ends = [0 if head is None else head.end_of(p) for p in range(size)]
        max_ts = [-1 if head is None else head.max_timestamp_of(p) for p in range(size)]
        created = now_ms()
        append_ms = max(created, 0 if head is None else head.append_ms)
        entries = []
        # Stable: a partition's runs keep the order given (a flush's, or the committer's across objects).
        for run, object_key in sorted(zip(runs, objects, strict=True), key=lambda pair: pair[0].partition):
            p = run.partition
            if not 0 <= p < size:
                raise CorruptRecordError(f"{self.name}: a run names partition {p}, beyond the topic's {size}")
            rows = [[int(row[name]) for name in ROW_FIELDS] for row in run.rows]
            base = ends[p]
            transactional = any(row[7] & (1 << 4) for row in rows)
            entries.append(
                CommitEntry(
                    partition=p,
                    object=object_key,
                    base_offset=base,
                    next_offset=base + run.span,
                    rows=rows,
                    value_schema_version=run.value_schema_version,
                    transaction_timeout_ms=transaction_timeout_ms if transactional else None,
                    value_stats=run.value_stats,
                )
            )
            ends[p] = base + run.span
            newest = append_ms if log_append_time else max(int(r["max_timestamp"]) for r in run.rows)
            max_ts[p] = max(max_ts[p], newest)
        return Commit(
            sequence=sequence,
            commit_id=commit_id,
            created_ms=created,
            append_ms=append_ms,
            entries=entries,
            ends=ends,
            max_timestamps=max_ts,
            writer=writer,
        )


def _check_follows(before: CommitElement, commit: Commit, key: str) -> None:
    """The state vectors never shrink (PROTOCOL.md 7.3): a commit with fewer slots than the one before is corrupt."""
    if len(commit.ends) < len(before.commit.ends):
        raise CorruptRecordError(
            f"commit {commit.sequence} holds {len(commit.ends)} partitions' ends, fewer than the "
            f"{len(before.commit.ends)} of the commit before it",
            key=key,
        )
