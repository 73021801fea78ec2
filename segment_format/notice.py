"""Change notices: small objects that say "something was appended" (PROTOCOL.md 9.1).

::

    topics/<topic>/<topic_id>/notice.json     {"nonce": "9f3c...", "written_ms": ..., "partitions": [3]}
    _notice.json                              {"nonce": "4b1e...", "written_ms": ..., "topics": ["clicks"]}

A writer replaces the notice of each topic it wrote, with a fresh random ``nonce``,
after the objects holding new records exist and before it acknowledges them (for a
transaction, after its decision), and then the root's notice, once per write
(:func:`write_notices`, the one function that writes either). A reader at the end
of every partition of a topic then needs to read only the topic's notice, at most
once per interval, and probes the partitions again only when its bytes changed: an
idle consumer of a topic costs one GET per interval whatever the partition count.
A reader waiting on several topics of a root whose protocol lists ``rootNotice``
reads the root notice instead, and a topic's notice only after the root notice
changed (:class:`NoticeWatch`): one GET per interval whatever the number of topics.

The notices are hints, never data: no invariant reads them, a lost or failed
notice only delays when a waiting reader looks again, and nothing but
:class:`NoticeWatch`'s "did it change" is ever concluded from them. They are the
only objects of a root that are overwritten (``Store.replace``).
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from .documents import JsonDocument
from .errors import ObjectNotFoundError, PlogError
from .layout import ROOT_NOTICE_KEY, notice_key
from .parallel import io_map
from .records import now_ms
from .stores.base import Store

log = logging.getLogger(__name__)

#: The protocol feature (PROTOCOL.md 12.2) under which readers may rely on notices.
CHANGE_NOTICES = "changeNotices"
#: The protocol feature under which readers waiting on several topics may rely on the root notice.
ROOT_NOTICE = "rootNotice"
#: How often a waiting reader reads a notice by default: one GET per topic (or per root) per second
#: while a new record still becomes visible within about a second.
NOTICE_INTERVAL_MS = 1000
#: On a store that does not bill requests (a local disk) a notice read is a small file read: a waiting reader
#: looks every 10 ms there, so that a record is seen about as soon as it is written.
LOCAL_NOTICE_INTERVAL_MS = 10


def default_notice_interval_ms(store: Store) -> int:
    """How often a waiting reader of ``store`` reads a notice unless told: once a second on an object store
    (what a GET costs), every 10 ms on a local disk."""
    return NOTICE_INTERVAL_MS if store.billed_per_request else LOCAL_NOTICE_INTERVAL_MS


@dataclass(frozen=True)
class ChangeNotice(JsonDocument):
    """One topic's notice: only its bytes changing means anything; the fields are for people and tools."""

    #: 32 random hex digits, new for every write: two writes never leave the same bytes.
    nonce: str
    written_ms: int = 0
    #: The partitions the writer appended to (informational: a later writer may have replaced it).
    partitions: tuple[int, ...] = ()


@dataclass(frozen=True)
class RootNotice(JsonDocument):
    """The root's notice, replaced after the topic notices of every write: only its bytes changing means anything."""

    #: 32 random hex digits, new for every write.
    nonce: str
    written_ms: int = 0
    #: The topics whose notices the write replaced (a hint: concurrent writers overwrite each other's).
    topics: tuple[str, ...] = ()


#: Share of the interval one poll spends reading topic notices after a root change (at least
#: ``MIN_SWEEP_S``); the topics left are read at the next polls, the root notice's named ones first.
SWEEP_SHARE = 0.25
MIN_SWEEP_S = 0.05
#: Topic notices read at once in a sweep (the I/O pool overlaps them); the share is checked between chunks.
SWEEP_CHUNK = 32

#: Attempts at writing a notice before the write it announces is reported as failed.
NOTICE_ATTEMPTS = 3


def _replace(store: Store, key: str, data: bytes, what: str) -> None:
    """Replace one notice, retrying; the last error if every attempt failed."""
    for attempt in range(NOTICE_ATTEMPTS):
        try:
            store.replace(key, data)
            return
        except PlogError as exc:
            log.warning("%s: writing the change notice failed (attempt %d): %s", what, attempt + 1, exc)
            if attempt + 1 == NOTICE_ATTEMPTS:
                raise
            time.sleep(0.05 * 2**attempt)


