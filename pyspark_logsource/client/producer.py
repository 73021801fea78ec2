"""The producer: kafka-python's ``KafkaProducer`` API on a plog root.

``send`` only buffers: records accumulate per topic and a background sender
thread writes them when ``linger_ms`` has passed or ``batch_size`` bytes are
waiting, one segment object per partition touched. Partitions are computed
at flush time, vectorised (Kafka's murmur2 of the key; null keys stick to
one partition per batch), so the per-record cost of ``send`` is a few list
appends. ``send_batch`` writes an Arrow table straight to the log.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from coordinator.groups import materialize_offsets
from coordinator.transactions import Decision, TransactionCoordinator, allocate_producer_id
from pyspark_logsource.client.partitioner import partitions_for_keys
from pyspark_logsource.client.types import RecordMetadata
from segment_format.appender import AppendResult
from segment_format.errors import (
    FencedError,
    InvalidConfigError,
    InvalidRecordError,
    KafkaTimeoutError,
    PlogError,
    ProducerClosedError,
    UnknownTopicOrPartitionError,
)
from segment_format.log import PartitionLog
from segment_format.reader import COMMITTED
from segment_format.records import (
    as_bytes,
    check_headers,
    normalize_payload,
    now_ms,
    payload_batch,
    table_from_user_data,
)
from segment_format.root import LogRoot
from segment_format.segment import ATTR_TRANSACTIONAL, BatchMeta, ipc_options
from segment_format.topic import TopicMetadata

PRODUCER_DEFAULTS: dict[str, Any] = {
    "acks": "all",
    "linger_ms": 5,
    "batch_size": 1024 * 1024,
    "buffer_memory": 64 * 1024 * 1024,
    "max_block_ms": 60_000,
    "compression_type": None,
    "partitioner": None,
    "key_serializer": None,
    "value_serializer": None,
    "client_id": "",
    "enable_idempotence": True,
    "transactional_id": None,
    "transaction_timeout_ms": 60_000,
}


def _check_producer_config(config: dict[str, Any]) -> dict[str, Any]:
    unknown = set(config) - set(PRODUCER_DEFAULTS)
    if unknown:
        raise InvalidConfigError(f"unknown producer config {sorted(unknown)}; known: {sorted(PRODUCER_DEFAULTS)}")
    merged = {**PRODUCER_DEFAULTS, **config}
    acks = merged["acks"]
    if acks in (-1, "-1"):
        acks = "all"
    if acks not in (0, 1, "all", "0", "1"):
        raise InvalidConfigError(f"acks={acks!r} must be 0, 1 or 'all'")
    merged["acks"] = acks if acks == "all" else int(acks)
    for key in ("linger_ms", "batch_size", "buffer_memory", "max_block_ms"):
        if not isinstance(merged[key], int) or merged[key] < 0:
            raise InvalidConfigError(f"{key}={merged[key]!r} must be a non-negative int")
    if merged["compression_type"] is not None:
        ipc_options(merged["compression_type"])  # validates the name
    for key in ("partitioner", "key_serializer", "value_serializer"):
        if merged[key] is not None and not callable(merged[key]):
            raise InvalidConfigError(f"{key} must be callable")
    return merged


def _combined_nbytes(column: pa.ChunkedArray) -> int:
    """``column.combine_chunks().nbytes``, without copying the column when that is the chunk's own figure.

    A single chunk at offset 0 whose validity bitmap is absent or in use has the
    same ``nbytes`` as its concatenation; anything else is concatenated as before.
    """
    if column.num_chunks == 1:
        chunk = column.chunk(0)
        if chunk.offset == 0 and (chunk.null_count > 0 or chunk.buffers()[0] is None):
            return chunk.nbytes
    return column.combine_chunks().nbytes


class _Buffer:
    """Records accumulated for one topic, written together; futures wait on ``done``."""

    __slots__ = (
        "topic",
        "values",
        "keys",
        "timestamps",
        "headers",
        "partitions",
        "nbytes",
        "created",
        "done",
        "error",
        "out_partitions",
        "out_offsets",
        "out_timestamps",
        "has_headers",
        "has_partitions",
    )

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.values: list[bytes | None] = []
        self.keys: list[bytes | None] = []
        self.timestamps: list[int] = []
        self.headers: list[Any] = []
        self.partitions: list[int] = []
        self.has_headers = False
        self.has_partitions = False
        self.nbytes = 0
        self.created = time.monotonic()
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.out_partitions: np.ndarray | None = None
        self.out_offsets: np.ndarray | None = None
        #: Per row, the time the log stamped it with (LogAppendTime topics only).
        self.out_timestamps: np.ndarray | None = None


class FutureRecordMetadata:
    """The result of ``send``: ``get(timeout)`` waits for the write and returns ``RecordMetadata``."""

    __slots__ = ("_buffer", "_index", "_acks0")

    def __init__(self, buffer: _Buffer, index: int, acks0: bool) -> None:
        self._buffer = buffer
        self._index = index
        self._acks0 = acks0

    def is_done(self) -> bool:
        """Whether the record has been written (or failed)."""
        return self._buffer.done.is_set()

    def succeeded(self) -> bool:
        """Whether the record has been written successfully."""
        return self._buffer.done.is_set() and self._buffer.error is None

    def get(self, timeout: float | None = None) -> RecordMetadata:
        """Wait up to ``timeout`` seconds; raise the write's error, or ``KafkaTimeoutError``."""
        buffer = self._buffer
        if not buffer.done.wait(timeout):
            raise KafkaTimeoutError(f"record to {buffer.topic!r} not written within {timeout} s")
        if buffer.error is not None:
            raise buffer.error
        assert buffer.out_partitions is not None and buffer.out_offsets is not None
        offset = -1 if self._acks0 else int(buffer.out_offsets[self._index])
        stamps = buffer.out_timestamps
        timestamp = buffer.timestamps[self._index] if stamps is None else int(stamps[self._index])
        return RecordMetadata(buffer.topic, int(buffer.out_partitions[self._index]), offset, timestamp)


