"""What reading costs in requests, counted at a moto S3 server (issue #11), and that it stays as strict.

On S3 every request is billed, so a reader catching up on a backlog reads each
small object with one GET (index and batches together), probes the tail with
one request whether or not the next object exists, and reads a large merged
object in ranges of at least 8 MiB. The bytes it keeps between requests are
verified when decoded, exactly as bytes just read: damage anywhere is still
:class:`CorruptRecordError`, never records.
"""

from __future__ import annotations

import math
import uuid
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from segment_format.errors import CorruptRecordError
from segment_format.log.partition_log import PartitionLog
from segment_format.records import payload_batch
from segment_format.segment import READ_AHEAD, WHOLE_READ, BatchMeta
from segment_format.stores import MemoryStore, open_store
from segment_format.stores.base import Store
from segment_format.topic import validate_config
from tests.fixtures_s3 import REQUESTS

PREFIX = "topics/t/id/0/"
VALUE = 210


def payload(n: int, seed: int) -> pa.RecordBatch:
    """``n`` records of random, incompressible ``VALUE``-byte values."""
    rng = np.random.default_rng(seed)
    values = [rng.bytes(VALUE) for _ in range(n)]
    return payload_batch([1_000 + i for i in range(n)], [None] * n, values)


def append(log: PartitionLog, n: int, seed: int, batch: int | None = None) -> None:
    """Append ``n`` records as one object, in batches of ``batch`` records (one batch by default)."""
    batch = batch or n
    log.append([(payload(min(batch, n - lo), seed * 100_003 + lo), BatchMeta()) for lo in range(0, n, batch)])


def read_all(log: PartitionLog, max_records: int = 500) -> int:
    """Read the whole partition from offset 0, ``max_records`` at a time (a consumer's polls); the records read."""
    offset, total = 0, 0
    while True:
        batches, offset = log.read(offset, max_records=max_records)
        if not batches:
            return total
        total += sum(b.num_rows for b in batches)


def spent(bucket: str, before: Counter[str]) -> Counter[str]:
    """Requests made on ``bucket`` since ``before``."""
    return REQUESTS.of(bucket) - before


@pytest.fixture
def s3_store(s3_url: tuple[str, dict[str, Any]]) -> tuple[Store, str]:
    """A store on a fresh moto bucket, and the bucket's name."""
    url, options = s3_url
    return open_store(url, options), url.split("/")[2]


def fresh_log(store: Store, **config: Any) -> PartitionLog:
    """A partition log with nothing cached (a new consumer process)."""
    return PartitionLog(store, PREFIX, validate_config({"compression.type": "none", **config}), name="t-0")


def test_a_backlog_of_small_objects_costs_one_get_per_object(s3_store: tuple[Store, str]) -> None:
    store, bucket = s3_store
    writer = fresh_log(store)
    objects, per_object = 40, 120
    for i in range(objects):
        append(writer, per_object, i)
    reader = fresh_log(store)
    before = REQUESTS.of(bucket)
    assert read_all(reader) == objects * per_object
    cost = spent(bucket, before)
    # One GET per object (index and batches together), one listing, the tail probe that finds nothing.
    assert cost["GET"] + cost["HEAD"] <= objects + 2, cost
    assert cost["LIST"] <= 1, cost


def test_following_the_tail_costs_one_request_per_object_and_one_when_idle(s3_store: tuple[Store, str]) -> None:
    store, bucket = s3_store
    writer = fresh_log(store)
    append(writer, 10, 0)
    reader = fresh_log(store)
    assert read_all(reader) == 10
    before = REQUESTS.of(bucket)
    assert reader.read(10) == ([], 10)
    assert sum(spent(bucket, before).values()) == 1  # the probe of an absent object: one request
    for i in range(5):
        append(writer, 10, 1 + i)
    before = REQUESTS.of(bucket)
    offset, total = 10, 0
    while True:
        batches, offset = reader.read(offset, max_records=500)
        if not batches:
            break
        total += sum(b.num_rows for b in batches)
    assert total == 50
    cost = spent(bucket, before)
    # Each probe that finds an object reads it whole (one GET); the probes of the last two reads find nothing.
    assert sum(cost.values()) == 5 + 2, cost


def test_a_merged_segment_costs_one_get_per_read_ahead(s3_store: tuple[Store, str]) -> None:
    store, bucket = s3_store
    per_object = (1024 * 1024) // VALUE  # about 1 MiB per appended object, in 64 KiB batches
    objects = 13
    writer = fresh_log(store, **{"segment.bytes": 12 * per_object * VALUE})
    for i in range(objects):
        append(writer, per_object, i, batch=300)
    assert writer.merge_segments() == 1
    view = writer.view()
    merged = view.segments[0]
    assert merged.generation >= 1 and merged.size > WHOLE_READ
    reader = fresh_log(store)
    before = REQUESTS.of(bucket)
    assert read_all(reader) == objects * per_object
    cost = spent(bucket, before)
    # The merged object: its index, then one GET per READ_AHEAD bytes; each appended object after it: one GET;
    # the tail probes of the last two reads (polls inside the known chain probe nothing); a listing.
    limit = math.ceil(merged.size / READ_AHEAD) + 1 + (len(view.segments) - 1) + 2
    assert cost["GET"] + cost["HEAD"] <= limit, (cost, limit)
    assert cost["LIST"] <= 1, cost