def write_notices(
    store: Store, written: Mapping[str, tuple[str, Iterable[int]]], committed: Collection[str] = ()
) -> None:
    """Announce one write: replace the notice of each topic written, then the root notice (PROTOCOL.md 9.1).

    ``written`` maps each topic to its id and the partitions written. The writer must not
    acknowledge its records without both notices: a reader waiting on either would not look
    for them. Every topic's notice is tried, and the root notice is written after those that
    were (a reader waiting on the root notice learns of them); then the first error, if any,
    reaches the writer, which reports its write as failed (its records are in the log, as
    after any ambiguous failure). Writers of this version write the root notice in every
    root, whatever its protocol lists, as they write topic notices. A topic of ``committed`` (a shared
    topic, PROTOCOL.md 7.3) gets no notice of its own: its next commit is its notice, and readers
    probe that; the root notice still names it.
    """
    failure: PlogError | None = None
    announced: list[str] = [topic for topic in written if topic in committed]
    for topic, (topic_id, partitions) in written.items():
        if topic in committed:
            continue
        doc = ChangeNotice(secrets.token_hex(16), now_ms(), tuple(sorted(set(partitions))))
        try:
            _replace(store, notice_key(topic, topic_id), doc.to_json(), f"topic {topic}")
            announced.append(topic)
        except PlogError as exc:
            failure = failure or exc
    if announced:
        # After every topic notice of the write, before its acknowledgement: readers that waited on this
        # one object since their last read of it learn that some topic notice changed (PROTOCOL.md 9.1).
        root_doc = RootNotice(secrets.token_hex(16), now_ms(), tuple(sorted(announced)))
        try:
            _replace(store, ROOT_NOTICE_KEY, root_doc.to_json(), "the root")
        except PlogError as exc:
            failure = failure or exc
    if failure is not None:
        raise failure


def write_root_notice(store: Store, topics: Iterable[str]) -> None:
    """Replace the root notice alone, naming ``topics``: after a change of their metadata
    (PROTOCOL.md 9.1, *Topic metadata and the root notice*). Raises the store's error after retries:
    the change must then be reported as failed, although it took effect."""
    doc = RootNotice(secrets.token_hex(16), now_ms(), tuple(sorted(set(topics))))
    _replace(store, ROOT_NOTICE_KEY, doc.to_json(), "the root")


def write_notice(store: Store, topic: str, topic_id: str, partitions: Iterable[int] = ()) -> None:
    """Replace the topic's notice, then the root notice: :func:`write_notices` for a write of one topic."""
    write_notices(store, {topic: (topic_id, partitions)})


def read_notice(store: Store, topic: str, topic_id: str) -> bytes | None:
    """The notice's bytes (one GET), None when the topic has none (yet, or any more)."""
    try:
        return store.get(notice_key(topic, topic_id))
    except ObjectNotFoundError:
        return None


def read_root_notice(store: Store) -> bytes | None:
    """The root notice's bytes (one GET), None when the root has none (no writer of this version wrote yet)."""
    try:
        return store.get(ROOT_NOTICE_KEY)
    except ObjectNotFoundError:
        return None


class RootReads:
    """The root notice as one reader reads it (PROTOCOL.md 9.1): the bytes last kept, how often they
    changed, and when the newest read started.

    One per reader of a root, shared by what it waits on: :class:`NoticeWatch` waiting for records, and
    :class:`~segment_format.root.LogRoot`'s metadata, which is taken as current while the root notice
    is unchanged since a read that returned before the metadata was read (*Metadata under the root
    notice*). Safe from several threads: a read compares with the bytes last kept, so a late answer
    with older bytes counts as one more change, which costs re-reads, never a missed change.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        #: The bytes last kept (None: absent), and whether any read has returned.
        self.data: bytes | None = None
        self.read_once = False
        #: Reads whose bytes differed from those kept before (the first read counts).
        self.changes = 0
        #: Monotonic start of the newest read that returned.
        self.started = -math.inf
        #: The topics the last changed root notice names (a hint of where to look first).
        self.hint: frozenset[str] = frozenset()

    def read(self) -> bool:
        """Read the root notice now (one GET); whether its bytes differ from the last kept (True for a first read)."""
        started = time.monotonic()
        data = read_root_notice(self.store)
        with self._lock:
            changed = not self.read_once or data != self.data
            self.data, self.read_once = data, True
            self.started = max(self.started, started)
            if changed:
                self.changes += 1
                self.hint = frozenset(_root_topics(data))
        return changed

    def basis(self) -> int | None:
        """What metadata about to be read rests on: the count of changes, once a read has returned (else None).

        Take it before the metadata read starts; :meth:`unchanged_since` with it later tells whether the
        root notice kept the bytes of that read."""
        with self._lock:
            return self.changes if self.read_once else None

    def unchanged_since(self, basis: int | None, max_age_s: float) -> float | None:
        """If every root read since ``basis`` returned its bytes, as of a read started less than ``max_age_s``
        ago (made now when there is none): that read's start (monotonic); else None."""
        if basis is None:
            return None
        if time.monotonic() - self.started >= max_age_s:
            self.read()
        with self._lock:
            return self.started if self.changes == basis else None