@dataclass(frozen=True)
class BatchSendResult:
    """What ``send_batch`` wrote: per partition the first and last offset, and the record count."""

    topic: str
    offsets: dict[int, tuple[int, int]]
    record_count: int


class Producer:
    """Sends records to topics of a plog root (``url``: any fsspec URL or a local path)."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None, **config: Any) -> None:
        self.config = _check_producer_config(config)
        self.root = LogRoot(url, storage_options)
        self._durable = self.config["acks"] == "all"
        # send() takes the condition's lock directly: the Condition's own ``with`` costs two Python calls.
        self._mutex = threading.RLock()
        self._lock = threading.Condition(self._mutex)
        self._open: dict[str, _Buffer] = {}
        self._sealed: list[_Buffer] = []
        self._in_flight = 0
        self._queued_bytes = 0
        self._closed = False
        self._flush_requested = False
        self._sticky: dict[str, int] = {}
        self._coordinator = TransactionCoordinator(self.root.store)
        self._producer_id = -1
        self._producer_epoch = 0
        self._sequences: dict[tuple[str, int], int] = {}
        self._txn_lock = threading.Lock()
        self._transactional_id: str | None = self.config["transactional_id"]
        self._txn_holder: str | None = None
        self._txn_epoch: int | None = None  # the newest epoch this instance created
        self._txn: int | None = None  # the open transaction, if any
        self._txn_ranges: dict[str, dict[str, list[list[int]]]] = {}
        self._txn_offsets: dict[str, dict[str, dict[str, int]]] = {}
        self._txn_failed: BaseException | None = None
        self._sender = threading.Thread(target=self._run_sender, name="plog-producer-sender", daemon=True)
        self._sender.start()

    # ------------------------------------------------------------------ sending

    def _topic_meta(self, topic: str) -> TopicMetadata:
        return self.root.topic(topic)

    def _topic_meta_for(self, topic: str, partitions: np.ndarray | list[int]) -> TopicMetadata:
        """Metadata of ``topic``, read again if it names fewer partitions than asked for (they may be new)."""
        meta = self._topic_meta(topic)
        if len(partitions) and int(np.max(partitions)) >= meta.partitions:
            meta = self.root.topic(topic, refresh=True)
        return meta

    def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Any = None,
    ) -> FutureRecordMetadata:
        """Buffer one record for ``topic``; returns a future of its ``RecordMetadata``."""
        if self._closed:
            raise ProducerClosedError("send() on a closed producer")
        if self._transactional_id is not None and self._txn is None:
            raise InvalidConfigError("a transactional producer sends only inside begin_transaction()")
        config = self.config
        if config["value_serializer"] is not None:
            value = config["value_serializer"](value)
        if config["key_serializer"] is not None and key is not None:
            key = config["key_serializer"](key)
        if value is not None and value.__class__ is not bytes:
            value = as_bytes(value, "value")
        if key is not None and key.__class__ is not bytes:
            key = as_bytes(key, "key")
        if value is None and key is None:
            raise InvalidRecordError("a record needs a key or a value (a null value with a null key means nothing)")
        if headers is not None:
            headers = check_headers(headers)
        meta = self._topic_meta(topic)
        if partition is not None:
            if isinstance(partition, int) and not isinstance(partition, bool):
                meta = self._topic_meta_for(topic, [partition])
            meta.check_partition(partition)
        if timestamp_ms is None:
            timestamp_ms = time.time_ns() // 1_000_000
        elif not isinstance(timestamp_ms, int) or isinstance(timestamp_ms, bool) or timestamp_ms < 0:
            raise InvalidRecordError(f"timestamp_ms={timestamp_ms!r} must be a non-negative int")
        size = (len(value) if value is not None else 0) + (len(key) if key is not None else 0) + 24
        with self._mutex:
            if self._queued_bytes > config["buffer_memory"]:
                self._wait_for_room()
            buffer = self._open.get(topic)
            if buffer is None:
                buffer = self._open[topic] = _Buffer(topic)
                self._lock.notify_all()
            index = len(buffer.values)
            buffer.values.append(value)
            buffer.keys.append(key)
            buffer.timestamps.append(timestamp_ms)
            buffer.headers.append(headers)
            buffer.partitions.append(-1 if partition is None else partition)
            if headers is not None:
                buffer.has_headers = True
            if partition is not None:
                buffer.has_partitions = True
            buffer.nbytes += size
            self._queued_bytes += size
            if buffer.nbytes >= config["batch_size"]:
                self._seal(topic)
        return FutureRecordMetadata(buffer, index, config["acks"] == 0)

    def _wait_for_room(self) -> None:
        deadline = time.monotonic() + self.config["max_block_ms"] / 1000
        while self._queued_bytes > self.config["buffer_memory"]:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KafkaTimeoutError(f"buffer_memory full for {self.config['max_block_ms']} ms")
            self._lock.wait(remaining)

    def _seal(self, topic: str) -> None:
        buffer = self._open.pop(topic, None)
        if buffer is not None:
            self._sealed.append(buffer)
            self._lock.notify_all()

    # ------------------------------------------------------------------ the sender thread

    def _run_sender(self) -> None:
        linger = self.config["linger_ms"] / 1000
        while True:
            with self._lock:
                while True:
                    now = time.monotonic()
                    for topic, buffer in list(self._open.items()):
                        if self._flush_requested or self._closed or now - buffer.created >= linger:
                            self._seal(topic)
                    if self._sealed:
                        break
                    if self._closed:
                        return
                    self._flush_requested = False
                    oldest = min((b.created for b in self._open.values()), default=None)
                    self._lock.wait(None if oldest is None else max(0.0, oldest + linger - now))
                work, self._sealed = self._sealed, []
                self._in_flight += len(work)
            for buffer in work:
                self._write_buffer(buffer)
            with self._lock:
                self._in_flight -= len(work)
                self._queued_bytes -= sum(b.nbytes for b in work)
                self._lock.notify_all()

    def _assign_partitions(
        self,
        topic: str,
        meta: TopicMetadata,
        keys: pa.Array,
        explicit: np.ndarray | None,
        key_objects: list[bytes | None],
    ) -> np.ndarray:
        n = len(keys)
        partitioner: Callable | None = self.config["partitioner"]
        if partitioner is not None:
            all_partitions = list(range(meta.partitions))
            computed = np.array([partitioner(k, all_partitions, all_partitions) for k in key_objects], np.int32)
        else:
            computed = partitions_for_keys(keys, meta.partitions) if keys.null_count < n else np.full(n, -1, np.int32)
            nulls = computed < 0
            if nulls.any():
                computed[nulls] = self._next_sticky(topic, meta.partitions)
        if explicit is not None:
            computed = np.where(explicit >= 0, explicit, computed)
        for p in (int(computed.min()), int(computed.max())) if n else ():
            meta.check_partition(p)
        return computed

    def _next_sticky(self, topic: str, partitions: int) -> int:
        """Kafka's sticky partitioner: a new partition per batch, never the previous one if there is a choice."""
        previous = self._sticky.get(topic)
        choice = random.randrange(partitions)
        if partitions > 1 and choice == previous:
            choice = (choice + 1) % partitions
        self._sticky[topic] = choice
        return choice

    def _write_buffer(self, buffer: _Buffer) -> None:
        try:
            meta = self._topic_meta(buffer.topic)
            payload = payload_batch(
                buffer.timestamps, buffer.keys, buffer.values, buffer.headers if buffer.has_headers else None
            )
            explicit = np.asarray(buffer.partitions, np.int32) if buffer.has_partitions else None
            partitions = self._assign_partitions(buffer.topic, meta, payload.column(1), explicit, buffer.keys)
            buffer.out_partitions = partitions
            buffer.out_offsets, buffer.out_timestamps = self._append_by_partition(
                buffer.topic, meta, payload, partitions
            )
        except BaseException as exc:  # the futures carry it to the caller
            buffer.error = exc
        finally:
            buffer.done.set()

    def _append_by_partition(
        self, topic: str, meta: TopicMetadata, payload: pa.RecordBatch, partitions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Append each partition's rows (in send order); return every row's offset and, when the
        log stamps records itself (LogAppendTime), every row's stored timestamp."""
        offsets = np.empty(len(partitions), np.int64)
        stamps: np.ndarray | None = None
        order = np.argsort(partitions, kind="stable")
        sorted_parts = partitions[order]
        bounds = np.flatnonzero(np.diff(sorted_parts)) + 1
        starts = np.concatenate(([0], bounds))
        ends = np.concatenate((bounds, [len(order)]))
        compression = self.config["compression_type"]
        for lo, hi in zip(starts, ends, strict=True):
            rows = order[lo:hi]
            part = int(sorted_parts[lo])
            rows_batch = payload if hi - lo == len(order) else payload.take(pa.array(rows))
            log = self.root.partition(topic, part, meta)
            result = self._append(log, topic, part, [rows_batch], compression)
            offsets[rows] = np.arange(result.base_offsets[0], result.next_offset, dtype=np.int64)
            if log.config["message.timestamp.type"] == "LogAppendTime":
                if stamps is None:
                    stamps = np.asarray(payload.column(0).cast(pa.int64()), np.int64).copy()
                stamps[rows] = result.log_append_time_ms
        return offsets, stamps

    # ------------------------------------------------------------------ bulk

    def send_batch(self, topic: str, data: Any) -> BatchSendResult:
        """Write a table of records at once (pyarrow Table/RecordBatch or pandas DataFrame).

        Columns: ``value`` (required; binary or string), optional ``key``,
        ``partition``, ``timestamp`` (ms or timestamp type) and ``headers``.
        Without ``partition``, keyed rows go where Kafka's partitioner would
        put them and null-keyed rows are spread in ``batch_size`` runs. Returns
        once written (and, with ``acks='all'``, durable).
        """
        if self._closed:
            raise ProducerClosedError("send_batch() on a closed producer")
        meta = self._topic_meta(topic)
        table = table_from_user_data(data)
        payload = normalize_payload(table)
        if payload.num_rows == 0:
            return BatchSendResult(topic, {}, 0)
        keys = payload.column("key").combine_chunks()
        if "partition" in table.column_names:
            column = table.column("partition")
            if not pa.types.is_integer(column.type):
                raise InvalidRecordError(f"column 'partition' has type {column.type}; expected an integer type")
            try:  # checked widening: a huge partition number must not wrap around into range
                wide = pc.fill_null(column.cast(pa.int64()), -1).to_numpy()
            except pa.ArrowInvalid:  # beyond int64: certainly no such partition
                raise UnknownTopicOrPartitionError(
                    f"partition {pc.max(column).as_py()} does not exist in topic {topic!r} "
                    f"(it has partitions 0..{meta.partitions - 1})"
                ) from None
            meta = self._topic_meta_for(topic, wide)
            bad = (wide >= meta.partitions) | (wide < -1)
            if bad.any():
                meta.check_partition(int(wide[np.flatnonzero(bad)[0]]))
            partitions = wide.astype(np.int32)
        else:
            partitions = (
                partitions_for_keys(keys, meta.partitions)
                if keys.null_count < len(keys)
                else np.full(len(keys), -1, np.int32)
            )
        null_rows = partitions < 0
        null_count = int(np.count_nonzero(null_rows))
        if null_count:
            # Sticky per batch: runs of about batch_size bytes each go to one partition.
            value_bytes = _combined_nbytes(payload.column("value"))
            per_row = max(1, value_bytes // max(1, payload.num_rows))
            run = max(1, self.config["batch_size"] // per_row)
            # When no row is placed (a keyless table) the runs are plain slices: no index array.
            nulls = None if null_count == len(partitions) else np.flatnonzero(null_rows)
            for lo in range(0, null_count, run):
                rows = slice(lo, lo + run) if nulls is None else nulls[lo : lo + run]
                partitions[rows] = self._next_sticky(topic, meta.partitions)
        batch = payload.combine_chunks().to_batches()
        combined = batch[0] if len(batch) == 1 else pa.Table.from_batches(batch).combine_chunks().to_batches()[0]
        offsets = self._append_table(topic, meta, combined, partitions)
        return BatchSendResult(topic, offsets, payload.num_rows)

    def _append_table(
        self, topic: str, meta: TopicMetadata, payload: pa.RecordBatch, partitions: np.ndarray
    ) -> dict[int, tuple[int, int]]:
        n = len(partitions)
        if n and partitions.min() == partitions.max():
            # All rows go to one partition (e.g. one partition, or null keys in one sticky run): the stable
            # sort below would be the identity, so skip its O(n) passes and temporary arrays.
            order, sorted_parts, starts, ends = None, partitions[:1], np.array([0]), np.array([n])
        else:
            order = np.argsort(partitions, kind="stable")
            sorted_parts = partitions[order]
            bounds = np.flatnonzero(np.diff(sorted_parts)) + 1
            starts = np.concatenate(([0], bounds))
            ends = np.concatenate((bounds, [n]))
        result: dict[int, tuple[int, int]] = {}
        batch_bytes = self.config["batch_size"]
        compression = self.config["compression_type"]
        for lo, hi in zip(starts, ends, strict=True):
            part = int(sorted_parts[lo])
            if hi - lo == n:
                rows = payload
            else:
                assert order is not None  # several partitions: the rows were sorted
                rows = payload.take(pa.array(order[lo:hi]))
            log = self.root.partition(topic, part, meta)
            per_row = max(1, rows.nbytes // max(1, rows.num_rows))
            rows_per_batch = max(1, batch_bytes // per_row)
            rows_per_object = max(rows_per_batch, meta.config["segment.bytes"] // per_row)
            first = last = -1
            for o in range(0, rows.num_rows, rows_per_object):
                chunk = rows.slice(o, rows_per_object)
                batches = [chunk.slice(b, rows_per_batch) for b in range(0, chunk.num_rows, rows_per_batch)]
                appended = self._append(log, topic, part, batches, compression)
                if first < 0:
                    first = appended.base_offsets[0]
                last = appended.next_offset - 1
            result[part] = (first, last)
        return result

    def _append(
        self, log: PartitionLog, topic: str, partition: int, batches: list[pa.RecordBatch], compression: str | None
    ) -> AppendResult:
        """Append with this producer's id, sequences and transaction (PROTOCOL.md 11.1, 11.2)."""
        with self._txn_lock:
            transactional = self._transactional_id is not None
            if transactional and self._txn is None:
                raise InvalidConfigError("a transactional producer sends only inside begin_transaction()")
            if self._producer_id < 0 and self.config["enable_idempotence"]:
                self._producer_id = allocate_producer_id(self.root.store, owner=self.config["client_id"])
            txn = -1 if self._txn is None else self._txn
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
            epoch = self._producer_epoch
        timeout_ms = self.config["transaction_timeout_ms"] if transactional else None
        try:
            result = log.append(
                list(zip(batches, metas, strict=True)),
                durable=self._durable,
                compression=compression,
                transaction_timeout_ms=timeout_ms,
            )
        except BaseException as exc:
            with self._txn_lock:
                if self._producer_epoch == epoch and self._producer_id >= 0:
                    # Unknown whether it landed: continuing the sequence could leave a gap or a
                    # false duplicate, so start a new epoch with sequences from 0 (as Kafka does).
                    self._producer_epoch += 1
                    self._sequences.clear()
                if transactional:
                    self._txn_failed = exc
            raise
        with self._txn_lock:
            if self._producer_epoch == epoch:
                self._sequences[(topic, partition)] = sequence
            if transactional:
                self._txn_ranges.setdefault(topic, {}).setdefault(str(partition), []).append(
                    [result.base_offsets[0], result.next_offset - 1]
                )
        return result

    # ------------------------------------------------------------------ transactions

    def _require_transactional(self) -> str:
        if self._transactional_id is None:
            raise InvalidConfigError("this producer has no transactional_id")
        return self._transactional_id

    def init_transactions(self) -> None:
        """Fence earlier instances with the same ``transactional_id`` and abort their open transactions.

        Also completes the consumer-offset commits of this id's last committed
        transaction, in case the previous instance died between its commit and
        writing them (call it before consuming, as in Kafka's read-process-write loop).
        """
        tid = self._require_transactional()
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
        if self._txn is not None:
            raise InvalidConfigError("a transaction is already open")
        txn = self._coordinator.next_epoch(tid, self._txn_holder, self._txn_epoch)
        with self._txn_lock:
            self._txn_epoch = self._txn = txn
            self._txn_ranges, self._txn_offsets, self._txn_failed = {}, {}, None

    def send_offsets_to_transaction(self, offsets: dict[Any, Any], group_id: str) -> None:
        """Commit consumer offsets (``{TopicPartition: offset}``) for ``group_id`` with this transaction."""
        if self._txn is None:
            raise InvalidConfigError("send_offsets_to_transaction() outside a transaction")
        if not isinstance(group_id, str) or not group_id:
            raise InvalidConfigError(f"group_id must be a non-empty str, got {group_id!r}")
        group = self._txn_offsets.setdefault(group_id, {})
        for tp, offset in offsets.items():
            value = getattr(offset, "offset", offset)
            if not isinstance(value, int) or value < 0:
                raise InvalidConfigError(f"offset {offset!r} for {tp} must be a non-negative int")
            group.setdefault(tp[0], {})[str(tp[1])] = value

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Flush, then make the transaction's records (and offsets) visible everywhere at once."""
        if self._txn is None:
            raise InvalidConfigError("commit_transaction() without begin_transaction()")
        self.flush(timeout)
        if self._txn_failed is not None:
            raise InvalidConfigError(
                f"a send in this transaction failed ({self._txn_failed}); call abort_transaction()"
            ) from self._txn_failed
        decision = Decision(
            COMMITTED,
            self._producer_id,
            self._txn,
            batches=self._txn_ranges,
            offsets=self._txn_offsets,
            epoch=self._txn,
            created_ms=now_ms(),
        )
        stands = self._coordinator.decide(decision)
        self._txn = None
        if stands.state != COMMITTED:
            raise FencedError(
                f"transaction {decision.txn} of {self._transactional_id!r} was aborted by a newer instance; "
                "this producer has been fenced"
            )
        if stands.offsets:
            materialize_offsets(self.root.store, stands)

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Flush, then abort: nothing sent in the transaction is ever visible to read_committed readers."""
        if self._txn is None:
            raise InvalidConfigError("abort_transaction() without begin_transaction()")
        with contextlib.suppress(PlogError):  # the records' own futures report their failures
            self.flush(timeout)
        self._coordinator.abort_if_undecided(self._producer_id, self._txn, epoch=self._txn)
        self._txn = None

    # ------------------------------------------------------------------ lifecycle

    def flush(self, timeout: float | None = None) -> None:
        """Write everything sent so far and wait for it; ``KafkaTimeoutError`` after ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            pending = list(self._open.values()) + list(self._sealed)
            self._flush_requested = True
            self._lock.notify_all()
        for buffer in pending:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not buffer.done.wait(remaining):
                raise KafkaTimeoutError(f"flush did not finish within {timeout} s")

    def close(self, timeout: float | None = None) -> None:
        """Flush, stop the sender thread and release the store. Idempotent."""
        if self._closed:
            return
        try:
            self.flush(timeout)
        finally:
            with self._lock:
                self._closed = True
                self._lock.notify_all()
            self._sender.join(timeout)
            self.root.close()

    def metrics(self) -> dict[str, Any]:
        """A few counters, for progress displays."""
        with self._lock:
            return {"queued_bytes": self._queued_bytes, "open_buffers": len(self._open), "in_flight": self._in_flight}

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def partitions_for(self, topic: str) -> set[int]:
        """The partition numbers of ``topic``."""
        try:
            return set(range(self.root.topic(topic, refresh=True).partitions))
        except UnknownTopicOrPartitionError:
            raise


__all__ = ["BatchSendResult", "FutureRecordMetadata", "Producer", "now_ms"]
