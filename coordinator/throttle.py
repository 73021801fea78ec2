"""A quota's allowance (PROTOCOL.md 11.10): how long a client waits before it may move the next bytes.

A :class:`Throttle` holds Kafka's bound over any run: whatever a client moves between two instants
``a`` and ``b`` is at most ``quota × (b - a + burst_s)``, and from a new client's first step on at most
``quota × (elapsed + burst_s)``. It is a ledger of two running totals::

    reserved  ──────────────┬────────┬──────────────┬───▶   bytes asked for, in order of asking
                        step k-1   step k         step k+1
    allowed   ═══════════╪═════════▶                       grows by quota × dt, never more than
                         now                                reserved + quota × burst_s

``reserve(n)`` puts a step of ``n`` at the end of ``reserved`` and returns the step's end; the step may
be taken once ``allowed`` has reached that end (:meth:`wait_s`). A step is therefore delayed *before*
it is taken, never after, so no client runs ahead of its allowance, and one caller's wait never grows
because another caller asked later (steps clear in the order they were reserved). A quota changed at
run time changes the slope from then on: a waiting step clears at the new rate.

Why not Kafka's sampled rate: Kafka measures a rate over ``quota.window.num`` samples and delays a
client *after* its request by at most the whole window, which holds its bound only because
``max.request.size`` bounds a request. A plog append or fetch has no such bound (``send_batch`` of a
large table is one step), so a delay after the fact, capped at the window, let a fast producer run at
several times its quota. The ledger needs no cap and no bound on a step.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TypeVar

from segment_format.errors import InvalidConfigError

__all__ = ["QUOTA_BURST_S", "Throttle", "TimeAverage", "quota_steps"]

T = TypeVar("T")

#: The allowance a new client starts with, and the most an idle client saves, in seconds of its quota:
#: one of Kafka's ``quota.window.size.seconds`` (PROTOCOL.md 11.10 says why not Kafka's ten).
QUOTA_BURST_S = 1.0


class Throttle:
    """The ledger of one quota: steps reserved in order, each cleared once the allowance reaches its end.

    ``quota`` is in units per second (bytes, requests); None means unlimited (every step clears at
    once). Thread-safe: the clients of one quota entity in a process share one (Kafka's clients of one
    entity share the quota of a broker).
    """

    def __init__(
        self,
        quota: float | None,
        burst_s: float = QUOTA_BURST_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not burst_s > 0:
            raise InvalidConfigError(f"a throttle's burst must be a positive number of seconds, got {burst_s}")
        self.burst_s = burst_s
        self.clock = clock
        self._quota = quota
        self._lock = threading.Lock()
        self._at = clock()
        #: Running totals: what was asked for, and what the quota has allowed so far (a new client's burst first).
        self._reserved = 0.0
        self._allowed = self._cap()

    @property
    def quota(self) -> float | None:
        """The rate in units per second; None for unlimited."""
        return self._quota

    @quota.setter
    def quota(self, rate: float | None) -> None:
        with self._lock:
            if rate == self._quota:
                return
            self._accrue(self.clock())  # what the old rate allowed until now stays allowed
            self._quota = rate
            self._allowed = min(self._allowed, self._reserved + self._cap())

    def _cap(self) -> float:
        """The most the allowance runs ahead of what was asked for: one burst of the quota."""
        return math.inf if self._quota is None else self._quota * self.burst_s

    def _accrue(self, now: float) -> None:
        elapsed = max(0.0, now - self._at)
        self._at = max(self._at, now)
        if self._quota is None:
            self._allowed = self._reserved
        else:
            self._allowed = min(self._allowed + self._quota * elapsed, self._reserved + self._cap())

    def reserve(self, amount: float) -> float:
        """Ask for a step of ``amount``; return its end, for :meth:`wait_s` (the step may be taken once it is 0)."""
        with self._lock:
            self._accrue(self.clock())
            self._reserved += max(0.0, amount)
            return self._reserved

    def wait_s(self, end: float) -> float:
        """Seconds until the allowance reaches ``end`` (a step's end) at the current quota: 0 when it has.

        ``math.inf`` under a quota of 0: the step waits until the quota changes.
        """
        with self._lock:
            self._accrue(self.clock())
            short = end - self._allowed
            if short <= 0:
                return 0.0
            if not self._quota:
                return math.inf
            return short / self._quota


class TimeAverage:
    """The average of values recorded in the last ``span_s`` seconds (Kafka's ``*-throttle-time-avg``).

    Kafka averages the throttle time of every response, zeros included, over its metrics window
    (30 s by default); so does this.
    """

    def __init__(self, span_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.span_s = span_s
        self.clock = clock
        self._values: deque[tuple[float, float]] = deque()
        self._lock = threading.Lock()

    def record(self, value: float) -> None:
        """Add one value (a throttle time in ms)."""
        now = self.clock()
        with self._lock:
            self._values.append((now, value))
            self._trim(now)

    def _trim(self, now: float) -> None:
        while self._values and self._values[0][0] < now - self.span_s:
            self._values.popleft()

    def value(self) -> float:
        """The average, 0.0 when nothing was recorded in the span."""
        with self._lock:
            self._trim(self.clock())
            if not self._values:
                return 0.0
            return sum(v for _, v in self._values) / len(self._values)

    def maximum(self) -> float:
        """The largest value of the span, 0.0 when nothing was recorded (Kafka's ``*-throttle-time-max``)."""
        with self._lock:
            self._trim(self.clock())
            return max((v for _, v in self._values), default=0.0)


def quota_steps(items: Sequence[T], size: Callable[[T], float], limit: float | None) -> list[list[T]]:
    """``items`` cut, in order, into steps of at most ``limit`` (by ``size``), each holding at least one item;
    one step when ``limit`` is None (no quota). A client takes each step only once its quota allows it, so
    over any interval it moves at most one burst more than the quota's rate (PROTOCOL.md 11.10). (The producer
    also cuts a partition's batches into objects of at most ``segment.bytes`` with it.)"""
    if limit is None:
        return [list(items)]
    steps: list[list[T]] = []
    total = 0.0
    for item in items:
        nbytes = size(item)
        if not steps or total + nbytes > limit:
            steps.append([])
            total = 0.0
        steps[-1].append(item)
        total += nbytes
    return steps
