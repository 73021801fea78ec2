"""The segment object format: round trips, plain-Arrow readability, index search, corruption.

A segment object is an Arrow IPC stream (schema, record batches, end-of-stream
marker), then a checksummed batch index, then a 24-byte tail. These tests write
objects through :class:`PartitionLog` and through the low-level functions of
``segment_format.segment``, and read them back byte for byte, or damage them
and check that every kind of damage surfaces as :class:`CorruptRecordError`
naming the object (and the batch's offset) and never as wrong data.
"""

from __future__ import annotations

import itertools
import json
import os
import uuid
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from segment_format.errors import CorruptRecordError
from segment_format.log.partition_log import PartitionLog
from segment_format.records import RECORD_SCHEMA, now_ms, payload_batch, with_offsets
from segment_format.segment import (
    ATTR_LOG_APPEND_TIME,
    END_OF_STREAM,
    INDEX_SCHEMA,
    MAGIC,
    SCHEMA_CRC_KEY,
    TAIL,
    BatchMeta,
    EncodedBatch,
    SegmentMeta,
    assemble_segment,
    crc32c,
    encode_batch,
    encode_batches_together,
    ipc_options,
    read_batches,
    read_index,
)
from segment_format.stores import LocalStore, MemoryStore
from segment_format.topic import validate_config

COMPRESSIONS = ["none", "lz4", "zstd"]
MB = 1024 * 1024

Record = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]] | None]  # ts, key, value, headers


# --------------------------------------------------------------------------- helpers


def memory_store() -> MemoryStore:
    return MemoryStore(f"segfmt-{uuid.uuid4().hex}")


def payload_of(records: Sequence[Record]) -> pa.RecordBatch:
    return payload_batch(
        [r[0] for r in records], [r[1] for r in records], [r[2] for r in records], [r[3] for r in records]
    )


def build_segment(
    batches: Sequence[Sequence[Record]],
    compression: str = "lz4",
    base_offset: int = 0,
    metas: Sequence[BatchMeta] | None = None,
) -> tuple[bytes, SegmentMeta, list[pa.RecordBatch]]:
    """Encode batches of records into one segment object; also return the batches with offsets."""
    options = ipc_options(compression)
    encoded: list[EncodedBatch] = []
    with_offs: list[pa.RecordBatch] = []
    offset = base_offset
    for i, records in enumerate(batches):
        batch = with_offsets(payload_of(records), offset)
        with_offs.append(batch)
        encoded.append(encode_batch(batch, metas[i] if metas else BatchMeta(), options))
        offset += len(records)
    max_ts = max(r[0] for records in batches for r in records)
    data, meta = assemble_segment(
        encoded,
        {
            "base_offset": base_offset,
            "next_offset": offset,
            "running_max_timestamp": max_ts,
            "compression": compression,
            "created_ms": 1,
            "writer": "test",
        },
    )
    return data, meta, with_offs


def read_all(store: Any, key: str) -> list[pa.RecordBatch]:
    """Everything plog reads of an object: its index, then all batches in one range read."""
    index = read_index(store, key)
    return read_batches(store, index, 0, index.batch_count - 1)


def rows(batches: Sequence[pa.RecordBatch] | pa.Table) -> list[dict[str, Any]]:
    """Records as dicts, the timestamp as exact epoch ms (no datetime round trip)."""
    table = batches if isinstance(batches, pa.Table) else pa.Table.from_batches(list(batches), schema=RECORD_SCHEMA)
    stamps = table.column("timestamp").cast(pa.int64())
    return table.drop_columns(["timestamp"]).append_column("timestamp_ms", stamps).to_pylist()


def expected_rows(records: Sequence[Record], base_offset: int = 0) -> list[dict[str, Any]]:
    out = []
    for i, (ts, key, value, headers) in enumerate(records):
        out.append(
            {
                "offset": base_offset + i,
                "timestamp_ms": ts,
                "key": key,
                "value": value,
                "headers": None if headers is None else [{"key": k, "value": v} for k, v in headers],
            }
        )
    return out


def log_config(**overrides: Any) -> dict[str, Any]:
    return validate_config(overrides)