# --------------------------------------------------------------------------- still as strict


def damaged(store: MemoryStore, key: str, at: int) -> None:
    """Replace ``key`` with a copy whose byte ``at`` is flipped."""
    data = bytearray(store.get(key))
    data[at] ^= 0xFF
    store.delete(key)
    store.put_if_absent(key, bytes(data))


@pytest.mark.parametrize("which", ["first", "middle", "last"])
def test_damage_in_bytes_read_whole_or_ahead_is_corruption(which: str) -> None:
    """A batch read from kept bytes (whole object or read ahead) is verified like one just read."""
    store = MemoryStore(f"reads-{uuid.uuid4().hex}")
    writer = PartitionLog(store, PREFIX, validate_config({"compression.type": "none"}))
    append(writer, 600, 1, batch=100)  # six batches in one small object
    append(writer, 10, 2)
    key = writer.view().segments[0].key
    idx = writer.index(writer.view().segments[0])
    b = {"first": 0, "middle": 3, "last": 5}[which]
    damaged(store, key, int(idx.positions[b]) + int(idx.lengths[b]) - 3)
    for _attempt in range(2):  # kept bytes never turn a failed read into a good one
        reader = PartitionLog(store, PREFIX, validate_config({"compression.type": "none"}))
        offset = 0
        with pytest.raises(CorruptRecordError) as info:
            while offset < 610:
                _batches, offset = reader.read(offset, max_records=50)
        assert info.value.key == key
        assert offset <= b * 100


def test_a_truncated_range_read_ahead_is_corruption() -> None:
    """An object shorter than its index says is corruption: a small one is read whole, so at once."""
    store = MemoryStore(f"reads-{uuid.uuid4().hex}")
    writer = PartitionLog(store, PREFIX, validate_config({"compression.type": "none"}))
    append(writer, 600, 1, batch=100)
    append(writer, 10, 2)
    ref = writer.view().segments[0]
    idx = writer.index(ref)

    class Short(MemoryStore):
        """Serves the first object's ranges cut short after batch 2 (a store that lost bytes)."""

        def get_range(self, key: str, start: int, end: int) -> bytes:
            data = super().get_range(key, start, end)
            cut = int(idx.positions[3]) + 5
            return data[: max(0, cut - start)] if key == ref.key and end > cut else data

    short = Short(f"reads-{uuid.uuid4().hex}")
    for info in store.list(""):
        short.put_if_absent(info.key, store.get(info.key))
    reader = PartitionLog(short, PREFIX, validate_config({"compression.type": "none"}))
    offset = 0
    with pytest.raises(CorruptRecordError):
        while offset < 610:
            _batches, offset = reader.read(offset, max_records=50)


@pytest.mark.parametrize("layout", ["partitioned", "shared"])
def test_a_consumer_catching_up_in_byte_bounded_polls_costs_one_get_per_object(
    s3_url: tuple[str, dict[str, Any]], layout: str
) -> None:
    # poll_arrow is bounded by max_partition_fetch_bytes, so read_to_end takes many rounds per partition;
    # a round that cannot reach the end of the chain it knows must not probe the tail (PROTOCOL.md 9).
    from pyspark_logsource import Consumer, LogStore, Producer, TopicPartition

    url, options = s3_url
    bucket = url.split("/")[2]
    partitions, appends, per_append = 2, 12, 240
    with LogStore(url, storage_options=options) as admin:
        admin.create_topic("catchup", partitions, config={"compression.type": "none", "storage.layout": layout})
    with Producer(url, storage_options=options) as producer:
        for i in range(appends):
            for p in range(partitions):
                values = payload(per_append, i * partitions + p).column("value")
                producer.send_batch("catchup", pa.table({"value": values, "partition": [p] * per_append}))
    consumer = Consumer(
        url, storage_options=options, auto_offset_reset="earliest", max_partition_fetch_bytes=3 * per_append * VALUE
    )
    try:
        consumer.assign([TopicPartition("catchup", p) for p in range(partitions)])
        before = REQUESTS.of(bucket)
        table = consumer.read_to_end()
        cost = spent(bucket, before)
    finally:
        consumer.close()
    assert table.num_rows == partitions * appends * per_append
    objects = partitions * appends
    # One GET per object; per partition the probe when the position is first set and the one at the end;
    # the topic's metadata (two GETs); one listing per partition (end_offsets), none for the positions. A
    # shared topic's flushes (one partition each here) are an object and a commit: one GET more per flush.
    commits = objects if layout == "shared" else 0
    assert cost["GET"] + cost["HEAD"] <= objects + commits + 2 * partitions + 2, cost
    assert cost["LIST"] <= partitions + (layout == "shared"), cost  # and a shared topic's commits, once
