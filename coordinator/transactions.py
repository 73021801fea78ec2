"""Producer ids, transaction decisions and transactional-id epochs (PROTOCOL.md 11.1-11.3).

::

    _coordinator/producer-ids/<id>.json                          one per producer id ever allocated
    _coordinator/transactional-ids/<sha256(tid)>/producer-id.json   the producer id of a transactional id
    _coordinator/transactional-ids/<sha256(tid)>/epochs/<e>.json     one per transaction (and per fence)
    _coordinator/transactions/<producer_id>/<txn>.json             the decision: committed or aborted

Every object is created with put-if-absent and never changed, so decisions
can be cached forever once seen. In a root listing ``boundedHistory`` all but
the newest of them are collected (``coordinator/collection/transactions.py``,
PROTOCOL.md 11.1-11.3, *Collection*), which changes how producer ids are found
(a listing, never a probe) and adds two duties to producers: a commit is never
issued after the transaction's timeout, and an epoch begun long after the
previous one is checked against the epochs after it.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from segment_format import numbered
from segment_format.documents import JsonDocument
from segment_format.errors import (
    ConcurrentCreateError,
    CorruptRecordError,
    FencedError,
    InvalidConfigError,
    ObjectNotFoundError,
    PlogError,
    UnknownTopicOrPartitionError,
)
from segment_format.log.reader import ABORTED, COMMITTED
from segment_format.numbered import numbered_key
from segment_format.protocol import BOUNDED_HISTORY, RootProtocol
from segment_format.records import now_ms
from segment_format.segment import ATTR_TRANSACTIONAL
from segment_format.stores.base import Store

if TYPE_CHECKING:
    from segment_format.root import LogRoot

from .keys import PRODUCER_IDS, transactional_id_prefix, transactions_prefix

#: D of the coordinator's collection rules: the default ``file.delete.delay.ms`` (PROTOCOL.md 11.1-11.3).
COORDINATOR_DELAY_MS = 20 * 60 * 1000
#: W: an allocator never creates a producer id from a listing older than this (PROTOCOL.md 11.1).
LISTING_MAX_AGE_S = 60.0
#: T: the longest transaction timeout a root listing ``boundedHistory`` allows (Kafka's
#: ``transaction.max.timeout.ms``); the collection of aborted decisions counts on it (PROTOCOL.md 11.2).
MAX_TRANSACTION_TIMEOUT_MS = 15 * 60 * 1000


def bounded_history(protocol: RootProtocol) -> bool:
    """Whether the root lists ``boundedHistory``: coordinator objects are collected there."""
    return BOUNDED_HISTORY in protocol.version.writer_features


def check_transaction_timeout(timeout_ms: int, protocol: RootProtocol, name: str = "transaction_timeout_ms") -> None:
    """Refuse, naming the setting, a transaction timeout above 15 min in a root listing ``boundedHistory``."""
    if timeout_ms > MAX_TRANSACTION_TIMEOUT_MS and bounded_history(protocol):
        raise InvalidConfigError(
            f"{name}={timeout_ms} is above {MAX_TRANSACTION_TIMEOUT_MS} ms (15 min), the longest transaction "
            "timeout this root allows (Kafka's transaction.max.timeout.ms): collected decisions count on it"
        )


#: A retry id (PROTOCOL.md 11.3): the transactional id a Spark sink's micro-batch ``txn`` is re-run under once
#: its own transaction was aborted. Only a sink's ids (``spark-sink:`` and 64 hex digits) have them.
_RETRY_ID = re.compile(r"(?P<base>spark-sink:[0-9a-f]{64}(?:/query:[^/]*)?)/batch:(?P<txn>[0-9]+)/retry:[1-9][0-9]*")
#: Transactional ids with this prefix are the Spark sink's own: a producer may not take one.
SINK_TRANSACTIONAL_ID_PREFIX = "spark-sink:"


def retry_transactional_id(base: str, txn: int, retry: int) -> str:
    """The transactional id of the ``retry``-th re-run (``retry >= 1``) of micro-batch ``txn`` of sink id ``base``."""
    return f"{base}/batch:{txn}/retry:{retry}"


def parse_retry_id(transactional_id: str) -> tuple[str, int] | None:
    """``(base, txn)`` of a sink's retry id, None for any other transactional id."""
    found = _RETRY_ID.fullmatch(transactional_id)
    return None if found is None else (found["base"], int(found["txn"]))


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


def allocate_producer_id(store: Store, owner: str = "", protocol: RootProtocol | None = None) -> int:
    """A producer id no one else has: create ``producer-ids/<n>`` for a free ``n`` (PROTOCOL.md 11.1).

    In a root listing ``boundedHistory`` old ids are collected, so the next id is the largest listed plus
    one, from a listing at most W old. Elsewhere ids are contiguous from 0 and never deleted, so the first
    free one is found by galloping and bisecting over ``exists`` (O(log n) point lookups). Either way a
    create that loses a race moves on to a larger number.
    """
    if bounded_history(protocol if protocol is not None else RootProtocol(store)):
        return _allocate_after_largest(store, owner)
    body = ProducerIdClaim(owner, now_ms(), uuid.uuid4().hex).to_json()
    candidate = _first_free_producer_id(store)
    # Unbounded on purpose: each lost race consumes an id for good, so the loop always progresses.
    while not numbered.create(store, PRODUCER_IDS, candidate, body):
        candidate += 1
    return candidate