def regions(data: bytes) -> dict[str, tuple[int, int]]:
    """Byte ranges of the parts of a segment object, from its own tail and index."""
    store = memory_store()
    store.put_if_absent("probe", data)
    index = read_index(store, "probe")
    index_position = TAIL.unpack(data[-TAIL.size :])[0]
    out = {"schema": (0, int(index.positions[0]))}
    for i in range(index.batch_count):
        start = int(index.positions[i])
        out[f"batch{i}"] = (start, start + int(index.lengths[i]))
    last_end = int(index.positions[-1] + index.lengths[-1])
    out["eos"] = (last_end, last_end + len(END_OF_STREAM))
    assert last_end + len(END_OF_STREAM) == index_position
    out["index"] = (index_position, len(data) - TAIL.size)
    out["tail"] = (len(data) - TAIL.size, len(data))
    return out


# A record set exercising every field's edge cases.
ONE_MB_VALUE = (b"plog-" + bytes(range(256))) * (MB // 261) + b"x" * (MB % 261)
EDGE_RECORDS: list[Record] = [
    (0, None, b"null key", None),
    (1, b"", b"empty key", []),
    (1_700_000_000_000, b"k", None, [("tombstone", b"")]),  # null value: a tombstone
    (1_700_000_000_001, b"k\x00\xff", b"", [("h", None)]),  # empty value, null header value
    (2**41, b"big", ONE_MB_VALUE, [("ключ", b"\x00\x01"), ("日本語", b"v"), ("dup", b"1"), ("dup", b"2")]),
    (5, "é".encode(), "välue".encode(), [("", b"empty header key")]),
]


@pytest.fixture
def local_log(tmp_path: Path):
    def make(**config: Any) -> PartitionLog:
        return PartitionLog(LocalStore(str(tmp_path / "root")), "topics/t/id/0/", log_config(**config), name="t-0")

    return make


# --------------------------------------------------------------------------- round trips


def test_crc32c_is_castagnoli() -> None:
    assert crc32c(b"123456789") == 0xE3069283  # the standard CRC-32C check value
    assert crc32c(memoryview(b"123456789")) == 0xE3069283


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_every_field_round_trips_through_a_segment(compression: str) -> None:
    store = memory_store()
    data, meta, _ = build_segment([EDGE_RECORDS[:3], EDGE_RECORDS[3:]], compression, base_offset=100)
    store.put_if_absent("seg", data)
    got = rows(read_all(store, "seg"))
    assert got == expected_rows(EDGE_RECORDS, base_offset=100)
    assert got[4]["value"] == ONE_MB_VALUE
    assert meta.compression == compression
    assert (meta.base_offset, meta.next_offset, meta.record_count, meta.batch_count) == (100, 106, 6, 2)
    assert meta.min_timestamp == 0 and meta.max_timestamp == 2**41


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_every_field_round_trips_through_a_partition_log(local_log, compression: str) -> None:
    log = local_log(**{"compression.type": compression})
    first = log.append([(payload_of(EDGE_RECORDS[:2]), BatchMeta()), (payload_of(EDGE_RECORDS[2:4]), BatchMeta())])
    second = log.append([(payload_of(EDGE_RECORDS[4:]), BatchMeta())])
    assert first.base_offsets == [0, 2] and first.next_offset == 4
    assert second.base_offsets == [4] and second.next_offset == 6
    batches, next_offset = log.read(0)
    assert next_offset == 6
    assert (rows(batches)) == expected_rows(EDGE_RECORDS)
    # Reading from the middle of a batch starts exactly there.
    batches, next_offset = log.read(3, max_records=2)
    assert [r["offset"] for r in rows(batches)] == [3, 4] and next_offset == 5
    # A fresh reader (new index cache) sees the same bytes.
    fresh = PartitionLog(log.store, log.prefix, log.config)
    assert (rows(fresh.read(0)[0])) == expected_rows(EDGE_RECORDS)


def test_index_rows_keep_producer_fields_and_attributes() -> None:
    store = memory_store()
    metas = [BatchMeta(7, 3, 11, 0), BatchMeta(7, 3, 13, ATTR_LOG_APPEND_TIME)]
    data, _, _ = build_segment([[(10, b"a", b"1", None)] * 2, [(5, b"b", b"2", None)] * 3], metas=metas)
    store.put_if_absent("seg", data)
    index = read_index(store, "seg")
    table = index.table.to_pylist()
    assert [(r["producer_id"], r["producer_epoch"], r["base_sequence"], r["attributes"]) for r in table] == [
        (7, 3, 11, 0),
        (7, 3, 13, ATTR_LOG_APPEND_TIME),
    ]
    assert [(r["base_offset"], r["last_offset"], r["record_count"]) for r in table] == [(0, 1, 2), (2, 4, 3)]
    assert [(r["first_timestamp"], r["max_timestamp"]) for r in table] == [(10, 10), (5, 5)]
    assert index.table.schema.remove_metadata() == INDEX_SCHEMA
    assert index.meta.schema_crc32c == crc32c(RECORD_SCHEMA.serialize().to_pybytes())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.lists(
            st.tuples(
                st.integers(0, 2**50),
                st.one_of(st.none(), st.binary(max_size=20)),
                st.one_of(st.none(), st.binary(max_size=200)),
                st.one_of(
                    st.none(),
                    st.lists(
                        st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=8))),
                        max_size=3,
                    ),
                ),
            ),
            min_size=1,
            max_size=6,
        ),
        min_size=1,
        max_size=4,
    ),
    st.sampled_from(COMPRESSIONS),
)
def test_arbitrary_records_round_trip(batches: list[list[Record]], compression: str) -> None:
    store = memory_store()
    data, _, _ = build_segment(batches, compression)
    store.put_if_absent("seg", data)
    flat = [r for b in batches for r in b]
    assert (rows(read_all(store, "seg"))) == expected_rows(flat)


