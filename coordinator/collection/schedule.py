"""When a root pass runs: the ``collector`` lease (PROTOCOL.md 3.2, *The root collector*).

Like the maintainer lease of a topic (10.1): one lease per root, ``_coordinator/leases/collector/``, taken
with no clock-skew margin, whose newest epoch's expiry is when the next pass is due (``lease_ms`` =
``collection.interval.ms``, 10 minutes by default). Writers call :func:`maybe_collect` after their writes
(through :func:`coordinator.maintainer.maintain_written`); one that finds the lease unexpired skips at
the cost of one LIST, and none at all, within one process, while the expiry it read is ahead of its
clock. A pass cut short by its budget releases the epoch so the next writer continues.
"""

from __future__ import annotations

import threading
import weakref
from typing import cast

from segment_format.records import now_ms
from segment_format.stores.base import Store

from ..leases import Lease
from .base import CollectionReport
from .passes import collect

#: The lease that schedules root passes.
LEASE_NAME = "collector"
#: ``collection.interval.ms``: least time between two scheduled root passes.
DEFAULT_INTERVAL_MS = 10 * 60 * 1000


class _Schedule:
    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.due_ms = 0


_SCHEDULES: weakref.WeakKeyDictionary[Store, dict[tuple[str, int], _Schedule]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _schedule(store: Store, owner: str, interval_ms: int) -> _Schedule:
    with _LOCK:
        per_store = _SCHEDULES.setdefault(store, {})
        found = per_store.get((owner, interval_ms))
        if found is None:
            # A proxy, as the maintainer's: the schedule must not keep a closed writer's store alive.
            lease = Lease(
                cast(Store, weakref.proxy(store)), LEASE_NAME, owner, lease_ms=interval_ms, max_clock_skew_ms=0
            )
            found = per_store[(owner, interval_ms)] = _Schedule(lease)
        return found


def maybe_collect(
    store: Store, *, owner: str, budget_s: float, interval_ms: int = DEFAULT_INTERVAL_MS
) -> CollectionReport:
    """Run a root pass if one is due (the ``collector`` lease); ``outcome`` ``"not-due"`` if not.

    The pass's lease epoch picks the collectors that run only every so many passes. Errors from storage
    propagate: callers that must not fail log them.
    """
    schedule = _schedule(store, owner, interval_ms)
    lease = schedule.lease
    if now_ms() < schedule.due_ms:
        return CollectionReport(outcome="not-due")
    if not lease.try_acquire():
        seen = lease.last_state
        if seen is not None and seen.holder is not None and not seen.released:
            schedule.due_ms = seen.expires_ms
        return CollectionReport(outcome="not-due")
    schedule.due_ms = lease.expires_ms
    report = collect(store, budget_s=budget_s, epoch=lease.epoch)
    # Pruned whatever the outcome, so that a lease whose passes are all cut short stays a few objects long.
    lease.prune()
    if report.outcome == "budget":
        lease.release()  # the next writer continues now rather than an interval later
        schedule.due_ms = 0
    return report
