"""Fuzzing plog serve's request decoder and its connection loop.

(a) :func:`decode_request` on arbitrary bytes and on mutations (truncations, flipped bytes, spliced bytes) of
valid requests of every API and version the gateway serves: it returns a Request or UnsupportedVersion or
raises MalformedRequestError, never anything else, and quickly.

(b) A running gateway over real sockets: each of a few hundred fuzzed, size-prefixed frames (random bytes and
mutated Produce, Fetch and Metadata requests) gets one well-formed response frame or a closed connection; the
root holds no more records than the fuzzed frames that decode as Produce requests carry; and a real
librdkafka client is served normally afterwards. On a SASL listener, an unauthenticated peer's fuzzed frames
get only ApiVersions/SASL answers and write nothing.

What it found, now fixed and kept as regressions: an array length of billions in a few dozen bytes made kio
reserve hundreds of GiB and the process abort; nulls in non-nullable fields reached handlers; a Metadata v10/v11
request for a topic by id crashed the answer's encoding. ``PLOG_FUZZ_SEED`` explores other frames.
"""

from __future__ import annotations

import io
import logging
import os
import random
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer

from pyspark_logsource.client.admin import LogStore
from pyspark_logsource.gateway import Gateway, GatewayConfig, running_gateway
from pyspark_logsource.gateway.entities import make, null_violation
from pyspark_logsource.gateway.errors import CorruptRecordBatchError, MalformedRequestError
from pyspark_logsource.gateway.handlers import all_apis
from pyspark_logsource.gateway.record_batch import decode_batches, encode_batch
from pyspark_logsource.gateway.wire import Request, UnsupportedVersion, decode_request
from segment_format.records import RECORD_SCHEMA

SUPPORTED = {key: (api.min_version, api.max_version) for key, api in all_apis().items()}
PRODUCE, FETCH, METADATA = 0, 1, 3
#: The only topic fuzzed requests name; the assertions count its records.
FUZZ_TOPIC = "fuzz"
RECORDS_PER_BATCH = 3
#: A decode of a frame of a few hundred bytes takes microseconds; this bound (thousands of times that) catches
#: a quadratic or worse path, not a slow machine. It is CPU time of the decoding thread, so other processes on a
#: busy machine do not count, and every schema is imported before (an import's CPU time is no decode's).
DECODE_BUDGET_S = 2.0


def _import_every_schema() -> None:
    from kio.index import load_request_schema

    from pyspark_logsource.gateway.wire import peek_header  # noqa: F401 - the wire module's own imports too

    for key, (low, high) in SUPPORTED.items():
        for version in range(low, high + 1):
            load_request_schema(key, version)


_import_every_schema()


def _batch(first: int) -> bytes:
    rows = [
        {"offset": i, "timestamp": 1_700_000_000_000 + i, "key": b"k", "value": f"fuzz-{first + i}".encode(),
         "headers": None}
        for i in range(RECORDS_PER_BATCH)
    ]  # fmt: skip
    return encode_batch(pa.RecordBatch.from_pylist(rows, schema=RECORD_SCHEMA))


#: Field values that make each API's request meaningful (a topic, a partition, records); ``make`` drops the
#: fields a version lacks and fills the others with neutral values.
_FIELDS: dict[int, dict[str, Any]] = {
    PRODUCE: {
        "transactional_id": None,
        "acks": -1,
        "timeout": 5000,
        "topic_data": [{"name": FUZZ_TOPIC, "partition_data": [{"index": 0, "records": _batch(0)}]}],
    },
    FETCH: {
        "replica_id": -1,
        "max_wait": 50,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "topics": [
            {
                "topic": FUZZ_TOPIC,
                "topic_id": uuid.UUID(int=0),
                "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}],
            }
        ],
    },
    METADATA: {"topics": [{"name": FUZZ_TOPIC}], "allow_auto_topic_creation": False},
}


def build_frame(key: int, version: int, correlation_id: int = 7, **fields: Any) -> bytes:
    """A valid request frame (no size prefix): header v2 for a flexible body, v1 otherwise."""
    body_type = load_request_schema(key, version)
    body = make(body_type, **{**_FIELDS.get(key, {}), **fields})
    header_type = RequestHeaderV2 if body_type.__flexible__ else RequestHeaderV1
    out = io.BytesIO()
    entity_writer(header_type)(
        out,
        header_type(request_api_key=key, request_api_version=version, correlation_id=correlation_id, client_id="fz"),
    )
    entity_writer(body_type)(out, body)
    return out.getvalue()