# --------------------------------------------------------------------------- plain Arrow readers


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_object_is_readable_by_plain_pyarrow_open_stream(tmp_path: Path, compression: str) -> None:
    log = PartitionLog(LocalStore(str(tmp_path)), "topics/t/id/0/", log_config(**{"compression.type": compression}))
    log.append([(payload_of(EDGE_RECORDS[:3]), BatchMeta()), (payload_of(EDGE_RECORDS[3:]), BatchMeta())])
    files = sorted((tmp_path / "topics/t/id/0/log").iterdir())
    assert [f.name for f in files] == ["00000000000000000000.arrow"]
    # The notebook path: open the file with nothing but pyarrow; it stops at the end-of-stream marker.
    with pa.OSFile(str(files[0])) as f:
        reader = ipc.open_stream(f)
        assert reader.schema == RECORD_SCHEMA
        table = reader.read_all()
    assert table.num_rows == len(EDGE_RECORDS)
    assert rows(table) == expected_rows(EDGE_RECORDS)
    # The same from bytes.
    table2 = ipc.open_stream(files[0].read_bytes()).read_all()
    assert table2.equals(table)
    assert [b.num_rows for b in ipc.open_stream(files[0].read_bytes())] == [3, 3]


def test_tail_layout() -> None:
    data, meta, _ = build_segment([[(1, None, b"v", None)]])
    index_position, index_crc, version, magic = TAIL.unpack(data[-TAIL.size :])
    assert TAIL.size == 24 and magic == MAGIC and version == 1
    index_bytes = data[index_position : len(data) - TAIL.size]
    assert crc32c(index_bytes) == index_crc
    index_table = ipc.open_stream(index_bytes).read_all()
    assert json.loads(index_table.schema.metadata[b"plog.segment"])["next_offset"] == meta.next_offset == 1
    assert data[index_position - len(END_OF_STREAM) : index_position] == END_OF_STREAM


# --------------------------------------------------------------------------- index search


def test_batch_for_offset_every_offset() -> None:
    sizes = [1, 4, 2, 7, 1]
    batches = [[(i, None, b"x", None)] * n for i, n in enumerate(sizes)]
    store = memory_store()
    data, _, _ = build_segment(batches, base_offset=50)
    store.put_if_absent("seg", data)
    index = read_index(store, "seg")
    offset = 50
    for b, n in enumerate(sizes):
        for _ in range(n):
            assert index.batch_for_offset(offset) == b, offset
            offset += 1
    assert index.batch_for_offset(offset) == len(sizes)  # past the end
    assert index.batch_for_offset(0) == 0  # before the start


