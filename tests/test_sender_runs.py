"""The sender writes the buffers sealed while it was busy together: per partition one object with a batch per
buffer, one change notice, every record's future at its own offset; a buffer that cannot be built fails alone."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from pyspark_logsource import LogStore, Producer
from pyspark_logsource.client.sender import Sender
from segment_format.errors import InvalidConfigError, InvalidRecordError, StorageError
from segment_format.layout import ROOT_NOTICE_KEY
from segment_format.root import LogRoot

#: Partitioned topics: the sender's per-partition appends, held at their object's create.
PARTITIONED = {"storage.layout": "partitioned"}


class HeldFirstCreate:
    """Holds the sender's first object create until released, so that buffers seal meanwhile; counts creates
    of partition objects and notice writes."""

    def __init__(
        self, producer: Producer, monkeypatch: pytest.MonkeyPatch, failing_partition: int | None = None
    ) -> None:
        store = producer.root.data_store
        self.creates: list[str] = []
        self.notices = 0
        #: Root notices written (PROTOCOL.md 9.1): one after each write's topic notice.
        self.root_notices = 0
        self.started = threading.Event()
        self.release = threading.Event()
        create, replace = store.put_if_absent_parts, store.replace

        def held(key: str, parts: Any, *, durable: bool = True) -> bool:
            if "/log/" in key:
                self.creates.append(key)
                if len(self.creates) == 1:
                    self.started.set()
                    assert self.release.wait(30)
                elif f"/{failing_partition}/log/" in key:
                    raise StorageError(f"creating {key} failed for good")
            return create(key, parts, durable=durable)

        def counted(key: str, data: bytes) -> None:
            self.notices += key.endswith("/notice.json")
            self.root_notices += key == ROOT_NOTICE_KEY
            replace(key, data)

        monkeypatch.setattr(store, "put_if_absent_parts", held)
        monkeypatch.setattr(store, "replace", counted)


def test_buffers_sealed_while_the_sender_writes_become_one_object_per_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = str(tmp_path / "root")
    LogStore(url).create_topic("t", 2, PARTITIONED)
    with Producer(url, batch_size=1_000, linger_ms=60_000, acks=1) as producer:
        hold = HeldFirstCreate(producer, monkeypatch)
        values = [b"%03d-" % i + b"x" * 96 for i in range(80)]
        futures = [producer.send("t", values[i], partition=i % 2) for i in range(9)]  # seals the first buffer
        assert hold.started.wait(30)
        futures += [producer.send("t", values[i], partition=i % 2) for i in range(9, 80)]  # seals 7 more
        flushed = threading.Thread(target=producer.flush)
        flushed.start()  # seals the last one; the sender takes them all once the first write ends
        hold.release.set()
        flushed.join(30)
        placed = [f.get(timeout=30) for f in futures]
    # The first buffer: one object per partition. Everything sealed meanwhile: one more per partition.
    assert len(hold.creates) == 4, hold.creates
    assert hold.notices == 2  # the first buffer's, then one for the whole run
    assert hold.root_notices == 2  # after each of them
    root = LogRoot(url)
    for metadata, value, i in zip(placed, values, range(80), strict=True):
        assert metadata.partition == i % 2
        batches, _ = root.partition("t", metadata.partition).read(metadata.offset, max_records=1)
        assert batches[0].column("value").to_pylist() == [value]
    assert [root.partition("t", p).view().end_offset for p in (0, 1)] == [40, 40]


def test_a_buffer_that_cannot_be_built_fails_alone_in_its_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = str(tmp_path / "root")
    LogStore(url).create_topic("ev", 1, PARTITIONED, value_schema="n int")
    with Producer(url, batch_size=200, linger_ms=60_000, acks=1) as producer:
        hold = HeldFirstCreate(producer, monkeypatch)
        first = producer.send("ev", {"n": 0}, key=b"k" * 300)  # one record is a buffer: sealed at once
        assert hold.started.wait(30)
        good = producer.send("ev", {"n": 1}, key=b"k" * 300)
        bad = producer.send("ev", {"n": 2**40}, key=b"k" * 300)  # an int, but not an int32: the sender finds out
        later = producer.send("ev", {"n": 3}, key=b"k" * 300)
        flushed = threading.Thread(target=producer.flush)
        flushed.start()
        hold.release.set()
        flushed.join(30)
        assert [f.get(timeout=30).offset for f in (first, good, later)] == [0, 1, 2]
        with pytest.raises(InvalidRecordError, match="field 'n'.*int32"):
            bad.get(timeout=30)
    assert len(hold.creates) == 2  # the first buffer, then the two good ones of the run together


def test_in_a_run_only_the_buffers_an_append_failed_to_write_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Buffer A goes to partition 0, buffer B to partition 1, written in one run; partition 1's create
    fails for good. A's records are stored and announced: its futures report their offsets (failing them
    would make a caller send them again, as duplicates). B's futures fail."""
    url = str(tmp_path / "root")
    LogStore(url).create_topic("t", 2, PARTITIONED)
    # 9 records of 103 + 24 bytes fill a buffer exactly: A's and B's records are buffers of their own.
    with Producer(url, batch_size=9 * 127, linger_ms=60_000, acks="all") as producer:
        hold = HeldFirstCreate(producer, monkeypatch, failing_partition=1)
        first = producer.send("t", b"x" * 1_200, partition=0)  # a buffer of its own; its create is held
        assert hold.started.wait(30)
        a = [producer.send("t", b"a%02d" % i + b"x" * 100, partition=0) for i in range(9)]
        b = [producer.send("t", b"b%02d" % i + b"x" * 100, partition=1) for i in range(9)]
        flushed = threading.Thread(target=producer.flush)
        flushed.start()
        hold.release.set()
        flushed.join(30)
        assert first.get(timeout=30).offset == 0
        assert [f.get(timeout=30).offset for f in a] == list(range(1, 10))
        for future in b:
            with pytest.raises(StorageError, match="failed for good"):
                future.get(timeout=30)
    assert hold.notices == 2  # the first buffer's, and the run's for partition 0
    batches, _ = LogRoot(url).partition("t", 0).read(1, max_records=100)
    assert [v[:3] for batch in batches for v in batch.column("value").to_pylist()] == [b"a%02d" % i for i in range(9)]


