"""Reads that decode ahead (``PartitionLog.read(..., decode_ahead=True)``, what a consumer's fetcher asks):
the batches that follow a read, in bytes already read, decode on the pool while the caller works.

They must change nothing but the time: every read returns exactly what a read without them returns, each
batch is decoded once, damage is still corruption, and batches decoded for other fields, or in another
process, are never taken.
"""

from __future__ import annotations

import os
import random
import uuid
from concurrent.futures import Future
from pathlib import Path

import pyarrow as pa
import pytest

from segment_format.log.partition_log import PartitionLog
from segment_format.records import payload_batch
from segment_format.segment import BatchMeta
from segment_format.segment import reader as segment
from segment_format.stores import MemoryStore
from segment_format.topic import validate_config

PREFIX = "topics/t/id/0/"


def filled_log(objects: int = 4, batches: int = 6, per_batch: int = 50) -> tuple[MemoryStore, PartitionLog]:
    """A partition of ``objects`` appended objects of ``batches`` lz4 batches of ``per_batch`` records."""
    store = MemoryStore(f"ahead-{uuid.uuid4().hex}")
    log = PartitionLog(store, PREFIX, validate_config({"compression.type": "lz4"}))
    offset = 0
    for _ in range(objects):
        parts = []
        for _ in range(batches):
            values = [b"value-%08d-" % (offset + i) + b"x" * 40 for i in range(per_batch)]
            parts.append(
                (payload_batch([1_000 + offset + i for i in range(per_batch)], [None] * per_batch, values), BatchMeta())
            )
            offset += per_batch
        log.append(parts)
    return store, log


def reader_of(store: MemoryStore) -> PartitionLog:
    """A new reader of the partition (nothing cached)."""
    return PartitionLog(store, PREFIX, validate_config({"compression.type": "lz4"}))


def values_of(batches: list[pa.RecordBatch]) -> list[bytes]:
    return [v for b in batches for v in b.column("value").to_pylist()]


def test_reads_decoding_ahead_return_what_reads_without_return() -> None:
    """Polls on, seeks back and forward, limits by records and bytes: each read returns the same batches'
    records and next offset with and without decoding ahead."""
    store, log = filled_log()
    end = log.view().end_offset
    ahead, plain = reader_of(store), reader_of(store)
    rng = random.Random(7)
    offset = 0
    for _ in range(300):
        if rng.random() < 0.15 or offset >= end:
            offset = rng.randrange(end)  # a seek, forward or back
        max_records = rng.choice([None, 1, 7, 50, 120, 400])
        max_bytes = rng.choice([None, 1, 3_000, 20_000])
        got, next_got = ahead.read(offset, max_records, max_bytes, decode_ahead=True)
        want, next_want = plain.read(offset, max_records, max_bytes)
        assert (values_of(got), next_got) == (values_of(want), next_want), (offset, max_records, max_bytes)
        offset = next_got


