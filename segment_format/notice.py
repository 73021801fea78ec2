"""Change notices: one small object per topic that says "something was appended" (PROTOCOL.md 9.1).

::

    topics/<topic>/<topic_id>/notice.json     {"nonce": "9f3c...", "written_ms": ..., "partitions": [3]}

A writer replaces its topic's notice, with a fresh random ``nonce``, after the
objects holding new records exist and before it acknowledges them; for a
transaction, after its decision. A reader at the end of every partition of a
topic then needs to read only this one object, at most once per interval, and
probes the partitions again only when its bytes changed: an idle consumer of a
topic costs one GET per interval whatever the partition count, instead of a
probe per partition.

The notice is a hint, never data: no invariant reads it, a lost or failed
notice only delays when a waiting reader looks again, and nothing but
:class:`NoticeWatch`'s "did it change" is ever concluded from it. It is the
only object of a root that is overwritten (``Store.replace``).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

from .documents import JsonDocument
from .errors import ObjectNotFoundError, PlogError
from .layout import notice_key
from .records import now_ms
from .stores.base import Store

log = logging.getLogger(__name__)

#: The protocol feature (PROTOCOL.md 12.2) under which readers may rely on notices.
CHANGE_NOTICES = "changeNotices"
#: How often a waiting reader reads a notice by default: one GET per topic per second (issue #11's
#: budget) while a new record still becomes visible within about a second.
NOTICE_INTERVAL_MS = 1000


@dataclass(frozen=True)
class ChangeNotice(JsonDocument):
    """One notice: only its bytes changing means anything; the fields are for people and tools."""

    #: 32 random hex digits, new for every write: two writes never leave the same bytes.
    nonce: str
    written_ms: int = 0
    #: The partitions the writer appended to (informational: a later writer may have replaced it).
    partitions: tuple[int, ...] = ()


#: Attempts at writing a notice before the write it announces is reported as failed.
NOTICE_ATTEMPTS = 3


def write_notice(store: Store, topic: str, topic_id: str, partitions: Iterable[int] = ()) -> None:
    """Replace the topic's notice with a fresh one, retrying; the last error if every attempt failed.

    The writer must not acknowledge its records without it (PROTOCOL.md 9.1): a
    reader waiting on the notice would not look for them. So the error reaches
    the writer, which reports its write as failed (its records are in the log,
    as after any ambiguous failure).
    """
    doc = ChangeNotice(secrets.token_hex(16), now_ms(), tuple(sorted(set(partitions))))
    for attempt in range(NOTICE_ATTEMPTS):
        try:
            store.replace(notice_key(topic, topic_id), doc.to_json())
            return
        except PlogError as exc:
            log.warning("topic %s: writing the change notice failed (attempt %d): %s", topic, attempt + 1, exc)
            if attempt + 1 == NOTICE_ATTEMPTS:
                raise
            time.sleep(0.05 * 2**attempt)


def read_notice(store: Store, topic: str, topic_id: str) -> bytes | None:
    """The notice's bytes (one GET), None when the topic has none (yet, or any more)."""
    try:
        return store.get(notice_key(topic, topic_id))
    except ObjectNotFoundError:
        return None


class NoticeWatch:
    """A reader's view of the notices of the topics it waits on: the bytes it last read, and when.

    ``baseline(topic)`` is the notice as last read; a partition probed empty *after*
    that read may wait until :meth:`changed` reports new bytes (PROTOCOL.md 9.1
    argues why nothing appended after the probe is missed). Reads are spaced at
    least ``interval_s`` apart per topic, so an idle reader costs one GET per
    topic per interval.
    """

    def __init__(self, store: Store, interval_s: float) -> None:
        self.store = store
        self.interval_s = interval_s
        self._lock = threading.Lock()
        #: topic -> (topic id, bytes last read or None, monotonic time of that read)
        self._seen: dict[str, tuple[str, bytes | None, float]] = {}

    def known(self, topic: str, topic_id: str) -> bool:
        """Whether the notice of this incarnation of ``topic`` has been read (a baseline exists)."""
        seen = self._seen.get(topic)
        return seen is not None and seen[0] == topic_id

    def due(self, topic: str, now: float | None = None) -> bool:
        """Whether an interval has passed since the topic's notice was last read (or it never was)."""
        seen = self._seen.get(topic)
        now = time.monotonic() if now is None else now
        return seen is None or now - seen[2] >= self.interval_s

    def changed(self, topic: str, topic_id: str) -> bool:
        """Read the notice now; whether its bytes differ from the last read (True for a first read)."""
        data = read_notice(self.store, topic, topic_id)
        with self._lock:
            seen = self._seen.get(topic)
            self._seen[topic] = (topic_id, data, time.monotonic())
        return seen is None or seen[0] != topic_id or seen[1] != data

    def hinted(self, topic: str) -> tuple[int, ...]:
        """The partitions the last notice read names (informational: where to look first, never only)."""
        seen = self._seen.get(topic)
        if seen is None or seen[1] is None:
            return ()
        try:
            return ChangeNotice.from_json(seen[1]).partitions
        except PlogError:  # a hint only: a notice we cannot parse still changed
            return ()

    def absent(self, topic: str) -> bool:
        """Whether the last read of the topic's notice found none."""
        seen = self._seen.get(topic)
        return seen is not None and seen[1] is None

    def forget(self, topic: str) -> None:
        """Drop what is known of ``topic`` (unsubscribed, deleted)."""
        with self._lock:
            self._seen.pop(topic, None)


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
    def if_promised(cls, store: Store, writer_features: Iterable[str], interval_s: float) -> ParkedPartitions | None:
        """Parking for a reader of a root whose protocol lists ``changeNotices``; None (probe every time) otherwise."""
        return cls(NoticeWatch(store, interval_s)) if CHANGE_NOTICES in writer_features else None

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
        """Park ``tp``, found empty at ``position`` by a probe made after a read of its topic's notice."""
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

        A topic is read when it has parked partitions, or when its notice was never read
        (so that partitions found empty in the coming round may park); its id comes from
        the parked partitions, else from ``topic_id_of``. Every partition of a topic whose
        notice changed is unparked, and so is a partition stopped at a transaction for
        :data:`BLOCKED_RECHECK_S`. While a topic's notice is absent, its current id
        (``topic_id_of``) is compared with the one waited on: a topic deleted and
        created again has its notice under the new id.
        """
        now = time.monotonic()
        self.hinted = set()
        waiting = {tp[0]: p.topic_id for tp, p in self.parked.items()}
        for topic in set(topics) - waiting.keys():
            topic_id = _id_or_none(topic_id_of, topic)
            if topic_id is not None and not self.watch.known(topic, topic_id):
                waiting[topic] = topic_id
        for topic, topic_id in sorted(waiting.items()):
            if not self.watch.due(topic, now):
                continue
            # An absent notice may mean the topic was deleted and created again under a new id, whose
            # notice is elsewhere: compare the ids too (metadata as cached, so this costs little).
            if self.watch.changed(topic, topic_id) or (
                self.watch.absent(topic) and _id_or_none(topic_id_of, topic) != topic_id
            ):
                self.parked = {tp: p for tp, p in self.parked.items() if tp[0] != topic}
                self.hinted.update((topic, p) for p in self.watch.hinted(topic))
        self.parked = {tp: p for tp, p in self.parked.items() if not (p.blocked and now - p.since >= BLOCKED_RECHECK_S)}


def _id_or_none(topic_id_of: Callable[[str], str], topic: str) -> str | None:
    """The topic's current id, None while it does not exist (the probes that follow report that)."""
    try:
        return topic_id_of(topic)
    except PlogError:
        return None
