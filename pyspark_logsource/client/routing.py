"""Where a record goes: one ``Router`` per topic, used by ``Producer.send``, ``Producer.send_batch`` and the Spark sink.

The rule, per record, first match wins:

1. an explicit partition (``send(partition=N)``, a ``partition`` column) is kept, after a
   range check; a number beyond the partitions known makes the router read the topic's
   metadata again once (partitions may have been added) before it refuses the record with
   ``UnknownTopicOrPartitionError`` naming the topic and the partition;
2. a configured ``partitioner`` callable (the producer's config of that name) decides;
3. a non-null key goes where Kafka's default partitioner puts it: murmur2 of the key
   (``partitioner.partitions_for_keys``, bit-for-bit Kafka's choice);
4. a null key is *sticky*, as in Kafka (KIP-480, KIP-794): the router's null-key records all
   go to one partition until the batch holding them is sealed, then to the next partition.
   A batch is sealed when it holds ``batch_bytes`` bytes (each record counting the length of
   its key and value plus ``RECORD_OVERHEAD``; the record that reaches the limit is the
   batch's last), or when the caller's batch ends: each ``route`` call is one batch (a
   sealed producer buffer, one ``send_batch`` table, one Arrow batch the sink receives).

The next partition is the one after the current, modulo the partition count; a router's
first batch starts at ``start_partition`` (random). Kafka picks each next partition at
random; moving round the partitions in order keeps its two properties (never the same
partition twice in a row when there is a choice, every partition used) and adds two: the
partitions receive batches evenly, and two routers that start at the same partition agree
record for record, so the producer and the sink place the same sequence of null-key records
on the same partitions (``tests/test_routing.py`` checks exactly that).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pyspark_logsource.client.accumulator import RECORD_OVERHEAD
from pyspark_logsource.client.partitioner import partitions_for_keys
from segment_format.topic import TopicMetadata

__all__ = [
    "DEFAULT_BATCH_BYTES",
    "Router",
    "partition_groups",
    "partition_order",
    "start_partition",
]

#: Bytes of null-key records one partition takes before the next is chosen, unless a producer's
#: ``batch_size`` says otherwise: the producer's default ``batch_size``, so the Spark sink (which has
#: no such option) places null-key records as a default-configured ``Producer`` does.
DEFAULT_BATCH_BYTES = 1024 * 1024

#: ``partitioner(key_bytes_or_None, all_partitions, available_partitions) -> int``, kafka-python's signature.
Partitioner = Callable[[bytes | None, list[int], list[int]], int]


def partition_order(partitions: np.ndarray) -> np.ndarray:
    """The row order that groups rows by partition, each partition's rows in their original order.

    A stable sort; on partition numbers narrowed to int16 NumPy sorts by radix, in one linear pass,
    about twice as fast as its merge sort of int64 (partition numbers are never negative here).
    """
    if partitions.size and int(partitions.max()) < 2**15:
        return np.argsort(partitions.astype(np.int16, copy=False), kind="stable")
    return np.argsort(partitions, kind="stable")


def partition_groups(partitions: np.ndarray) -> list[tuple[int, np.ndarray | None]]:
    """Each partition of ``partitions`` (one per row), ascending, with its rows in their original order;
    ``None`` for the rows when every row goes to that one partition (nothing to sort or take)."""
    n = len(partitions)
    if not n:
        return []
    if partitions.min() == partitions.max():
        return [(int(partitions[0]), None)]
    order = partition_order(partitions)
    sorted_parts = partitions[order]
    bounds = np.flatnonzero(np.diff(sorted_parts)) + 1
    starts = np.concatenate(([0], bounds))
    ends = np.concatenate((bounds, [n]))
    return [(int(sorted_parts[lo]), order[lo:hi]) for lo, hi in zip(starts, ends, strict=True)]


def start_partition(partitions: int) -> int:
    """The partition a router's first null-key batch goes to: a random one, so that many short-lived
    producers (or Spark tasks) do not all begin on partition 0. Tests replace it to fix the start."""
    return random.randrange(partitions)


class Router:
    """Places the records of one topic on its partitions (the rule is in the module docstring).

    ``refresh`` reads the topic's metadata again (bypassing caches); it is called only when an
    explicit partition lies beyond the partitions known. Safe to share between threads: the
    producer's sender thread and a caller's ``send_batch`` route the same topic concurrently.
    """

    def __init__(
        self,
        topic: str,
        refresh: Callable[[], TopicMetadata],
        batch_bytes: int = DEFAULT_BATCH_BYTES,
        partitioner: Partitioner | None = None,
    ) -> None:
        self.topic = topic
        self.batch_bytes = batch_bytes
        self.partitioner = partitioner
        self._refresh = refresh
        self._lock = threading.Lock()
        self._current: int | None = None  # the sticky partition; None until the first null-key record

    # ------------------------------------------------------------------ explicit partitions

    def check(self, partition: Any, meta: TopicMetadata) -> int:
        """``partition`` if it is a partition of the topic; else read the metadata again and raise
        ``UnknownTopicOrPartitionError`` naming topic and partition. A plain int comparison when it is."""
        if partition.__class__ is int and 0 <= partition < meta.partitions:
            return partition  # type: ignore[no-any-return]
        if partition.__class__ is int and partition >= meta.partitions:
            meta = self._refresh()  # partitions may have been added
        return meta.check_partition(partition)

    def check_given(self, meta: TopicMetadata, given: np.ndarray, unset: np.ndarray | None = None) -> TopicMetadata:
        """Range-check explicit partitions: ``given`` per row, except where ``unset`` (a bool mask) is true.

        Returns the metadata, read again if a partition lay beyond those known; raises
        ``UnknownTopicOrPartitionError`` for the first row whose partition does not exist.
        """
        valid = given if unset is None else given[~unset]
        if not valid.size:
            return meta
        low, high = int(valid.min()), int(valid.max())
        if low >= 0 and high < meta.partitions:
            return meta
        if high >= meta.partitions:
            meta = self._refresh()
        bad = valid[(valid < 0) | (valid >= meta.partitions)]
        if bad.size:
            meta.check_partition(int(bad[0]))
        return meta

    # ------------------------------------------------------------------ routing

    def route(
        self,
        meta: TopicMetadata,
        keys: pa.Array | pa.ChunkedArray,
        values: pa.Array | pa.ChunkedArray,
        given: np.ndarray | None = None,
        unset: np.ndarray | None = None,
        key_objects: Sequence[bytes | None] | None = None,
    ) -> np.ndarray:
        """The partition (int32) of every row of one batch.

        ``keys`` and ``values`` are the batch's binary/string columns. ``given`` holds explicit
        partitions (checked with ``check_given``); rows where the bool mask ``unset`` is true (all
        rows if ``given`` is None) are routed by key. ``key_objects``, the keys as Python objects,
        spares a conversion when a ``partitioner`` callable is configured. The call is one batch:
        afterwards the next null-key record goes to the next partition.
        """
        n = len(keys)
        if given is None:
            return self._place(meta, keys, values, key_objects)
        meta = self.check_given(meta, given, unset)
        out = given.astype(np.int32)
        if unset is None:
            return out
        rows = np.flatnonzero(unset)
        if rows.size == n:
            return self._place(meta, keys, values, key_objects)
        if rows.size:
            objects = None if key_objects is None else [key_objects[i] for i in rows.tolist()]
            out[rows] = self._place(meta, keys.take(pa.array(rows)), values, objects, rows)
        return out

    def _place(
        self,
        meta: TopicMetadata,
        keys: pa.Array | pa.ChunkedArray,
        values: pa.Array | pa.ChunkedArray,
        key_objects: Sequence[bytes | None] | None,
        rows: np.ndarray | None = None,
    ) -> np.ndarray:
        """Rules 2-4 for rows without an explicit partition.

        ``keys`` are those rows' keys; ``values`` is the whole batch's column and ``rows`` says which of its
        rows these are (None: all), so that only value lengths are computed, never the value bytes copied.
        """
        n = len(keys)
        if not n:
            return np.empty(0, np.int32)
        if self.partitioner is not None:
            objects = keys.to_pylist() if key_objects is None else key_objects
            everyone = list(range(meta.partitions))
            out = np.fromiter((self.partitioner(k, everyone, everyone) for k in objects), np.int32, n)
            for p in (int(out.min()), int(out.max())):
                meta.check_partition(p)
            return out
        null_count = keys.null_count
        out = partitions_for_keys(keys, meta.partitions) if null_count < n else np.full(n, -1, np.int32)
        if null_count:
            sizes = _value_sizes(values) if rows is None else _value_sizes(values)[rows]
            if null_count == n:
                return self._sticky(sizes, meta.partitions)
            nulls = np.flatnonzero(out < 0)  # partitions_for_keys marks exactly the null keys with -1
            out[nulls] = self._sticky(sizes[nulls], meta.partitions)
        return out

    def _sticky(self, sizes: np.ndarray, partitions: int) -> np.ndarray:
        """Partitions of a batch's null-key records, of ``sizes`` bytes each, in order; then seal the batch."""
        out = np.empty(len(sizes), np.int32)
        ends = np.cumsum(sizes)  # bytes up to and including each record
        with self._lock:
            current = self._current
            if current is None or current >= partitions:
                current = start_partition(partitions)
            first, before = 0, 0  # the first record of the sticky batch; bytes of the records before it
            while first < len(out):
                # The record whose end reaches batch_bytes is the batch's last (a batch has at least one).
                last = max(first, int(np.searchsorted(ends, before + self.batch_bytes, side="left")))
                out[first : last + 1] = current
                current = (current + 1) % partitions  # sealed: full, or the caller's batch ends here
                first = last + 1
                if first < len(out):
                    before = int(ends[last])
            self._current = current
        return out


def _value_sizes(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """What each null-key record counts towards a batch: its value's length plus ``RECORD_OVERHEAD``."""
    if pa.types.is_struct(values.type):  # a typed topic's value (PROTOCOL.md 11.8): its mean width per row
        mean = values.nbytes // max(1, len(values))
        return np.full(len(values), mean + RECORD_OVERHEAD, np.int64)
    lengths = pc.fill_null(pc.binary_length(values), 0)
    return np.asarray(lengths.to_numpy(zero_copy_only=False), np.int64) + RECORD_OVERHEAD
