"""Collection of producer ids, transactional-id epochs, decisions and markers (PROTOCOL.md 11.1-11.3).

::

    _coordinator/producer-ids/<n>.json                         all but those below the newest one older than 2D
    _coordinator/transactional-ids/<h>/epochs/<e>.json         decided, not the newest, some epoch >= e older than 2D
    _coordinator/transactions/<pid>/<txn>.json                  not the newest nor the newest committed of pid, and
                                                                  committed: every batch settled in the log
                                                                  aborted: older than T + 2D
    _coordinator/transactions/<pid>/<txn>.materialized          with its decision, or when the decision is gone
    _coordinator/transactional-ids/<h>/producer-id.json         a sink's retry id of a passed micro-batch, once
                                                                  its decisions are gone (newest ones included)

Only in a root listing ``boundedHistory``: elsewhere producer ids are found by probing (they must stay
contiguous) and merges keep transactional batches, so nothing here may go. A pass is safe to run
concurrently with itself and with every writer: each deletion is one the rules allow whoever makes it.
Objects never change, so what a pass reads it keeps (``created_ms`` of ids and epochs, decisions,
indexes) and a later pass in the same process reads only what is new.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from segment_format import numbered
from segment_format.errors import PlogError, UnknownTopicOrPartitionError
from segment_format.log.chain import LogView
from segment_format.log.reader import COMMITTED
from segment_format.parallel import ordered_map
from segment_format.protocol import BOUNDED_HISTORY
from segment_format.root import LogRoot
from segment_format.segment import ATTR_TRANSACTIONAL
from segment_format.stores.base import ObjectInfo, Store

from ..keys import (
    PRODUCER_IDS,
    TRANSACTIONAL_IDS,
    TRANSACTIONS,
    materialized_key,
    transactional_id_prefix,
    transactions_prefix,
)
from ..transactions import (
    COORDINATOR_DELAY_MS,
    LISTING_MAX_AGE_S,
    MAX_TRANSACTION_TIMEOUT_MS,
    Decision,
    EpochClaim,
    ProducerIdClaim,
    TransactionalIdMapping,
    TransactionCoordinator,
    parse_retry_id,
)
from .base import CollectionContext, NamespaceCollector

#: ε of assumption A4 (PROTOCOL.md 2).
CLOCK_SKEW_MS = 1_000
#: One DeleteObjects request takes at most this many keys (S3's limit).
DELETE_BATCH = 1_000
_MARKER = ".materialized"


@dataclass
class TransactionCollection:
    """What one pass deleted, by namespace, and whether it ran out of time."""

    producer_ids: int = 0
    epochs: int = 0
    decisions: int = 0
    markers: int = 0
    retry_ids: int = 0
    cut_short: bool = False

    @property
    def deleted(self) -> int:
        """Objects deleted, all namespaces together."""
        return self.producer_ids + self.epochs + self.decisions + self.markers + self.retry_ids


@dataclass
class _Listing:
    """One pass's listings of ``transactions/`` and ``transactional-ids/``, sorted by owner."""

    decisions: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    markers: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))
    epochs: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    mappings: set[str] = field(default_factory=set)