@cache
def valid_frames() -> tuple[tuple[int, int, bytes], ...]:
    """One valid frame for every (API, version) the gateway serves."""
    return tuple(
        (key, version, build_frame(key, version))
        for key, (low, high) in sorted(SUPPORTED.items())
        for version in range(low, high + 1)
    )


def _decode(frame: bytes) -> Request | UnsupportedVersion | None:
    """decode_request, asserting its contract: a result or MalformedRequestError (None), within the budget."""
    started = time.thread_time()
    try:
        result = decode_request(frame, SUPPORTED)
    except MalformedRequestError:
        result = None
    elapsed = time.thread_time() - started
    assert elapsed < DECODE_BUDGET_S, f"decoding {len(frame)} bytes took {elapsed:.3f}s: {frame[:64]!r}"
    assert result is None or isinstance(result, (Request, UnsupportedVersion))
    if isinstance(result, Request):  # what reaches a handler keeps its schema's promises
        assert null_violation(result.body) is None
    return result


@st.composite
def mutated(draw: st.DrawFn, frames: tuple[tuple[int, int, bytes], ...]) -> bytes:
    """A valid frame with a few truncations, byte flips, inserted, deleted or spliced runs of bytes."""
    _key, _version, frame = draw(st.sampled_from(frames))
    data = bytearray(frame)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["truncate", "flip", "set", "insert", "delete", "splice"]))
        at = draw(st.integers(0, len(data)))
        if kind == "truncate":
            del data[at:]
        elif kind == "flip" and at < len(data):
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and at < len(data):
            data[at] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF]))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del data[at : at + draw(st.integers(1, 8))]
        elif kind == "splice":  # a run of bytes from another valid frame (lengths, strings, arrays of another API)
            _k, _v, other = draw(st.sampled_from(frames))
            start = draw(st.integers(0, len(other)))
            data[at:at] = other[start : start + draw(st.integers(1, 32))]
    return bytes(data)


# ------------------------------------------------------------------------------------------- (a) decoder


def test_every_served_api_and_version_has_a_valid_frame_that_decodes() -> None:
    frames = valid_frames()
    assert {key for key, _v, _f in frames} == set(SUPPORTED)
    for key, version, frame in frames:
        decoded = _decode(frame)
        assert isinstance(decoded, Request), (key, version)
        assert (decoded.api_key, decoded.api_version, decoded.correlation_id) == (key, version, 7)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frame=st.binary(max_size=256))
def test_decode_arbitrary_bytes(frame: bytes) -> None:
    _decode(frame)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    key=st.sampled_from(sorted(SUPPORTED)),
    version=st.integers(-2, 20),
    correlation_id=st.integers(-(2**31), 2**31 - 1),
    rest=st.binary(max_size=128),
)
def test_decode_a_served_api_key_with_arbitrary_body(key: int, version: int, correlation_id: int, rest: bytes) -> None:
    # random bytes rarely hit a served key and version; these always do, so the body readers are reached
    frame = struct.pack(">hhi", key, version, correlation_id) + rest
    decoded = _decode(frame)
    low, high = SUPPORTED[key]
    if not low <= version <= high:
        assert isinstance(decoded, UnsupportedVersion) and decoded.correlation_id == correlation_id


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frame=mutated(valid_frames()))
def test_decode_mutated_valid_requests(frame: bytes) -> None:
    _decode(frame)


def _huge_array_frames() -> list[bytes]:
    """Produce requests whose topic array announces billions of elements in a few dozen bytes."""
    compact = build_frame(PRODUCE, 9, topic_data=[])
    legacy = build_frame(PRODUCE, 3, topic_data=[])
    # the empty array is the body's last field: compact 0x01 (length+1), legacy int32 0
    assert compact.endswith(b"\x01\x00") and legacy.endswith(b"\x00\x00\x00\x00")
    return [
        compact[:-2] + b"\xff\xff\xff\xff\x7f" + b"\x00" * 8,  # 2**35 - 2 elements: ~256 GiB reserved
        compact[:-2] + b"\xfe\xff\xff\xff\x0f" + b"\x00" * 8,  # 2**32 - 2 elements: ~32 GiB
        legacy[:-4] + struct.pack(">i", 2**31 - 1) + b"\x00" * 8,  # ~16 GiB
    ]


