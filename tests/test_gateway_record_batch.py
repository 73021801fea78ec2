"""Kafka record batches (magic v2) <-> Arrow payloads: round trips, interop with kafka-python, hostile bytes."""

from __future__ import annotations

import os
import struct
import time

import cramjam
import google_crc32c
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyspark_logsource.gateway.compression import XERIAL_MAGIC
from pyspark_logsource.gateway.errors import CorruptRecordBatchError
from pyspark_logsource.gateway.record_batch import (
    HEADER_SIZE,
    TRANSACTIONAL_BIT,
    DecodedBatch,
    decode_batches,
    encode_batch,
)
from segment_format.records import RECORD_SCHEMA, payload_batch

kafka_records = pytest.importorskip("kafka.record.default_records")
kafka_codec = pytest.importorskip("kafka.codec")

CODECS = [None, "gzip", "snappy", "lz4", "zstd"]
KAFKA_CODEC_IDS = {None: 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
MAX = 64 << 20


def _kafka_has(codec: str | None) -> bool:
    return {
        None: True,
        "gzip": kafka_codec.has_gzip(),
        "snappy": kafka_codec.has_snappy(),
        "lz4": kafka_codec.has_lz4(),
        "zstd": kafka_codec.has_zstd(),
    }[codec]


def _records(
    offsets: list[int],
    stamps: list[int],
    keys: list[bytes | None],
    values: list[bytes | None],
    headers: list[list[tuple[str, bytes | None]] | None] | None = None,
) -> pa.RecordBatch:
    payload = payload_batch(stamps, keys, values, headers)
    return pa.RecordBatch.from_arrays([pa.array(offsets, pa.int64()), *payload.columns], schema=RECORD_SCHEMA)


def _sample() -> pa.RecordBatch:
    """Null and empty keys and values, headers with a null value, gaps in offsets, timestamps out of order."""
    return _records(
        offsets=[100, 101, 105, 106, 300],
        stamps=[1_700_000_000_000, 1_700_000_000_500, 1_699_999_999_000, 1_700_000_100_000, 5],
        keys=[None, b"k", b"", b"key-3" * 40, b"\x00\xff"],
        values=[b"v" * 300, None, b"", b"x" * 9000, b"\x80" * 70],
        headers=[None, [("a", b"1"), ("b", None)], None, [("", b""), ("h\u00e9", b"\x00" * 200)], None],
    )


def _rows(batch: DecodedBatch) -> list[tuple[object, ...]]:
    return [
        (batch.base_offset + int(d), r["timestamp"], r["key"], r["value"], r["headers"])
        for d, r in zip(batch.offset_deltas, batch.payload.to_pylist(), strict=True)
    ]


def _expected(records: pa.RecordBatch) -> list[tuple[object, ...]]:
    return [(r["offset"], r["timestamp"], r["key"], r["value"], r["headers"]) for r in records.to_pylist()]


def _batch_around(section: bytes, count: int, attributes: int = 0, magic: int = 2, base_offset: int = 0) -> bytes:
    """A batch with a correct CRC and length around an arbitrary records section."""
    tail = struct.pack(">hiqqqhii", attributes, max(count - 1, 0), 0, 0, -1, -1, -1, count) + section
    head = struct.pack(">qiibI", base_offset, HEADER_SIZE - 12 + len(section), 0, magic, google_crc32c.value(tail))
    return head + tail


def _section(batch: bytes) -> bytes:
    return batch[HEADER_SIZE:]


# ------------------------------------------------------------------------------------------------ round trips


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_every_codec(codec: str | None) -> None:
    records = _sample()
    data = encode_batch(
        records,
        compression=codec,
        producer_id=77,
        producer_epoch=3,
        base_sequence=12,
        attributes=TRANSACTIONAL_BIT,
        partition_leader_epoch=9,
    )
    [batch] = decode_batches(data, max_uncompressed_bytes=MAX)
    assert batch.codec == codec
    assert batch.transactional and not batch.control and not batch.log_append_time
    assert (batch.base_offset, batch.last_offset_delta, batch.record_count) == (100, 200, 5)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence, batch.partition_leader_epoch) == (
        77,
        3,
        12,
        9,
    )
    assert batch.base_timestamp == 1_700_000_000_000
    assert batch.max_timestamp == 1_700_000_100_000
    assert batch.offset_deltas.tolist() == [0, 1, 5, 6, 200]
    assert _rows(batch) == _expected(records)
    assert batch.payload.schema == pa.schema(RECORD_SCHEMA.remove(0))