class TransactionHistoryCollector:
    """Applies the *Collection* rules of PROTOCOL.md 11.1-11.3 to one root; keep one per root and process."""

    def __init__(self, root: LogRoot, coordinator: TransactionCoordinator | None = None) -> None:
        self.root = root
        #: The store the pass's own listings, reads and deletions go through (a counting view, in a pass).
        self.counted: Store | None = None
        self.coordinator = coordinator or TransactionCoordinator(root.store, root.protocol)
        self._created: dict[str, int] = {}  # key -> created_ms of producer ids and epochs read
        self._mappings: dict[str, TransactionalIdMapping] = {}  # transactional-id hash -> its mapping
        #: Per topic, this pass's listing of it: (when, partition count, listings by partition).
        self._listings: dict[str, tuple[float, int, dict[int, list[ObjectInfo]]]] = {}
        self._views: dict[tuple[str, int], LogView] = {}

    @property
    def store(self) -> Store:
        """Where this collector's requests go: the pass's counting view, else the root's store."""
        return self.counted if self.counted is not None else self.root.store

    def collect(self, now_ms: int, deadline: float = float("inf")) -> TransactionCollection:
        """One pass over the three namespaces, stopping between steps once ``time.monotonic()`` passes ``deadline``."""
        report = TransactionCollection()
        # Only once every process that may write the root knows the feature (PROTOCOL.md 12.3): one that
        # opened the root before would still find producer ids by probing and could reuse a collected one.
        if not self.root.protocol.is_settled(BOUNDED_HISTORY, COORDINATOR_DELAY_MS):
            return report
        self._listings.clear()  # chains are read again each pass (at most W old)
        self._views.clear()
        report.producer_ids = self._producer_ids(now_ms)
        listing = self._listing()
        epoch_holders: dict[int, set[int]] = {}
        for tid_hash, epochs in listing.epochs.items():
            if time.monotonic() > deadline:
                report.cut_short = True
                return report
            producer_id = self._producer_id(tid_hash) if tid_hash in listing.mappings else None
            if producer_id is None:
                continue
            decided = set(listing.decisions.get(producer_id, ()))
            gone = self._epochs(tid_hash, epochs, decided, now_ms)
            report.epochs += len(gone)
            epoch_holders[producer_id] = set(epochs) - gone
        passed = self._passed_retries(listing)
        for producer_id, txns in listing.decisions.items():
            if time.monotonic() > deadline:
                report.cut_short = True
                return report
            decisions, markers = self._decisions(
                producer_id,
                txns,
                listing.markers.get(producer_id, set()),
                epoch_holders.get(producer_id, set()),
                now_ms,
                keep_newest=producer_id not in passed,
            )
            report.decisions += decisions
            report.markers += markers
        # A passed retry id whose decisions are all gone goes itself (its producer id is never used again).
        spent = [
            f"{TRANSACTIONAL_IDS}{tid_hash}/producer-id.json"
            for producer_id, tid_hash in passed.items()
            if not listing.decisions.get(producer_id) and not listing.markers.get(producer_id)
        ]
        self._delete(spent)
        report.retry_ids += len(spent)
        for producer_id, marked in listing.markers.items():  # markers whose decision is gone
            # A listing may show a marker and miss its decision created during it: look again before deleting.
            orphans = [
                txn
                for txn in sorted(marked - set(listing.decisions.get(producer_id, ())))
                if not self.store.exists(numbered.numbered_key(transactions_prefix(producer_id), txn))
            ]
            self._delete([self._marker_key(producer_id, txn) for txn in orphans])
            report.markers += len(orphans)
        return report

    # ------------------------------------------------------------------ producer ids (11.1)

    def _producer_ids(self, now_ms: int) -> int:
        """Delete every id below the largest one created at least 2D ago; the largest id always stays."""
        ids = numbered.numbers(self.store, PRODUCER_IDS)
        cutoff = now_ms - 2 * COORDINATOR_DELAY_MS
        oldest_enough = self._largest_created_by(ids, lambda n: numbered.numbered_key(PRODUCER_IDS, n), cutoff)
        if oldest_enough is None:
            return 0
        doomed = [numbered.numbered_key(PRODUCER_IDS, n) for n in ids if n < oldest_enough]
        self._delete(doomed)
        return len(doomed)

    def _largest_created_by(self, numbers: Sequence[int], key: Callable[[int], str], cutoff: int) -> int | None:
        """A large number among ``numbers`` whose object says it was created at or before ``cutoff``.

        Numbers are taken in creation order, so ``created_ms`` grows with them (up to clock skew): a
        bisection finds the largest such number with O(log n) reads. Skew can only make it find a smaller
        one, which the rule allows too (it needs some object that old above whatever it deletes).
        """
        if not numbers or self._created_ms(key(numbers[0])) > cutoff:
            return None
        low, high = 0, len(numbers) - 1  # invariant: numbers[low] is old enough
        if self._created_ms(key(numbers[high])) <= cutoff:
            return numbers[high]
        while high - low > 1:
            middle = (low + high) // 2
            if self._created_ms(key(numbers[middle])) <= cutoff:
                low = middle
            else:
                high = middle
        return numbers[low]

    def _created_ms(self, key: str) -> int:
        """``created_ms`` of a producer-id or epoch object; a missing one counts as new (nothing is deleted for it)."""
        found = self._created.get(key)
        if found is None:
            try:
                data = self.store.get(key)
                found = (
                    EpochClaim.from_json(data, what=key).created_ms
                    if "/epochs/" in key
                    else ProducerIdClaim.from_json(data, what=key).created_ms
                )
            except PlogError:  # gone, or damaged: its time is unknown, so it is never old enough
                return 2**63 - 1
            self._created[key] = found
        return found

    # ------------------------------------------------------------------ epochs (11.3)

    def _epochs(self, tid_hash: str, epochs: list[int], decided: set[int], now_ms: int) -> set[int]:
        """Delete decided epochs below the newest, up to the largest epoch created at least 2D ago."""
        prefix = f"{TRANSACTIONAL_IDS}{tid_hash}/epochs/"
        if len(epochs) < 2:
            return set()
        limit = self._largest_created_by(
            epochs, lambda e: numbered.numbered_key(prefix, e), now_ms - 2 * COORDINATOR_DELAY_MS
        )
        if limit is None:
            return set()
        newest = epochs[-1]
        gone = {e for e in epochs if e <= limit and e < newest and e in decided}
        self._delete([numbered.numbered_key(prefix, e) for e in sorted(gone)])
        return gone

    def _producer_id(self, tid_hash: str) -> int | None:
        found = self._mapping(tid_hash)
        return None if found is None else found.producer_id

    def _mapping(self, tid_hash: str) -> TransactionalIdMapping | None:
        """A transactional id's mapping (immutable: read once per process), None if gone or damaged."""
        found = self._mappings.get(tid_hash)
        if found is None:
            key = f"{TRANSACTIONAL_IDS}{tid_hash}/producer-id.json"
            try:
                found = TransactionalIdMapping.from_json(self.store.get(key), what=key)
            except PlogError:  # gone or damaged (ObjectNotFoundError is one)
                return None
            self._mappings[tid_hash] = found
        return found

    # ------------------------------------------------------------------ retry ids (11.3)

    def _passed_retries(self, listing: _Listing) -> dict[int, str]:
        """The producer ids of retry ids whose micro-batch the sink has passed (its own producer id has a
        decision for a later micro-batch), with their transactional-id hashes. Only ids without epochs are
        looked at: a sink's ids take none, so a root's transactional producers cost no read here."""
        passed: dict[int, str] = {}
        for tid_hash in sorted(listing.mappings - set(listing.epochs)):
            mapping = self._mapping(tid_hash)
            retry = None if mapping is None else parse_retry_id(mapping.transactional_id)
            if mapping is None or retry is None:
                continue
            base, txn = retry
            base_hash = transactional_id_prefix(base)[len(TRANSACTIONAL_IDS) : -1]
            sink = self._producer_id(base_hash) if base_hash in listing.mappings else None
            if sink is not None and max(listing.decisions.get(sink, ()), default=-1) > txn:
                passed[mapping.producer_id] = tid_hash
        return passed

    # ------------------------------------------------------------------ decisions (11.2)

    def _decisions(
        self,
        producer_id: int,
        txns: list[int],
        markers: set[int],
        epochs: set[int],
        now_ms: int,
        keep_newest: bool = True,
    ) -> tuple[int, int]:
        """Delete the decisions of one producer id the rules allow, each after its marker (``keep_newest``
        False: a passed retry id's, whose newest and newest committed need not stay)."""
        txns = sorted(txns)
        if len(txns) < (2 if keep_newest else 1):
            return 0, 0
        # Decisions are immutable and cached by the coordinator: a later pass reads only new ones.
        read = dict(zip(txns, ordered_map(lambda txn: self._decision(producer_id, txn), txns), strict=True))
        newest_committed = max((t for t, d in read.items() if d is not None and d.state == COMMITTED), default=None)
        kept = {txns[-1], newest_committed} if keep_newest else set()
        doomed = []
        unsettled = False  # once a commit's batches are not all settled, later ones (written after) are not checked
        for txn, decision in read.items():
            if txn in kept or decision is None or txn in epochs:
                continue
            if decision.state == COMMITTED:
                if not unsettled and self._settled(decision, now_ms):
                    doomed.append(txn)
                else:
                    unsettled = True
            elif decision.created_ms <= now_ms - MAX_TRANSACTION_TIMEOUT_MS - 2 * COORDINATOR_DELAY_MS:
                doomed.append(txn)
        marker_keys = [self._marker_key(producer_id, txn) for txn in doomed if txn in markers]
        self._delete(marker_keys)  # markers first: a marker never outlives the rule that kept its decision
        self._delete([numbered.numbered_key(transactions_prefix(producer_id), txn) for txn in doomed])
        return len(doomed), len(marker_keys)

    def _decision(self, producer_id: int, txn: int) -> Decision | None:
        try:
            return self.coordinator.decision(producer_id, txn)
        except PlogError:  # damaged: kept, as the reader's error names it
            return None

    def _settled(self, decision: Decision, now_ms: int) -> bool:
        """Whether every batch a committed decision lists is below its log start, gone with its topic, or
        in a chain element free of the transaction and created at least D + ε ago (PROTOCOL.md 11.2)."""
        for topic, partitions in decision.batches.items():
            for partition_text, ranges in partitions.items():
                partition = int(partition_text)
                view = self._view(topic, partition)
                if view is None:
                    continue  # the topic or partition no longer exists: its batches went with it
                delay_ms = int(self.root.topic(topic).config["file.delete.delay.ms"])
                for first, last in ranges:
                    if last < view.start_offset:
                        continue
                    if not self._resolved_at(
                        topic, partition, view, decision, first, now_ms - delay_ms - CLOCK_SKEW_MS
                    ):
                        return False
        return True

    def _view(self, topic: str, partition: int) -> LogView | None:
        """The partition's chain from one listing of its topic taken at most W ago (every partition of the
        topic from the same listing: one LIST per 1,000 objects of the topic), None if it does not exist."""
        listed = self._listings.get(topic)
        if listed is None or time.monotonic() - listed[0] > LISTING_MAX_AGE_S:
            try:
                meta = self.root.topic(topic, refresh=True)  # a deleted topic must not look alive
                listed = (time.monotonic(), meta.partitions, self.root.partition_listings(topic, meta))
            except UnknownTopicOrPartitionError:
                listed = (time.monotonic(), 0, {})
            self._listings[topic] = listed
            self._views = {k: v for k, v in self._views.items() if k[0] != topic}
        at, partitions, listings = listed
        if partition >= partitions:
            return None
        if (topic, partition) not in self._views:
            self._views[(topic, partition)] = self.root.partition(topic, partition).chain.view_from(
                listings.get(partition, []), at
            )
        return self._views[(topic, partition)]

    def _resolved_at(
        self, topic: str, partition: int, view: LogView, decision: Decision, first: int, created_by: int
    ) -> bool:
        """Whether the chain element holding ``first`` is free of the transaction and created by ``created_by``."""
        if not view.segments or first >= view.end_offset:
            return False
        ref = view.segments[max(view.segment_for(first), 0)]
        index = self.root.partition(topic, partition).index(ref)
        if index.meta.created_ms > created_by:
            return False
        transactional = (index.attributes & ATTR_TRANSACTIONAL) != 0
        ours = transactional & (index.producer_ids == decision.producer_id) & (index.transactions == decision.txn)
        return not bool(ours.any())

    # ------------------------------------------------------------------ listing and deleting

    def _listing(self) -> _Listing:
        listing = _Listing()
        for info in self.store.list(TRANSACTIONS):
            owner, _, name = info.key[len(TRANSACTIONS) :].partition("/")
            if not owner.isdigit():
                continue
            if name.endswith(_MARKER) and name[: -len(_MARKER)].isdigit():
                listing.markers[int(owner)].add(int(name[: -len(_MARKER)]))
            elif (txn := numbered.parse_number(name)) is not None and "/" not in name:
                listing.decisions[int(owner)].append(txn)
        for info in self.store.list(TRANSACTIONAL_IDS):
            tid_hash, _, rest = info.key[len(TRANSACTIONAL_IDS) :].partition("/")
            if rest == "producer-id.json":
                listing.mappings.add(tid_hash)
            elif rest.startswith("epochs/") and (epoch := numbered.parse_number(rest)) is not None:
                listing.epochs[tid_hash].append(epoch)
        for epochs in listing.epochs.values():
            epochs.sort()
        return listing

    @staticmethod
    def _marker_key(producer_id: int, txn: int) -> str:
        return materialized_key(producer_id, txn)

    def _delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), DELETE_BATCH):
            self.store.delete_many(keys[start : start + DELETE_BATCH])


class TransactionsCollector(NamespaceCollector):
    """The root pass's step for producer ids, epochs, decisions and markers (PROTOCOL.md 11.1-11.3).

    One :class:`TransactionHistoryCollector` per store is kept for the life of the process, so that what
    one pass read (decisions, times, indexes: all immutable) the next pass does not read again.
    """

    namespace = "transactions"

    def __init__(self) -> None:
        self._collectors: weakref.WeakKeyDictionary[Store, TransactionHistoryCollector] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def collect(self, context: CollectionContext) -> int:
        """One pass of the rules on the context's store, within its deadline."""
        raw = context.raw_store if context.raw_store is not None else context.store
        with self._lock:
            collector = self._collectors.get(raw)
            if collector is None:
                collector = self._collectors[raw] = TransactionHistoryCollector(
                    LogRoot(getattr(raw, "url", ""), store=raw)
                )
        collector.counted = context.store
        deadline = float("inf") if context.deadline is None else context.deadline
        return collector.collect(context.now_ms, deadline).deleted
