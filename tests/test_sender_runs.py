"""The sender writes the buffers sealed while it was busy together: per partition one object with a batch per
buffer, one change notice, every record's future at its own offset; a buffer that cannot be built fails alone."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from pyspark_logsource import LogStore, Producer
from segment_format.errors import InvalidRecordError
from segment_format.root import LogRoot


class HeldFirstCreate:
    """Holds the sender's first object create until released, so that buffers seal meanwhile; counts creates
    of partition objects and notice writes."""

    def __init__(self, producer: Producer, monkeypatch: pytest.MonkeyPatch) -> None:
        store = producer.root.data_store
        self.creates: list[str] = []
        self.notices = 0
        self.started = threading.Event()
        self.release = threading.Event()
        create, replace = store.put_if_absent_parts, store.replace

        def held(key: str, parts: Any, *, durable: bool = True) -> bool:
            if "/log/" in key:
                self.creates.append(key)
                if len(self.creates) == 1:
                    self.started.set()
                    assert self.release.wait(30)
            return create(key, parts, durable=durable)

        def counted(key: str, data: bytes) -> None:
            self.notices += "notice" in key
            replace(key, data)

        monkeypatch.setattr(store, "put_if_absent_parts", held)
        monkeypatch.setattr(store, "replace", counted)


def test_buffers_sealed_while_the_sender_writes_become_one_object_per_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = str(tmp_path / "root")
    LogStore(url).create_topic("t", 2)
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
    root = LogRoot(url)
    for metadata, value, i in zip(placed, values, range(80), strict=True):
        assert metadata.partition == i % 2
        batches, _ = root.partition("t", metadata.partition).read(metadata.offset, max_records=1)
        assert batches[0].column("value").to_pylist() == [value]
    assert [root.partition("t", p).view().end_offset for p in (0, 1)] == [40, 40]


def test_a_buffer_that_cannot_be_built_fails_alone_in_its_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = str(tmp_path / "root")
    LogStore(url).create_topic("ev", 1, value_schema="n int")
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