def test_a_transaction_with_a_record_that_could_not_be_built_cannot_commit(tmp_path: Path) -> None:
    url = str(tmp_path / "root")
    LogStore(url).create_topic("ev", 1, PARTITIONED, value_schema="n int")
    with Producer(url, transactional_id="tx") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("ev", {"n": 1})
        bad = producer.send("ev", {"n": 2**40})  # an int, but not an int32: found when the buffer is built
        with pytest.raises(InvalidConfigError, match="a send in this transaction failed.*call abort_transaction"):
            producer.commit_transaction()
        with pytest.raises(InvalidRecordError):
            bad.get(timeout=30)
        producer.abort_transaction()


def test_a_buffer_is_built_and_routed_by_the_thread_that_seals_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The send that fills a buffer builds and routes it before it returns, so that the sender needs the
    GIL only to encode and write (benchmarks/profile_send.py); a buffer sealed by flush is built by the
    sender. Every record lands where it was sent, at its future's offset."""
    url = str(tmp_path / "root")
    LogStore(url).create_topic("t", 2, PARTITIONED)
    builders: list[str] = []
    routed = Sender._routed

    def recorded(self: Sender, buffer: Any, meta: Any) -> Any:
        builders.append(threading.current_thread().name)
        return routed(self, buffer, meta)

    monkeypatch.setattr(Sender, "_routed", recorded)
    # 9 records of 103 + 24 bytes fill a buffer exactly: the 9th send seals it.
    with Producer(url, batch_size=9 * 127, linger_ms=60_000, acks=1) as producer:
        futures = [producer.send("t", b"%03d" % i + b"x" * 100, partition=1) for i in range(9)]
        assert builders == [threading.current_thread().name]
        futures += [producer.send("t", b"%03d" % i + b"x" * 100, partition=1) for i in range(9, 12)]
        producer.flush()
        assert builders == [threading.current_thread().name, "plog-producer-sender"]
        assert [(f.get(timeout=30).partition, f.get(timeout=30).offset) for f in futures] == [(1, i) for i in range(12)]
        assert all(f[0].routed is None for f in futures)  # a future keeps its buffer, not the buffer's Arrow copy
    batches, _ = LogRoot(url).partition("t", 1).read(0, max_records=100)
    assert [v[:3] for batch in batches for v in batch.column("value").to_pylist()] == [b"%03d" % i for i in range(12)]


def test_a_send_interrupted_while_it_builds_the_buffer_it_sealed_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A KeyboardInterrupt in the send that seals a buffer, while it builds it: the buffer is sealed already,
    and the sender builds and writes it; the records sent before, and the interrupted one, are written."""
    url = str(tmp_path / "root")
    LogStore(url).create_topic("t", 1, PARTITIONED)
    prepare = Sender.prepare
    interrupted: list[str] = []

    def interrupt_once(self: Sender, buffer: Any) -> None:
        if not interrupted:
            interrupted.append(threading.current_thread().name)
            raise KeyboardInterrupt
        prepare(self, buffer)

    monkeypatch.setattr(Sender, "prepare", interrupt_once)
    with Producer(url, batch_size=9 * 127, linger_ms=60_000, acks=1) as producer:
        futures = [producer.send("t", b"%03d" % i + b"x" * 100) for i in range(8)]
        with pytest.raises(KeyboardInterrupt):
            producer.send("t", b"008" + b"x" * 100)  # fills the buffer: sealed, then interrupted
        assert interrupted == [threading.current_thread().name]
        futures.append(producer.send("t", b"009" + b"x" * 100))
        producer.flush()
        assert [f.get(timeout=30).offset for f in futures] == [*range(8), 9]
    batches, _ = LogRoot(url).partition("t", 0).read(0, max_records=100)
    assert [v[:3] for batch in batches for v in batch.column("value").to_pylist()] == [b"%03d" % i for i in range(10)]


def test_a_future_is_equal_only_to_itself(tmp_path: Path) -> None:
    url = str(tmp_path / "root")
    LogStore(url).create_topic("t", 1, PARTITIONED)
    with Producer(url, acks=0) as producer:
        first, second = producer.send("t", b"a"), producer.send("t", b"b")
        assert first == first and first != second and first != (first[0], first[1])  # not a tuple's equality
        assert len({first, second, first}) == 2
        assert first.get(timeout=30).offset == -1  # acks=0: no offset reported, as Kafka