def test_huge_array_lengths_are_refused_before_kio_reserves_memory() -> None:
    # kio reserves an array's memory from its declared length; failing that, Rust aborts the process (no
    # exception), so one small frame would kill the gateway. Checked in a child process: an abort fails the test
    # instead of the test run.
    script = (
        "import sys\n"
        "from pyspark_logsource.gateway.errors import MalformedRequestError\n"
        "from pyspark_logsource.gateway.wire import decode_request\n"
        "from tests.test_gateway_wire_fuzz import SUPPORTED, _huge_array_frames\n"
        "for frame in _huge_array_frames():\n"
        "    try:\n"
        "        decode_request(frame, SUPPORTED)\n"
        "    except MalformedRequestError as exc:\n"
        "        print('refused:', exc)\n"
    )
    repo = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("refused:") == 3, result.stdout
    assert result.stdout.count("elements at byte") == 3, result.stdout


# ------------------------------------------------------------------------------- (b) connection loop


@pytest.fixture
def root(tmp_path: Path) -> str:
    path = str(tmp_path / "root")
    store = LogStore(path)
    store.create_topic(FUZZ_TOPIC, 2)
    store.create_topic("after", 1)
    return path


@pytest.fixture
def gateway(root: str) -> Iterator[Gateway]:
    with running_gateway(GatewayConfig(url=root, port=0, flush_interval_ms=5)) as gw:
        yield gw