def first_batch_with(max_ts: Sequence[int], target: int) -> int:
    return next((i for i, m in enumerate(max_ts) if m >= target), len(max_ts))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 1000), min_size=1, max_size=4), min_size=1, max_size=8), st.data())
def test_batch_for_timestamp_with_non_monotonic_create_time(stamps: list[list[int]], data: st.DataObject) -> None:
    store = memory_store()
    seg, _, _ = build_segment([[(ts, None, b"x", None) for ts in batch] for batch in stamps])
    store.put_if_absent("seg", seg)
    index = read_index(store, "seg")
    max_ts = [max(b) for b in stamps]
    for target in [*sorted({t for b in stamps for t in b}), 0, 1001, data.draw(st.integers(0, 1001))]:
        assert index.batch_for_timestamp(target) == first_batch_with(max_ts, target), (stamps, target)


def test_batch_for_timestamp_example() -> None:
    store = memory_store()
    stamps = [[100, 90], [50], [300, 10], [200], [400]]
    seg, _, _ = build_segment([[(ts, None, b"x", None) for ts in b] for b in stamps])
    store.put_if_absent("seg", seg)
    index = read_index(store, "seg")
    assert [index.batch_for_timestamp(t) for t in (0, 100, 101, 200, 300, 301, 400, 401)] == [
        0,
        0,
        2,
        2,
        2,
        4,
        4,
        5,
    ]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.integers(0, 500), min_size=1, max_size=5), min_size=1, max_size=6), st.data())
def test_offset_for_timestamp_across_segments_is_exact(stamps: list[list[int]], data: st.DataObject) -> None:
    log = PartitionLog(memory_store(), "p/", log_config())
    for batch in stamps:  # one object per batch, CreateTime going back and forth
        log.append([(payload_of([(ts, None, b"v", None) for ts in batch]), BatchMeta())])
    flat = [t for b in stamps for t in b]
    start = data.draw(st.integers(0, len(flat) - 1))
    if start:
        log.delete_records(start)
    for target in [*sorted(set(flat)), 0, 501, data.draw(st.integers(0, 501))]:
        expected = next((o for o in range(start, len(flat)) if flat[o] >= target), None)
        assert log.offset_for_timestamp(target) == expected, (stamps, start, target)


# --------------------------------------------------------------------------- corruption


CORRUPTION_BATCHES: list[list[Record]] = [
    [(1000 + i, b"k%d" % i, b"value-%d-" % i * 20, [("h", b"x")]) for i in range(5)],
    [(2000 + i, None, b"second" * 30, None) for i in range(3)],
    [(3000, b"last", b"", [])],
]
CORRUPTION_BASE = 40


@pytest.fixture(scope="module", params=["none", "lz4"])
def pristine(
    request: pytest.FixtureRequest,
) -> tuple[bytes, list[pa.RecordBatch], dict[str, tuple[int, int]]]:
    data, _, batches = build_segment(CORRUPTION_BATCHES, request.param, base_offset=CORRUPTION_BASE)
    return data, batches, regions(data)


def batch_base_offsets() -> list[int]:
    out, offset = [], CORRUPTION_BASE
    for b in CORRUPTION_BATCHES:
        out.append(offset)
        offset += len(b)
    return out


def check_damaged(data: bytes, good: list[pa.RecordBatch], region: str | None) -> CorruptRecordError:
    """A full read of damaged bytes must raise; reading any single batch returns the true batch or raises."""
    store = memory_store()
    key = f"topics/t/id/0/log/{uuid.uuid4().hex}.arrow"
    store.put_if_absent(key, data)
    with pytest.raises(CorruptRecordError) as excinfo:
        read_all(store, key)
    err = excinfo.value
    assert repr(key) in str(err) and err.key == key
    if region is not None and region.startswith("batch"):
        base = batch_base_offsets()[int(region[5:])]
        assert err.offset == base and f"offset {base}" in str(err)
    # Never wrong data: whatever part can still be read is exactly what was written.
    try:
        index = read_index(store, key)
    except CorruptRecordError:
        return err
    for i in range(index.batch_count):
        try:
            (batch,) = read_batches(store, index, i, i)
        except CorruptRecordError as exc:
            assert repr(key) in str(exc)
            continue
        assert batch.equals(good[i])
    return err


