"""The typed optional fields of the segment JSON, and objects written before they were fields.

``append_id``, ``writer_epoch``, ``transaction_timeout_ms`` and
``schema_crc32c`` are top-level fields of the segment JSON (the index's
``plog.segment`` metadata). Writers before them put them in the ``extra``
object (the timeout as ``transaction.timeout.ms``); a reader takes the
top-level field and falls back to ``extra``, so such objects keep their
meaning: they fence, they are recognised as the earlier attempt of an append,
and their schema message is checked against their CRC.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from pyspark_logsource import LogStore, Producer
from segment_format.errors import ConcurrentAppendError, CorruptRecordError, FencedError
from segment_format.log.partition_log import PartitionLog
from segment_format.log.producer_state import ProducerStateManager
from segment_format.records import RECORD_SCHEMA, payload_batch
from segment_format.root import LogRoot
from segment_format.segment import (
    FORMAT_VERSION,
    LEGACY_EXTRA_FIELDS,
    MAGIC,
    TAIL,
    BatchMeta,
    SegmentMeta,
    crc32c,
    read_index,
)
from segment_format.stores import MemoryStore
from segment_format.topic import validate_config

CONFIG = validate_config({"writer.max.staleness.ms": 1})
FIELDS = ("append_id", "writer_epoch", "transaction_timeout_ms", "schema_crc32c")
SCHEMA_CRC = crc32c(RECORD_SCHEMA.serialize().to_pybytes())


def memory_store() -> MemoryStore:
    return MemoryStore(f"fields-{uuid.uuid4().hex}")


def payload(values: list[bytes]) -> pa.RecordBatch:
    return payload_batch([1_000] * len(values), [None] * len(values), values)


def segment_json(store: Any, key: str) -> dict[str, Any]:
    """The segment JSON of an object exactly as stored (no parsing by plog)."""
    data = store.get(key)
    index_position = TAIL.unpack(data[-TAIL.size :])[0]
    table = ipc.open_stream(data[index_position : len(data) - TAIL.size]).read_all()
    doc: dict[str, Any] = json.loads(table.schema.metadata[b"plog.segment"])
    return doc


def with_segment_json(data: bytes, change: Callable[[dict[str, Any]], None]) -> bytes:
    """The object ``data`` with ``change`` applied to its segment JSON, index CRC and tail made valid again."""
    index_position = TAIL.unpack(data[-TAIL.size :])[0]
    table = ipc.open_stream(data[index_position : len(data) - TAIL.size]).read_all()
    doc = json.loads(table.schema.metadata[b"plog.segment"])
    change(doc)
    table = table.replace_schema_metadata({"plog.segment": json.dumps(doc).encode()})
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    index_bytes = sink.getvalue().to_pybytes()
    return data[:index_position] + index_bytes + TAIL.pack(index_position, crc32c(index_bytes), FORMAT_VERSION, MAGIC)


def the_old_way(doc: dict[str, Any]) -> None:
    """Move the typed fields into ``extra`` under the keys writers before them used."""
    for name, (legacy_key, _kind) in LEGACY_EXTRA_FIELDS.items():
        if name in doc:
            doc["extra"][legacy_key] = doc.pop(name)


def test_the_fields_have_the_protocol_names_and_old_keys() -> None:
    assert {name: key for name, (key, _kind) in LEGACY_EXTRA_FIELDS.items()} == {
        "append_id": "append_id",
        "writer_epoch": "writer_epoch",
        "transaction_timeout_ms": "transaction.timeout.ms",
        "schema_crc32c": "schema_crc32c",
    }


def test_writers_put_the_fields_top_level_and_leave_extra_to_extensions() -> None:
    store = memory_store()
    log = PartitionLog(store, "p/", dict(CONFIG))
    stamped = log.append(
        [(payload([b"a"]), BatchMeta())], writer_epoch=3, transaction_timeout_ms=9_000, extra={"x.custom": "yes"}
    )
    doc = segment_json(store, stamped.key)
    assert doc["writer_epoch"] == 3 and doc["transaction_timeout_ms"] == 9_000 and doc["schema_crc32c"] == SCHEMA_CRC
    assert isinstance(doc["append_id"], str) and len(doc["append_id"]) == 32
    assert doc["extra"] == {"x.custom": "yes"}
    meta = log.index(log.view().segments[0]).meta
    assert (meta.append_id, meta.writer_epoch, meta.transaction_timeout_ms) == (doc["append_id"], 3, 9_000)

    # Without an epoch or a timeout those fields are absent, not null.
    plain = log.append([(payload([b"b"]), BatchMeta())], writer_epoch=3)
    doc = segment_json(store, plain.key)
    assert "transaction_timeout_ms" not in doc and doc["extra"] == {}
    assert None not in doc.values()
    log.append([(payload([b"c"]), BatchMeta())], writer_epoch=3)

    # A merged (rewritten) object is no append: it has the schema CRC and no append id.
    log.config["segment.bytes"] = sum(ref.size for ref in log.view().segments[:2])
    assert log.merge_segments() == 1
    merged = [ref for ref in log.view().segments if ref.generation == 1]
    doc = segment_json(store, merged[0].key)
    assert doc["schema_crc32c"] == SCHEMA_CRC and "append_id" not in doc and doc["extra"] == {}


def test_an_object_written_the_old_way_reads_with_the_same_meaning() -> None:
    scratch = memory_store()
    first = PartitionLog(scratch, "p/", dict(CONFIG)).append(
        [(payload([b"old"]), BatchMeta(7, 0, 0))], writer_epoch=5, transaction_timeout_ms=60_000
    )
    new_doc = segment_json(scratch, first.key)
    old_bytes = with_segment_json(scratch.get(first.key), the_old_way)
    store = memory_store()
    store.put_if_absent(first.key, old_bytes)
    old_doc = segment_json(store, first.key)
    assert not set(FIELDS) & set(old_doc) and old_doc["extra"]["transaction.timeout.ms"] == 60_000

    meta = read_index(store, first.key).meta
    for name in FIELDS:
        assert getattr(meta, name) == new_doc[name], name

    # writer_epoch: an append of an older epoch is fenced by the old object, of its epoch it is not.
    with pytest.raises(FencedError, match="epoch 5"):
        PartitionLog(store, "p/", dict(CONFIG)).append([(payload([b"late"]), BatchMeta())], writer_epoch=4)
    PartitionLog(store, "p/", dict(CONFIG)).append([(payload([b"next"]), BatchMeta())], writer_epoch=5)

    # append_id: the retry of the attempt that wrote it recognises it as its own.
    producers = ProducerStateManager(store, "p/", "p")
    assert producers.landed(first.key, new_doc["append_id"], [BatchMeta()]) is not None
    assert producers.landed(first.key, "another attempt", [BatchMeta()]) is None

    # schema_crc32c: the schema message is checked against the CRC kept in extra.
    log = PartitionLog(store, "p/", dict(CONFIG))
    assert log.read(0)[0][0].column("value").to_pylist() == [b"old"]

    def wrong_crc(doc: dict[str, Any]) -> None:
        the_old_way(doc)
        doc["extra"]["schema_crc32c"] ^= 1

    broken = memory_store()
    broken.put_if_absent(first.key, with_segment_json(old_bytes, wrong_crc))
    with pytest.raises(CorruptRecordError, match="schema message .*is damaged"):
        PartitionLog(broken, "p/", dict(CONFIG)).read(0)


def test_hand_written_json_of_both_ways() -> None:
    base = {
        "base_offset": 10,
        "next_offset": 12,
        "record_count": 2,
        "batch_count": 1,
        "min_timestamp": 1,
        "max_timestamp": 2,
        "running_max_timestamp": 2,
        "compression": "lz4",
        "created_ms": 3,
        "writer": "w",
        "generation": 0,
        "format_version": 1,
    }
    old = {
        **base,
        "extra": {"append_id": "a1", "writer_epoch": 2, "transaction.timeout.ms": 60_000, "schema_crc32c": 9},
    }
    new = {
        **base,
        "extra": {},
        "append_id": "a1",
        "writer_epoch": 2,
        "transaction_timeout_ms": 60_000,
        "schema_crc32c": 9,
    }
    for doc in (old, new):
        meta = SegmentMeta.from_json(json.dumps(doc).encode())
        got = (meta.append_id, meta.writer_epoch, meta.transaction_timeout_ms, meta.schema_crc32c)
        assert got == ("a1", 2, 60_000, 9)
    # Written again, the typed fields are top-level; a new object round-trips exactly.
    assert json.loads(SegmentMeta.from_json(json.dumps(new).encode()).to_json()) == new
    # Neither way: unknown, and not written.
    bare = SegmentMeta.from_json(json.dumps(base).encode())
    assert all(getattr(bare, name) is None for name in FIELDS) and bare.extra == {}
    assert not set(FIELDS) & set(json.loads(bare.to_json()))
    # Both ways: the top-level field is the one that counts.
    both = {**new, "extra": {"writer_epoch": 1}}
    assert SegmentMeta.from_json(json.dumps(both).encode()).writer_epoch == 2


@pytest.mark.parametrize(
    "change",
    [
        {"writer_epoch": "2"},
        {"append_id": 5},
        {"transaction_timeout_ms": True},
        {"extra": {"transaction.timeout.ms": "60s"}},
        {"extra": {"schema_crc32c": 1.5}},
    ],
)
def test_a_field_of_the_wrong_type_makes_the_object_corrupt(change: dict[str, Any]) -> None:
    scratch = memory_store()
    result = PartitionLog(scratch, "p/", dict(CONFIG)).append([(payload([b"v"]), BatchMeta())])

    def lie(doc: dict[str, Any]) -> None:
        for name in FIELDS:
            doc.pop(name, None)
        doc.update(change)

    store = memory_store()
    store.put_if_absent(result.key, with_segment_json(scratch.get(result.key), lie))
    with pytest.raises(CorruptRecordError) as excinfo:
        read_index(store, result.key)
    assert excinfo.value.key == result.key


def test_a_transactional_producer_stamps_its_timeout_and_a_plain_one_does_not(tmp_path: Path) -> None:
    LogStore(str(tmp_path)).create_topic("t", 1)
    with Producer(str(tmp_path), transactional_id="tx", transaction_timeout_ms=12_345, linger_ms=0) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("t", value=b"in a transaction")
        producer.commit_transaction()
    with Producer(str(tmp_path), linger_ms=0) as producer:
        producer.send("t", value=b"plain")
    log = LogRoot(str(tmp_path)).partition("t", 0)
    metas = [log.index(ref).meta for ref in log.view().segments]
    assert [m.transaction_timeout_ms for m in metas] == [12_345, None]
    assert all("transaction.timeout.ms" not in m.extra for m in metas)


def test_an_append_that_loses_to_an_object_with_one_of_its_batches_acknowledges_none_unwritten() -> None:
    # Two gateways, one partition: a client sent its first batch to both (its leader moved), and the other
    # gateway's object, which won the race for the offsets, begins with that batch but holds nothing else.
    store = memory_store()
    config = validate_config({})  # knowledge of the end stays fresh for a while: the next create races for it
    ours = PartitionLog(store, "p/", dict(config))
    ours.append([(payload([b"before"]), BatchMeta())])
    theirs = PartitionLog(store, "p/", dict(config))
    won = theirs.append([(payload([b"x-0"]), BatchMeta(7, 0, 0))])
    with pytest.raises(ConcurrentAppendError, match="producer 7 epoch 0 sequence 0"):
        ours.append([(payload([b"x-0"]), BatchMeta(7, 0, 0)), (payload([b"y-0"]), BatchMeta(8, 0, 0))])
    # Nothing was acknowledged for the other producer's batch; its retry alone is written, after the first.
    retried = ours.append([(payload([b"y-0"]), BatchMeta(8, 0, 0))])
    assert retried.base_offsets == [won.next_offset]
    batches, _ = ours.read(0)
    assert [v for b in batches for v in b.column("value").to_pylist()] == [b"before", b"x-0", b"y-0"]
