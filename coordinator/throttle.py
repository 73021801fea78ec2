"""Kafka's sampled rate and its throttle time (PROTOCOL.md 11.10): how long to delay a client over its quota.

A :class:`Throttle` keeps ``window_num`` samples of ``window_size_s`` seconds each (Kafka's
``quota.window.num`` 11 and ``quota.window.size.seconds`` 1). ``record(amount)`` adds to the current
sample, measures the rate over the samples still in the window and, when it is above the quota,
returns Kafka's delay::

    delay = (observed_rate - quota) / quota * window_elapsed

which is exactly the time after which the bytes in the window, spread over the longer window, would
be at the quota (``window_elapsed`` is the time the samples span). The caller sleeps that long (or a
gateway mutes the connection and reports it as ``throttle_time_ms``). The delay is bounded by the
whole window (11 s): a client that sent far more than its quota in one request is delayed in steps.

One difference from Kafka, on purpose: Kafka pads the elapsed time of a young rate to ``window_num - 1``
windows, so that a new client may burst ``quota × 10 s`` before its first delay; here it is padded to
one window only, so a burst is at most one second of quota. The object store throttles per second
(PROTOCOL.md 11.10), and a ten-second burst is what the quota exists to prevent.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from segment_format.errors import InvalidConfigError

__all__ = ["QUOTA_WINDOW_NUM", "QUOTA_WINDOW_SIZE_S", "Throttle", "TimeAverage"]

#: Kafka's ``quota.window.num``: samples kept.
QUOTA_WINDOW_NUM = 11
#: Kafka's ``quota.window.size.seconds``: the span of one sample.
QUOTA_WINDOW_SIZE_S = 1.0


class Throttle:
    """A sampled rate over ``window_num`` windows of ``window_size_s`` and the delay that keeps it at ``quota``.

    ``quota`` is in units per second (bytes, requests); None means unlimited (``record`` returns 0).
    Thread-safe: the clients of one quota entity in a process share one (Kafka's clients of one entity
    share the quota of a broker).
    """

    def __init__(
        self,
        quota: float | None,
        window_num: int = QUOTA_WINDOW_NUM,
        window_size_s: float = QUOTA_WINDOW_SIZE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if window_num < 2 or window_size_s <= 0:
            raise InvalidConfigError(
                f"a throttle needs at least 2 windows of a positive size, got {window_num} × {window_size_s} s"
            )
        self.quota = quota
        self.window_num = window_num
        self.window_size_s = window_size_s
        self.clock = clock
        #: [start, total] per sample, oldest first.
        self._samples: deque[list[float]] = deque()
        self._lock = threading.Lock()

    @property
    def max_delay_s(self) -> float:
        """The longest delay one ``record`` returns: the whole window."""
        return self.window_num * self.window_size_s

    def _purge(self, now: float) -> None:
        horizon = now - self.window_num * self.window_size_s
        while self._samples and self._samples[0][0] + self.window_size_s <= horizon:
            self._samples.popleft()

    def _elapsed(self, now: float) -> float:
        """The span the samples cover, at least one window (see the module docstring)."""
        if not self._samples:
            return self.window_size_s
        return max(self.window_size_s, now - self._samples[0][0])

    def rate(self, now: float | None = None) -> float:
        """The measured rate: the samples' total over the time they span."""
        now = self.clock() if now is None else now
        with self._lock:
            self._purge(now)
            return sum(s[1] for s in self._samples) / self._elapsed(now)

    def record(self, amount: float, now: float | None = None) -> float:
        """Add ``amount`` now; return the seconds to delay the client (0 when at or under the quota)."""
        now = self.clock() if now is None else now
        with self._lock:
            self._purge(now)
            if not self._samples or now >= self._samples[-1][0] + self.window_size_s:
                self._samples.append([now, 0.0])
                while len(self._samples) > self.window_num:
                    self._samples.popleft()
            self._samples[-1][1] += amount
            quota = self.quota
            if quota is None:
                return 0.0
            elapsed = self._elapsed(now)
            observed = sum(s[1] for s in self._samples) / elapsed
        if observed <= quota:
            return 0.0
        return delay_s(observed, quota, elapsed, self.max_delay_s)


def delay_s(observed: float, quota: float, window_s: float, max_delay_s: float) -> float:
    """Kafka's throttle time: ``(observed - quota) / quota * window_s``, in ``[0, max_delay_s]``.

    A quota of 0 blocks the client: the delay is the bound.
    """
    if observed <= quota:
        return 0.0
    if quota <= 0:
        return max_delay_s
    return min(max_delay_s, (observed - quota) / quota * window_s)


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
