"""plog on an S3 endpoint that fails: the fault proxy itself, the store's retries, and clients end to end.

Every test uses a fixed seed, so the faults it meets are the same on every
run (as far as thread scheduling allows: concurrent requests draw from one
generator), and each asserts that the faults it depends on were injected.
"""

from __future__ import annotations

import http.client
import time
import uuid
from collections import Counter
from typing import Any
from urllib.parse import urlsplit

import pytest

from pyspark_logsource import Consumer, LogStore, Producer
from segment_format.errors import PlogError, StorageError
from segment_format.stores import FsspecStore, open_store
from tests.fault_proxy import KINDS, FaultyS3

#: The faults that cost no waiting (``delay`` holds an answer for a second or more).
QUICK_KINDS = ("slowdown", "internal", "reset_before", "reset_after", "lost_put")


def bucket_of(url: str) -> str:
    return urlsplit(url).netloc


def raw_client(endpoint: str) -> Any:
    """A boto3 client that does not retry and times out fast: it shows each fault as it is."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
        config=Config(retries={"total_max_attempts": 1}, read_timeout=0.5, connect_timeout=1),
    )


def store_of(s3: FaultyS3, **extra: Any) -> FsspecStore:
    store = open_store(s3.url, {**s3.options, **extra})
    assert isinstance(store, FsspecStore)
    return store


# --------------------------------------------------------------------------- the proxy itself


@pytest.mark.parametrize("kind", KINDS)
def test_proxy_injects_each_kind(faulty_s3: FaultyS3, s3_admin_client: Any, kind: str) -> None:
    """Each kind fails the request as it should, and the request took effect exactly when it should."""
    from botocore.exceptions import ClientError

    bucket = bucket_of(faulty_s3.url)
    client = raw_client(faulty_s3.proxy.url)
    faulty_s3.inject(seed=1, probability=1.0, kinds=[kind], max_faults=1, delay_s=1.0)
    with pytest.raises((ClientError, OSError, Exception)) as info:
        client.put_object(Bucket=bucket, Key="k", Body=b"payload", IfNoneMatch="*")
    assert faulty_s3.proxy.injected == Counter({kind: 1})
    if kind == "slowdown":
        assert isinstance(info.value, ClientError) and info.value.response["Error"]["Code"] == "SlowDown"
    if kind == "internal":
        assert isinstance(info.value, ClientError) and info.value.response["Error"]["Code"] == "InternalError"
    took_effect = kind in ("reset_after", "delay", "lost_put")
    listed = s3_admin_client.list_objects_v2(Bucket=bucket).get("Contents", [])
    assert [o["Key"] for o in listed] == (["k"] if took_effect else [])
    # The schedule is spent: the same conditional PUT now reaches the server, and meets its own object.
    if took_effect:
        with pytest.raises(ClientError) as refused:
            client.put_object(Bucket=bucket, Key="k", Body=b"payload", IfNoneMatch="*")
        assert refused.value.response["Error"]["Code"] == "PreconditionFailed"
    else:
        client.put_object(Bucket=bucket, Key="k", Body=b"payload", IfNoneMatch="*")
    assert s3_admin_client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"payload"
    client.close()


def test_proxy_schedule_is_seeded_and_filtered(faulty_s3: FaultyS3) -> None:
    """The same seed draws the same faults; method and key filters leave other requests alone."""
    from tests.fault_proxy import FaultSchedule

    def draws(seed: int) -> list[str | None]:
        schedule = FaultSchedule(seed, 0.5, methods=frozenset({"PUT"}), key_pattern=r"^plog/log/")
        return [schedule.decide(m, k) for m, k in [("PUT", "plog/log/1"), ("GET", "plog/log/1"), ("PUT", "x")] * 20]

    assert draws(3) == draws(3) != draws(4)
    assert all(kind is None for kind in draws(3)[1::3] + draws(3)[2::3])
    assert any(kind is not None for kind in draws(3))


@pytest.mark.parametrize("chunked", [False, True])
def test_proxy_passes_bodies_and_headers_through(faulty_s3: FaultyS3, s3_admin_client: Any, chunked: bool) -> None:
    """A body arrives byte for byte (also as a chunked upload), and If-None-Match keeps its effect."""
    bucket = bucket_of(faulty_s3.url)
    body = bytes(range(256)) * 1000 + b"\r\n0\r\n\r\n"  # bytes that look like chunk framing, too
    proxy = urlsplit(faulty_s3.proxy.url)
    for expected_status in (200, 412):
        conn = http.client.HTTPConnection(proxy.hostname, proxy.port, timeout=10)
        # moto does not check signatures, but refuses anonymous writes to a taken key with 403.
        auth = "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0"
        headers = {"If-None-Match": "*", "Authorization": auth}
        if chunked:
            pieces = [body[i : i + 70_001] for i in range(0, len(body), 70_001)]
            conn.request("PUT", f"/{bucket}/raw", body=iter(pieces), headers=headers, encode_chunked=True)
        else:
            conn.request("PUT", f"/{bucket}/raw", body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        conn.close()
        assert response.status == expected_status
    assert s3_admin_client.get_object(Bucket=bucket, Key="raw")["Body"].read() == body
    assert faulty_s3.proxy.forwarded == 2


# --------------------------------------------------------------------------- the store through faults


def test_store_operations_succeed_through_faults(faulty_s3: FaultyS3) -> None:
    """Every operation of the conformance suite gives the right answer while a third of requests fail."""
    store = store_of(faulty_s3)
    faulty_s3.inject(seed=11, probability=0.3, kinds=QUICK_KINDS)
    payloads = {f"t/obj-{i:02d}": uuid.uuid4().bytes * (i + 1) for i in range(7)}
    for key, data in payloads.items():
        assert store.put_if_absent(key, data) is True
    for key, data in payloads.items():
        assert store.put_if_absent(key, b"someone else") is False
        assert store.get(key) == data
        assert store.get_range(key, 3, 9) == data[3:9]
        assert store.get_suffix(key, 5) == (data[-5:], len(data))
        assert store.size(key) == len(data) and store.exists(key)
    assert [(i.key, i.size) for i in store.list("t/")] == [(k, len(v)) for k, v in sorted(payloads.items())]
    assert [i.key for i in store.list_after("t/", "t/obj-04")] == ["t/obj-05", "t/obj-06"]
    store.replace("notice", b"one")
    store.replace("notice", b"two")
    assert store.get("notice") == b"two"
    store.delete("t/obj-00")
    store.delete("t/obj-00")  # absent: not an error, retried or not
    store.delete_many(["t/obj-01", "t/obj-02", "t/never"])
    assert not store.exists("t/obj-00") and [i.key for i in store.list("t/")][:1] == ["t/obj-03"]
    injected = faulty_s3.proxy.injected
    assert sum(injected.values()) >= 10, injected
    assert set(injected) == set(QUICK_KINDS), injected


@pytest.mark.parametrize("client_retries", [3, 1], ids=["botocore-retries", "store-retries"])
def test_lost_answer_put_if_absent_is_created_exactly_once(faulty_s3: FaultyS3, client_retries: int) -> None:
    """A conditional PUT stored but unanswered: the retry meets our own object, and the call says "created".

    With botocore's retries the 412 arrives inside one call (RetryAttempts = 1);
    with botocore at one try, the store's own loop retries. Either way the
    second create of the key (different bytes) is refused.
    """
    retries = {"mode": "standard", "total_max_attempts": client_retries}
    config = {**faulty_s3.options["config_kwargs"], "retries": retries}
    store = store_of(faulty_s3, config_kwargs=config)
    faulty_s3.inject(seed=5, probability=1.0, kinds=["lost_put"], methods=frozenset({"PUT"}), max_faults=3)
    outcomes = [store.put_if_absent(f"k{i}", b"mine %d" % i) for i in range(3)]
    assert outcomes == [True, True, True]
    assert faulty_s3.proxy.injected == Counter({"lost_put": 3})
    assert [store.put_if_absent(f"k{i}", b"late") for i in range(3)] == [False, False, False]
    direct = open_store(faulty_s3.url, faulty_s3.direct_options)
    assert [direct.get(f"k{i}") for i in range(3)] == [b"mine %d" % i for i in range(3)]


def test_put_if_absent_of_a_taken_key_is_refused_through_faults(faulty_s3: FaultyS3) -> None:
    """Someone else's object stays theirs, whatever happens to our tries, even when it holds our very bytes.

    On S3 the create id, not the bytes, tells our own object from another's.
    """
    direct = open_store(faulty_s3.url, faulty_s3.direct_options)
    theirs = [b"theirs", b"ours"] * 3
    for i, data in enumerate(theirs):
        assert direct.put_if_absent(f"taken/{i}", data)
    store = store_of(faulty_s3)
    faulty_s3.inject(seed=8, probability=0.5, kinds=["reset_before", "lost_put", "internal"])
    assert [store.put_if_absent(f"taken/{i}", b"ours") for i in range(len(theirs))] == [False] * len(theirs)
    assert [direct.get(f"taken/{i}") for i in range(len(theirs))] == theirs
    assert sum(faulty_s3.proxy.injected.values()) >= 3


@pytest.mark.parametrize("op", ["get", "put_if_absent", "list"])
def test_past_the_deadline_a_storage_error_names_the_operation_and_key(faulty_s3: FaultyS3, op: str) -> None:
    """A store that keeps failing gives up at the deadline with a StorageError (a PlogError) saying what failed."""
    store = store_of(faulty_s3, plog_deadline_ms=1500, plog_retry_backoff_ms=50, plog_retry_backoff_max_ms=300)
    # Not SlowDown: botocore's own throttling back-off (up to seconds within one try) would stretch the test.
    faulty_s3.inject(seed=2, probability=1.0, kinds=["internal", "reset_before"])
    started = time.monotonic()
    with pytest.raises(StorageError) as info:
        if op == "get":
            store.get("some/key.arrow")
        elif op == "put_if_absent":
            store.put_if_absent("some/key.arrow", b"x")
        else:
            store.list("some/")
    elapsed = time.monotonic() - started
    assert isinstance(info.value, PlogError)
    message = str(info.value)
    what = {"get": "reading object", "put_if_absent": "creating object", "list": "listing prefix"}[op]
    assert what in message and ("'some/key.arrow'" in message or "'some/'" in message), message
    assert "plog_deadline_ms" in message and "gave up after" in message
    assert 1.0 <= elapsed < 5, elapsed
    assert sum(faulty_s3.proxy.injected.values()) >= 3


def test_s3_defaults_leave_retrying_to_plogs_own_loop(s3_url: tuple[str, dict[str, Any]]) -> None:
    """open_store sets botocore (standard mode) and s3fs's own loop to one try each: FsspecStore's loop,
    which checks its deadline before every try, does the retrying (PROTOCOL.md A4)."""
    url, options = s3_url
    store = open_store(url, options)
    assert isinstance(store, FsspecStore)
    assert store.fs.config_kwargs["retries"] == {"mode": "standard", "total_max_attempts": 1}
    assert store.fs.retries == 1
    assert store.retry.deadline_s == 60.0
    mine = open_store(url, {**options, "config_kwargs": {"retries": {"mode": "adaptive", "total_max_attempts": 5}}})
    assert isinstance(mine, FsspecStore) and mine.fs.config_kwargs["retries"]["mode"] == "adaptive"


def test_failures_are_told_from_answers() -> None:
    """Throttling, 5xx and broken connections are transient; a missing object or a refused create is an answer.

    The outermost exception that says decides: a connection error raised
    while a refusal was being handled is a connection error.
    """
    from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError
    from s3fs.errors import translate_boto_error

    from segment_format.stores.retrying import is_transient

    def answer(code: str, status: int) -> ClientError:
        error = {"Code": code, "Message": code, "Condition": "If-None-Match"}
        return ClientError({"Error": error, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")

    for code, status, transient in [
        ("SlowDown", 503, True),
        ("InternalError", 500, True),
        ("ConditionalRequestConflict", 409, True),
        ("PreconditionFailed", 412, False),
        ("NoSuchKey", 404, False),
        ("AccessDenied", 403, False),
    ]:
        assert is_transient(answer(code, status)) is transient, code
        assert is_transient(translate_boto_error(answer(code, status))) is transient, code  # as s3fs raises it
    assert is_transient(ReadTimeoutError(endpoint_url="http://x"))
    assert is_transient(ConnectionResetError(104, "reset"))
    assert not is_transient(ValueError("a bug"))
    try:
        try:
            raise translate_boto_error(answer("PreconditionFailed", 412))
        except FileExistsError:
            raise EndpointConnectionError(endpoint_url="http://x") from None
    except EndpointConnectionError as e:
        assert is_transient(e)


def test_retry_options_are_checked(faulty_s3: FaultyS3) -> None:
    """A deadline that is not a positive number of milliseconds is a configuration error naming the option."""
    from segment_format.errors import InvalidConfigError

    with pytest.raises(InvalidConfigError, match="plog_deadline_ms"):
        open_store(faulty_s3.url, {**faulty_s3.options, "plog_deadline_ms": 0})
    with pytest.raises(InvalidConfigError, match="plog_retry_backoff_ms"):
        open_store(faulty_s3.url, {**faulty_s3.options, "plog_retry_backoff_ms": "soon"})
    store = store_of(faulty_s3, plog_deadline_ms="2500")
    assert store.retry.deadline_s == 2.5


# --------------------------------------------------------------------------- clients through faults


def make_topic(s3: FaultyS3, topic: str, partitions: int) -> None:
    with LogStore(s3.url, storage_options=s3.direct_options) as admin:
        admin.create_topic(topic, partitions)


def stored(s3: FaultyS3, topic: str, isolation: str = "read_uncommitted") -> dict[int, list[tuple[int, bytes]]]:
    """Every record of ``topic`` by partition as (offset, value), read without faults."""
    out: dict[int, list[tuple[int, bytes]]] = {}
    with Consumer(
        s3.url, storage_options=s3.direct_options, auto_offset_reset="earliest", isolation_level=isolation
    ) as consumer:
        consumer.subscribe([topic])
        while records := consumer.poll(timeout_ms=200, max_records=10_000):
            for tp, batch in records.items():
                out.setdefault(tp.partition, []).extend((r.offset, r.value) for r in batch)
    return out


def assert_exactly_once(found: dict[int, list[tuple[int, bytes]]], acked: dict[int, dict[int, bytes]]) -> None:
    """Each partition holds exactly the acknowledged records at their acknowledged offsets, contiguous from 0."""
    for partition, records in found.items():
        offsets = [offset for offset, _ in records]
        assert offsets == list(range(len(records))), f"partition {partition}: offsets {offsets}"
    assert {p: dict(r) for p, r in found.items() if r} == {p: r for p, r in acked.items() if r}
    values = [v for records in found.values() for _, v in records]
    assert len(values) == len(set(values)), "a record was appended twice"


def test_producer_send_and_send_batch_through_faults(faulty_s3: FaultyS3) -> None:
    """Every acknowledged record is stored once, at its acknowledged offset, offsets contiguous."""
    import pyarrow as pa

    make_topic(faulty_s3, "t", 3)
    producer = Producer(faulty_s3.url, storage_options=faulty_s3.options, linger_ms=0)
    producer.send("t", value=b"warm-up", partition=0).get(30)  # metadata read before the faults
    faulty_s3.inject(seed=21, probability=0.3, kinds=QUICK_KINDS, methods=frozenset({"PUT", "GET", "HEAD"}))
    futures = []
    for i in range(30):
        futures.append(producer.send("t", value=b"send-%03d" % i, partition=i % 3))
        if i % 5 == 4:
            producer.flush()  # several appends per partition, each one object
    producer.flush()
    acked: dict[int, dict[int, bytes]] = {0: {0: b"warm-up"}, 1: {}, 2: {}}
    for i, future in enumerate(futures):
        meta = future.get(30)
        acked[meta.partition][meta.offset] = b"send-%03d" % i
    for round_ in range(3):
        values = [b"batch-%d-%03d" % (round_, i) for i in range(20)]
        result = producer.send_batch("t", pa.table({"value": values, "partition": [i % 3 for i in range(20)]}))
        for partition, (first, last) in result.offsets.items():
            mine = [v for i, v in enumerate(values) if i % 3 == partition]
            assert last - first + 1 == len(mine)
            acked[partition].update(zip(range(first, last + 1), mine, strict=True))
    producer.close()
    injected = faulty_s3.proxy.injected
    print(f"\nfaults {dict(injected)}, forwarded {faulty_s3.proxy.forwarded}")  # the README's reliability table
    faulty_s3.calm()
    assert_exactly_once(stored(faulty_s3, "t"), acked)
    assert faulty_s3.proxy.lost_answers("PUT") >= 1 and sum(injected.values()) >= 10, injected


def test_transaction_through_faults(faulty_s3: FaultyS3) -> None:
    """A committed transaction is visible once, an aborted one never, while requests fail around them."""
    make_topic(faulty_s3, "tx", 2)
    faulty_s3.inject(seed=31, probability=0.25, kinds=QUICK_KINDS)
    producer = Producer(faulty_s3.url, storage_options=faulty_s3.options, transactional_id="app", linger_ms=0)
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(10):
        producer.send("tx", value=b"gone-%02d" % i, partition=i % 2)
    producer.abort_transaction()
    producer.begin_transaction()
    futures = [producer.send("tx", value=b"kept-%02d" % i, partition=i % 2) for i in range(20)]
    producer.commit_transaction()
    acked = {p: {} for p in range(2)}  # type: dict[int, dict[int, bytes]]
    for i, future in enumerate(futures):
        meta = future.get(30)
        acked[meta.partition][meta.offset] = b"kept-%02d" % i
    producer.close()
    injected = faulty_s3.proxy.injected
    print(f"\nfaults {dict(injected)}, forwarded {faulty_s3.proxy.forwarded}")  # the README's reliability table
    faulty_s3.calm()
    committed = stored(faulty_s3, "tx", "read_committed")
    assert sorted(v for r in committed.values() for _, v in r) == sorted(b"kept-%02d" % i for i in range(20))
    assert {p: dict(r) for p, r in committed.items()} == acked
    everything = [v for r in stored(faulty_s3, "tx").values() for _, v in r]
    assert sorted(everything) == sorted([b"gone-%02d" % i for i in range(10)] + [b"kept-%02d" % i for i in range(20)])
    assert faulty_s3.proxy.lost_answers("PUT") >= 1 and sum(injected.values()) >= 5, injected


def test_consumers_plain_and_in_a_group_through_faults(faulty_s3: FaultyS3) -> None:
    """A plain consumer reads every record once; a group member commits, and its successor resumes exactly there."""
    make_topic(faulty_s3, "c", 3)
    with Producer(faulty_s3.url, storage_options=faulty_s3.direct_options, linger_ms=0) as producer:
        for i in range(60):
            producer.send("c", value=b"rec-%03d" % i, partition=i % 3)
            if i % 10 == 9:
                producer.flush()
    expected = sorted(b"rec-%03d" % i for i in range(60))
    faulty_s3.inject(seed=41, probability=0.25, kinds=QUICK_KINDS)

    plain: list[bytes] = []
    with Consumer(faulty_s3.url, storage_options=faulty_s3.options, auto_offset_reset="earliest") as consumer:
        consumer.subscribe(["c"])
        while records := consumer.poll(timeout_ms=500, max_records=7):
            plain.extend(r.value for batch in records.values() for r in batch)
    assert sorted(plain) == expected

    group = {
        "group_id": "g",
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
        "session_timeout_ms": 6000,
        "heartbeat_interval_ms": 200,
    }
    seen: list[bytes] = []
    first = Consumer(faulty_s3.url, storage_options=faulty_s3.options, client_id="first", **group)
    first.subscribe(["c"])
    _poll_until(first, seen, 30, max_records=5)
    first.commit()
    first.close()
    second = Consumer(faulty_s3.url, storage_options=faulty_s3.options, client_id="second", **group)
    second.subscribe(["c"])
    _poll_until(second, seen, 60, max_records=50)
    positions = {tp.partition: second.position(tp) for tp in second.assignment()}
    second.close()
    assert sorted(seen) == expected, "a record was skipped or read twice across the committed hand-over"
    assert positions == {0: 20, 1: 20, 2: 20}
    injected = faulty_s3.proxy.injected
    print(f"\nfaults {dict(injected)}, forwarded {faulty_s3.proxy.forwarded}")  # the README's reliability table
    assert faulty_s3.proxy.lost_answers("PUT") >= 1 and sum(injected.values()) >= 10, injected


def _poll_until(consumer: Consumer, seen: list[bytes], count: int, max_records: int) -> None:
    """Poll ``consumer`` into ``seen`` until it holds ``count`` values or 30 s have passed."""
    deadline = time.monotonic() + 30
    while len(seen) < count and time.monotonic() < deadline:
        records = consumer.poll(timeout_ms=200, max_records=max_records)
        seen.extend(r.value for batch in records.values() for r in batch)


class _FakeClock:
    """Monotonic time that moves only when the store sleeps or the test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_request_made_while_settling_an_operation_shares_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused create's check, retried, gives up at the create's deadline, not at a deadline of its own."""
    import fsspec

    from segment_format.stores import fsspec_store
    from segment_format.stores.retrying import RetryPolicy

    clock = _FakeClock()
    monkeypatch.setattr(fsspec_store, "time", clock)
    store = FsspecStore(
        fsspec.filesystem("memory"),
        "bucket/plog",
        "memory://bucket/plog",
        create_kwargs={"mode": "create"},
        retry=RetryPolicy(deadline_s=10.0, backoff_s=0.5, backoff_max_s=1.0),
    )

    def check() -> None:
        raise ConnectionResetError("the check keeps failing")

    def create() -> None:
        clock.now += 8.0  # the create itself took most of the operation's 10 s
        store._retrying("inspecting object", "k", check)

    with pytest.raises(StorageError, match="inspecting object 'k'"):
        store._retrying("creating object", "k", create)
    assert clock.now < 10.0  # a deadline of its own would have run to 8 + 10 s