def _exchange(port: int, frame: bytes, timeout_s: float) -> bytes | None:
    """Send one size-prefixed frame and read until the gateway closes; None if it neither answers nor closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except TimeoutError:
            return None
        except ConnectionResetError:
            pass  # closed with our bytes unread: a closed connection too
        return b"".join(chunks)


def _records_carried(request: Request | UnsupportedVersion | None) -> int:
    """How many records a decoded Produce request could append to the fuzz topic (0 for anything else)."""
    if not isinstance(request, Request) or request.api_key != PRODUCE:
        return 0
    count = 0
    for topic in request.body.topic_data:
        for part in topic.partition_data:
            try:
                batches = decode_batches(bytes(part.records or b""), max_uncompressed_bytes=1 << 24)
            except CorruptRecordBatchError:
                continue
            count += sum(b.record_count for b in batches)
    return count


def _fuzz_frames(count: int, seed: int) -> list[bytes]:
    """Random and mutated valid Produce/Fetch/Metadata frames, reproducibly from ``seed``."""
    rng = random.Random(seed)
    templates = [
        frame for key, version, frame in valid_frames() if key in (PRODUCE, FETCH, METADATA)
    ] + [build_frame(PRODUCE, 9, topic_data=[{"name": FUZZ_TOPIC, "partition_data": [
        {"index": 1, "records": _batch(100) + _batch(200)}]}])]  # fmt: skip
    frames = []
    for i in range(count):
        if i % 5 == 0:  # random bytes behind a plausible header prefix or none at all
            head = struct.pack(">hhi", rng.choice([PRODUCE, FETCH, METADATA, 999]), rng.randint(0, 13), i)
            frames.append((head if rng.random() < 0.7 else b"") + rng.randbytes(rng.randint(0, 200)))
            continue
        data = bytearray(rng.choice(templates))
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            at = rng.randint(0, len(data))
            # flips and sets mostly keep a frame decodable, so the handlers see odd values, not only the decoder
            kind = rng.choice(["truncate", "flip", "flip", "flip", "set", "set", "insert", "delete", "splice", "none"])
            if kind == "truncate":
                del data[at:]
            elif kind in ("flip", "set") and at < len(data):
                data[at] = data[at] ^ (1 << rng.randint(0, 7)) if kind == "flip" else rng.choice([0, 0x7F, 0x80, 0xFF])
            elif kind == "insert":
                data[at:at] = rng.randbytes(rng.randint(1, 8))
            elif kind == "delete":
                del data[at : at + rng.randint(1, 8)]
            elif kind == "splice":
                other = rng.choice(templates)
                start = rng.randint(0, len(other))
                data[at:at] = other[start : start + rng.randint(1, 32)]
        frames.append(bytes(data))
    return frames


#: How long a frame may go unanswered: only a Fetch the fuzz left asking to wait longer may take more.
ANSWER_TIMEOUT_S = 2.0


def test_fuzzed_frames_against_a_running_gateway(gateway: Gateway, root: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    # PLOG_FUZZ_SEED explores other frames (the default keeps runs reproducible)
    frames = _fuzz_frames(300, seed=int(os.environ.get("PLOG_FUZZ_SEED", "20261127"))) + _huge_array_frames()
    allowed_records = 0
    outcomes = {"answered": 0, "closed": 0, "long-poll": 0}
    for frame in frames:
        request = _decode(frame)
        allowed_records += _records_carried(request)
        reply = _exchange(gateway.port, frame, ANSWER_TIMEOUT_S)
        if reply is None:
            # a Fetch whose fuzzed max_wait is longer than we wait is a legitimate long poll, nothing else is
            assert isinstance(request, Request) and request.api_key == FETCH, frame
            assert request.body.max_wait.total_seconds() >= ANSWER_TIMEOUT_S / 2, frame
            outcomes["long-poll"] += 1
            continue
        if not reply:
            outcomes["closed"] += 1
            continue
        # exactly one well-formed response frame, for this request's correlation id
        assert request is not None, f"an undecodable frame was answered: {frame!r} -> {reply!r}"
        assert len(reply) >= 8, reply
        (size,) = struct.unpack_from(">i", reply)
        assert size == len(reply) - 4, (size, len(reply))
        assert struct.unpack_from(">i", reply, 4)[0] == request.correlation_id
        if isinstance(request, Request):  # and it decodes as the response of the request's API and version
            response_type = load_response_schema(request.api_key, request.api_version)
            _header, header_size = entity_reader(response_type.__header_schema__)(reply, 4)
            _body, body_size = entity_reader(response_type)(reply, 4 + header_size)
            assert 4 + header_size + body_size == len(reply), (request.api_key, request.api_version)
        outcomes["answered"] += 1
    # no handler failed on what the decoder let through (asyncio logs an escaped exception as an error)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    # the fuzz exercised both outcomes (a generator that only ever broke frames would prove little)
    assert outcomes["answered"] >= 20 and outcomes["closed"] >= 20, outcomes

    written = LogStore(root).read_topic(FUZZ_TOPIC).read_all()
    assert written.num_rows <= allowed_records, (written.num_rows, allowed_records)
    # a batch's CRC covers its records: whatever was written is the templates' records, unaltered
    known = {f"fuzz-{first + i}".encode() for first in (0, 100, 200) for i in range(RECORDS_PER_BATCH)}
    assert set(written.column("value").to_pylist()) <= known
    assert sorted(LogStore(root).list_topics()) == sorted([FUZZ_TOPIC, "after"])  # fuzzed names created nothing

    # and a real client is served as before
    from confluent_kafka import Consumer, Producer, TopicPartition

    bootstrap = f"127.0.0.1:{gateway.port}"
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(5):
        producer.produce("after", value=f"after-{i}".encode(), partition=0)
    assert producer.flush(20) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "after", "enable.auto.commit": False})
    consumer.assign([TopicPartition("after", 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + 20
    while len(got) < 5 and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None:
            assert message.error() is None, message.error()
            got.append(message.value())
    consumer.close()
    assert got == [f"after-{i}".encode() for i in range(5)]


def test_fuzzed_frames_before_authentication_write_nothing(root: str, tmp_path: Path) -> None:
    """On a listener that requires SASL, fuzzed frames from an unauthenticated peer are never served: only
    ApiVersions and the SASL APIs may be answered, everything else closes the connection, nothing is written."""
    from pyspark_logsource.gateway.security.credentials import add_user_to_file

    users = str(tmp_path / "users.json")
    add_user_to_file(users, "alice", "alice-secret")
    pre_auth = {18, 17, 36}  # ApiVersions, SaslHandshake, SaslAuthenticate
    frames = _fuzz_frames(150, seed=int(os.environ.get("PLOG_FUZZ_SEED", "20261128")))
    frames += [frame for _key, _version, frame in valid_frames() if _key == PRODUCE]  # valid ones too
    with running_gateway(GatewayConfig(url=root, port=0, flush_interval_ms=5, users_file=users)) as gw:
        for frame in frames:
            request = _decode(frame)
            reply = _exchange(gw.port, frame, ANSWER_TIMEOUT_S)
            assert reply is not None, frame  # no request is held open (no long poll) before authentication
            if reply:
                assert isinstance(request, (Request, UnsupportedVersion)) and request.api_key in pre_auth, frame
    assert LogStore(root).read_topic(FUZZ_TOPIC).read_all().num_rows == 0
