"""The producer's side of idempotence and transactions (PROTOCOL.md 11.1, 11.2): ``TransactionManager``.

One manager per producer holds its producer id and epoch, the next sequence number of each
partition it wrote, and the open transaction with what it wrote and the consumer offsets to
commit with it. Every append of the producer goes through ``TransactionManager.append``, which
stamps the batches with these (and starts a new epoch when an append's outcome is unknown);
``init_transactions`` … ``abort_transaction`` drive the transaction coordinator
(``coordinator/transactions.py``). The ``Producer`` facade flushes before commit and abort.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pyarrow as pa

from coordinator.groups import materialize_offsets
from coordinator.transactions import (
    MAX_TRANSACTION_TIMEOUT_MS,
    Decision,
    TransactionCoordinator,
    allocate_producer_id,
    check_transaction_timeout,
)
from pyspark_logsource.client.metrics import ProducerMetrics
from segment_format.errors import FencedError, InvalidConfigError, PlogError
from segment_format.log.appender import AppendResult
from segment_format.log.flush import append_shared
from segment_format.log.partition_log import PartitionLog
from segment_format.log.reader import COMMITTED
from segment_format.records import now_ms
from segment_format.root import LogRoot
from segment_format.segment import ATTR_TRANSACTIONAL, BatchMeta

log = logging.getLogger(__name__)

__all__ = ["TransactionManager"]


class TransactionManager:
    """Producer id, epoch, sequences and the open transaction of one producer (see the module docstring).

    ``config`` is the producer's checked config (``transactional_id``, ``enable_idempotence``,
    ``client_id``, ``transaction_timeout_ms``, ``acks``). ``append`` runs on the sender thread and
    on callers' threads; the state it shares with the transaction calls is guarded by one lock.
    """

    def __init__(self, root: LogRoot, config: dict[str, Any]) -> None:
        self.root = root
        self.config = config
        self._durable = config["acks"] == "all"
        self._coordinator = TransactionCoordinator(root.store, root.protocol)
        self._producer_id = -1
        self._producer_epoch = 0
        self._sequences: dict[tuple[str, int], int] = {}
        self._txn_lock = threading.Lock()
        #: One lock per partition, held from reading its next sequence until the append's outcome is
        #: recorded: the sender thread and ``send_batch`` may append to one partition at once, and two
        #: appends with the same first sequence would each take the other's object for its own (11.1).
        self._partition_locks: dict[tuple[str, int], threading.Lock] = {}
        #: The producer's transactional id; None for a producer that is not transactional.
        self.transactional_id: str | None = config["transactional_id"]
        self._txn_holder: str | None = None
        self._txn_epoch: int | None = None  # the newest epoch this instance created
        #: The open transaction (its number), if any.
        self.txn: int | None = None
        self._txn_ranges: dict[str, dict[str, list[list[int]]]] = {}
        self._txn_offsets: dict[str, dict[str, dict[str, int]]] = {}
        self._txn_failed: BaseException | None = None
        #: When the open transaction began creating its epoch (monotonic): its commit deadline counts from here.
        self._txn_began = 0.0
        #: Every append of the producer comes through here: its produce requests, for ``Producer.metrics``.
        self.metrics = ProducerMetrics()

    # ------------------------------------------------------------------ appends

    def append(
        self, log: PartitionLog, topic: str, partition: int, batches: list[pa.RecordBatch], compression: str | None
    ) -> AppendResult:
        """Append with this producer's id, sequences and transaction (PROTOCOL.md 11.1, 11.2).

        The change notice is left to the caller, which writes one per topic before it
        acknowledges what it appended (PROTOCOL.md 9.1). Appends to one partition are serialised.
        """
        with self._txn_lock:
            lock = self._partition_locks.setdefault((topic, partition), threading.Lock())
        with lock:
            started = time.monotonic()
            result = self._append(log, topic, partition, batches, compression)
            self.metrics.appended(batches, time.monotonic() - started)
            return result

    def append_many(
        self, items: list[tuple[PartitionLog, str, int, list[pa.RecordBatch]]], compression: str | None
    ) -> list[AppendResult | BaseException]:
        """Append to several partitions at once (a flush): the partitions of shared topics as one shared object
        and a commit per topic (PROTOCOL.md 7.3), the others one by one. Returns each item's result, or the
        error that failed it (its producer's epoch and the transaction handled as :meth:`append` does)."""
        keys = sorted({(topic, partition) for _log, topic, partition, _b in items})
        with self._txn_lock:
            locks = [self._partition_locks.setdefault(key, threading.Lock()) for key in keys]
        for lock in locks:  # in one order, so that two flushes never wait on each other
            lock.acquire()
        try:
            started = time.monotonic()
            shared = [n for n, item in enumerate(items) if item[0].chain.sequence is not None]
            out: list[AppendResult | BaseException | None] = [None] * len(items)
            for n, item in enumerate(items):
                if n not in shared:
                    try:
                        out[n] = self._append(*item, compression)
                    except Exception as exc:  # noqa: BLE001 - this item's failure, reported with its result
                        out[n] = exc
            if shared:
                for n, result in zip(shared, self._append_shared([items[n] for n in shared], compression), strict=True):
                    out[n] = result
            results = [r if r is not None else RuntimeError("not appended") for r in out]
            sent = [
                b
                for (*_rest, batches), r in zip(items, results, strict=True)
                if not isinstance(r, BaseException)
                for b in batches
            ]
            self.metrics.appended(sent, time.monotonic() - started)  # records written, as Kafka's send total counts
            return results
        finally:
            for lock in locks:
                lock.release()

    def _append_shared(
        self, items: list[tuple[PartitionLog, str, int, list[pa.RecordBatch]]], compression: str | None
    ) -> list[AppendResult | BaseException]:
        """One shared flush of ``items`` with this producer's ids, sequences and transaction (7.3, 11.1, 11.2)."""
        plans = [self._metas(topic, partition, batches) for _log, topic, partition, batches in items]
        epoch = plans[0][2] if plans else self._producer_epoch
        timeout_ms = self.config["transaction_timeout_ms"] if self.transactional_id is not None else None
        flush = [
            (log.appender, list(zip(batches, metas, strict=True)), None)
            for (log, _t, _p, batches), (metas, _seq, _e) in zip(items, plans, strict=True)
        ]
        results = append_shared(flush, durable=self._durable, compression=compression, timeout_ms=timeout_ms)
        for (_log, topic, partition, _batches), (_metas, sequence, _e), result in zip(
            items, plans, results, strict=True
        ):
            if isinstance(result, BaseException):
                self._failed(result, epoch)
            else:
                self._landed(topic, partition, sequence, epoch, result)
        return results

    def _append(
        self, log: PartitionLog, topic: str, partition: int, batches: list[pa.RecordBatch], compression: str | None
    ) -> AppendResult:
        metas, sequence, epoch = self._metas(topic, partition, batches)
        timeout_ms = self.config["transaction_timeout_ms"] if self.transactional_id is not None else None
        try:
            result = log.append(
                list(zip(batches, metas, strict=True)),
                durable=self._durable,
                compression=compression,
                transaction_timeout_ms=timeout_ms,
                notify=False,
            )
        except BaseException as exc:
            self._failed(exc, epoch)
            raise
        self._landed(topic, partition, sequence, epoch, result)
        return result

    def _failed(self, exc: BaseException, epoch: int) -> None:
        """An append whose outcome is unknown: start a new epoch with sequences from 0 (as Kafka does), and fail
        the open transaction (it must not commit without those records)."""
        with self._txn_lock:
            if self._producer_epoch == epoch and self._producer_id >= 0:
                self._producer_epoch += 1
                self._sequences.clear()
            if self.transactional_id is not None:
                self._txn_failed = exc

    def _landed(self, topic: str, partition: int, sequence: int, epoch: int, result: AppendResult) -> None:
        """An append that landed: its partition's next sequence, and its range in the open transaction."""
        with self._txn_lock:
            if self._producer_epoch == epoch:
                self._sequences[(topic, partition)] = sequence
            if self.transactional_id is not None:
                self._txn_ranges.setdefault(topic, {}).setdefault(str(partition), []).append(
                    [result.base_offsets[0], result.next_offset - 1]
                )

    def _metas(self, topic: str, partition: int, batches: list[pa.RecordBatch]) -> tuple[list[BatchMeta], int, int]:
        """Each batch's producer fields (id, epoch, sequence, transaction), the partition's sequence after them,
        and the epoch they were stamped with."""
        with self._txn_lock:
            transactional = self.transactional_id is not None
            if transactional and self.txn is None:
                raise InvalidConfigError("a transactional producer sends only inside begin_transaction()")
            if self._producer_id < 0 and self.config["enable_idempotence"]:
                self._producer_id = allocate_producer_id(
                    self.root.store, owner=self.config["client_id"], protocol=self.root.protocol
                )
            txn = -1 if self.txn is None else self.txn
            sequence = self._sequences.get((topic, partition), 0)
            metas = []
            for batch in batches:
                if self._producer_id >= 0:
                    metas.append(
                        BatchMeta(
                            self._producer_id,
                            self._producer_epoch,
                            sequence,
                            ATTR_TRANSACTIONAL if transactional else 0,
                            transaction=txn,
                        )
                    )
                    sequence += batch.num_rows
                else:
                    metas.append(BatchMeta())
            return metas, sequence, self._producer_epoch

    # ------------------------------------------------------------------ transactions

    def send_failed(self, exc: BaseException) -> None:
        """A record sent in the open transaction could not be written (a buffer that could not be
        built): the transaction must not commit without it, only abort (Kafka's abortable error)."""
        with self._txn_lock:
            if self.transactional_id is not None and self.txn is not None and self._txn_failed is None:
                self._txn_failed = exc

    def _require_transactional(self) -> str:
        if self.transactional_id is None:
            raise InvalidConfigError("this producer has no transactional_id")
        return self.transactional_id

    def init_transactions(self) -> None:
        """Fence earlier instances with the same ``transactional_id`` and abort their open transactions.

        Also completes the consumer-offset commits of this id's last committed
        transaction, in case the previous instance died between its commit and
        writing them.
        """
        tid = self._require_transactional()
        check_transaction_timeout(self.config["transaction_timeout_ms"], self.root.protocol)
        producer_id, fence, holder = self._coordinator.init_transactions(tid)
        with self._txn_lock:
            if producer_id != self._producer_id:
                self._producer_epoch = 0
            else:  # initialised again: start a new producer epoch, sequences from 0
                self._producer_epoch += 1
            self._producer_id, self._txn_holder, self._txn_epoch = producer_id, holder, fence
            self._sequences.clear()
        last = self._coordinator.last_committed(producer_id)
        if last is not None and last.offsets:
            materialize_offsets(self.root.store, last)

    def begin_transaction(self) -> None:
        """Start a transaction: a new epoch for this transactional id (``FencedError`` if another instance took it)."""
        tid = self._require_transactional()
        if self._txn_holder is None or self._txn_epoch is None:
            raise InvalidConfigError("call init_transactions() before begin_transaction()")
        if self.txn is not None:
            raise InvalidConfigError("a transaction is already open")
        began = time.monotonic()
        txn = self._coordinator.next_epoch(tid, self._txn_holder, self._txn_epoch)
        with self._txn_lock:
            self._txn_began = began
            self._txn_epoch = self.txn = txn
            self._txn_ranges, self._txn_offsets, self._txn_failed = {}, {}, None

    def send_offsets_to_transaction(self, offsets: dict[Any, Any], group_id: str) -> None:
        """Commit consumer offsets (``{TopicPartition: offset}``) for ``group_id`` with this transaction."""
        if self.txn is None:
            raise InvalidConfigError("send_offsets_to_transaction() outside a transaction")
        if not isinstance(group_id, str) or not group_id:
            raise InvalidConfigError(f"group_id must be a non-empty str, got {group_id!r}")
        group = self._txn_offsets.setdefault(group_id, {})
        for tp, offset in offsets.items():
            value = getattr(offset, "offset", offset)
            if not isinstance(value, int) or value < 0:
                raise InvalidConfigError(f"offset {offset!r} for {tp} must be a non-negative int")
            group.setdefault(tp[0], {})[str(tp[1])] = value

    def require_transaction(self, call: str) -> None:
        """Raise ``InvalidConfigError`` unless a transaction is open (``call`` names the caller's method)."""
        if self.txn is None:
            raise InvalidConfigError(f"{call}() without begin_transaction()")

    def commit_transaction(self) -> None:
        """Make the open transaction's records (and offsets) visible everywhere at once; the caller flushed."""
        self.require_transaction("commit_transaction")
        if self._txn_failed is not None:
            raise InvalidConfigError(
                f"a send in this transaction failed ({self._txn_failed}); call abort_transaction()"
            ) from self._txn_failed
        assert self.txn is not None
        self._refuse_late_commit()
        decision = Decision(
            COMMITTED,
            self._producer_id,
            self.txn,
            batches=self._txn_ranges,
            offsets=self._txn_offsets,
            epoch=self.txn,
            created_ms=now_ms(),
        )
        stands = self._coordinator.decide(decision)
        self.txn = None
        self._notify_decided(self._txn_ranges)
        if stands.state != COMMITTED:
            raise FencedError(
                f"transaction {decision.txn} of {self.transactional_id!r} was aborted, by a newer instance or "
                "by a reader after it stayed open longer than transaction_timeout_ms; this producer has been fenced"
            )
        if stands.offsets:
            materialize_offsets(self.root.store, stands)

    def _refuse_late_commit(self) -> None:
        """Abort instead of committing once the transaction outlived its timeout (PROTOCOL.md 11.2, *Collection*).

        In a root listing ``boundedHistory`` an abort decision is collected some time after the timeout;
        a commit issued later than the timeout could then land on a collected abort and revive a
        transaction a newer instance fenced, so it is never issued.
        """
        # A producer configured before the root listed the feature may have a longer timeout: capped at T.
        timeout_ms = min(self.config["transaction_timeout_ms"], MAX_TRANSACTION_TIMEOUT_MS)
        if (time.monotonic() - self._txn_began) * 1000 <= timeout_ms or not self._coordinator.bounded_history:
            return
        txn = self.txn
        assert txn is not None
        self.abort_transaction()
        raise FencedError(
            f"transaction {txn} of {self.transactional_id!r} stayed open longer than transaction_timeout_ms "
            f"({timeout_ms} ms) and was aborted instead of committed; this producer has been fenced"
        )

    def abort_transaction(self) -> None:
        """Abort the open transaction: nothing sent in it is ever visible to read_committed readers."""
        self.require_transaction("abort_transaction")
        assert self.txn is not None
        self._coordinator.abort_if_undecided(self._producer_id, self.txn, epoch=self.txn)
        self.txn = None
        self._notify_decided(self._txn_ranges)

    def _notify_decided(self, ranges: dict[str, dict[str, list[list[int]]]]) -> None:
        """After a decision, before it is acknowledged: the change notices of the topics it wrote to.

        read_committed readers stopped at the transaction then look again at once (PROTOCOL.md 9.1).
        Best effort: this producer's appends were announced when they were acknowledged, so a
        waiting reader is stopped at the transaction and checks it again by itself within seconds.
        """
        try:
            # Every topic's notice, then one root notice (PROTOCOL.md 9.1); topics deleted meanwhile are left out.
            self.root.notify_topics({topic: [int(p) for p in partitions] for topic, partitions in ranges.items()})
        except PlogError as exc:
            log.warning("transaction decided, but a change notice of %s failed: %s", sorted(ranges), exc)
