"""Kafka's bound on a client under a quota, checked on what it moved over time (PROTOCOL.md 11.10).

A client under a quota of ``q`` bytes per second moves, from its start, at most ``q × (elapsed + burst)``,
and over any interval ``[a, b]`` of its run at most ``q × (b - a + burst)``: the first is the bound for a
new client, the second for one already running. The tests observe the bytes from outside (the log's end,
delivery callbacks, what ``poll`` returned), a little after the client moved them, so the interval check
allows ``lag_s`` of the quota for that; the check from the start needs no allowance, since nothing is
observed before it happened.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from coordinator.throttle import QUOTA_BURST_S

#: How long after a client moves bytes a test may first observe them, at most (a store request, a poll).
OBSERVATION_LAG_S = 0.5


class Progress:
    """(time, bytes moved so far) pairs, taken as a client runs."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self.total = 0.0
        self._lock = threading.Lock()

    def add(self, nbytes: float) -> None:
        """Count ``nbytes`` moved now."""
        with self._lock:
            self.total += nbytes
            self.samples.append((time.monotonic(), self.total))

    def set(self, total: float) -> None:
        """The bytes moved so far, observed now."""
        with self._lock:
            self.total = total
            self.samples.append((time.monotonic(), total))


class Poller:
    """Samples ``moved()`` (bytes moved so far, read from outside the client) every ``every_s`` in a thread."""

    def __init__(self, moved: Callable[[], float], every_s: float = 0.05) -> None:
        self.progress = Progress()
        self._moved = moved
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Progress:
        self._thread.start()
        return self.progress

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.progress.set(self._moved())

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            self.progress.set(self._moved())


def assert_within_quota(
    progress: Progress, quota: float, start: float, lag_s: float = OBSERVATION_LAG_S, burst_s: float = QUOTA_BURST_S
) -> None:
    """Fail unless ``progress`` keeps Kafka's bound: from ``start`` (before the client's first step) and over
    every interval between two samples. Prints the tightest margin of each."""
    samples = progress.samples
    assert samples, "nothing was observed"
    worst_start = max(moved / (quota * (t - start + burst_s)) for t, moved in samples)
    assert worst_start <= 1.0 + 1e-9, f"moved {worst_start:.2f} × the bound from the start"
    worst = 0.0
    where = (0.0, 0.0)
    for i, (a, moved_a) in enumerate(samples):
        for b, moved_b in samples[i + 1 :]:
            ratio = (moved_b - moved_a) / (quota * (b - a + burst_s + lag_s))
            if ratio > worst:
                worst, where = ratio, (a - start, b - start)
    print(f"bound: {worst_start:.2f} of it from the start, {worst:.2f} over [{where[0]:.1f} s, {where[1]:.1f} s]")
    assert worst <= 1.0 + 1e-9, f"moved {worst:.2f} × the bound over [{where[0]:.1f} s, {where[1]:.1f} s] of the run"


def assert_near_quota(progress: Progress, quota: float, start: float, tolerance: float = 0.2) -> None:
    """Fail unless the client reached its quota over the run, give or take ``tolerance`` (Kafka's 20 %): a
    quota held by not moving at all is not held."""
    end, moved = progress.samples[-1]
    rate = moved / (end - start)
    print(f"rate: {rate / quota:.2f} of the quota over {end - start:.1f} s")
    assert rate >= (1 - tolerance) * quota, (rate, quota)