def test_pristine_object_reads(pristine) -> None:
    data, good, where = pristine
    store = memory_store()
    store.put_if_absent("k", data)
    assert all(a.equals(b) for a, b in zip(read_all(store, "k"), good, strict=True))
    assert list(where) == ["schema", "batch0", "batch1", "batch2", "eos", "index", "tail"]
    assert where["schema"][0] == 0 and where["tail"][1] == len(data)
    covered = sorted(where.values())
    assert all(a[1] == b[0] for a, b in pairwise(covered))  # the regions tile the object


@pytest.mark.parametrize("region", ["schema", "batch0", "batch1", "batch2", "eos", "index", "tail"])
@pytest.mark.parametrize("where_in_region", ["first", "middle", "last"])
def test_one_flipped_byte_in_each_region_is_detected(pristine, region: str, where_in_region: str) -> None:
    data, good, where = pristine
    lo, hi = where[region]
    pos = {"first": lo, "middle": (lo + hi) // 2, "last": hi - 1}[where_in_region]
    damaged = bytearray(data)
    damaged[pos] ^= 0xFF
    check_damaged(bytes(damaged), good, region)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_any_flipped_byte_is_detected(pristine, data: st.DataObject) -> None:
    raw, good, where = pristine
    pos = data.draw(st.integers(0, len(raw) - 1), label="position")
    bit = data.draw(st.integers(0, 7), label="bit")
    damaged = bytearray(raw)
    damaged[pos] ^= 1 << bit
    region = next(name for name, (lo, hi) in where.items() if lo <= pos < hi)
    check_damaged(bytes(damaged), good, region)


def test_every_single_bit_flip_in_a_small_object_is_detected() -> None:
    """Exhaustive over positions (one bit each) for a one-record object: no byte is unchecked."""
    data, _, good = build_segment([[(7, b"k", b"v", [("h", None)])]], "none")
    for pos in range(len(data)):
        damaged = bytearray(data)
        damaged[pos] ^= 1 << (pos % 8)
        check_damaged(bytes(damaged), good, None)


def test_truncation_at_many_lengths_is_detected(pristine) -> None:
    data, good, where = pristine
    cuts = {
        0,
        1,
        7,
        TAIL.size - 1,
        TAIL.size,
        TAIL.size + 1,
        len(data) // 2,
        len(data) - 1,
        len(data) - TAIL.size,
    }
    for lo, hi in where.values():
        cuts |= {lo, hi - 1}
    cuts.discard(len(data))
    for cut in sorted(cuts):
        check_damaged(data[:cut], good, None)


def test_object_shorter_than_listed_is_detected(pristine) -> None:
    """A listing size bigger than the object (a stale or lying listing) is corruption, not a short read."""
    data, _, _ = pristine
    store = memory_store()
    store.put_if_absent("k", data[:-5])
    with pytest.raises(CorruptRecordError, match="'k'"):
        read_index(store, "k", size=len(data))


def test_damaged_batch_surfaces_through_the_partition_log(tmp_path: Path) -> None:
    root = tmp_path / "root"
    log = PartitionLog(LocalStore(str(root)), "topics/t/id/0/", log_config(**{"compression.type": "none"}))
    log.append([(payload_of([(1, None, b"a" * 50, None)] * 3), BatchMeta())])
    log.append([(payload_of([(2, None, b"b" * 50, None)] * 2), BatchMeta())])
    victim = log.view().segments[1]
    path = root / victim.key
    raw = bytearray(path.read_bytes())
    idx = log.index(victim)
    raw[int(idx.positions[0]) + int(idx.lengths[0]) // 2] ^= 0x10
    os.chmod(path, 0o644)  # objects may be stored read-only
    path.write_bytes(bytes(raw))
    fresh = PartitionLog(log.store, log.prefix, log.config)
    assert rows(fresh.read(0, max_records=3)[0])[2]["value"] == b"a" * 50  # the healthy object still reads
    with pytest.raises(CorruptRecordError) as excinfo:
        fresh.read(3)
    assert excinfo.value.key == victim.key and excinfo.value.offset == 3
    assert victim.key in str(excinfo.value) and "offset 3" in str(excinfo.value)


def test_legacy_object_without_schema_crc_still_reads_and_is_checked() -> None:
    """Objects written before the schema CRC existed: a good schema reads, a broken one is reported."""
    data, _, good = build_segment(CORRUPTION_BATCHES, "none")
    index_position = TAIL.unpack(data[-TAIL.size :])[0]
    table = ipc.open_stream(data[index_position : len(data) - TAIL.size]).read_all()
    meta = json.loads(table.schema.metadata[b"plog.segment"])
    del meta[SCHEMA_CRC_KEY]
    table = table.replace_schema_metadata({"plog.segment": json.dumps(meta).encode()})
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    index_bytes = sink.getvalue().to_pybytes()
    legacy = data[:index_position] + index_bytes + TAIL.pack(index_position, crc32c(index_bytes), 1, MAGIC)
    store = memory_store()
    store.put_if_absent("legacy", legacy)
    assert all(a.equals(b) for a, b in zip(read_all(store, "legacy"), good, strict=True))
    broken = bytearray(legacy)
    broken[0] ^= 0xFF  # the continuation marker of the schema message
    store.put_if_absent("broken", bytes(broken))
    with pytest.raises(CorruptRecordError, match="'broken'"):
        read_all(store, "broken")


# --------------------------------------------------------------------------- compression


def compressible(n: int) -> bytes:
    return (b"sensor=42;status=OK;reading=" + b"0123456789" * 8 + b";") * (n // 119 + 1)


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_compressed_object_is_smaller_and_decompressed_only_on_read(codec: str) -> None:
    value = compressible(200_000)[:200_000]
    records = [(i, b"key", value, None) for i in range(5)]
    plain, _, _ = build_segment([records], "none")
    packed, meta, good = build_segment([records], codec)
    assert meta.compression == codec
    assert len(packed) < len(plain) / 5
    # Stored compressed: the plaintext is in the uncompressed object, not in the compressed one.
    probe = value[1000:1400]
    assert probe in plain and probe not in packed
    store = memory_store()
    store.put_if_absent("seg", packed)
    index = read_index(store, "seg")  # reading the index decodes no record data
    row = index.table.to_pylist()[0]
    assert row["uncompressed_bytes"] > 5 * len(value) > row["length"]
    (batch,) = read_batches(store, index, 0, 0)
    assert batch.equals(good[0])
    assert batch.column(3).to_pylist() == [value] * 5


def test_partition_log_respects_compression_config(tmp_path: Path) -> None:
    sizes = {}
    for codec in COMPRESSIONS:
        log = PartitionLog(LocalStore(str(tmp_path / codec)), "p/", log_config(**{"compression.type": codec}))
        log.append([(payload_of([(1, None, compressible(100_000), None)] * 4), BatchMeta())])
        (ref,) = log.view().segments
        sizes[codec] = ref.size
        assert log.index(ref).meta.compression == codec
        assert log.read(0)[0][0].column(3).to_pylist() == [compressible(100_000)] * 4
    assert sizes["lz4"] < sizes["none"] and sizes["zstd"] < sizes["none"]


def test_empty_batch_is_refused() -> None:
    empty = with_offsets(payload_of([(1, None, b"", None)]).slice(0, 0), 0)
    with pytest.raises(ValueError, match="at least one record"):
        encode_batch(empty, BatchMeta(), ipc_options("none"))


def test_segment_parts_are_the_assembled_object_and_resume_after_an_interrupted_pass() -> None:
    from segment_format.segment import SegmentParts

    options = ipc_options("lz4")
    encoded = [
        encode_batch(with_offsets(payload_of([(1_000 + i, None, b"v%d" % i, None)] * 3), 3 * i), BatchMeta(), options)
        for i in range(4)
    ]
    fields = {"base_offset": 0, "next_offset": 12, "compression": "lz4", "created_ms": 1, "writer": "test"}
    whole, meta = assemble_segment(encoded, {**fields, "running_max_timestamp": 5_000})
    produced: list[int] = []

    def lazily() -> Any:
        for i, e in enumerate(encoded):
            produced.append(i)
            yield e

    parts = SegmentParts(lazily(), fields, running_max_floor=5_000)
    first = list(itertools.islice(iter(parts), 2))  # a store that failed after two parts
    assert produced == [0] and len(first) == 2  # batches are pulled one part at a time, not all first
    assert b"".join(parts) == whole  # a new pass yields those two again, then produces the rest
    assert parts.meta.to_json() == meta.to_json() and parts.size == len(whole)
    lower = SegmentParts(iter(encoded), fields, running_max_floor=0)
    assert b"".join(lower) != whole
    assert lower.meta.running_max_timestamp == 1_003  # the batches' own greatest timestamp

    def failing() -> Any:
        yield encoded[0]
        raise ValueError("batch 1 could not be encoded")

    broken = SegmentParts(failing(), fields, running_max_floor=0)
    for _ in range(2):  # every pass raises it: no pass may yield a truncated object as whole
        with pytest.raises(ValueError, match="batch 1 could not be encoded"):
            b"".join(broken)


def test_closed_segment_parts_are_freed_without_waiting_for_the_garbage_collector() -> None:
    """A store that gives up mid-write leaves the parts half produced; closing them releases them at once
    (their generator refers to them, a cycle only the collector would otherwise break)."""
    import gc
    import weakref

    from segment_format.segment import SegmentParts

    options = ipc_options("lz4")
    batches = [with_offsets(payload_of([(1, None, b"v", None)]), i) for i in range(3)]
    encoded = [encode_batch(batch, BatchMeta(), options) for batch in batches]
    fields = {"base_offset": 0, "next_offset": 3, "compression": "lz4", "created_ms": 1, "writer": "test"}
    gc.disable()
    try:
        for close in (False, True):
            parts = SegmentParts(iter(encoded), fields, running_max_floor=0)
            next(itertools.islice(iter(parts), 2, 3))  # two parts in, then the store fails
            if close:
                parts.close()
            alive = weakref.ref(parts)
            del parts
            assert (alive() is None) == close  # without close, only the collector frees it
    finally:
        gc.enable()


# ---------------------------------------------------------------------------------------- encoding together


def _alone(batch: pa.RecordBatch, options: ipc.IpcWriteOptions) -> bytes:
    """A batch's IPC message as a stream of that batch alone gives it: the stream less its schema message."""
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, batch.schema, options=options) as writer:
        writer.write_batch(batch)
        end = sink.tell()
    stream = sink.getvalue()
    schema_end = pa.BufferReader(stream)
    ipc.read_message(schema_end)
    return stream[schema_end.tell() : end].to_pybytes()


@pytest.mark.parametrize("compression", ["lz4", "zstd", "none"])
def test_batches_encoded_together_are_the_messages_each_gives_alone(compression: str) -> None:
    """One Arrow call for several batches (what an append does, BATCHES_PER_CALL at a time) gives each
    batch's own message, byte for byte, and the index row its message and records call for."""
    options = ipc_options(compression)
    sizes = [1, 7, 300, 2]
    batches = []
    offset = 40
    for n, size in enumerate(sizes):
        records = [
            (1_000 + 10 * n + i % 3, None if i % 2 else b"k%d" % i, b"v%d-" % i * (n + 1), None) for i in range(size)
        ]
        batches.append(with_offsets(payload_of(records), offset))
        offset += size
    metas = [BatchMeta(7, 1, 3 * n, 0) for n in range(len(sizes))]
    together = encode_batches_together(batches, metas, options)
    assert [bytes(e.message) for e in together] == [_alone(b, options) for b in batches]
    for encoded, batch, meta in zip(together, batches, metas, strict=True):
        row = encoded.row
        assert (row["base_offset"], row["last_offset"], row["record_count"]) == (
            batch.column(0)[0].as_py(),
            batch.column(0)[-1].as_py(),
            batch.num_rows,
        )
        assert row["crc32c"] == crc32c(bytes(encoded.message))
        assert (row["producer_id"], row["base_sequence"]) == (meta.producer_id, meta.base_sequence)
        stamps = batch.column(1).cast(pa.int64()).to_pylist()
        assert (row["first_timestamp"], row["max_timestamp"]) == (stamps[0], max(stamps))
    # The object they make reads back as the batches.
    data, meta = assemble_segment(
        together,
        {
            "next_offset": offset,
            "running_max_timestamp": 2_000,
            "compression": compression,
            "created_ms": 1,
            "writer": "t",
        },
    )
    store = memory_store()
    assert store.put_if_absent("o.arrow", data)
    index = read_index(store, "o.arrow")
    assert read_batches(store, index, 0, len(sizes) - 1) == batches


def test_an_empty_batch_is_refused_when_encoded_together() -> None:
    batch = with_offsets(payload_of([(1, None, b"v", None)]), 0)
    with pytest.raises(ValueError, match="at least one record"):
        encode_batches_together([batch, batch.slice(0, 0)], [BatchMeta(), BatchMeta()], ipc_options("lz4"))


@pytest.mark.parametrize("backend", ["local", "memory"])
def test_a_cached_index_does_not_keep_its_object_read_whole(tmp_path: Path, backend: str) -> None:
    """An object read whole with its index (``read_segment`` with ``whole``) comes as one buffer; the index,
    which caches keep long after the bytes are dropped, must be a copy, not a view of that buffer."""
    from segment_format.segment import WHOLE_READ, read_segment

    store = LocalStore(str(tmp_path)) if backend == "local" else MemoryStore(f"pin-{uuid.uuid4().hex}")
    log = PartitionLog(store, "topics/t/id/0/", validate_config({"compression.type": "none"}))
    values = [os.urandom(200) for _ in range(5_000)]
    log.append([(payload_batch(list(range(5_000)), [None] * 5_000, values), BatchMeta())])
    ref = log.view().segments[0]
    index, data = read_segment(store, ref.key, ref.size, WHOLE_READ)
    assert data is not None and len(data) == ref.size > 1_000_000
    whole = pa.py_buffer(data)
    lo, hi = whole.address, whole.address + whole.size
    for column in index.table.columns:
        for chunk in column.chunks:
            for buffer in chunk.buffers():
                assert buffer is None or not lo <= buffer.address < hi, "the index points into the object's bytes"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"not json", "not valid JSON"),
        (b'{"offset": 2}', "'created_ms'"),
        (b'{"offset": 2, "created_ms": "soon"}', "'created_ms'"),
        (b'{"offset": 1, "created_ms": 0}', "'offset'"),  # the name says 2: the name is authoritative
    ],
)
def test_a_damaged_start_marker_is_reported_as_corrupt_naming_it(tmp_path: Path, body: bytes, field: str) -> None:
    """PROTOCOL.md 3.1 and 7.1: a start marker that is not one is corruption naming the object and the field,
    not a crash of garbage collection; the marker written is the document the spec describes."""
    root = tmp_path / "root"
    log = PartitionLog(LocalStore(str(root)), "topics/t/id/0/", log_config(**{"compression.type": "none"}))
    for n in range(3):
        log.append([(payload_of([(n, None, b"v", None)]), BatchMeta())])
    assert log.delete_records(2) == 2
    (marker,) = (root / "topics/t/id/0/start").iterdir()
    written = json.loads(marker.read_bytes())
    assert written["offset"] == 2 and isinstance(written["created_ms"], int)
    os.chmod(marker, 0o644)
    marker.write_bytes(body)
    fresh = PartitionLog(log.store, log.prefix, log.config)
    with pytest.raises(CorruptRecordError) as excinfo:
        fresh.collect_garbage()
    assert marker.name in str(excinfo.value) and field in str(excinfo.value)


def test_start_markers_below_the_largest_are_collected_once_it_is_d_old(tmp_path: Path) -> None:
    """PROTOCOL.md 10, *Garbage collection*: retention writes a marker per step; only the largest is read, so the
    others go once it is D old, and a year of retention steps leaves one marker per partition."""
    root = tmp_path / "root"
    log = PartitionLog(LocalStore(str(root)), "topics/t/id/0/", log_config(**{"compression.type": "none"}))
    for n in range(6):
        log.append([(payload_of([(n, None, b"v", None)]), BatchMeta())])
    for start in (1, 2, 3, 4):
        log.delete_records(start)
    markers = root / "topics/t/id/0/start"
    assert len(list(markers.iterdir())) == 4
    log.collect_garbage()  # the largest is new: nothing goes yet
    assert len(list(markers.iterdir())) == 4
    log.collect_garbage(now=now_ms() + log.config["file.delete.delay.ms"])
    assert [p.name for p in markers.iterdir()] == [f"{4:020d}.json"]
    assert log.view().start_offset == 4
