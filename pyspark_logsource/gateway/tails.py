"""Waiting at the end of partitions for all of a gateway's fetches, at one GET per topic per interval.

A Kafka consumer long-polls (``fetch.max.wait.ms``). The gateway must not probe
the store for every waiting partition of every client, so a partition a fetch
found empty is *parked* until its topic changes: a change notice read with new
bytes (PROTOCOL.md 9.1: one GET per topic per ``interval``, shared by every
client of the gateway) or an append made by this gateway. Each topic has a
generation that every observed change increments; a park remembers the
generation read *before* its empty probe, so a change seen between the probe
and the park still wakes it (the argument of PROTOCOL.md 9.1 for one reader,
kept for many).
"""

from __future__ import annotations

import asyncio
import threading

from segment_format.errors import PlogError
from segment_format.notice import NOTICE_INTERVAL_MS, NoticeWatch
from segment_format.stores.base import Store


class TailWatch:
    """Parked partitions and the change notices that wake them (``gateway.services["fetch"]``)."""

    def __init__(self, store: Store, interval_s: float = NOTICE_INTERVAL_MS / 1000) -> None:
        self.watch = NoticeWatch(store, interval_s)
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
        """Read the notices that are due ({topic: topic id}); a change wakes the topic's partitions (blocking)."""
        for topic, topic_id in topics.items():
            if not self.watch.due(topic):
                continue
            try:
                if self.watch.changed(topic, topic_id):
                    self._changed(topic)
            except PlogError:
                self._changed(topic)  # unknown: probe again rather than wait too long

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
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except TimeoutError:
            pass