def test_round_trip_many_records_and_wide_varints() -> None:
    """Hundreds of records (2-byte offset deltas), 3-byte lengths, negative and 10-byte timestamp deltas."""
    n = 700
    rng = np.random.default_rng(1)
    sizes = rng.integers(0, 20000, n)
    values = [bytes([i % 251]) * int(s) for i, s in enumerate(sizes)]
    stamps = [1_700_000_000_000 - 7 * i if i % 3 else i for i in range(n)]
    records = _records(list(range(10, 10 + 2 * n, 2)), stamps, [b"k%d" % i for i in range(n)], values)
    for codec in (None, "zstd"):
        [batch] = decode_batches(encode_batch(records, compression=codec, base_offset=0), max_uncompressed_bytes=MAX)
        assert batch.base_offset == 0 and batch.last_offset_delta == 10 + 2 * (n - 1)
        assert _rows(batch) == _expected(records)


def test_several_batches_back_to_back_and_log_append_time() -> None:
    one = encode_batch(_sample())
    two = encode_batch(_sample(), base_offset=50, log_append_time_ms=1234, compression="lz4")
    batches = decode_batches(memoryview(one + two + one), max_uncompressed_bytes=MAX)
    assert [b.base_offset for b in batches] == [100, 50, 100]
    assert batches[1].log_append_time and batches[1].max_timestamp == 1234
    stamps = batches[1].payload.column("timestamp").cast(pa.int64()).to_pylist()
    assert stamps == [1234] * 5  # LogAppendTime: every record's timestamp is the batch's maxTimestamp


def test_empty_header_list_reads_back_as_null() -> None:
    """Kafka has no null-versus-empty headers: both are a zero count, which decodes as null."""
    records = _records([0, 1], [1, 2], [None, None], [b"a", b"b"], [[], [("k", b"v")]])
    [batch] = decode_batches(encode_batch(records), max_uncompressed_bytes=MAX)
    assert batch.payload.column("headers").to_pylist() == [None, [{"key": "k", "value": b"v"}]]


def test_control_batch_is_returned_without_records() -> None:
    data = _batch_around(b"\x00" * 20, 1, attributes=0x30)
    [batch] = decode_batches(data, max_uncompressed_bytes=MAX)
    assert batch.control and batch.transactional and batch.record_count == 0 and batch.payload.num_rows == 0


# ------------------------------------------------------------------------------------------------ interop


@pytest.mark.parametrize("codec", CODECS)
def test_batches_built_by_kafka_python_decode(codec: str | None) -> None:
    if not _kafka_has(codec):
        pytest.skip(f"kafka-python has no {codec} library here (python-snappy is not installed)")
    builder = kafka_records.DefaultRecordBatchBuilder(2, KAFKA_CODEC_IDS[codec], True, 42, 1, 7, 1 << 30)
    records = _sample()
    for row in records.to_pylist():
        headers = [(h["key"], h["value"]) for h in row["headers"] or []]
        stamp = int(row["timestamp"].timestamp() * 1000)
        builder.append(row["offset"] - 100, stamp, row["key"], row["value"], headers)
    data = bytes(builder.build())
    [batch] = decode_batches(data, max_uncompressed_bytes=MAX)
    assert batch.codec == codec and batch.transactional and batch.producer_id == 42 and batch.base_sequence == 7
    assert _rows(batch) == [(o - 100, *rest) for o, *rest in _expected(records)]