#: Reads a topic's notice, or what stands for it: (topic, topic id) -> its bytes, None when absent.
TopicChangeReader = Callable[[str, str], "bytes | None"]


class Seen(NamedTuple):
    """What a reader knows of one topic's notice."""

    topic_id: str
    #: The bytes last read, None when the notice was absent.
    data: bytes | None
    #: Monotonic time of that read.
    at: float
    #: The watch's count of root changes when that read started (PROTOCOL.md 9.1, *current*).
    root_changes: int


class NoticeWatch:
    """A reader's view of the notices of the topics it waits on: the bytes it last read, and when.

    ``baseline(topic)`` is the notice as last read; a partition probed empty *after*
    that read may wait until :meth:`changed` reports new bytes (PROTOCOL.md 9.1
    argues why nothing appended after the probe is missed). Reads are spaced at
    least ``interval_s`` apart per topic, so an idle reader costs one GET per
    topic per interval.

    With ``root_notice`` (the root's protocol lists ``rootNotice``), :meth:`poll` over
    several topics reads the root notice once per interval instead, and a topic's
    notice only while that topic's last read is not *current*: it started before the
    last root read whose bytes differed from the read before (a root change). So an
    idle reader costs one GET per interval whatever the number of topics. Safe when
    several threads poll one watch (the gateway): a topic read records the count of
    root changes taken before it starts, and a root read compares with the bytes last
    kept, so a late answer with older bytes is one more root change, never a lost one.
    """

    def __init__(
        self,
        store: Store,
        interval_s: float,
        root_notice: bool = False,
        root_reads: RootReads | None = None,
        read_topic: TopicChangeReader | None = None,
    ) -> None:
        self.store = store
        #: Reads what stands for a topic's notice: its notice object, or a shared topic's next commit
        #: (:meth:`LogRoot.topic_change <segment_format.root.LogRoot.topic_change>`, PROTOCOL.md 9.1).
        self.read_topic: TopicChangeReader = read_topic or (lambda topic, topic_id: read_notice(store, topic, topic_id))
        self.interval_s = interval_s
        #: Whether the root notice may be relied on (the root lists ``changeNotices`` and ``rootNotice``).
        self.root_notice = root_notice
        self._lock = threading.Lock()
        self._seen: dict[str, Seen] = {}
        #: The reader's reads of the root notice (shared with its metadata when given: one GET serves both).
        self.root_reads = root_reads if root_reads is not None else RootReads(store)
        #: Monotonic time the last root read was started (claimed, so that threads do not read it twice).
        self._root_at = -math.inf

    def known(self, topic: str, topic_id: str) -> bool:
        """Whether the notice of this incarnation of ``topic`` has been read (a baseline exists)."""
        seen = self._seen.get(topic)
        return seen is not None and seen.topic_id == topic_id

    def due(self, topic: str, now: float | None = None) -> bool:
        """Whether an interval has passed since the topic's notice was last read (or it never was)."""
        seen = self._seen.get(topic)
        now = time.monotonic() if now is None else now
        return seen is None or now - seen.at >= self.interval_s

    def current(self, topic: str, topic_id: str) -> bool:
        """Whether the topic's notice was read (for this id) after the last root change was seen."""
        seen = self._seen.get(topic)
        return seen is not None and seen.topic_id == topic_id and seen.root_changes == self.root_reads.changes

    def changed(self, topic: str, topic_id: str) -> bool:
        """Read the notice now; whether its bytes differ from the last read (True for a first read)."""
        root_changes = self.root_reads.changes  # taken before the read starts: what makes the read current
        data = self.read_topic(topic, topic_id)
        with self._lock:
            seen = self._seen.get(topic)
            self._seen[topic] = Seen(topic_id, data, time.monotonic(), root_changes)
        return seen is None or seen.topic_id != topic_id or seen.data != data

    def root_changed(self) -> bool:
        """Read the root notice now; whether its bytes differ from the last kept (True for a first read)."""
        return self.root_reads.read()

    def _claim_root(self, now: float) -> bool:
        """Whether the root notice is due; if so, the read is this caller's (the interval restarts now).

        A read made for the reader's metadata (the same :class:`RootReads`) counts: it is as recent."""
        with self._lock:
            if now - max(self._root_at, self.root_reads.started) < self.interval_s:
                return False
            self._root_at = now
            return True

    def poll(self, waiting: Mapping[str, str], now: float | None = None) -> tuple[list[str], list[str]]:
        """Read what is due of the notices of ``waiting`` ({topic: topic id}): (topics read, those that changed).

        One topic, or a root without the root notice: each topic's notice once per interval.
        Several topics with the root notice: the root notice once per interval, and the notice
        of every topic whose last read is not current (never read, or read before the last root
        change), the topics the root notice names first: when one of those changed, the others
        are left for the next poll (they stay not current, so it reads them), which hands their
        records out a round of reads sooner. So are those a poll has no time left for (a share of
        the interval): a sweep over hundreds of topic notices, seconds on an object store, does not
        hold up the next root read and the topics it names. A topic whose notice was absent is read every
        interval, so that its caller can compare the topic's id (PROTOCOL.md 9.1).
        """
        now = time.monotonic() if now is None else now
        if not (self.root_notice and len(waiting) > 1):
            due = sorted(topic for topic in waiting if self.due(topic, now))
            return due, [topic for topic in due if self.changed(topic, waiting[topic])]
        if self._claim_root(now):
            self.root_changed()
        hint = self.root_reads.hint
        stale = sorted(
            (
                topic
                for topic, topic_id in waiting.items()
                if not self.current(topic, topic_id) or (self.absent(topic) and self.due(topic, now))
            ),
            key=lambda topic: (topic not in hint, topic),
        )
        read: list[str] = []
        changed: list[str] = []
        # The named topics first, then the rest in chunks; each chunk's reads overlap (a reader starting on
        # many topics reads every notice once, in parallel). Once a known topic changed (hand its records out
        # first), or this poll's share of the interval is spent, the rest wait for the next poll, except first
        # reads: until one is made, the topic's partitions cannot wait.
        woken = False
        until = time.monotonic() + max(self.interval_s * SWEEP_SHARE, MIN_SWEEP_S)
        others = [t for t in stale if t not in hint]
        groups = [[t for t in stale if t in hint]] + [
            others[i : i + SWEEP_CHUNK] for i in range(0, len(others), SWEEP_CHUNK)
        ]
        for n, group in enumerate(groups):
            known = {topic: self.known(topic, waiting[topic]) for topic in group}
            if n and (woken or time.monotonic() >= until):
                group = [topic for topic in group if not known[topic]]
            if not group:
                continue
            results = io_map(lambda topic: self.changed(topic, waiting[topic]), group)
            read.extend(group)
            news = [topic for topic, differs in zip(group, results, strict=True) if differs]
            changed.extend(news)
            woken = woken or any(known[topic] for topic in news)  # a first read is no news: it defers nothing
        return read, changed

    def hinted(self, topic: str) -> tuple[int, ...]:
        """The partitions the last notice read names (informational: where to look first, never only)."""
        seen = self._seen.get(topic)
        if seen is None or seen.data is None:
            return ()
        try:
            return ChangeNotice.from_json(seen.data).partitions
        except PlogError:  # a hint only: a notice we cannot parse still changed
            return ()

    def absent(self, topic: str) -> bool:
        """Whether the last read of the topic's notice found none."""
        seen = self._seen.get(topic)
        return seen is not None and seen.data is None

    def forget(self, topic: str) -> None:
        """Drop what is known of ``topic`` (unsubscribed, deleted)."""
        with self._lock:
            self._seen.pop(topic, None)


