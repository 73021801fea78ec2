"""Waiting at the end of partitions for all of a gateway's fetches, at one GET per root (or topic) per interval.

A Kafka consumer long-polls (``fetch.max.wait.ms``). The gateway must not probe
the store for every waiting partition of every client, so a partition a fetch
found empty is *parked* until its topic changes: a change notice read with new
bytes (PROTOCOL.md 9.1: one GET per topic per ``interval``, shared by every
client of the gateway; for a fetch of several topics in a root that lists
``rootNotice``, one GET of the root notice per interval, and a topic's notice
only after the root notice changed) or an append made by this gateway. Each topic has a
generation that every observed change increments; a park remembers the
generation read *before* its empty probe, so a change seen between the probe
and the park still wakes it (the argument of PROTOCOL.md 9.1 for one reader,
kept for many).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterable

from segment_format.errors import PlogError
from segment_format.notice import CHANGE_NOTICES, NOTICE_INTERVAL_MS, ROOT_NOTICE, NoticeWatch, TopicChangeReader
from segment_format.stores.base import Store


class TailWatch:
    """Parked partitions and the change notices that wake them (``gateway.services["fetch"]``)."""

    def __init__(
        self,
        store: Store,
        interval_s: float = NOTICE_INTERVAL_MS / 1000,
        features: Callable[[], Iterable[str]] | None = None,
        read_topic: TopicChangeReader | None = None,
    ) -> None:
        self.watch = NoticeWatch(store, interval_s, read_topic=read_topic)
        #: The root's writer features, asked at the first refresh (a blocking read, kept off the event loop):
        #: the root notice is relied on only in a root listing ``changeNotices`` and ``rootNotice`` (PROTOCOL.md 9.1).
        self._features = features
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._generation: dict[str, int] = {}
        #: (topic, partition) -> (position, generation before the probe)
        self._parked: dict[tuple[str, int], tuple[int, int]] = {}
        self._event = asyncio.Event()

    def generation(self, topic: str) -> int:
        """The topic's change count as this gateway has seen it."""
        with self._lock:
            return self._generation.get(topic, 0)

    def _changed(self, topic: str) -> None:
        with self._lock:
            self._generation[topic] = self._generation.get(topic, 0) + 1

    def refresh(self, topics: dict[str, str]) -> None:
        """Read the notices that are due ({topic: topic id}); a change wakes the topic's partitions (blocking).

        Several fetches may refresh at once, from threads of the gateway's pool: ``NoticeWatch.poll``
        is safe so (PROTOCOL.md 9.1, for a reader serving several waiting callers)."""
        try:
            if self._features is not None:
                self.watch.root_notice = {CHANGE_NOTICES, ROOT_NOTICE} <= set(self._features())
                self._features = None
            _, changed = self.watch.poll(topics)
        except PlogError:
            changed = list(topics)  # unknown: probe again rather than wait too long
        for topic in changed:
            self._changed(topic)

    def is_parked(self, topic: str, partition: int, position: int) -> bool:
        """Whether a fetch at ``position`` may skip the partition: parked there and nothing changed since."""
        with self._lock:
            parked = self._parked.get((topic, partition))
            return parked is not None and parked == (position, self._generation.get(topic, 0))

    def park(self, topic: str, partition: int, position: int, generation: int) -> None:
        """The partition was probed empty at ``position`` after the topic's ``generation`` was read."""
        with self._lock:
            self._parked[(topic, partition)] = (position, generation)

    def wake(self, topic: str) -> None:
        """This gateway appended to ``topic``: wake its partitions and the fetches waiting (event loop thread)."""
        self._changed(topic)
        self._event.set()
        self._event = asyncio.Event()

    def appended(self) -> asyncio.Event:
        """An event set by this gateway's next append: take it before reading, then wait on it."""
        return self._event

    @staticmethod
    async def wait(event: asyncio.Event, timeout_s: float) -> None:
        """Until ``event`` is set or ``timeout_s`` passes."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout_s)
