"""One root pass: the collectors of :data:`COLLECTORS` in turn, within a budget (PROTOCOL.md 3)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from segment_format.records import now_ms as wall_now_ms
from segment_format.root import LogRoot
from segment_format.stores.base import Store

from .base import CollectionContext, CollectionReport, CountingView, NamespaceCollector
from .groups import GroupsCollector
from .leases import LeasesCollector
from .shared_objects import SharedObjectsCollector
from .temp_files import TempFilesCollector
from .topics import TopicsCollector
from .transactions import TransactionsCollector

log = logging.getLogger(__name__)

#: The collectors a pass runs, in order.
COLLECTORS: list[NamespaceCollector] = [
    LeasesCollector(),
    GroupsCollector(),
    TopicsCollector(),
    TempFilesCollector(),
    SharedObjectsCollector(),
    TransactionsCollector(),
]


def collect(
    store_or_root: Store | LogRoot,
    *,
    now_ms: int | None = None,
    budget_s: float | None = None,
    epoch: int | None = None,
    collectors: Sequence[NamespaceCollector] | None = None,
) -> CollectionReport:
    """One root pass: each collector in turn, within ``budget_s`` seconds (None: no limit).

    ``now_ms`` is the wall clock every age is measured against (default: now). ``epoch`` is the
    ``collector`` lease epoch of a scheduled pass (collectors with ``every > 1`` run on the epochs that are
    multiples of it); None runs them all. A collector that fails is logged and reported, and the pass
    goes on with the next.
    """
    store = store_or_root.store if isinstance(store_or_root, LogRoot) else store_or_root
    started = time.monotonic()
    report = CollectionReport()
    deadline = None if budget_s is None else started + budget_s
    at = wall_now_ms() if now_ms is None else now_ms
    for collector in COLLECTORS if collectors is None else collectors:
        if epoch is not None and epoch % collector.every:
            continue
        context = CollectionContext(CountingView(store), at, deadline, epoch, raw_store=store)
        if context.spent():
            report.outcome = "budget"
            break
        try:
            deleted = collector.collect(context)
        except Exception as exc:  # noqa: BLE001 - one namespace's failure must not stop the others
            log.warning("plog collector: %s failed: %s", collector.namespace, exc)
            report.errors[collector.namespace] = str(exc)
            deleted = 0
        report.deleted[collector.namespace] = report.deleted.get(collector.namespace, 0) + deleted
        report.requests[collector.namespace] = report.requests.get(collector.namespace, 0) + context.requests
        if context.spent():
            report.outcome = "budget"
            break
    report.seconds = time.monotonic() - started
    return report
