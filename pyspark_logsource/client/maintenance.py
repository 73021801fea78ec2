"""A producer's self-maintenance, off its send path (PROTOCOL.md 10.1, 10.2).

::

    sender thread:       write ─ complete futures ─ merge_own_tier ─ submit(written) ─ write ─ ...
    maintainer thread:                  maintain_written(own root) ─ ...              (a pass never holds a write)

A pass (merges, retention, compaction, the root collector) can take up to its budget; run on the sender's
thread it held every write behind it, and a record sent meanwhile waited that long to be written. Here it
runs on a thread of its own, with a ``LogRoot`` of its own over the same store: to the sender's root it is
another writer, which the protocol makes safe whatever either does (PROTOCOL.md 10), and neither's cached
views are touched by the other's thread. The index cache is shared (it is thread-safe), so a pass reads no
index the sender already knows. The merge of the sender's own tier of small commits (10.2, *A writer merges
its small tier*) stays on the sender's thread: it needs the sender's root, which knows which commits it made
and keeps their bytes, and it is a few milliseconds. Work submitted while a pass runs is merged into the
next one.
"""

from __future__ import annotations

import logging
import threading

from coordinator.maintainer import maintain_written
from segment_format.root import LogRoot

__all__ = ["BackgroundMaintainer"]

_log = logging.getLogger(__name__)


class BackgroundMaintainer:
    """Maintains the partitions a producer (or ``plog serve``'s maintenance process) wrote, on a thread of its
    own (see the module docstring)."""

    def __init__(self, root: LogRoot, owner: str, budget_s: float, writer: str = "producer") -> None:
        self.root = root
        self.owner = owner
        self.budget_s = budget_s
        #: What the log lines call the writer ("producer", "plog serve").
        self.writer = writer
        self._pending: dict[str, set[int]] = {}
        self._condition = threading.Condition()
        self._closed = False
        self._busy = False
        self._own_root: LogRoot | None = None
        self._thread = threading.Thread(target=self._run, name="plog-producer-maintainer", daemon=True)
        self._thread.start()

    def submit(self, written: dict[str, set[int]]) -> None:
        """Maintain ``written`` (topic -> partitions) soon; returns at once."""
        if not written:
            return
        with self._condition:
            for topic, partitions in written.items():
                self._pending.setdefault(topic, set()).update(partitions)
            self._condition.notify()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until nothing is pending or running; whether that happened within ``timeout``."""
        with self._condition:
            return self._condition.wait_for(lambda: not self._pending and not self._busy, timeout)

    def close(self, timeout: float | None = None) -> None:
        """Finish what was submitted, then stop the thread and release the maintainer's root."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()
        self._thread.join(timeout)
        if self._own_root is not None and not self._thread.is_alive():
            self._own_root.close()

    def _run(self) -> None:
        while True:
            with self._condition:
                self._condition.wait_for(lambda: bool(self._pending) or self._closed)
                if not self._pending:
                    return
                work, self._pending = self._pending, {}
                self._busy = True
            try:
                self._maintain(work)
            finally:
                with self._condition:
                    self._busy = False
                    self._condition.notify_all()

    def _maintain(self, work: dict[str, set[int]]) -> None:
        try:
            maintain_written(self._root(), work, owner=self.owner, budget_s=self.budget_s, writer=self.writer)
        except Exception as exc:  # noqa: BLE001 - maintenance never fails a write (maintain_written logs its own)
            _log.warning("plog %s: maintenance failed: %s", self.writer, exc)

    def _root(self) -> LogRoot:
        if self._own_root is None:
            own = LogRoot(self.root.url, store=self.root.store, metadata_max_age_s=self.root.metadata_max_age_s)
            own.index_cache = self.root.index_cache  # thread-safe; the sender's indexes need no read here
            self._own_root = own
        return self._own_root
