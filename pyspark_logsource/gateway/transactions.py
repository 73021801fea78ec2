"""Kafka's producer ids and transactions, mapped onto plog's (PROTOCOL.md 11.1-11.3, 11.9).

* ``InitProducerId`` without a transactional id allocates a plog producer id
  (11.1); with one, it initialises the id as plog's producer does (11.3): a
  fence epoch that aborts whatever an earlier instance left open.
* The first ``AddPartitionsToTxn`` or ``AddOffsetsToTxn`` of a transaction
  begins it: the next epoch of the transactional id is its number ``txn``.
* Produced transactional batches carry ``txn`` in the index (11.2); the
  ranges written are remembered, and ``TxnOffsetCommit``'s offsets too.
* ``EndTxn`` creates the decision object: committed with the ranges and
  offsets (then copies the offsets into the groups), or aborted.

The open transaction lives in the gateway that began it. A gateway that dies
loses nothing written: the transaction stays undecided and is aborted by its
timeout or by the producer's next ``InitProducerId`` (11.3), exactly as when a
plog producer dies; the client sees its transaction fail and starts anew.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from coordinator.groups.transaction_offsets import materialize_offsets
from coordinator.transactions import (
    MAX_TRANSACTION_TIMEOUT_MS,
    Decision,
    TransactionCoordinator,
    allocate_producer_id,
)
from segment_format.errors import PlogError
from segment_format.log.reader import COMMITTED
from segment_format.protocol import RootProtocol
from segment_format.records import now_ms
from segment_format.stores.base import Store

from .batcher import ProduceError

NONE, INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE, INVALID_PRODUCER_ID_MAPPING = 0, 47, 48, 49
PRODUCER_FENCED, KAFKA_STORAGE_ERROR, INVALID_TRANSACTION_TIMEOUT = 90, 56, 50
#: Kafka's producer epochs are int16; a plog fence epoch is any non-negative integer.
EPOCH_MODULUS = 32767


@dataclass
class OpenTransactions:
    """What one transactional id has open in this gateway."""

    transactional_id: str
    producer_id: int
    kafka_epoch: int
    holder: str
    epoch: int
    timeout_ms: int
    txn: int | None = None
    #: When the open transaction began creating its epoch (monotonic): the commit deadline counts from here.
    began: float = 0.0
    ranges: dict[str, dict[str, list[list[int]]]] = field(default_factory=dict)
    offsets: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class GatewayTransactions:
    """Producer ids and open transactions of the gateway's clients (``gateway.services["transactions"]``)."""

    def __init__(
        self,
        store: Store,
        notify: Callable[[Mapping[str, Iterable[int]]], None],
        protocol: RootProtocol | None = None,
    ) -> None:
        self.store = store
        self.coordinator = TransactionCoordinator(store, protocol)
        self._notify = notify
        self._open: dict[str, OpenTransactions] = {}
        self._lock = threading.Lock()

    def init_producer_id(
        self, transactional_id: str | None, timeout_ms: int, producer_id: int, producer_epoch: int, owner: str
    ) -> tuple[int, int]:
        """(producer id, epoch) for a client (blocking)."""
        if transactional_id is None:
            if producer_id >= 0 and producer_epoch >= 0:  # KIP-360: the same id, its next epoch
                return producer_id, (producer_epoch + 1) % EPOCH_MODULUS
            return allocate_producer_id(self.store, owner=owner, protocol=self.coordinator.protocol), 0
        pid, fence, holder = self.coordinator.init_transactions(transactional_id)
        last = self.coordinator.last_committed(pid)
        if last is not None and last.offsets:
            materialize_offsets(self.store, last)
        state = OpenTransactions(transactional_id, pid, fence % EPOCH_MODULUS, holder, fence, timeout_ms)
        with self._lock:
            self._open[transactional_id] = state
        return pid, state.kafka_epoch

    def _state(self, transactional_id: str, producer_id: int, epoch: int) -> OpenTransactions:
        state = self._open.get(transactional_id)
        if state is None or state.producer_id != producer_id:
            raise ProduceError(
                f"transactional id {transactional_id!r} with producer id {producer_id} was not initialised on this "
                "gateway",
                INVALID_PRODUCER_ID_MAPPING,
            )
        if state.kafka_epoch != epoch:
            raise ProduceError(
                f"transactional id {transactional_id!r}: epoch {epoch} is not the current one", PRODUCER_FENCED
            )
        return state

    def begin(self, transactional_id: str, producer_id: int, epoch: int) -> None:
        """Begin the transaction if none is open (AddPartitionsToTxn, AddOffsetsToTxn; blocking)."""
        state = self._state(transactional_id, producer_id, epoch)
        with state.lock:
            if state.txn is not None:
                return
            began = time.monotonic()
            txn = self.coordinator.next_epoch(transactional_id, state.holder, state.epoch)
            state.epoch = state.txn = txn
            state.began = began
            state.ranges, state.offsets = {}, {}

    def produce_context(
        self, transactional_id: str, producer_id: int, epoch: int, topic: str, partition: int
    ) -> tuple[int, int, object]:
        """For a transactional batch: its ``txn``, the transaction's timeout and the callback recording its range."""
        state = self._state(transactional_id, producer_id, epoch)
        txn = state.txn
        if txn is None:
            raise ProduceError(f"transactional id {transactional_id!r} has no open transaction", INVALID_TXN_STATE)

        def written(topic: str, partition: int, base: int, last: int) -> None:
            with state.lock:
                if state.txn == txn:
                    state.ranges.setdefault(topic, {}).setdefault(str(partition), []).append([base, last])

        return txn, state.timeout_ms, written

    def add_offsets(
        self, transactional_id: str, producer_id: int, epoch: int, group: str, offsets: dict[tuple[str, int], int]
    ) -> None:
        """TxnOffsetCommit: offsets committed with the open transaction."""
        state = self._state(transactional_id, producer_id, epoch)
        with state.lock:
            if state.txn is None:
                raise ProduceError(f"{transactional_id!r}: TxnOffsetCommit outside a transaction", INVALID_TXN_STATE)
            target = state.offsets.setdefault(group, {})
            for (topic, partition), offset in offsets.items():
                target.setdefault(topic, {})[str(partition)] = offset

    def end(self, transactional_id: str, producer_id: int, epoch: int, commit: bool) -> int:
        """EndTxn: decide the open transaction; Kafka's error code (blocking)."""
        try:
            state = self._state(transactional_id, producer_id, epoch)
        except ProduceError as exc:
            return exc.error_code
        with state.lock:
            txn, ranges, offsets = state.txn, state.ranges, state.offsets
            state.txn = None
        if txn is None:
            return NONE  # nothing was sent: Kafka answers an empty transaction's end with success
        deadline_ms = min(state.timeout_ms, MAX_TRANSACTION_TIMEOUT_MS)  # a client initialised before: capped at T
        late = (time.monotonic() - state.began) * 1000 > deadline_ms and self.coordinator.bounded_history
        if commit and late:
            # Never issue a commit after the transaction's timeout (PROTOCOL.md 11.2, *Collection*): abort.
            self.coordinator.abort_if_undecided(producer_id, txn, epoch=txn)
            self._notify_decided(ranges)
            return PRODUCER_FENCED
        if commit:
            decision = Decision(
                COMMITTED, producer_id, txn, batches=ranges, offsets=offsets, epoch=txn, created_ms=now_ms()
            )
            stands = self.coordinator.decide(decision)
            self._notify_decided(ranges)
            if stands.state != COMMITTED:
                return PRODUCER_FENCED
            if stands.offsets:
                materialize_offsets(self.store, stands)
            return NONE
        self.coordinator.abort_if_undecided(producer_id, txn, epoch=txn)
        self._notify_decided(ranges)
        return NONE

    def _notify_decided(self, ranges: dict[str, dict[str, list[list[int]]]]) -> None:
        # Every topic's notice, then one root notice (PROTOCOL.md 9.1). Best effort, as plog's producer:
        # waiting readers re-check a partition stopped at a transaction on their own.
        with contextlib.suppress(PlogError):
            self._notify({topic: [int(p) for p in partitions] for topic, partitions in ranges.items()})
