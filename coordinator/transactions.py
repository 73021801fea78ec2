"""Producer ids, transaction decisions and transactional-id epochs (PROTOCOL.md 11.1-11.3).

::

    _coordinator/producer-ids/<id>.json                          one per producer id ever allocated
    _coordinator/transactional-ids/<sha256(tid)>/producer-id.json   the producer id of a transactional id
    _coordinator/transactional-ids/<sha256(tid)>/epochs/<e>.json     one per transaction (and per fence)
    _coordinator/transactions/<producer_id>/<txn>.json             the decision: committed or aborted

Every object is created with put-if-absent and never changed, so decisions
can be cached forever once seen.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar

from segment_format import numbered
from segment_format.documents import JsonDocument
from segment_format.errors import (
    ConcurrentCreateError,
    CorruptRecordError,
    FencedError,
    ObjectNotFoundError,
    PlogError,
)
from segment_format.log.reader import ABORTED, COMMITTED
from segment_format.numbered import numbered_key
from segment_format.records import now_ms
from segment_format.stores.base import Store

from .keys import PRODUCER_IDS, transactional_id_prefix, transactions_prefix

#: Offset ranges by topic and partition: {"topic": {"0": [[first, last], ...]}}.
BatchRanges = dict[str, dict[str, list[list[int]]]]


def _batch_ranges(value: Any) -> BatchRanges:
    """Check a decision's ``batches``: each range is a pair of integers (a reader unpacks it as one)."""
    if not isinstance(value, dict):
        raise TypeError("expected an object")
    out: BatchRanges = {}
    for topic, per in value.items():
        if not isinstance(per, dict):
            raise TypeError(f"topic {topic!r}: expected an object")
        out[topic] = {}
        for partition, ranges in per.items():
            if not isinstance(ranges, list) or not all(
                isinstance(r, list) and len(r) == 2 and all(type(o) is int for o in r) for r in ranges
            ):
                raise TypeError(f"{topic}/{partition}: expected an array of [first_offset, last_offset] pairs")
            out[topic][partition] = ranges
    return out


@dataclass(frozen=True)
class Decision(JsonDocument):
    """The outcome of one transaction."""

    json_separators: ClassVar[tuple[str, str]] = (", ", ": ")  # the spacing stored objects have always had

    state: str
    producer_id: int
    txn: int
    batches: BatchRanges = field(default_factory=dict, metadata={"decode": _batch_ranges})
    offsets: dict[str, Any] = field(default_factory=dict)
    epoch: int = -1
    created_ms: int = 0
    #: ``{topic: {topic_id: {partition: [next_offset, running_max_timestamp, since_ms]}}}``: tail hints
    #: for the next writer of those partitions (PROTOCOL.md 11.2). Typed loosely on purpose: readers
    #: ignore them, so a malformed hint must not make the decision unreadable; its user checks each one.
    tails: dict[str, Any] = field(default_factory=dict)

    def includes(self, topic: str, partition: int, base_offset: int, last_offset: int) -> bool:
        """Whether the batch ``[base_offset, last_offset]`` of ``topic``/``partition`` is part of it."""
        if self.state != COMMITTED:
            return False
        for first, last in self.batches.get(topic, {}).get(str(partition), ()):
            if first <= base_offset and last_offset <= last:
                return True
        return False


@dataclass(frozen=True)
class ProducerIdClaim(JsonDocument):
    """``producer-ids/<n>``: who allocated producer id ``n``, and when."""

    json_separators: ClassVar[tuple[str, str]] = (", ", ": ")

    owner: str = ""
    created_ms: int = 0
    #: A random id of the allocation: owners and times can repeat, and an allocator whose create's
    #: answer was lost is told "created" only if the stored bytes are its own (PROTOCOL.md 2, 11.1).
    claim: str = ""


@dataclass(frozen=True)
class TransactionalIdMapping(JsonDocument):
    """``transactional-ids/<h>/producer-id.json``: the producer id a transactional id uses for ever."""

    json_separators: ClassVar[tuple[str, str]] = (", ", ": ")

    producer_id: int
    transactional_id: str = ""


@dataclass(frozen=True)
class EpochClaim(JsonDocument):
    """``transactional-ids/<h>/epochs/<e>``: the producer instance (holder) that took epoch ``e``."""

    json_separators: ClassVar[tuple[str, str]] = (", ", ": ")

    holder: str
    created_ms: int = 0