def _root_topics(data: bytes | None) -> tuple[str, ...]:
    """The topics a root notice names; none when it is absent or unreadable (a hint only: it still changed)."""
    if data is None:
        return ()
    try:
        return RootNotice.from_json(data).topics
    except PlogError:
        return ()


#: How often a partition stopped at an undecided transaction is checked again although its topic's
#: notice did not change: deciders write the notice, so this matters only after one died in between.
BLOCKED_RECHECK_S = 5.0


class Parked(NamedTuple):
    """A partition waiting for its topic's change notice."""

    #: The position (offset) it was found empty at.
    position: int
    topic_id: str
    #: Monotonic time it was parked.
    since: float
    #: Stopped at an open transaction (read_committed) rather than at the end of the log.
    blocked: bool


class ParkedPartitions:
    """The partitions a reader skips until their topic's notice changes (PROTOCOL.md 9.1).

    Keys are ``(topic, partition)`` tuples. A reader calls :meth:`wake` before a round of
    probes, skips the partitions :meth:`is_parked` names, and :meth:`park`\\ s each partition a
    probe found empty; :meth:`park` refuses unless a read of the topic's notice came before
    that probe, which is what makes waiting safe. The consumer's fetcher and the Spark
    source's ``latestOffset`` share this.
    """

    @classmethod
    def if_promised(
        cls,
        store: Store,
        writer_features: Iterable[str],
        interval_s: float,
        root_reads: RootReads | None = None,
        read_topic: TopicChangeReader | None = None,
    ) -> ParkedPartitions | None:
        """Parking for a reader of a root whose protocol lists ``changeNotices``; None (probe every time) otherwise.

        Waiting on several topics, it reads the root notice instead of theirs when the root also lists
        ``rootNotice`` (PROTOCOL.md 9.1), through ``root_reads`` when given (the reader's root's
        :attr:`~segment_format.root.LogRoot.root_reads`, so that one read also confirms its metadata), and
        reads a topic's notice, or what stands for it, with ``read_topic`` when given."""
        features = set(writer_features)
        if CHANGE_NOTICES not in features:
            return None
        watch = NoticeWatch(store, interval_s, ROOT_NOTICE in features, root_reads, read_topic)
        return cls(watch)

    def __init__(self, watch: NoticeWatch) -> None:
        self.watch = watch
        self.parked: dict[tuple[str, int], Parked] = {}
        #: Partitions the notices that changed at the last :meth:`wake` name: probe them first, since
        #: every partition of such a topic is probed again and the new records are most likely there.
        self.hinted: set[tuple[str, int]] = set()

    def is_parked(self, tp: tuple[str, int], position: int | None) -> bool:
        """Whether ``tp`` waits at ``position`` (a partition moved since it was parked, by a seek, does not)."""
        parked = self.parked.get(tp)
        return parked is not None and parked.position == position

    def park(self, tp: tuple[str, int], position: int, topic_id: str, blocked: bool = False) -> bool:
        """Park ``tp``, found empty at ``position`` by a probe made after a read of its topic's notice returned.

        The probe may be a tail check or a listing of the topic begun after that read
        (PROTOCOL.md 9.1, *Parking from a listing*); the caller keeps that order."""
        if not self.watch.known(tp[0], topic_id):
            return False  # no read of the notice precedes the probe: it cannot tell of later appends
        self.parked[tp] = Parked(position, topic_id, time.monotonic(), blocked)
        return True

    def keep_only(self, tps: Iterable[tuple[str, int]]) -> None:
        """Forget parked partitions outside ``tps`` (the new assignment)."""
        keep = set(tps)
        self.parked = {tp: p for tp, p in self.parked.items() if tp in keep}

    def wake(self, topics: Iterable[str], topic_id_of: Callable[[str], str]) -> None:
        """Before a round over ``topics``: read the notices that are due, and unpark what may have changed.

        A topic is waited on when it has parked partitions, or when its notice was never read
        (so that partitions found empty in the coming round may park); its id comes from
        the parked partitions, else from ``topic_id_of``. :meth:`NoticeWatch.poll` reads what
        is due of their notices (the root notice instead, for several topics in a root that
        lists ``rootNotice``). Every partition of a topic whose notice changed is unparked,
        and so is a partition stopped at a transaction for :data:`BLOCKED_RECHECK_S`. While
        a topic's notice is absent, its current id (``topic_id_of``) is compared with the one
        waited on: a topic deleted and created again has its notice under the new id.
        """
        now = time.monotonic()
        self.hinted = set()
        waiting = {tp[0]: p.topic_id for tp, p in self.parked.items()}
        for topic in set(topics) - waiting.keys():
            topic_id = _id_or_none(topic_id_of, topic)
            if topic_id is not None and not self.watch.known(topic, topic_id):
                waiting[topic] = topic_id
        read, changed = self.watch.poll(waiting, now)
        for topic in read:
            # An absent notice may mean the topic was deleted and created again under a new id, whose
            # notice is elsewhere: compare the ids too (metadata as cached, so this costs little).
            if topic in changed or (self.watch.absent(topic) and _id_or_none(topic_id_of, topic) != waiting[topic]):
                self.parked = {tp: p for tp, p in self.parked.items() if tp[0] != topic}
                self.hinted.update((topic, p) for p in self.watch.hinted(topic))
        self.parked = {tp: p for tp, p in self.parked.items() if not (p.blocked and now - p.since >= BLOCKED_RECHECK_S)}


def _id_or_none(topic_id_of: Callable[[str], str], topic: str) -> str | None:
    """The topic's current id, None while it does not exist (the probes that follow report that)."""
    try:
        return topic_id_of(topic)
    except PlogError:
        return None