def _allocate_after_largest(store: Store, owner: str) -> int:
    """Create the largest listed producer id plus one; after a lost race, list only the keys after it."""
    listed_at = time.monotonic()
    candidate = max(numbered.numbers(store, PRODUCER_IDS), default=-1) + 1
    while True:
        if time.monotonic() - listed_at > LISTING_MAX_AGE_S:  # never create from a listing older than W
            listed_at = time.monotonic()
            candidate = max([candidate - 1, *numbered.numbers(store, PRODUCER_IDS)]) + 1
        # The claim's time is read after the listing it builds on: the collection rule counts on it.
        body = ProducerIdClaim(owner, now_ms(), uuid.uuid4().hex).to_json()
        with store.deadline(listed_at + LISTING_MAX_AGE_S):  # retries too: never sent after W (11.1)
            created = numbered.create(store, PRODUCER_IDS, candidate, body)
        if created:
            return candidate
        listed_at = time.monotonic()
        after = store.list_after(PRODUCER_IDS, numbered_key(PRODUCER_IDS, candidate))
        candidate = max([candidate, *numbered.numbers_in([i.key for i in after], PRODUCER_IDS)]) + 1


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

    def __init__(self, store: Store, protocol: RootProtocol | None = None) -> None:
        self.store = store
        self._protocol = protocol
        #: Per transactional id, the newest epoch this coordinator created and when it began creating it
        #: (monotonic): a begin more than D later checks the epochs after its own (PROTOCOL.md 11.3).
        self._began: dict[str, tuple[int, float]] = {}
        self._decisions: dict[tuple[int, int], Decision] = {}
        self._root: LogRoot | None = None
        #: Undecided batches whose chain was listed afresh on their first absent decision (11.2, *Collection*).
        self._chain_checked: set[tuple[int, int, str, int]] = (
            set()
        )  # for the chain check before an abort in a root that collects
        #: When this coordinator first found a transaction undecided (monotonic), for timeouts (11.2).
        self._first_undecided: dict[tuple[int, int], float] = {}
        self._lock = threading.Lock()

    @property
    def protocol(self) -> RootProtocol:
        """The root's protocol (read on first use when the caller gave none)."""
        if self._protocol is None:
            self._protocol = RootProtocol(self.store)
        return self._protocol

    @property
    def bounded_history(self) -> bool:
        """Whether the root lists ``boundedHistory`` (decisions, epochs and producer ids are collected)."""
        return bounded_history(self.protocol)

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
        *,
        appended_ms: int | None = None,
    ) -> str | None:
        """A ``TransactionResolver`` for ``PartitionLog.read``: committed, aborted, or None (undecided).

        With ``timeout_ms`` (the transaction's, as the object holding the batch states it), a transaction
        this coordinator has itself seen undecided for longer, on its monotonic clock, is aborted here
        (PROTOCOL.md 11.2, *How long it has been undecided*): a producer or query that died with it open
        holds the last stable offset for about its timeout, not forever.

        In a root listing ``boundedHistory`` a decision may be absent because it was collected once its
        batches were merged into plain records (PROTOCOL.md 11.2, *Collection*). So the first time a batch's
        decision is found absent, and again before an abort, the reader's own chain is listed afresh: a
        reader whose view still names a replaced object then reads the plain records on its next read, and
        no transaction is aborted on the strength of a batch the log no longer holds. The first look lists
        only for a batch whose object (``appended_ms``) is older than D: a decision is collected only D
        after a merge replaced that object, so a reader tailing open transactions lists nothing for them.
        """
        found = self.decision(producer_id, txn)
        if found is None:
            first_look = (producer_id, txn, topic, partition) not in self._chain_checked
            collectable = appended_ms is None or now_ms() - appended_ms > COORDINATOR_DELAY_MS
            if first_look and collectable and self.bounded_history:
                self._chain_checked.add((producer_id, txn, topic, partition))
                if not self._still_transactional(topic, partition, base_offset, producer_id, txn):
                    return None  # the reader's view was stale: it is fresh now, and the next read finds the batch
            if timeout_ms is None or not self._undecided_past(producer_id, txn, timeout_ms):
                return None
            if self.bounded_history and not self._still_transactional(topic, partition, base_offset, producer_id, txn):
                return None
            found = self.abort_if_undecided(producer_id, txn)  # or the commit that got there first
        return COMMITTED if found.includes(topic, partition, base_offset, last_offset) else ABORTED

    def for_reader(self, root: LogRoot) -> TransactionCoordinator:
        """This coordinator checking chains through ``root``, the reader's own: the fresh listing of a check
        before an abort (and on a first absent decision) then refreshes the reader's view too."""
        self._root = root
        return self

    def _still_transactional(self, topic: str, partition: int, base_offset: int, producer_id: int, txn: int) -> bool:
        """Whether a chain resolved now (a fresh listing, which the reader's log then keeps) holds a
        transactional batch of ``(producer_id, txn)`` at ``base_offset``; False if the topic, partition or
        offset is gone."""
        if self._root is None:
            from segment_format.root import LogRoot  # noqa: PLC0415 - only roots that collect need it

            self._root = LogRoot(getattr(self.store, "url", ""), store=self.store)
        try:
            log = self._root.partition(topic, partition)
            view = log.view(refresh=True)
            if not view.segments or not view.start_offset <= base_offset < view.end_offset:
                return False
            index = log.index(view.segments[view.segment_for(base_offset)])
        except (UnknownTopicOrPartitionError, ObjectNotFoundError):
            return False
        rows = index.base_offsets == base_offset
        ours = (
            rows
            & ((index.attributes & ATTR_TRANSACTIONAL) != 0)
            & (index.producer_ids == producer_id)
            & (index.transactions == txn)
        )
        return bool(ours.any())

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
        producer_id = allocate_producer_id(self.store, owner=transactional_id, protocol=self.protocol)
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
        In a root listing ``boundedHistory``, a begin more than D after this coordinator began creating
        ``expected`` also lists the epochs after the new one: older epochs may have been collected, so a
        create that succeeded may have landed on a collected number (PROTOCOL.md 11.3).
        """
        prefix = transactional_id_prefix(transactional_id) + "epochs/"
        began = time.monotonic()
        candidate = (max(self.epochs(transactional_id), default=-1) + 1) if expected is None else expected + 1
        for attempt in range(numbered.MAX_CREATE_ATTEMPTS):
            # Read after the listing the number came from: the collection rule counts on it (11.3).
            body = EpochClaim(holder, now_ms()).to_json()
            if numbered.create(self.store, prefix, candidate, body):
                if expected is not None and self._stale_begin(transactional_id, expected, began):
                    self._check_newest(transactional_id, candidate)
                self._began[transactional_id] = (candidate, began)
                return candidate
            if expected is not None and self._epoch_holder(transactional_id, candidate) != holder:
                raise self._fenced(transactional_id, candidate)
            numbered.backoff(attempt)
            candidate = max(self.epochs(transactional_id), default=-1) + 1
        raise ConcurrentCreateError(
            f"transactional id {transactional_id!r}: lost {numbered.MAX_CREATE_ATTEMPTS} races for the next epoch"
        )

    @staticmethod
    def _fenced(transactional_id: str, epoch: int) -> FencedError:
        return FencedError(
            f"transactional id {transactional_id!r}: epoch {epoch} belongs to another producer; "
            "this producer has been fenced"
        )

    def _stale_begin(self, transactional_id: str, expected: int, began: float) -> bool:
        """Whether a begin after ``expected`` must check the epochs after it: more than D since this
        coordinator began creating ``expected``, or it does not know when (another coordinator created it)."""
        if not self.bounded_history:
            return False
        previous = self._began.get(transactional_id)
        return previous is None or previous[0] != expected or began - previous[1] > COORDINATOR_DELAY_MS / 1000

    def _check_newest(self, transactional_id: str, epoch: int) -> None:
        """Raise ``FencedError`` if an epoch after ``epoch`` exists (a start-after listing, PROTOCOL.md 11.3)."""
        prefix = transactional_id_prefix(transactional_id) + "epochs/"
        later = numbered.numbers_in([i.key for i in self.store.list_after(prefix, numbered_key(prefix, epoch))], prefix)
        if later:
            raise self._fenced(transactional_id, later[-1])

    def init_transactions(self, transactional_id: str, holder: str | None = None) -> tuple[int, int, str]:
        """Fence earlier instances: returns (producer id, fence epoch, holder id).

        Creates the next epoch, then aborts every earlier epoch's transaction
        that has no decision (PROTOCOL.md 11.3).
        """
        if transactional_id.startswith(SINK_TRANSACTIONAL_ID_PREFIX):
            raise InvalidConfigError(
                f"transactional id {transactional_id!r}: ids starting with {SINK_TRANSACTIONAL_ID_PREFIX!r} are "
                "the Spark sink's own (their history is collected by the sink's rules, PROTOCOL.md 11.3)"
            )
        holder = holder or uuid.uuid4().hex
        producer_id = self.producer_id_for(transactional_id)
        fence = self.next_epoch(transactional_id, holder, None)
        earlier = [epoch for epoch in self.epochs(transactional_id) if epoch < fence]
        if earlier:
            # Decisions from the oldest listed epoch on: collected ones sort before it (11.3, *Collection*).
            prefix = transactions_prefix(producer_id)
            listed = self.store.list_after(prefix, numbered_key(prefix, earlier[0] - 1)) if earlier[0] > 0 else None
            decided = set(
                numbered.numbers(self.store, prefix)
                if listed is None
                else numbered.numbers_in([i.key for i in listed], prefix)
            )
            for epoch in earlier:
                if epoch not in decided:
                    self.abort_if_undecided(producer_id, epoch, epoch=fence)
        return producer_id, fence, holder
