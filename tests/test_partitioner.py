"""Tests for pyspark_logsource.client.partitioner: Kafka's murmur2 and default key partitioner."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_logsource.client.partitioner import (
    kafka_partition,
    murmur2,
    murmur2_array,
    partitions_for_keys,
    to_positive,
)

# org.apache.kafka.common.utils.UtilsTest#testMurmur2
KAFKA_UTILS_TEST_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}

# Lengths 1..5 cover every tail case (1, 2, 3 trailing bytes) with zero and one full block.
SHORT_KEY_VECTORS = {
    b"1": -1993445489,
    b"12": 126087238,
    b"123": -267702483,
    b"1234": -1614185708,
    b"12345": -1188365604,
}

# murmur2 of the empty key: no blocks, no tail, only the final mix of seed ^ 0.
EMPTY_KEY_HASH = 275646681

ALL_VECTORS = {**KAFKA_UTILS_TEST_VECTORS, **SHORT_KEY_VECTORS, b"": EMPTY_KEY_HASH}


@pytest.mark.parametrize(("key", "expected"), sorted(ALL_VECTORS.items()))
def test_murmur2_known_vectors(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


def test_murmur2_empty_key_is_final_mix_of_seed() -> None:
    m = 0x5BD1E995
    h = 0x9747B28C
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    assert murmur2(b"") == h == EMPTY_KEY_HASH


def test_murmur2_is_signed_32_bit() -> None:
    for key in ALL_VECTORS:
        assert -(2**31) <= murmur2(key) < 2**31


def test_murmur2_array_known_vectors() -> None:
    keys = list(ALL_VECTORS)
    out = murmur2_array(pa.array(keys, type=pa.binary()))
    assert out.dtype == np.int32
    assert out.tolist() == [ALL_VECTORS[k] for k in keys]


def test_to_positive() -> None:
    assert to_positive(0) == 0
    assert to_positive(5) == 5
    assert to_positive(-1) == 0x7FFFFFFF
    assert to_positive(-(2**31)) == 0
    assert to_positive(-973932308) == -973932308 & 0x7FFFFFFF


def test_kafka_partition_matches_formula() -> None:
    for key, h in ALL_VECTORS.items():
        for n in (1, 2, 3, 7, 12, 100, 2**31 - 1):
            assert kafka_partition(key, n) == (h & 0x7FFFFFFF) % n


@pytest.mark.parametrize("n", [0, -1, 2**31])
def test_bad_num_partitions(n: int) -> None:
    with pytest.raises(ValueError):
        kafka_partition(b"x", n)
    with pytest.raises(ValueError):
        partitions_for_keys(pa.array([b"x"]), n)


@pytest.mark.parametrize("typ", [pa.binary(), pa.large_binary()])
def test_array_binary_types(typ: pa.DataType) -> None:
    keys = [b"", b"a", b"\x00\xff\x80\x7f", b"x" * 101, None, b"foobar"]
    expected = [murmur2(k) if k is not None else -1 for k in keys]
    assert murmur2_array(pa.array(keys, type=typ)).tolist() == expected


@pytest.mark.parametrize("typ", [pa.string(), pa.large_string()])
def test_array_string_types_hash_utf8(typ: pa.DataType) -> None:
    keys = ["", "1234", "héllo wörld", "日本語のキー", "🙂🙃", None]
    expected = [murmur2(k.encode("utf-8")) if k is not None else -1 for k in keys]
    assert murmur2_array(pa.array(keys, type=typ)).tolist() == expected


def test_empty_inputs() -> None:
    assert murmur2_array(pa.array([], type=pa.binary())).shape == (0,)
    assert murmur2_array(pa.chunked_array([], type=pa.binary())).shape == (0,)
    assert partitions_for_keys(pa.array([], type=pa.string()), 3).shape == (0,)


def test_all_empty_and_all_null() -> None:
    assert murmur2_array(pa.array([b"", b""])).tolist() == [EMPTY_KEY_HASH] * 2
    assert murmur2_array(pa.array([None, None], type=pa.binary())).tolist() == [-1, -1]
    assert partitions_for_keys(pa.array([None, None], type=pa.binary()), 4).tolist() == [-1, -1]


def test_null_slot_with_nonempty_data_is_still_null() -> None:
    # Arrow allows a null slot to span bytes in the data buffer; it must still come out as -1.
    data = pa.py_buffer(b"abcdefgh")
    offsets = pa.py_buffer(np.array([0, 3, 8], dtype=np.int32).tobytes())
    validity = pa.py_buffer(bytes([0b01]))  # row 0 valid, row 1 null
    arr = pa.Array.from_buffers(pa.binary(), 2, [validity, offsets, data], null_count=1)
    assert murmur2_array(arr).tolist() == [murmur2(b"abc"), -1]
    assert partitions_for_keys(arr, 5).tolist() == [kafka_partition(b"abc", 5), -1]


def test_sliced_array() -> None:
    keys = [b"lead-in", *ALL_VECTORS, None, b"tail-out-key"]
    arr = pa.array(keys, type=pa.binary())
    for start in range(len(keys)):
        for length in range(len(keys) - start + 1):
            sub = keys[start : start + length]
            expected = [murmur2(k) if k is not None else -1 for k in sub]
            assert murmur2_array(arr.slice(start, length)).tolist() == expected


def test_chunked_array_and_python_list() -> None:
    chunks: list[list[bytes | None]] = [[b"21", b"foobar"], [], [None, b"abc"], [b""]]
    chunked = pa.chunked_array(chunks, type=pa.binary())
    flat = [k for c in chunks for k in c]
    expected = [murmur2(k) if k is not None else -1 for k in flat]
    assert murmur2_array(chunked).tolist() == expected
    assert murmur2_array(flat).tolist() == expected


def test_unsupported_type() -> None:
    with pytest.raises(TypeError):
        murmur2_array(pa.array([1, 2, 3]))


# --- properties -------------------------------------------------------------------------------

binary_keys = st.one_of(
    st.binary(max_size=12),
    st.binary(min_size=13, max_size=300),
    st.text(max_size=40).map(lambda s: s.encode("utf-8")),
)
nullable_keys = st.one_of(st.none(), binary_keys)


def _expected_hashes(keys: list[bytes | None]) -> list[int]:
    return [murmur2(k) if k is not None else -1 for k in keys]


@settings(max_examples=300, deadline=None)
@given(st.lists(binary_keys, max_size=60))
def test_property_murmur2_array_matches_scalar(keys: list[bytes]) -> None:
    for typ in (pa.binary(), pa.large_binary()):
        assert murmur2_array(pa.array(keys, type=typ)).tolist() == [murmur2(k) for k in keys]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(min_size=4, max_size=9), min_size=1, max_size=30), st.lists(st.binary(max_size=200)))
def test_property_common_blocks_then_skewed(short: list[bytes], extra: list[bytes]) -> None:
    # Exercises the whole-column path for blocks every key has, then the ragged remainder.
    keys = short + [k for k in extra if len(k) >= 4]
    assert murmur2_array(pa.array(keys, type=pa.binary())).tolist() == [murmur2(k) for k in keys]


@settings(max_examples=300, deadline=None)
@given(st.lists(nullable_keys, max_size=60), st.data())
def test_property_sliced_and_nullable(keys: list[bytes | None], data: st.DataObject) -> None:
    start = data.draw(st.integers(0, len(keys)), label="start")
    length = data.draw(st.integers(0, len(keys) - start), label="length")
    typ = data.draw(st.sampled_from([pa.binary(), pa.large_binary()]), label="type")
    arr = pa.array(keys, type=typ).slice(start, length)
    assert len(arr) == length
    sub = keys[start : start + length]
    assert murmur2_array(arr).tolist() == _expected_hashes(sub)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(nullable_keys, max_size=60),
    st.integers(1, 2**31 - 1) | st.integers(1, 64),
    st.integers(0, 5),
)
def test_property_partitions_match_kafka_partition(keys: list[bytes | None], num_partitions: int, cut: int) -> None:
    expected = [kafka_partition(k, num_partitions) if k is not None else -1 for k in keys]
    arr = pa.array(keys, type=pa.binary())
    out = partitions_for_keys(arr, num_partitions)
    assert out.dtype == np.int32
    assert out.tolist() == expected
    # Same answer through a chunked array split at an arbitrary point.
    cut = min(cut, len(keys))
    chunked = pa.chunked_array([arr.slice(0, cut), arr.slice(cut)], type=pa.binary())
    assert partitions_for_keys(chunked, num_partitions).tolist() == expected


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(max_size=30)), max_size=40))
def test_property_string_arrays(keys: list[str | None]) -> None:
    expected = _expected_hashes([k.encode("utf-8") if k is not None else None for k in keys])
    for typ in (pa.string(), pa.large_string()):
        assert murmur2_array(pa.array(keys, type=typ)).tolist() == expected
