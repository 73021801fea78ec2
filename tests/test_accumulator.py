"""The producer's accumulator and sender: ``flush`` waits for every record sent before it.

Including the buffer the sender thread is writing at that moment: before this was fixed,
``flush`` collected only open and sealed buffers, so it could return while the last append
was still running, and ``commit_transaction`` (which flushes, then lists the transaction's
appended ranges in its decision) could decide without that append: its records then stayed
invisible to read_committed readers although their consumer offsets were committed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_logsource import Consumer, LogStore, Producer, TopicPartition
from segment_format.log.partition_log import PartitionLog

#: Partitioned topics: the sender's per-partition appends, held at their object's create.
PARTITIONED = {"storage.layout": "partitioned"}


@pytest.fixture
def url(tmp_path: Path) -> str:
    root = str(tmp_path / "plog")
    with LogStore(root) as store:
        store.create_topic("t", 1, PARTITIONED)
    return root


@pytest.fixture
def held_append(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, threading.Event]]:
    """(entered, release): the first appends block until ``release`` is set; ``entered`` tells one started."""
    entered, release = threading.Event(), threading.Event()
    real = PartitionLog.append

    def held(self: PartitionLog, *args: Any, **kwargs: Any) -> Any:
        entered.set()
        assert release.wait(60)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(PartitionLog, "append", held)
    yield entered, release
    release.set()


def in_thread(call: Any) -> tuple[threading.Thread, threading.Event, list[BaseException]]:
    finished, errors = threading.Event(), []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # surfaced by the test
            errors.append(exc)
        finished.set()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, finished, errors


def test_flush_waits_for_the_buffer_being_written(
    url: str, held_append: tuple[threading.Event, threading.Event]
) -> None:
    entered, release = held_append
    with Producer(url, linger_ms=0) as producer:
        future = producer.send("t", value=b"x")
        assert entered.wait(30)  # the sender has taken the buffer and is appending it
        assert producer.metrics()["plog-buffers-in-flight"] == 1
        thread, finished, errors = in_thread(producer.flush)
        assert not finished.wait(0.3)  # flush waits for the append in progress
        release.set()
        assert finished.wait(30) and not errors
        thread.join()
        assert future.is_done() and future.get(0).offset == 0


def test_commit_transaction_includes_the_append_in_progress(
    url: str, held_append: tuple[threading.Event, threading.Event]
) -> None:
    entered, release = held_append
    producer = Producer(url, transactional_id="tx", linger_ms=0)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("t", value=b"in the transaction")
    assert entered.wait(30)
    thread, finished, errors = in_thread(producer.commit_transaction)
    assert not finished.wait(0.3)
    release.set()
    assert finished.wait(30) and not errors
    thread.join()
    producer.close()
    with Consumer(url, isolation_level="read_committed", auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("t", 0)])
        assert consumer.read_to_end().column("value").to_pylist() == [b"in the transaction"]


def test_after_a_flush_new_buffers_linger_again() -> None:
    """A flush seals the buffers open at that moment, not every buffer after it (more, smaller objects)."""
    from pyspark_logsource.client.accumulator import RecordAccumulator

    accumulator = RecordAccumulator(batch_size=1 << 20, buffer_memory=1 << 26, max_block_ms=1000, linger_ms=60_000)
    first, _ = accumulator.append("t", b"v", None, 0, None, None)
    assert first in accumulator.request_flush()
    assert accumulator.take_sealed() == [first]  # sealed at once: the flush asked for it
    accumulator.completed([first])
    later, _ = accumulator.append("t", b"w", None, 0, None, None)
    taken: list[Any] = []
    sender = threading.Thread(target=lambda: taken.append(accumulator.take_sealed()), daemon=True)
    sender.start()
    sender.join(0.5)
    assert sender.is_alive() and not taken  # lingering (60 s): before the fix it was sealed at once
    accumulator.close()
    sender.join(10)
    assert taken == [[later]]


def test_sealed_buffers_wait_for_the_flush_interval_unless_someone_waits() -> None:
    """Group commit (``flush_interval_ms``): after a flush began, buffers sealed later wait until the interval
    has passed, so that a stream's flushes carry more; a caller waiting on one of them, and ``flush``, end the
    wait at once."""
    from pyspark_logsource.client.accumulator import RecordAccumulator

    accumulator = RecordAccumulator(
        batch_size=1 << 20, buffer_memory=1 << 26, max_block_ms=1000, linger_ms=0, flush_interval_ms=60_000
    )
    first, _ = accumulator.append("t", b"v", None, 0, None, None)
    assert accumulator.take_sealed() == [first]  # no flush before it: taken at once
    accumulator.completed([first])

    def take_in_thread() -> tuple[threading.Thread, list[Any]]:
        taken: list[Any] = []
        sender = threading.Thread(target=lambda: taken.append(accumulator.take_sealed()), daemon=True)
        sender.start()
        return sender, taken

    second, _ = accumulator.append("t", b"w", None, 0, None, None)
    sender, taken = take_in_thread()
    sender.join(0.5)
    assert sender.is_alive() and not taken  # sealed (linger 0), held for the interval (60 s)
    third, _ = accumulator.append("u", b"x", None, 0, None, None)
    accumulator.hurry(third)  # a caller waits on the third: it goes now, with everything held
    sender.join(10)
    assert not sender.is_alive() and sorted(map(id, taken[0])) == sorted(map(id, [second, third]))
    accumulator.completed(taken[0])

    fourth, _ = accumulator.append("t", b"y", None, 0, None, None)
    sender, taken = take_in_thread()
    sender.join(0.5)
    assert sender.is_alive() and not taken
    accumulator.request_flush()  # flush() does not wait for the interval either
    sender.join(10)
    assert taken == [[fourth]]


def test_a_producer_on_an_object_store_gathers_a_stream_into_fewer_flushes(tmp_path: Path) -> None:
    """The default flush interval follows the store: none on a local root, half a second where each request is
    billed; ``send(...).get()`` is not held by it."""
    from segment_format.stores import open_store

    url = str(tmp_path / "plog")
    LogStore(url).create_topic("s", 4)
    with Producer(url) as producer:
        assert producer._accumulator.flush_interval == 0  # noqa: SLF001 - the default chosen
    with Producer(url, flush_interval_ms=60_000) as producer:  # as on an object store, only longer
        producer.send("s", b"first").get(timeout=30)
        producer.send("s", b"second").get(timeout=30)  # waited on: not held for 60 s
        futures = [producer.send("s", b"%d" % i) for i in range(100)]  # a stream nobody waits on ...
        time.sleep(0.3)
        assert not any(f.is_done() for f in futures)  # ... waits for the interval
        producer.flush()
        assert all(f.succeeded() for f in futures)
    assert open_store(url).billed_per_request is False
    with pytest.raises(Exception, match="flush_interval_ms"):
        Producer(url, flush_interval_ms=-1)


def test_sparse_record_options_land_on_their_own_records(tmp_path: Path) -> None:
    """Headers, explicit partitions and timestamps are kept sparsely per buffer: each must reach
    exactly the record it was given with, in one buffer mixed with records that have none."""
    store = LogStore(str(tmp_path))
    store.create_topic("mixed", config=PARTITIONED, partitions=3)
    expected: dict[bytes, tuple[int | None, int | None, list[tuple[str, bytes]] | None]] = {}
    with Producer(str(tmp_path), linger_ms=60_000) as producer:
        futures = []
        for i in range(300):
            partition = i % 3 if i % 7 == 0 else None
            timestamp = 1_000_000 + i if i % 5 == 0 else None
            headers = [("h", str(i).encode())] if i % 11 == 0 else None
            value = b"v%d" % i
            expected[value] = (partition, timestamp, headers)
            futures.append(
                producer.send(
                    "mixed", value, key=b"k%d" % i, partition=partition, timestamp_ms=timestamp, headers=headers
                )
            )
        producer.flush()
        metadata = [f.get(5) for f in futures]
    for i, md in enumerate(metadata):
        partition, timestamp, _ = expected[b"v%d" % i]
        if partition is not None:
            assert md.partition == partition
        if timestamp is not None:
            assert md.timestamp == timestamp
        else:
            assert md.timestamp > 1_600_000_000_000  # the send time, in ms
    with Consumer(str(tmp_path), auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("mixed", p) for p in range(3)])
        seen = {}
        while len(seen) < 300:
            for records in consumer.poll(timeout_ms=2_000).values():
                for record in records:
                    seen[record.value] = record
    for value, (partition, timestamp, headers) in expected.items():
        record = seen[value]
        if partition is not None:
            assert record.partition == partition
        if timestamp is not None:
            assert record.timestamp == timestamp
        assert (record.headers or None) == (headers or None), value


def test_send_blocks_for_buffer_memory_then_times_out(
    url: str, held_append: tuple[threading.Event, threading.Event]
) -> None:
    """buffer_memory is checked when a buffer opens, as Kafka checks it per batch: while written-out
    buffers still hold more than it, a send that needs a new buffer waits up to max_block_ms."""
    from segment_format.errors import KafkaTimeoutError

    entered, release = held_append
    with Producer(url, linger_ms=60_000, batch_size=2_000, buffer_memory=3_000, max_block_ms=300) as producer:
        futures = [producer.send("t", value=b"x" * 500) for _ in range(4)]  # fills and seals the first buffer
        assert entered.wait(30)  # the sender holds it, appending
        futures += [producer.send("t", value=b"y" * 500) for _ in range(4)]  # a second buffer, sealed too
        started = time.monotonic()
        with pytest.raises(KafkaTimeoutError, match="buffer_memory"):
            producer.send("t", value=b"z" * 500)  # would open a third: over buffer_memory
        assert time.monotonic() - started >= 0.25
        release.set()
        producer.flush()
        assert [f.get(5).offset for f in futures] == list(range(8))
        after = producer.send("t", value=b"after")  # room again once written
        producer.flush()
        assert after.get(5).offset == 8


def test_send_after_close_is_refused() -> None:
    import tempfile

    from segment_format.errors import ProducerClosedError

    root = tempfile.mkdtemp()
    LogStore(root).create_topic("t", 1, PARTITIONED)
    producer = Producer(root)
    producer.send("t", b"before").get(5)
    producer.close()
    with pytest.raises(ProducerClosedError):
        producer.send("t", b"after")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(0, 3), st.integers(250, 1000)), min_size=1, max_size=40))
def test_explicit_partitions_are_noted_per_record_only_once_they_differ(partitions: list[int | None]) -> None:
    """Whatever the mix of records with and without a partition, every record keeps its own (-1: none)."""
    from pyspark_logsource.client.accumulator import MIXED, Buffer

    buffer = Buffer("t")
    for index, partition in enumerate(partitions):
        fresh = None if partition is None else int(str(partition))  # a new int object, as a caller's may be
        buffer.values.append(b"v")
        buffer.note_partition(index, fresh)
    given = buffer.given_partitions()
    if all(p is None for p in partitions):
        assert given is None
    else:
        assert given is not None and given.tolist() == [-1 if p is None else p for p in partitions]
    if len(set(partitions)) == 1:
        assert buffer.partitions == {} and buffer.sole_partition is not MIXED  # nothing noted per record


def test_runs_of_sends_to_one_partition_then_others_land_where_they_were_sent(tmp_path: Path) -> None:
    store = LogStore(str(tmp_path))
    store.create_topic("runs", config=PARTITIONED, partitions=3)
    pattern = [2] * 50 + [None] * 3 + [2] * 20 + [1] * 10 + [0] * 5 + [None] * 4
    with Producer(str(tmp_path), linger_ms=60_000) as producer:
        futures = [producer.send("runs", b"v%d" % i, key=b"k", partition=p) for i, p in enumerate(pattern)]
        producer.flush()
        placed = [f.get(5) for f in futures]
    keyed = placed[50].partition  # records without a partition go where their key hashes
    assert [md.partition for md in placed] == [keyed if p is None else p for p in pattern]