def allocate_producer_id(store: Store, owner: str = "") -> int:
    """A producer id no one else has: create ``producer-ids/<n>`` for the first free ``n`` (PROTOCOL.md 11.1).

    Ids are contiguous from 0 and never deleted, so the first free one is found by galloping and
    bisecting over ``exists`` (O(log n) point lookups, however many producers the root has seen) rather
    than by listing them all. A create that loses a race moves on to the next number.
    """
    body = ProducerIdClaim(owner, now_ms(), uuid.uuid4().hex).to_json()
    candidate = _first_free_producer_id(store)
    # Unbounded on purpose: each lost race consumes an id for good, so the loop always progresses.
    while not numbered.create(store, PRODUCER_IDS, candidate, body):
        candidate += 1
    return candidate


def _first_free_producer_id(store: Store) -> int:
    """The smallest ``n`` whose ``producer-ids/<n>`` did not exist when looked at (ids 0..n-1 did)."""

    def taken(n: int) -> bool:
        return store.exists(numbered_key(PRODUCER_IDS, n))

    if not taken(0):
        return 0
    low, high = 0, 1  # invariant: low is taken; high is free, once the gallop has found one
    while taken(high):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        if taken(middle):
            low = middle
        else:
            high = middle
    return high


class TransactionCoordinator:
    """Decides transactions and answers, for readers, whether a batch is committed."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._decisions: dict[tuple[int, int], Decision] = {}
        #: When this coordinator first found a transaction undecided (monotonic), for timeouts (11.2).
        self._first_undecided: dict[tuple[int, int], float] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ decisions

    def read_decision(self, producer_id: int, txn: int) -> Decision | None:
        """The decision of a transaction, or None while it is undecided, read without caching it.

        Raises :class:`CorruptRecordError` naming the object when it is not a decision, or is the
        decision of another transaction: its ``producer_id`` and ``txn`` must equal its key's
        (PROTOCOL.md 3.1), else a decision copied under another key would decide the wrong batches.
        """
        key = numbered_key(transactions_prefix(producer_id), txn)
        try:
            found = Decision.from_json(self.store.get(key), what=key, keyed={"producer_id": producer_id, "txn": txn})
        except ObjectNotFoundError:
            return None
        if found.state not in (COMMITTED, ABORTED):  # else a damaged "committed" would read as an abort
            raise CorruptRecordError(f"{key}: field 'state' is {found.state!r}, not committed or aborted", key=key)
        return found

    def decision(self, producer_id: int, txn: int) -> Decision | None:
        """The decision of a transaction, or None while it is undecided (cached once seen)."""
        key = (producer_id, txn)
        cached = self._decisions.get(key)
        if cached is not None:
            return cached
        found = self.read_decision(producer_id, txn)
        if found is None:
            return None
        with self._lock:
            self._decisions[key] = found
        return found

    def decide(self, decision: Decision) -> Decision:
        """Create the decision object; returns the decision that stands (ours, or the one that got there first)."""
        key = numbered_key(transactions_prefix(decision.producer_id), decision.txn)
        if numbered.create(self.store, transactions_prefix(decision.producer_id), decision.txn, decision.to_json()):
            with self._lock:
                self._decisions[(decision.producer_id, decision.txn)] = decision
            return decision
        existing = self.decision(decision.producer_id, decision.txn)
        if existing is None:  # pragma: no cover - deleted between create and get: never done by the protocol
            raise PlogError(f"transaction decision {key} vanished")
        return existing

    def remember(self, decision: Decision) -> None:
        """Cache a decision known to stand (one this process's decider created or found): decisions never
        change, so a later lookup of it costs no request."""
        with self._lock:
            self._decisions[(decision.producer_id, decision.txn)] = decision

    def abort_if_undecided(self, producer_id: int, txn: int, epoch: int = -1) -> Decision:
        """Abort a transaction unless it is decided already (timeouts, fencing)."""
        return self.decide(Decision(ABORTED, producer_id, txn, epoch=epoch, created_ms=now_ms()))

    def resolve(
        self,
        producer_id: int,
        txn: int,
        topic: str,
        partition: int,
        base_offset: int,
        last_offset: int,
        timeout_ms: int | None = None,
    ) -> str | None:
        """A ``TransactionResolver`` for ``PartitionLog.read``: committed, aborted, or None (undecided).

        With ``timeout_ms`` (the transaction's, as the object holding the batch states it), a transaction
        this coordinator has itself seen undecided for longer, on its monotonic clock, is aborted here
        (PROTOCOL.md 11.2, *How long it has been undecided*): a producer or query that died with it open
        holds the last stable offset for about its timeout, not forever.
        """
        found = self.decision(producer_id, txn)
        if found is None:
            if timeout_ms is None or not self._undecided_past(producer_id, txn, timeout_ms):
                return None
            found = self.abort_if_undecided(producer_id, txn)  # or the commit that got there first
        return COMMITTED if found.includes(topic, partition, base_offset, last_offset) else ABORTED

    def decided_ms(self, producer_id: int, txn: int) -> int | None:
        """When the transaction's decision was created, None while it is undecided (compaction's visible
        times, PROTOCOL.md 11.6; a decision without ``created_ms`` reads 0, which would understate it)."""
        found = self.decision(producer_id, txn)
        return None if found is None or found.created_ms <= 0 else found.created_ms

    def _undecided_past(self, producer_id: int, txn: int, timeout_ms: int) -> bool:
        """Whether this coordinator first saw ``(producer_id, txn)`` undecided more than ``timeout_ms`` ago."""
        now = time.monotonic()
        with self._lock:
            first = self._first_undecided.setdefault((producer_id, txn), now)
        return now - first > timeout_ms / 1000

    def last_committed(self, producer_id: int) -> Decision | None:
        """The committed decision with the highest transaction number of a producer id, if any."""
        for txn in reversed(numbered.numbers(self.store, transactions_prefix(producer_id))):
            found = self.decision(producer_id, txn)
            if found is not None and found.state == COMMITTED:
                return found
        return None

    # ------------------------------------------------------------------ transactional ids

    def producer_id_for(self, transactional_id: str) -> int:
        """The producer id of a transactional id, allocated by whoever asks first."""
        key = transactional_id_prefix(transactional_id) + "producer-id.json"
        try:
            return TransactionalIdMapping.from_json(self.store.get(key), what=key).producer_id
        except ObjectNotFoundError:
            pass
        producer_id = allocate_producer_id(self.store, owner=transactional_id)
        if self.store.put_if_absent(key, TransactionalIdMapping(producer_id, transactional_id).to_json()):
            return producer_id
        return TransactionalIdMapping.from_json(self.store.get(key), what=key).producer_id  # mapped by another

    def epochs(self, transactional_id: str) -> list[int]:
        """The epochs of a transactional id, ascending."""
        return numbered.numbers(self.store, transactional_id_prefix(transactional_id) + "epochs/")

    def _epoch_holder(self, transactional_id: str, epoch: int) -> str | None:
        key = numbered_key(transactional_id_prefix(transactional_id) + "epochs/", epoch)
        try:
            return EpochClaim.from_json(self.store.get(key), what=key).holder
        except ObjectNotFoundError:
            return None

    def next_epoch(self, transactional_id: str, holder: str, expected: int | None) -> int:
        """Create the next epoch for ``holder``.

        ``expected`` is the newest epoch this holder knows (its own); if the
        next number is taken by another holder, the caller has been fenced.
        With ``expected=None`` (initialisation) it takes whatever is next.
        """
        prefix = transactional_id_prefix(transactional_id) + "epochs/"
        body = EpochClaim(holder, now_ms()).to_json()
        candidate = (max(self.epochs(transactional_id), default=-1) + 1) if expected is None else expected + 1
        for attempt in range(numbered.MAX_CREATE_ATTEMPTS):
            if numbered.create(self.store, prefix, candidate, body):
                return candidate
            if expected is not None and self._epoch_holder(transactional_id, candidate) != holder:
                raise FencedError(
                    f"transactional id {transactional_id!r}: epoch {candidate} belongs to another producer; "
                    "this producer has been fenced"
                )
            numbered.backoff(attempt)
            candidate = max(self.epochs(transactional_id), default=-1) + 1
        raise ConcurrentCreateError(
            f"transactional id {transactional_id!r}: lost {numbered.MAX_CREATE_ATTEMPTS} races for the next epoch"
        )

    def init_transactions(self, transactional_id: str, holder: str | None = None) -> tuple[int, int, str]:
        """Fence earlier instances: returns (producer id, fence epoch, holder id).

        Creates the next epoch, then aborts every earlier epoch's transaction
        that has no decision (PROTOCOL.md 11.3).
        """
        holder = holder or uuid.uuid4().hex
        producer_id = self.producer_id_for(transactional_id)
        fence = self.next_epoch(transactional_id, holder, None)
        decided = set(numbered.numbers(self.store, transactions_prefix(producer_id)))
        for epoch in self.epochs(transactional_id):
            if epoch < fence and epoch not in decided:
                self.abort_if_undecided(producer_id, epoch, epoch=fence)
        return producer_id, fence, holder