def test_each_batch_is_decoded_once_and_most_are_decoded_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer reading on decodes every batch once: the batches started ahead are taken, not decoded again."""
    decoded: list[int] = []
    started_ahead: list[int] = []
    real_decode, real_ahead = segment.decode_batch, segment.decode_range_ahead

    def counting_decode(index: segment.SegmentIndex, i: int, *args: object) -> pa.RecordBatch:
        decoded.append(int(index.base_offsets[i]))
        return real_decode(index, i, *args)  # type: ignore[arg-type]

    def counting_ahead(index: segment.SegmentIndex, first: int, *args: object) -> dict[int, Future[pa.RecordBatch]]:
        futures = real_ahead(index, first, *args)  # type: ignore[arg-type]
        started_ahead.extend(int(index.base_offsets[i]) for i in futures)
        return futures

    monkeypatch.setattr(segment, "decode_batch", counting_decode)
    monkeypatch.setattr("segment_format.log.reader.decode_range_ahead", counting_ahead)
    store, log = filled_log()
    reader = reader_of(store)
    offset, records = 0, []
    while True:
        batches, offset = reader.read(offset, max_bytes=1, decode_ahead=True)  # one batch per read
        if not batches:
            break
        records += values_of(batches)
    by_this_reader = list(decoded)
    assert records == values_of(log.read(0)[0]) and len(records) == 4 * 6 * 50
    assert sorted(by_this_reader) == sorted(set(by_this_reader)) and len(by_this_reader) == 4 * 6  # once each
    assert len(started_ahead) >= 4 * 4, started_ahead  # all but the first of each object's (read whole) batches
    assert len(set(started_ahead)) == len(started_ahead)


@pytest.mark.parametrize("batch_number", [1, 3, 5])
def test_damage_in_a_batch_decoded_ahead_is_corruption_when_reached(batch_number: int) -> None:
    """A damaged batch decoded ahead fails the read that reaches it, with the object's key, and only that
    read: the reads before it return their records; a new reader fails there again."""
    from segment_format.errors import CorruptRecordError

    store, log = filled_log(objects=1, batches=6)
    log.append([(payload_batch([1], [None], [b"tail"]), BatchMeta())])
    ref = log.view().segments[0]
    idx = log.index(ref)
    data = bytearray(store.get(ref.key))
    data[int(idx.positions[batch_number]) + int(idx.lengths[batch_number]) - 3] ^= 0xFF
    store.delete(ref.key)
    store.put_if_absent(ref.key, bytes(data))
    for _attempt in range(2):
        reader = reader_of(store)
        offset = 0
        with pytest.raises(CorruptRecordError) as info:
            while True:
                batches, offset = reader.read(offset, max_bytes=1, decode_ahead=True)
                assert batches
        assert info.value.key == ref.key
        assert offset == batch_number * 50  # every batch before the damaged one was returned


def test_batches_decoded_for_other_fields_or_in_another_process_are_not_taken() -> None:
    """Kept futures name their object, fields and process: a read that differs decodes afresh. Futures of
    other fields are cancelled; those of another process (a forked child's view of its parent's) are only
    forgotten: the child has none of the threads that would finish them."""
    store, log = filled_log(objects=1, batches=6)
    reader = reader_of(store)
    batches, offset = reader.read(0, max_bytes=1, decode_ahead=True)
    key = log.view().segments[0].key
    expected = values_of(log.read(offset, max_bytes=1)[0])
    wrong = payload_batch([1] * 50, [None] * 50, [b"wrong"] * 50)
    for pid, fields in ((os.getpid() + 1, None), (os.getpid(), ("not", "these"))):
        taken: Future[pa.RecordBatch] = Future()
        taken.set_result(wrong)  # what a read taking it would return
        pending: Future[pa.RecordBatch] = Future()  # a batch this read does not need, still decoding
        reader.reader._ahead = (pid, key, fields, {1: taken, 5: pending})
        got, _ = reader.read(offset, max_bytes=1, decode_ahead=True)
        assert values_of(got) == expected
        assert pending.cancelled() is (pid == os.getpid())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_reads_on_while_a_parent_thread_holds_a_future_decoding_ahead() -> None:
    """A real fork while a thread of the parent holds the lock of a future decoding ahead (as a pool
    worker does while it finishes one): the child's next read must neither wait for nor cancel it (the
    lock stays held in the child forever). The child is killed if it has not finished in 20 s."""
    import signal
    import threading
    import time

    store, log = filled_log(objects=1, batches=6)
    reader = reader_of(store)
    _batches, offset = reader.read(0, max_bytes=1, decode_ahead=True)
    expected = values_of(log.read(offset, max_bytes=1)[0])
    ahead = reader.reader._ahead
    assert ahead is not None
    held: Future[pa.RecordBatch] = Future()
    ahead[3][max(ahead[3]) + 1] = held
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        with held._condition:  # type: ignore[attr-defined]
            locked.set()
            release.wait()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    locked.wait()
    child = os.fork()
    if child == 0:  # the child: read on, report by exit status
        try:
            got, _ = reader.read(offset, max_bytes=1, decode_ahead=True)
            os._exit(0 if values_of(got) == expected else 1)
        except BaseException:  # noqa: BLE001 - any failure is the test's
            os._exit(2)
    release.set()
    holder.join()
    deadline = time.monotonic() + 20
    while True:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            pytest.fail("the forked child hung on its parent's future")
        time.sleep(0.05)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


@pytest.mark.parametrize(
    ("fetch_max_bytes", "decodes_ahead"),
    [(4 * 2 * 4096, True), (4 * 2 * 4096 - 1, False)],  # 4 partitions x 2 reads x 4 KiB per partition
)
def test_a_consumer_decodes_ahead_only_while_it_fits_in_fetch_max_bytes(
    tmp_path: Path, fetch_max_bytes: int, decodes_ahead: bool
) -> None:
    """Decoded-ahead bytes are bounded as Kafka bounds fetched data: two reads of every assigned partition
    must fit in ``fetch_max_bytes``, else reads decode nothing ahead (and still return every record)."""
    from pyspark_logsource import Consumer, LogStore, Producer, TopicPartition

    url = str(tmp_path)
    LogStore(url).create_topic("bounded", 4, {"compression.type": "none"})
    rows = 2_000
    with Producer(url, batch_size=2_048) as producer:  # stored batches of about 2 KiB, many per object
        values = pa.array([b"%06d" % i + b"v" * 100 for i in range(rows)])
        producer.send_batch(
            "bounded", pa.table({"value": values, "partition": pa.array([i % 4 for i in range(rows)], pa.int32())})
        )
    tps = [TopicPartition("bounded", p) for p in range(4)]
    with Consumer(
        url, auto_offset_reset="earliest", max_partition_fetch_bytes=4096, fetch_max_bytes=fetch_max_bytes
    ) as consumer:
        consumer.assign(tps)
        seen = consumer.poll_arrow(timeout_ms=5_000).num_rows
        ahead = [consumer._fetcher.log(tp).reader._ahead for tp in tps]
        assert any(a is not None and a[3] for a in ahead) is decodes_ahead, ahead
        while seen < rows:
            seen += consumer.poll_arrow(timeout_ms=5_000).num_rows
    assert seen == rows


@pytest.mark.parametrize("decode_ahead", [False, True])
def test_reads_stopping_inside_a_batch_decode_it_once(monkeypatch: pytest.MonkeyPatch, decode_ahead: bool) -> None:
    """A consumer polling fewer records than a batch holds continues in the batch the last read stopped in
    (the reader keeps it decoded): each batch is verified and decoded once, not once per poll."""
    decoded: list[int] = []
    real_decode = segment.decode_batch

    def counting_decode(index: segment.SegmentIndex, i: int, *args: object) -> pa.RecordBatch:
        decoded.append(int(index.base_offsets[i]))
        return real_decode(index, i, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(segment, "decode_batch", counting_decode)
    store, _log = filled_log(objects=2, batches=4, per_batch=50)
    reader = reader_of(store)
    offset, values = 0, []
    while True:
        batches, offset = reader.read(offset, max_records=7, decode_ahead=decode_ahead)  # 7 of a batch's 50
        if not batches:
            break
        values += values_of(batches)
    assert values == [b"value-%08d-" % i + b"x" * 40 for i in range(2 * 4 * 50)]
    assert sorted(decoded) == sorted(set(decoded)) and len(decoded) == 2 * 4, decoded