@pytest.mark.parametrize("codec", CODECS)
def test_batches_we_encode_read_back_by_kafka_python(codec: str | None) -> None:
    if not _kafka_has(codec):
        pytest.skip(f"kafka-python has no {codec} library here (python-snappy is not installed)")
    records = _sample()
    reader = kafka_records.DefaultRecordBatch(bytearray(encode_batch(records, compression=codec, producer_id=9)))
    assert reader.validate_crc()
    assert reader.compression_type == KAFKA_CODEC_IDS[codec] and reader.producer_id == 9
    got = [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in reader]
    want = [
        (
            r["offset"],
            int(r["timestamp"].timestamp() * 1000),
            r["key"],
            r["value"],
            [(h["key"], h["value"]) for h in r["headers"] or []],
        )
        for r in records.to_pylist()
    ]
    assert got == want


def test_snappy_is_written_xerial_framed_and_raw_snappy_reads_too() -> None:
    records = _records(list(range(300)), [5] * 300, [None] * 300, [b"%05d" % i * 40 for i in range(300)])
    plain = _section(encode_batch(records))
    framed = _section(encode_batch(records, compression="snappy"))
    # read the framing with nothing of ours: the header, then [int32 length][raw snappy] blocks
    assert framed[:8] == XERIAL_MAGIC and struct.unpack(">ii", framed[8:16]) == (1, 1)
    pos, blocks = 16, []
    while pos < len(framed):
        (size,) = struct.unpack_from(">i", framed, pos)
        blocks.append(bytes(cramjam.snappy.decompress_raw(framed[pos + 4 : pos + 4 + size])))
        pos += 4 + size
    assert len(blocks) > 1 and b"".join(blocks) == plain
    raw = _batch_around(bytes(cramjam.snappy.compress_raw(plain)), 300, attributes=2)
    [batch] = decode_batches(raw, max_uncompressed_bytes=MAX)
    assert batch.payload.column("value").to_pylist() == records.column("value").to_pylist()


# ------------------------------------------------------------------------------------------------ errors


def _raises(data: bytes, match: str, max_bytes: int = MAX) -> None:
    with pytest.raises(CorruptRecordBatchError, match=match):
        decode_batches(data, max_uncompressed_bytes=max_bytes)


def test_wrong_crc() -> None:
    data = bytearray(encode_batch(_sample()))
    data[-1] ^= 1
    _raises(bytes(data), "CRC mismatch")


def test_every_prefix_of_three_batches_raises_or_decodes_the_whole_ones() -> None:
    batches = [encode_batch(_sample(), compression=c) for c in (None, "lz4", "gzip")]
    data = b"".join(batches)
    ends = {0, len(batches[0]), len(batches[0]) + len(batches[1]), len(data)}
    for cut in range(len(data) + 1):
        prefix = data[:cut]
        if cut in ends:
            assert len(decode_batches(prefix, max_uncompressed_bytes=MAX)) == sorted(ends).index(cut)
        else:
            with pytest.raises(CorruptRecordBatchError):
                decode_batches(prefix, max_uncompressed_bytes=MAX)


def test_lengths_beyond_the_data() -> None:
    data = bytearray(encode_batch(_sample()))
    struct.pack_into(">i", data, 8, len(data))
    _raises(bytes(data), r"batch length \d+ beyond the \d+ bytes given")
    _raises(_batch_around(b"\xc8\x01" + b"\x00" * 10, 1), "past the 12 bytes of records")  # length 100
    _raises(_batch_around(b"\x01" + b"\x00" * 10, 1), "negative length -1")
    _raises(_batch_around(b"\x04" + b"\x00" * 2 + b"\x14" + b"\x00" * 10, 2), "length 2, shorter than any record")


def test_bad_magic_and_unknown_codec() -> None:
    _raises(_batch_around(b"", 0, magic=1), "magic 1 not supported")
    _raises(_batch_around(b"", 0, attributes=6), "unknown codec 6")


