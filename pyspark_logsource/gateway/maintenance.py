"""The gateway maintains what it writes, in a child process (PROTOCOL.md 10.1).

Kafka clients' records reach the root through the gateway, so the gateway is their writer and maintains the
partitions its flushes wrote, as plog's producer does: without passes their shared objects and commits only
pile up, and every flush and fetch grows slower. The passes run in a process of their own, not on a thread:
a pass is Python work that holds the GIL for long stretches, and the event loop answering hundreds of
connections gives the GIL up at every socket operation and then waits behind the pass to get it back.

The child reads its work as JSON lines on its standard input and exits when that closes, so a gateway
killed with SIGKILL leaves its maintainer behind for one pass at most::

    gateway ──stdin──▶ child   {"url": ..., "storage_options": {...}, "owner": ..., "budget_s": ...}   (settings)
                               {"<topic>": [<partition>, ...], ...}                                 (after flushes)

The child hands each line to a producer's :class:`~pyspark_logsource.client.maintenance.BackgroundMaintainer`,
which merges what arrives during a pass into the next. A pass is a writer's
(:func:`coordinator.maintainer.maintain_written`): each topic's maintenance under its lease, then the root's
collector when its lease says a pass is due, which among other things deletes the shared objects moves left
behind.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

#: A pass's budget (a producer's); a budget-cut pass releases the topic's lease and the next continues.
PASS_BUDGET_S = 1.0
#: How much lower the child's scheduling priority is than the gateway's (os.nice).
NICENESS = 10
#: How long a closing gateway lets its maintainer finish the work submitted before it is killed.
CLOSE_S = 5.0
#: The least time between two starts of the child, should it die (a broken root must not become a fork loop).
RESTART_S = 10.0


class MaintenanceProcess:
    """The gateway's side: gathers what flushes wrote and feeds it to the child, started at the first submit."""

    def __init__(self, url: str, storage_options: dict[str, Any], owner: str) -> None:
        self._settings = {"url": url, "storage_options": storage_options, "owner": owner, "budget_s": PASS_BUDGET_S}
        self._pending: dict[str, set[int]] = {}
        self._condition = threading.Condition()
        self._closed = False
        self._child: subprocess.Popen[bytes] | None = None
        self._started = float("-inf")
        self._feeder: threading.Thread | None = None

    def submit(self, written: dict[str, list[int]]) -> None:
        """Have the partitions ``written`` (topic -> partitions) maintained soon; returns at once."""
        with self._condition:
            if self._closed:
                return
            for topic, partitions in written.items():
                self._pending.setdefault(topic, set()).update(partitions)
            if self._feeder is None:
                self._feeder = threading.Thread(target=self._feed, name="plog-gateway-maintenance", daemon=True)
                self._feeder.start()
            self._condition.notify()

    def close(self, timeout: float = CLOSE_S) -> None:
        """Hand the child what is pending, let it finish for up to ``timeout`` seconds, then kill it."""
        with self._condition:
            self._closed = True
            self._condition.notify()
            feeder = self._feeder
        if feeder is not None:
            feeder.join(timeout)
        child = self._child
        if child is None:
            return
        try:
            child.wait(timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()

    def _feed(self) -> None:
        while True:
            with self._condition:
                self._condition.wait_for(lambda: bool(self._pending) or self._closed)
                work, self._pending = self._pending, {}
                closing = self._closed
            if work:
                self._send(work)
            if closing:
                if self._child is not None and self._child.stdin is not None:
                    self._child.stdin.close()  # the child finishes what it holds and exits
                return

    def _send(self, work: dict[str, set[int]]) -> None:
        child = self._running_child()
        if child is None or child.stdin is None:
            return  # restarted later; the partitions are maintained by the next pass over them
        try:
            child.stdin.write(_line({topic: sorted(partitions) for topic, partitions in work.items()}))
            child.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            log.warning("plog serve: the maintenance process is gone (%s); it restarts at a later flush", exc)
            self._child = None

    def _running_child(self) -> subprocess.Popen[bytes] | None:
        child = self._child
        if child is not None and child.poll() is None:
            return child
        if time.monotonic() - self._started < RESTART_S:
            return None
        if child is not None:
            log.warning("plog serve: the maintenance process exited with %s; starting another", child.returncode)
        self._started = time.monotonic()
        child = subprocess.Popen(
            [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, close_fds=True
        )
        assert child.stdin is not None
        child.stdin.write(_line(self._settings))
        child.stdin.flush()
        self._child = child
        return child


def _line(document: dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode() + b"\n"


def main() -> int:
    """The child: maintain what the gateway sends until its stdin closes (see the module docstring)."""
    from pyspark_logsource.client.maintenance import BackgroundMaintainer
    from segment_format.root import LogRoot

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the gateway, which closes our stdin
    # Below the gateway in the scheduler's eyes: on a machine the gateway and its clients keep busy, passes take
    # the time left over (Kafka's log cleaner is throttled for the same reason), and catch up when it is quieter.
    os.nice(NICENESS)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    settings = json.loads(sys.stdin.buffer.readline())
    root = LogRoot(settings["url"], settings["storage_options"])
    # A producer's maintainer: work that arrives while a pass runs is merged into the next one.
    maintainer = BackgroundMaintainer(root, settings["owner"], settings["budget_s"], writer="plog serve")
    try:
        for line in sys.stdin.buffer:
            maintainer.submit({topic: set(partitions) for topic, partitions in json.loads(line).items()})
        maintainer.close()  # the gateway gives it CLOSE_S before it kills us
    finally:
        root.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
