"""Self-maintenance: writers merge, retire and collect their topics' objects as part of writing (PROTOCOL.md 10.1).

Kafka's brokers run their log cleaner and retention by themselves; plog has no
broker, so its writers do it, the way Delta's writers checkpoint and
auto-compact. After a write, a writer calls :func:`maybe_maintain` for the
partitions it wrote. One lease per topic says whether a pass is due::

    _coordinator/leases/maintainer=<topic>/<epoch:020d>.json   {"holder", "epoch", "expires_ms", "created_ms"}

An epoch's expiry is the time the next pass is due (its ``lease_ms`` is the
topic's ``auto.maintenance.interval.ms``). A writer that finds the newest epoch
expired creates the next one with put-if-absent and runs the pass; every other
writer skips, at the cost of one LIST (the epoch object it already read is
cached) and, within one process, no request at all until the expiry it read
has passed. A pass stops between partitions once its time budget is spent and
then releases the lease, so the next writer continues at once.

Concurrent maintainers are safe whatever the lease says (PROTOCOL.md 10): the
lease only keeps writers from duplicating work and requests, so it is taken
with no clock-skew margin and a lost race is simply a skip.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

from segment_format.log.move_reads import due_together, move_rounds
from segment_format.records import now_ms
from segment_format.root import LogRoot
from segment_format.segment import SegmentIndex
from segment_format.stores.base import ObjectInfo, Store
from segment_format.topic import TopicMetadata, is_shared

from .collection import maybe_collect
from .keys import maintainer_lease_name
from .leases import Lease
from .transactions import Decision, TransactionCoordinator

ENABLE_KEY = "auto.maintenance.enable"
INTERVAL_KEY = "auto.maintenance.interval.ms"
_log = logging.getLogger(__name__)
#: How long a budget-cut pass's continuation resolves partitions from the topic-wide listing the pass took;
#: any age is safe (PROTOCOL.md 10.1), a younger listing just leaves less work to a later pass.
LISTING_REUSE_S = 30.0
#: The default budget of a pass run after a write (the Spark sink's commit uses it; the producer's sender, on the
#: path of its next writes, passes a shorter one).
DEFAULT_BUDGET_S = 2.0


@dataclass
class MaintenanceReport:
    """What one :func:`maybe_maintain` call did.

    ``outcome`` is ``"disabled"`` (``auto.maintenance.enable`` is false), ``"not-due"`` (another pass
    ran less than an interval ago, or a concurrent writer just took the lease), ``"done"`` (every given
    partition was maintained) or ``"budget"`` (the time budget ran out; ``partitions`` lists those done).
    """

    topic: str
    outcome: str
    partitions: list[int] = field(default_factory=list)
    merged: int = 0
    garbage_deleted: int = 0
    seconds: float = 0.0

    @property
    def ran(self) -> bool:
        """Whether this call maintained at least one partition."""
        return bool(self.partitions)


class _TopicState:
    """One process's view of one topic's maintainer lease: the lease object and where to continue."""

    def __init__(self, lease: Lease | None) -> None:
        self.lease = lease
        self.due_ms = 0  # no pass before this (our clock): the expiry of the newest epoch we read
        self.cursor = 0  # the partition a budget-cut pass stopped before
        #: The topic-wide listing a budget-cut pass took (topic id, monotonic s, listings), for its continuation.
        self.listed: tuple[str, float, dict[int, list[ObjectInfo]]] | None = None
        #: The partitions this state's passes maintained since ``listed`` was taken: that listing is stale for
        #: them (their merges are not in it), so a later pass leaves them to the next cycle, which starts once
        #: every partition is visited or the listing is ``LISTING_REUSE_S`` old, instead of redoing the merges.
        self.visited: set[int] = set()


_STATES: weakref.WeakKeyDictionary[Store, dict[tuple[str, str, int], _TopicState]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _state(store: Store, topic: str, owner: str, interval_ms: int) -> _TopicState:
    with _LOCK:
        per_store = _STATES.setdefault(store, {})
        key = (topic, owner, interval_ms)
        found = per_store.get(key)
        if found is None:
            lease = None
            if interval_ms > 0:
                # A proxy: the state is kept only while the store lives (it keys _STATES weakly), and a lease
                # holding the store itself would keep every closed writer's store alive.
                lease = Lease(
                    cast(Store, weakref.proxy(store)),
                    maintainer_lease_name(topic),
                    owner,
                    lease_ms=interval_ms,
                    max_clock_skew_ms=0,
                )
            found = per_store[key] = _TopicState(lease)
        return found


def _topic_listing(
    root: LogRoot, topic: str, meta: TopicMetadata, state: _TopicState, visits: int
) -> tuple[float, dict[int, list[ObjectInfo]]]:
    """The listings a pass resolves its partitions from: (when listed, by partition); empty to list each itself.

    One listing of the whole topic when the pass visits most of it: a LIST per 1,000 objects, not one per
    partition (PROTOCOL.md 10.1); a writer of a few partitions of a wide topic lists just those. A pass cut
    short by its budget continues on the listing it took, while that is younger than ``LISTING_REUSE_S``:
    listing a large topic may take most of a budget, and listing it again for every continuation would
    cost as much as the listings saved.
    """
    now = time.monotonic()
    if state.listed is not None:
        topic_id, listed, listings = state.listed
        # Only a listing of this incarnation, with its partitions: a topic deleted and created again under the
        # name (a new id), or given more partitions, is listed afresh.
        same = topic_id == meta.topic_id and listings.keys() == set(range(meta.partitions))
        if same and now - listed < LISTING_REUSE_S:
            return listed, listings
    state.listed = None
    state.visited.clear()
    if 2 * visits <= meta.partitions:
        return now, {}
    listings = root.partition_listings(topic, meta)
    state.listed = (meta.topic_id, now, listings)
    return now, listings


_COORDINATORS: weakref.WeakKeyDictionary[LogRoot, TransactionCoordinator] = weakref.WeakKeyDictionary()
_COORDINATORS_LOCK = threading.Lock()


def _transactions(root: LogRoot) -> TransactionCoordinator:
    """One transaction coordinator per root, so that decisions compaction looked up stay cached (11.6)."""
    with _COORDINATORS_LOCK:
        found = _COORDINATORS.get(root)
        if found is None:
            found = _COORDINATORS[root] = TransactionCoordinator(root.store, root.protocol)
        return found


def maybe_maintain(
    root: LogRoot,
    topic: str,
    partitions: Iterable[int] | None = None,
    *,
    owner: str,
    budget_s: float = DEFAULT_BUDGET_S,
) -> MaintenanceReport:
    """Maintain ``partitions`` of ``topic`` (default: all) if the topic wants it and a pass is due.

    A pass merges small objects, applies retention and collects garbage on each partition in turn
    (``PartitionLog.maintain``: merge, retention, garbage collection sharing one listing, cut from one
    listing of the whole topic when the pass visits more than half its partitions), and stops between
    partitions once ``budget_s`` is spent (at least one partition is always done). ``owner`` names
    the writer in the lease. Errors from storage propagate: callers that must not fail log them.
    """
    started = time.monotonic()
    meta = root.topic(topic)
    report = MaintenanceReport(topic, "disabled")
    if not meta.config[ENABLE_KEY]:  # topic metadata fills in the defaults of keys older objects lack
        return report
    interval_ms = meta.config[INTERVAL_KEY]
    state = _state(root.store, topic, owner, interval_ms)
    report.outcome = "not-due"
    lease = state.lease
    if lease is not None:
        if now_ms() < state.due_ms:
            return report  # we read the lease already: not due yet, and no request needed to know it
        if not lease.try_acquire():
            seen = lease.last_state
            if seen is not None and seen.holder is not None and not seen.released:
                state.due_ms = seen.expires_ms  # whoever holds it: no pass of ours before its expiry
            return report
        state.due_ms = lease.expires_ms
    # A shared topic's pass visits every partition: a flush touches most of them, and a cold one must still
    # move its runs into a segment so that it pins neither commits nor shared objects (PROTOCOL.md 10.2).
    every = partitions is None or is_shared(meta.config)
    wanted = sorted(set(range(meta.partitions) if every or partitions is None else partitions))
    cut = next((i for i, p in enumerate(wanted) if p >= state.cursor), 0)
    order = wanted[cut:] + wanted[:cut]  # a pass cut short last time continues where it stopped
    report.outcome = "done"
    listed, listings = _topic_listing(root, topic, meta, state, len(order))
    if listings:
        # A continuation visits only what this cycle has not: on a partition visited since the listing,
        # the listing predates that visit's merge, and working on it would read the merged objects again
        # and have its merged object's create refused. If that is every partition this pass was given (a
        # writer of a few partitions), they are listed afresh, one by one, rather than skipped.
        unvisited = [p for p in order if p not in state.visited]
        if unvisited:
            order = unvisited
        else:
            listings = {}
    transactions = _transactions(root)
    due: dict[int, Sequence[SegmentIndex]] = {}
    if is_shared(meta.config) and listings:  # what each partition moves, so that the moves read objects once
        due = due_together({p: root.partition(topic, p, meta).move_candidate(listings.get(p), listed) for p in order})
    stale_s = meta.config["writer.max.staleness.ms"] / 4000

    def relist() -> None:  # before a round of moves: a listing W old would stop the rest of the pass (10.2)
        nonlocal listed, listings
        if listings and time.monotonic() - listed > stale_s:
            listed, listings = time.monotonic(), root.partition_listings(topic, meta)
            state.listed = (meta.topic_id, listed, listings)
            state.visited.clear()

    this_round = None
    for i, (p, reads) in enumerate(move_rounds(root.store, due, order, relist)):
        # Cut between rounds of moves, never inside one: a round reads its shared objects once for all its
        # partitions, and a partition left for the next pass would read them all again.
        inside_round = reads is not None and reads is this_round
        this_round = reads
        if i and not inside_round and time.monotonic() - started >= budget_s:
            report.outcome = "budget"
            state.cursor = p
            break
        listing = listings.get(p)
        merged, deleted = root.partition(topic, p, meta).maintain(
            listing=listing,
            listed_monotonic=listed,
            resolver=transactions.resolve,
            decided_ms=transactions.decided_ms,
            move_reads=reads,
        )
        report.merged += merged
        report.garbage_deleted += deleted
        report.partitions.append(p)
        if listings:
            state.visited.add(p)
    if is_shared(meta.config) and report.outcome == "done":
        logs = {p: root.partition(topic, p, meta) for p in range(meta.partitions)}
        merged, deleted = root.maintain_commits(topic, meta, logs)
        report.merged += merged
        report.garbage_deleted += deleted
    if state.listed is not None and state.visited >= state.listed[2].keys():
        # The cycle is over: every partition of its listing visited. The next pass lists afresh.
        state.listed = None
        state.visited.clear()
        state.cursor = 0
    if lease is not None:
        # Pruned whatever the outcome: a holder whose passes are all cut short by the budget must not let the
        # lease's epochs and release renewals pile up (PROTOCOL.md 10.1).
        lease.prune()
        if report.outcome == "budget":
            lease.release()  # the next writer continues now rather than an interval later
            state.due_ms = 0
    report.seconds = time.monotonic() - started
    return report


def maintain_written(
    root: LogRoot,
    written: Mapping[str, Iterable[int]],
    *,
    owner: str,
    budget_s: float = DEFAULT_BUDGET_S,
    writer: str = "writer",
    decisions: Iterable[Decision] = (),
) -> None:
    """After a write: :func:`maybe_maintain` the partitions written, per topic, then the root's collector
    (:func:`coordinator.collection.maybe_collect`) if its pass is due; never raises.

    Maintenance is best effort for the write that triggers it: a failure is
    logged (naming ``writer``) and the next pass retries. ``decisions``: decisions the writer made (the
    Spark sink's commit), which merges resolving its batches then need not read
    (PROTOCOL.md 10, *Resolving transactions*): a GET per micro-batch saved.
    """
    transactions = _transactions(root)
    for decision in decisions:
        transactions.remember(decision)
    for topic, partitions in written.items():
        try:
            maybe_maintain(root, topic, sorted({int(p) for p in partitions}), owner=owner, budget_s=budget_s)
            # Whatever the lease says: a tier of small commits this writer just completed is merged now, so that
            # a reader catching up does not read a commit and an object per flush (PROTOCOL.md 10.2).
            root.merge_own_tier(topic)
        except Exception as exc:  # noqa: BLE001 - never fail the write that triggered it
            _log.warning("plog %s: maintenance of topic %r failed: %s", writer, topic, exc)
    if written:
        # The root's other namespaces (groups, leases, leftovers of deleted topics), when the root's collector
        # lease says a pass is due: no request at all while the expiry this process read is ahead.
        try:
            maybe_collect(root.store, owner=owner, budget_s=budget_s)
        except Exception as exc:  # noqa: BLE001 - never fail the write that triggered it
            _log.warning("plog %s: collection of the root failed: %s", writer, exc)
