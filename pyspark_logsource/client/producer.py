"""The producer: kafka-python's ``KafkaProducer`` API on a plog root, as a facade over its parts.

``send`` only buffers: records accumulate per topic in the ``RecordAccumulator``
(``accumulator.py``) and the background ``Sender`` thread (``sender.py``) writes
them when ``linger_ms`` has passed or ``batch_size`` bytes are waiting, one
segment object per partition touched. Partitions are computed at write time,
vectorised, by the topic's ``Router`` (``routing.py``: Kafka's murmur2 of the
key; null keys sticky per batch), so the per-record cost of ``send`` is a few
list appends. ``send_batch`` routes an Arrow table with the same ``Router`` and
writes it straight to the log. Producer ids, sequences and transactions are
the ``TransactionManager``'s (``transactions.py``); the futures ``send``
returns are in ``futures.py``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from time import time_ns
from typing import Any, Literal, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from coordinator.quotas import ClientQuota
from pyspark_logsource.client.accumulator import RECORD_OVERHEAD, Buffer, RecordAccumulator, RoutedBuffer
from pyspark_logsource.client.config import PRODUCER_CONFIG
from pyspark_logsource.client.futures import (
    BatchSendFuture,
    BatchSendResult,
    FutureRecordMetadata,
    UnacknowledgedFutureRecordMetadata,
)
from pyspark_logsource.client.metrics import counting_root, store_metrics
from pyspark_logsource.client.routing import Router, partition_groups
from pyspark_logsource.client.sender import Sender
from pyspark_logsource.client.transactions import TransactionManager
from segment_format.errors import (
    InvalidConfigError,
    InvalidRecordError,
    KafkaTimeoutError,
    PlogError,
    ProducerClosedError,
    UnknownTopicOrPartitionError,
)
from segment_format.records import (
    as_bytes,
    check_headers,
    normalize_payload,
    table_from_user_data,
)
from segment_format.topic import TopicMetadata, is_compacted
from segment_format.typed.layout import entry_layout, typed_payload

#: Every producer config key with its default (declared in :data:`~pyspark_logsource.client.config.PRODUCER_CONFIG`).
PRODUCER_DEFAULTS: dict[str, Any] = PRODUCER_CONFIG.defaults()


def _check_timestamp(timestamp_ms: Any) -> None:
    if not isinstance(timestamp_ms, int) or isinstance(timestamp_ms, bool) or timestamp_ms < 0:
        raise InvalidRecordError(f"timestamp_ms={timestamp_ms!r} must be a non-negative int")


def _check_producer_config(config: dict[str, Any]) -> dict[str, Any]:
    return PRODUCER_CONFIG.validate(config)


#: The default ``flush_interval_ms`` on an object store: a 10 MiB/s stream then flushes 8 MiB at a time (the
#: accumulator flushes early at that size), so a flush's object, commit and root notice cost under 0.4 PUT per
#: MiB, and a GiB's whole life costs about $0.005 of requests. A caller that waits on a send is not held back.
OBJECT_STORE_FLUSH_INTERVAL_MS = 1000


class Producer:
    """Sends records to topics of a plog root (``url``: any fsspec URL or a local path)."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None, **config: Any) -> None:
        self.config = _check_producer_config(config)
        self.root = counting_root(url, storage_options)  # counts its store requests, for metrics()
        interval = self.config["flush_interval_ms"]
        if interval is None:  # a flush costs fixed requests on an object store: gather a second of records
            interval = OBJECT_STORE_FLUSH_INTERVAL_MS if self.root.store.billed_per_request else 0
        self._accumulator = RecordAccumulator(
            self.config["batch_size"],
            self.config["buffer_memory"],
            self.config["max_block_ms"],
            self.config["linger_ms"],
            interval,
        )
        self._routers: dict[str, Router] = {}
        self._routers_lock = threading.Lock()
        self._transactions = TransactionManager(self.root, self.config)
        self._quota = ClientQuota(
            self.root.store,
            "producer_byte_rate",
            self.config["quota_user"],
            self.config["client_id"],
            self.config["quota_refresh_ms"] / 1000,
        )
        self._sender = Sender(
            self._accumulator,
            self.root,
            self._router,
            self._transactions,
            self.config["compression_type"],
            self._quota,
        )
        self._accumulator.on_seal = self._sender.prepare
        self._sender.start()
        # Fixed for the producer's life; kept as attributes so that send() reads one each.
        self._transactional = self._transactions.transactional_id is not None
        self._serializing = self.config["value_serializer"] is not None or self.config["key_serializer"] is not None
        self._future = UnacknowledgedFutureRecordMetadata if self.config["acks"] == 0 else FutureRecordMetadata
        self._plain = not self._transactional and not self._serializing  # send's short path applies

    # ------------------------------------------------------------------ sending

    def _topic_meta(self, topic: str) -> TopicMetadata:
        return self.root.topic(topic)

    def _router(self, topic: str) -> Router:
        """The ``Router`` of ``topic`` (one per topic: it holds the topic's sticky partition)."""
        router = self._routers.get(topic)
        if router is None:
            with self._routers_lock:
                router = self._routers.get(topic)
                if router is None:
                    router = self._routers[topic] = Router(
                        topic,
                        lambda: self.root.topic(topic, refresh=True),
                        self.config["batch_size"],
                        self.config["partitioner"],
                    )
        return router

    def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Any = None,
    ) -> FutureRecordMetadata:
        """Buffer one record for ``topic``; returns a future of its ``RecordMetadata``.

        This is the per-record hot path, so it does only what must happen per record: the checks,
        the send time, and the append to the topic's open buffer. The topic's metadata is checked
        when a buffer is opened (and again by the sender when it writes it), not on every call.
        A plain record (bytes value, bytes or no key, at most a partition the buffer's metadata knows)
        into an open buffer takes the short path; everything else, and every record that opens a
        buffer, the full one.
        """
        if (
            self._plain
            and value.__class__ is bytes
            and (key is None or key.__class__ is bytes)
            and timestamp_ms is None
            and headers is None
        ):
            accumulator = self._accumulator
            size = len(value) + (RECORD_OVERHEAD if key is None else RECORD_OVERHEAD + len(key))
            lock = accumulator.lock
            # RecordAccumulator.append, inlined for plain records into an open buffer: the call and its
            # checks for headers and timestamps would be a fifth of the time of such a send. The lock's
            # acquire and release as calls, not a with block: 50 ns less, a tenth of a send.
            lock.acquire()
            try:
                buffer = accumulator.open_buffers.get(topic)
                if (
                    buffer is not None
                    and (key is not None or not buffer.keys_required)
                    and buffer.layout is None
                    # The partition every record of the buffer names (checked when the first did), or None
                    # for both: no per-record note. Small ints are shared objects, so a loop of sends to
                    # one partition below 257 takes this path; anything else takes the full one.
                    and partition is buffer.sole_partition
                ):
                    index = len(buffer.values)
                    buffer.values.append(value)
                    buffer.keys.append(key)
                    buffer.timestamps_ns.append(time_ns())
                    buffer.nbytes += size
                    if buffer.nbytes >= accumulator.batch_size:
                        accumulator.seal(topic)
                    return self._future((buffer, index))
            except TypeError:  # an unhashable topic: the full path names it
                pass
            finally:
                lock.release()
        return self._send(topic, value, key, partition, timestamp_ms, headers)

    def _send(
        self, topic: str, value: Any, key: Any, partition: int | None, timestamp_ms: int | None, headers: Any
    ) -> FutureRecordMetadata:
        """``send``'s full path: every check, and the record that opens a buffer."""
        accumulator = self._accumulator
        if accumulator.closed:
            raise ProducerClosedError("send() on a closed producer")
        if self._transactional and self._transactions.txn is None:
            raise InvalidConfigError("a transactional producer sends only inside begin_transaction()")
        if self._serializing:
            value, key = self._serialize(value, key)
        buffer = accumulator.open_buffers.get(topic) if topic.__class__ is str else None
        meta = buffer.meta if buffer is not None else self._topic_meta(topic)
        history = meta.schema_history
        if history is not None:  # a typed topic: the value is a dict of fields (PROTOCOL.md 11.8)
            if isinstance(value, pa.StructScalar):  # a pyarrow row
                value = value.as_py()
            elif isinstance(value, (pa.RecordBatch, pa.Table)):
                if value.num_rows != 1:
                    raise InvalidRecordError(f"send() takes one record: a table of 1 row, not {value.num_rows}")
                value = value.to_pylist()[0]
            entry_layout(history.current).check_python_value(value, topic)
        elif value is not None and value.__class__ is not bytes:
            value = as_bytes(value, "value")
        if key is not None and key.__class__ is not bytes:
            key = as_bytes(key, "key")
        if value is None and key is None:
            raise InvalidRecordError("a record needs a key or a value (a null value with a null key means nothing)")
        if headers is not None:
            headers = check_headers(headers)
        if key is None and is_compacted(meta.config):
            raise InvalidRecordError(
                f"a record without a key sent to topic {topic!r}, which is compacted "
                "(cleanup.policy contains 'compact'): compacted topics require a key on every record"
            )
        if partition is not None and not (partition.__class__ is int and 0 <= partition < meta.partitions):
            self._router(topic).check(partition, meta)  # reads the metadata again, or raises naming the partition
        if timestamp_ms is not None:
            _check_timestamp(timestamp_ms)
        buffer, index = accumulator.append(topic, value, key, time_ns(), headers, partition, meta, timestamp_ms)
        return self._future((buffer, index))

    def _serialize(self, value: Any, key: Any) -> tuple[Any, Any]:
        config = self.config
        if config["value_serializer"] is not None:
            value = config["value_serializer"](value)
        if config["key_serializer"] is not None and key is not None:
            key = config["key_serializer"](key)
        return value, key

    # ------------------------------------------------------------------ bulk

    @overload
    def send_batch(self, topic: str, data: Any, *, wait: Literal[True] = True) -> BatchSendResult: ...

    @overload
    def send_batch(self, topic: str, data: Any, *, wait: Literal[False]) -> BatchSendFuture: ...

    def send_batch(self, topic: str, data: Any, *, wait: bool = True) -> BatchSendResult | BatchSendFuture:
        """Write a table of records at once (pyarrow Table/RecordBatch or pandas DataFrame).

        Columns: ``value`` (required; binary or string), optional ``key``,
        ``partition``, ``timestamp`` (ms or timestamp type) and ``headers``.
        For a typed topic the value is a struct column ``value`` or the value
        schema's fields as columns, checked before anything is written.
        Without ``partition``, keyed rows go where Kafka's partitioner would
        put them and null-keyed rows are spread in ``batch_size`` runs.

        The table goes through the same accumulator and sender as ``send``: it is written after every
        record sent before it, in the same flush as whatever else is waiting (a shared topic's flush is one
        object and one commit, PROTOCOL.md 7.3). With ``wait`` (the default) it returns once the table is
        written (and, with ``acks='all'``, durable). With ``wait=False`` it returns a ``BatchSendFuture`` at
        once: consecutive tables then linger (``linger_ms``) and share flushes up to ``batch_size``, and
        ``get()`` (or ``flush()``) waits for them, raising the write's error.
        """
        if self._accumulator.closed:
            raise ProducerClosedError("send_batch() on a closed producer")
        if self._transactional and self._transactions.txn is None:
            raise InvalidConfigError("a transactional producer sends only inside begin_transaction()")
        meta = self._topic_meta(topic)
        table = table_from_user_data(data)
        history = meta.schema_history
        if history is None:
            payload = normalize_payload(table)
        else:  # a typed topic: a struct 'value' or the fields as columns, checked (PROTOCOL.md 11.8)
            payload = typed_payload(table, entry_layout(history.current), topic)
        if payload.num_rows == 0:
            return BatchSendResult(topic, {}, 0) if wait else BatchSendFuture(topic, [], 0)
        if is_compacted(meta.config) and payload.column("key").null_count:
            raise InvalidRecordError(
                f"{payload.column('key').null_count} row(s) without a key sent to topic {topic!r}, which is "
                "compacted (cleanup.policy contains 'compact'): compacted topics require a key on every record; "
                "nothing of the batch was written"
            )
        partitions = self._route_table(topic, meta, table, payload)
        batch = payload.combine_chunks().to_batches()
        combined = batch[0] if len(batch) == 1 else pa.Table.from_batches(batch).combine_chunks().to_batches()[0]
        buffers = []
        for start, stop in self._table_steps(combined, partitions):
            step = combined.slice(start, stop - start)
            step_partitions = partitions[start:stop]
            pieces = []
            for part, where in partition_groups(step_partitions):
                rows = step if where is None else step.take(pa.array(where))
                pieces.append((part, where, rows, rows.nbytes))
            buffers.append(Buffer.of_table(topic, meta, RoutedBuffer(step, step_partitions, pieces)))
        # Queued together: one round of the sender writes them, waiting out the quota's delay before each
        # step (PROTOCOL.md 11.10).
        self._accumulator.add_tables(topic, buffers, linger=not wait)
        future = BatchSendFuture(topic, buffers, payload.num_rows)
        return future.get() if wait else future

    def _route_table(self, topic: str, meta: TopicMetadata, table: pa.Table, payload: pa.Table) -> np.ndarray:
        """Each row's partition: its ``partition`` column's, else where the topic's router puts its key."""
        given: np.ndarray | None = None
        if "partition" in table.column_names:
            column = table.column("partition")
            if not pa.types.is_integer(column.type):
                raise InvalidRecordError(f"column 'partition' has type {column.type}; expected an integer type")
            try:  # checked widening: a huge partition number must not wrap around into range
                given = pc.fill_null(column.cast(pa.int64()), -1).to_numpy()
            except pa.ArrowInvalid:  # beyond int64: certainly no such partition
                raise UnknownTopicOrPartitionError(
                    f"partition {pc.max(column).as_py()} does not exist in topic {topic!r} "
                    f"(it has partitions 0..{meta.partitions - 1})"
                ) from None
        return self._router(topic).route(
            meta,
            payload.column("key"),
            payload.column("value"),
            given=given,
            unset=None if given is None else given == -1,  # a null partition: routed by key
        )

    def _table_steps(self, payload: pa.RecordBatch, partitions: np.ndarray) -> list[tuple[int, int]]:
        """Row ranges of ``payload``, each one buffer for the sender: about ``batch_size`` per partition it
        touches (each partition's rows of a buffer are one stored batch), and at most the byte quota's burst,
        so that the sender can delay each before it is written (PROTOCOL.md 11.10)."""
        touched = max(1, len(np.unique(partitions)))
        limit = self.config["batch_size"] * touched
        burst = self._quota.step_bytes()
        if burst is not None:
            limit = min(limit, burst)
        if payload.nbytes <= limit:
            return [(0, payload.num_rows)]
        rows = max(1, int(limit // max(1, payload.nbytes // max(1, payload.num_rows))))
        return [(start, min(start + rows, payload.num_rows)) for start in range(0, payload.num_rows, rows)]

    # ------------------------------------------------------------------ transactions

    def init_transactions(self) -> None:
        """Fence earlier instances with the same ``transactional_id`` and abort their open transactions.

        Also completes the consumer-offset commits of this id's last committed
        transaction, in case the previous instance died between its commit and
        writing them (call it before consuming, as in Kafka's read-process-write loop).
        """
        self._transactions.init_transactions()

    def begin_transaction(self) -> None:
        """Start a transaction: a new epoch for this transactional id (``FencedError`` if another instance took it)."""
        self._transactions.begin_transaction()

    def send_offsets_to_transaction(self, offsets: dict[Any, Any], group_id: str) -> None:
        """Commit consumer offsets (``{TopicPartition: offset}``) for ``group_id`` with this transaction."""
        self._transactions.send_offsets_to_transaction(offsets, group_id)

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Flush, then make the transaction's records (and offsets) visible everywhere at once."""
        self._transactions.require_transaction("commit_transaction")
        self.flush(timeout)
        self._transactions.commit_transaction()

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Flush, then abort: nothing sent in the transaction is ever visible to read_committed readers."""
        self._transactions.require_transaction("abort_transaction")
        with contextlib.suppress(PlogError):  # the records' own futures report their failures
            self.flush(timeout)
        self._transactions.abort_transaction()

    # ------------------------------------------------------------------ lifecycle

    def flush(self, timeout: float | None = None) -> None:
        """Write everything sent so far and wait for it; ``KafkaTimeoutError`` after ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for buffer in self._accumulator.request_flush():
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not buffer.done.wait(remaining):
                raise KafkaTimeoutError(f"flush did not finish within {timeout} s")

    def close(self, timeout: float | None = None) -> None:
        """Flush, stop the sender thread and release the store. Idempotent."""
        if self._accumulator.closed:
            return
        try:
            self.flush(timeout)
        finally:
            self._accumulator.close()
            self._sender.stop()
            self._sender.join(timeout)
            self.root.close()

    def metrics(self) -> dict[str, Any]:
        """Kafka's producer metrics by name (``record-send-rate``, ``produce-throttle-time-avg``, ...), the buffers'
        counters and the store's requests (``pyspark_logsource/client/metrics.py``, PROTOCOL.md 11.10)."""
        return {
            **self._accumulator.metrics(),
            **self._transactions.metrics.snapshot(),
            **store_metrics(self.root.store),
            "produce-throttle-time-avg": self._quota.throttle_time_avg_ms(),
            "produce-throttle-time-max": self._quota.throttle_time_max_ms(),
        }

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


__all__ = ["BatchSendResult", "FutureRecordMetadata", "Producer"]