def test_record_count_and_trailing_bytes_and_fields() -> None:
    section = _section(encode_batch(_sample()))
    _raises(_batch_around(section, 4), "bytes left after the 4 records")
    _raises(_batch_around(section, 6), "past the")
    _raises(_batch_around(section, -1), "negative record count")
    _raises(encode_batch(_sample()) + b"\x00" * 5, "5 trailing bytes")
    # one record: attributes, ts 0, offset 0, key -1, value length 50 in a 6-byte record
    _raises(_batch_around(b"\x0c\x00\x00\x00\x01\x64\x00", 1), "value length 50 is negative or beyond")
    _raises(_batch_around(b"\x0e\x00\x00\x00\x01\x00\x00\x00", 1), "1 bytes left after its last field")
    # a header whose key is not UTF-8
    record = b"\x00\x00\x00\x01\x00\x02\x04\xff\xfe\x01"
    _raises(_batch_around(bytes([2 * len(record)]) + record, 1), "header key is not UTF-8")


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_decompression_bomb_is_refused(codec: str) -> None:
    values = [b"\x00" * 100_000] * 20
    data = encode_batch(_records(list(range(20)), [0] * 20, [None] * 20, values), compression=codec)
    assert len(data) < 200_000
    _raises(data, "beyond max", max_bytes=1_000_000)
    assert decode_batches(data, max_uncompressed_bytes=3_000_000)[0].record_count == 20
    _raises(encode_batch(_sample()), "beyond max", max_bytes=100)


# ------------------------------------------------------------------------------------------------ fuzzing


def _survives(data: bytes) -> None:
    # CPU time of this thread: a bound on the work done (a quadratic path, a bomb), not on the machine's speed.
    start = time.thread_time()
    try:
        batches = decode_batches(data, max_uncompressed_bytes=1 << 20)
    except CorruptRecordBatchError:
        pass
    else:
        assert all(isinstance(b, DecodedBatch) for b in batches)
        for b in batches:
            assert b.payload.num_rows == len(b.offset_deltas)
            b.payload.validate(full=True)
    assert time.thread_time() - start < 5


# PLOG_FUZZ_EXAMPLES runs a longer hunt by hand; the default keeps the file near 5 s.
FUZZ = settings(
    max_examples=int(os.environ.get("PLOG_FUZZ_EXAMPLES", "250")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
_VALID = [encode_batch(_sample(), compression=c) for c in CODECS]
_SECTIONS = [_section(encode_batch(_sample()))]


@FUZZ
@given(st.binary(max_size=400))
def test_fuzz_random_bytes(data: bytes) -> None:
    _survives(data)


@FUZZ
@given(st.binary(max_size=300), st.integers(-3, 40), st.integers(0, 0x3F))
def test_fuzz_random_records_behind_a_valid_header(section: bytes, count: int, attributes: int) -> None:
    """Random records under a correct CRC, so the record parser itself is what is fuzzed."""
    _survives(_batch_around(section, count, attributes))


@FUZZ
@given(
    st.sampled_from(range(len(CODECS))),
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=6),
    st.integers(0, 10**6),
    st.booleans(),
)
def test_fuzz_mutated_batches(which: int, flips: list[tuple[int, int]], cut: int, fix_crc: bool) -> None:
    """Flip bytes of a valid batch (of each codec), truncate it, and (with fix_crc) restore its CRC."""
    data = bytearray(_VALID[which])
    for pos, value in flips:
        data[pos % len(data)] = value
    data = data[: max(cut % (len(data) + 1), 1)]
    if fix_crc and len(data) >= HEADER_SIZE:
        struct.pack_into(">I", data, 17, google_crc32c.value(bytes(data[21:])))
    _survives(bytes(data))


@FUZZ
@given(
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=6),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.sampled_from(CODECS),
    st.integers(0, 8),
)
def test_fuzz_mutated_records_recompressed(
    flips: list[tuple[int, int]], splice_from: int, splice_to: int, codec: str | None, count_change: int
) -> None:
    """Mutate and splice the uncompressed records, then compress them and wrap them in a correct header."""
    section = bytearray(_SECTIONS[0])
    for pos, value in flips:
        section[pos % len(section)] = value
    a, b = sorted((splice_from % len(section), splice_to % len(section)))
    section = section[:a] + section[b:] + section[a:b]
    if codec is not None:
        from pyspark_logsource.gateway.compression import CODEC_IDS, compress

        data = _batch_around(compress(codec, bytes(section)), 5 - 4 + count_change, CODEC_IDS[codec])
    else:
        data = _batch_around(bytes(section), 1 + count_change)
    _survives(data)
