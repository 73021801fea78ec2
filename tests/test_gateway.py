"""plog serve with real Kafka clients: librdkafka (confluent-kafka) and kafka-python, never a client of ours."""

from __future__ import annotations

import signal
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

from pyspark_logsource.client.admin import LogStore  # noqa: E402
from pyspark_logsource.gateway import Gateway, GatewayConfig, running_gateway  # noqa: E402
from pyspark_logsource.gateway.batcher import TIER_MERGE_SPACING_S, recover_producer  # noqa: E402
from segment_format.stores import open_store  # noqa: E402

from .gateway_fixtures import (  # noqa: E402
    consume_from_start,
    gateway_process,
    one_record_batch,
    produce_frame,
    send_frames,
)


@pytest.fixture
def root(tmp_path: Path) -> str:
    return str(tmp_path / "root")


@pytest.fixture
def gateway(root: str) -> Iterator[Gateway]:
    LogStore(root).create_topic("orders", 3)
    with running_gateway(GatewayConfig(url=root, port=0, flush_interval_ms=20)) as gw:
        yield gw


def _bootstrap(gw: Gateway) -> str:
    return f"127.0.0.1:{gw.port}"


def _consume(bootstrap: str, topic: str, partitions: int, expected: int, **config: object) -> list[Any]:
    return consume_from_start({"bootstrap.servers": bootstrap, **config}, topic, partitions, expected)


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_librdkafka_produces_with_each_codec_and_both_sides_read_it(gateway: Gateway, root: str, codec: str) -> None:
    producer = Producer(
        {"bootstrap.servers": _bootstrap(gateway), "compression.type": codec, "enable.idempotence": True}
    )
    failures: list[object] = []
    for i in range(300):
        producer.produce(
            "orders",
            key=f"k{i % 7}".encode(),
            value=f"v{i}".encode(),
            headers=[("h", str(i).encode())],
            timestamp=1_700_000_000_000 + i,
            on_delivery=lambda err, _msg: err and failures.append(err),
        )
    assert producer.flush(30) == 0
    assert failures == []
    # plog's own reader sees the same keys, values, headers and timestamps
    table = LogStore(root).read_topic("orders").read_all()
    assert table.num_rows == 300
    rows = {(r["key"], r["value"]) for r in table.select(["key", "value"]).to_pylist()}
    assert rows == {(f"k{i % 7}".encode(), f"v{i}".encode()) for i in range(300)}
    stamps = {r["value"]: r["timestamp"] for r in table.select(["value", "timestamp"]).to_pylist()}
    assert int(stamps[b"v5"].timestamp() * 1000) == 1_700_000_000_005
    # and a Kafka consumer reads the same offsets plog assigned
    messages = _consume(_bootstrap(gateway), "orders", 3, 300)
    assert len(messages) == 300
    plog_offsets = {
        r["value"]: (r["partition"], r["offset"]) for r in table.select(["value", "partition", "offset"]).to_pylist()
    }
    for m in messages:
        assert plog_offsets[m.value()] == (m.partition(), m.offset())
        assert m.headers() == [("h", m.value()[1:])]


def test_kafka_python_produces_and_librdkafka_consumes(gateway: Gateway) -> None:
    producer = kafka.KafkaProducer(bootstrap_servers=_bootstrap(gateway), acks="all", compression_type="gzip")
    for i in range(100):
        producer.send("orders", key=b"same", value=f"{i}".encode(), partition=1)
    producer.flush(30)
    producer.close()
    messages = _consume(_bootstrap(gateway), "orders", 3, 100)
    assert [m.value() for m in messages] == [f"{i}".encode() for i in range(100)]  # one partition: in order


def test_plog_producer_writes_and_kafka_python_reads(gateway: Gateway, root: str) -> None:
    from pyspark_logsource.client.producer import Producer as PlogProducer

    plog = PlogProducer(root)
    for i in range(50):
        plog.send("orders", key=b"k", value=f"p{i}".encode(), partition=2)
    plog.close()
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=_bootstrap(gateway), auto_offset_reset="earliest", consumer_timeout_ms=5000
    )
    consumer.assign([kafka.TopicPartition("orders", 2)])
    values = [m.value for m in consumer]
    consumer.close()
    assert values == [f"p{i}".encode() for i in range(50)]


def test_transactional_producer_and_read_committed_consumer(gateway: Gateway) -> None:
    bootstrap = _bootstrap(gateway)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "tx-1"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(10):
        producer.produce("orders", value=f"aborted-{i}".encode(), partition=0)
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()
    for i in range(10):
        producer.produce("orders", value=f"committed-{i}".encode(), partition=0)
    producer.commit_transaction(30)
    committed = _consume(bootstrap, "orders", 1, 10, **{"isolation.level": "read_committed"})
    assert [m.value() for m in committed] == [f"committed-{i}".encode() for i in range(10)]
    everything = _consume(bootstrap, "orders", 1, 20, **{"isolation.level": "read_uncommitted"})
    assert len(everything) == 20


def test_a_transaction_timeout_above_fifteen_minutes_is_refused_as_kafka_refuses_it(gateway: Gateway) -> None:
    """A root listing boundedHistory caps timeouts at Kafka's transaction.max.timeout.ms (PROTOCOL.md 11.2)."""
    producer = Producer(
        {"bootstrap.servers": _bootstrap(gateway), "transactional.id": "tx-long", "transaction.timeout.ms": 900_001}
    )
    with pytest.raises(confluent_kafka.KafkaException, match="INVALID_TRANSACTION_TIMEOUT"):
        producer.init_transactions(30)


def test_a_transactional_id_reserved_for_the_spark_sink_is_refused(gateway: Gateway) -> None:
    """Ids starting with ``spark-sink:`` are the sink's, collected by its rules (PROTOCOL.md 11.3)."""
    producer = Producer({"bootstrap.servers": _bootstrap(gateway), "transactional.id": "spark-sink:" + "0" * 64})
    with pytest.raises(confluent_kafka.KafkaException, match="TRANSACTIONAL_ID_AUTHORIZATION_FAILED"):
        producer.init_transactions(30)


def test_list_offsets_earliest_latest_and_by_time(gateway: Gateway) -> None:
    producer = Producer({"bootstrap.servers": _bootstrap(gateway)})
    for i in range(5):
        producer.produce("orders", value=b"x", partition=0, timestamp=1_000_000 + i * 1000)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": _bootstrap(gateway), "group.id": "lo"})
    low, high = consumer.get_watermark_offsets(TopicPartition("orders", 0), timeout=10)
    assert (low, high) == (0, 5)
    found = consumer.offsets_for_times([TopicPartition("orders", 0, 1_002_500)], timeout=10)
    assert found[0].offset == 3
    consumer.close()


def test_admin_creates_describes_and_deletes_topics(gateway: Gateway, root: str) -> None:
    from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

    admin = AdminClient({"bootstrap.servers": _bootstrap(gateway)})
    admin.create_topics([NewTopic("fresh", 4, 1, config={"retention.ms": "60000"})])["fresh"].result(30)
    assert len(LogStore(root).describe_topic("fresh")["partitions"]) == 4
    configs = admin.describe_configs([ConfigResource("topic", "fresh")])
    described = next(iter(configs.values())).result(30)
    assert described["retention.ms"].value == "60000"
    with pytest.raises(confluent_kafka.KafkaException):
        admin.create_topics([NewTopic("fresh", 1, 1)])["fresh"].result(30)
    admin.delete_topics(["fresh"])["fresh"].result(30)
    assert "fresh" not in LogStore(root).list_topics()


@pytest.mark.parametrize(
    "frame",
    [
        struct.pack(">i", 2**31 - 1),  # beyond socket.request.max.bytes
        struct.pack(">i", 3) + b"abc",  # shorter than any header
        struct.pack(">ihhi", 10, 999, 0, 1) + b"\xff\xff",  # unknown API key
        struct.pack(">ihhi", 10, 0, 99, 1) + b"\xff\xff",  # Produce at a version nobody speaks
        struct.pack(">ihhi", 30, 0, 9, 1) + b"\x00" * 22,  # Produce v9 whose fields do not decode
    ],
    ids=["oversized", "short", "unknown-api", "unknown-version", "garbage-body"],
)
def test_hostile_frames_close_the_connection_and_write_nothing(gateway: Gateway, root: str, frame: bytes) -> None:
    assert send_frames(gateway.port, frame) == b""
    assert LogStore(root).read_topic("orders").read_all().num_rows == 0


def test_corrupt_record_batch_is_refused_with_kafkas_error(gateway: Gateway, root: str) -> None:
    import io

    import pyarrow as pa
    from kio.index import load_request_schema, load_response_schema
    from kio.schema.request_header.v2.header import RequestHeader
    from kio.serial import entity_reader, entity_writer

    from pyspark_logsource.gateway.entities import make
    from pyspark_logsource.gateway.record_batch import encode_batch
    from segment_format.records import RECORD_SCHEMA

    good = encode_batch(
        pa.RecordBatch.from_pylist(
            [{"offset": 0, "timestamp": 0, "key": None, "value": b"v", "headers": None}], schema=RECORD_SCHEMA
        )
    )
    bad = bytearray(good)
    bad[-1] ^= 0xFF  # the CRC no longer matches
    request = make(
        load_request_schema(0, 9),
        transactional_id=None,
        acks=-1,
        timeout=5000,
        topic_data=[{"name": "orders", "partition_data": [{"index": 0, "records": bytes(bad)}]}],
    )
    out = io.BytesIO()
    entity_writer(RequestHeader)(
        out, RequestHeader(request_api_key=0, request_api_version=9, correlation_id=7, client_id="t")
    )
    entity_writer(type(request))(out, request)
    body = out.getvalue()
    reply = send_frames(gateway.port, struct.pack(">i", len(body)) + body)
    response, _ = entity_reader(load_response_schema(0, 9))(reply, 4 + 5)  # size, correlation id, tagged fields
    assert int(response.responses[0].partition_responses[0].error_code) == 2  # CORRUPT_MESSAGE
    assert LogStore(root).read_topic("orders").read_all().num_rows == 0


def _produce_answer(port: int, records: bytes) -> tuple[int, int]:
    from kio.index import load_response_schema
    from kio.serial import entity_reader

    reply = send_frames(port, produce_frame(records))
    response, _ = entity_reader(load_response_schema(0, 9))(reply, 4 + 5)
    partition = response.responses[0].partition_responses[0]
    return int(partition.error_code), int(partition.base_offset)


def _idempotent_batch(first_sequence: int, n: int, producer_id: int, producer_epoch: int) -> bytes:
    """A Kafka record batch of ``n`` records valued by their sequence numbers, from ``first_sequence`` on."""
    import pyarrow as pa

    from pyspark_logsource.gateway.record_batch import encode_batch
    from segment_format.records import RECORD_SCHEMA

    rows = [
        {"offset": i, "timestamp": 0, "key": None, "value": f"{first_sequence + i}".encode(), "headers": None}
        for i in range(n)
    ]
    return encode_batch(
        pa.RecordBatch.from_pylist(rows, schema=RECORD_SCHEMA),
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=first_sequence,
    )


def test_a_retried_batch_is_recognised_by_a_gateway_that_never_saw_its_producer(root: str) -> None:
    """PROTOCOL.md 11.9, *Retries across gateways*: the second gateway reads the producer's state from the log."""
    LogStore(root).create_topic("orders", 1)

    def batch(first_sequence: int, n: int) -> bytes:
        return _idempotent_batch(first_sequence, n, producer_id=42, producer_epoch=3)

    with running_gateway(GatewayConfig(url=root, port=0, flush_interval_ms=5)) as first:
        assert _produce_answer(first.port, batch(0, 5)) == (0, 0)
        assert _produce_answer(first.port, batch(5, 5)) == (0, 5)
    with running_gateway(GatewayConfig(url=root, port=0, flush_interval_ms=5)) as second:
        assert _produce_answer(second.port, batch(5, 5)) == (0, 5)  # the retry: the same offset, not written again
        assert _produce_answer(second.port, batch(20, 5))[0] == 45  # OUT_OF_ORDER_SEQUENCE_NUMBER: records skipped
        assert _produce_answer(second.port, batch(10, 5)) == (0, 10)  # the next batch goes on
    values = LogStore(root).read_topic("orders").read_all().column("value").to_pylist()
    assert values == [f"{i}".encode() for i in range(15)]


def test_a_gateway_whose_producer_wrote_elsewhere_meanwhile_reads_its_state_again(root: str) -> None:
    """A producer moves to another gateway and back (a registration that lapsed under load moves leadership both
    ways): the first gateway's memory of its sequences is stale, and it reads them from the log again instead
    of refusing the next batch as out of order, which librdkafka takes as fatal (PROTOCOL.md 11.9)."""
    LogStore(root).create_topic("orders", 1)

    def batch(first_sequence: int, n: int) -> bytes:
        return _idempotent_batch(first_sequence, n, producer_id=43, producer_epoch=0)

    config = {"url": root, "port": 0, "flush_interval_ms": 5}
    with running_gateway(GatewayConfig(**config)) as first, running_gateway(GatewayConfig(**config)) as second:
        assert _produce_answer(first.port, batch(0, 5)) == (0, 0)
        assert _produce_answer(second.port, batch(5, 5)) == (0, 5)  # the producer moved: the second recovers it
        assert _produce_answer(first.port, batch(10, 5)) == (0, 10)  # and back: the first's memory said 5
        assert _produce_answer(first.port, batch(5, 5)) == (0, 5)  # a retry of the batch written elsewhere
        assert _produce_answer(first.port, batch(20, 5))[0] == 45  # a real gap is still refused
        # The producer bumps its epoch (librdkafka does, after an error) and starts it through the second gateway;
        # the first, which remembers epoch 0, reads the log again rather than refuse epoch 1's next batch.
        assert _produce_answer(second.port, _idempotent_batch(0, 5, producer_id=43, producer_epoch=1)) == (0, 15)
        assert _produce_answer(first.port, _idempotent_batch(5, 5, producer_id=43, producer_epoch=1)) == (0, 20)
    values = LogStore(root).read_topic("orders").read_all().column("value").to_pylist()
    assert values == [f"{i}".encode() for i in [*range(15), *range(10)]]


def test_a_batch_the_log_does_not_show_is_never_answered_as_written(root: str) -> None:
    """A client whose leader moved sends its third batch to a gateway while its first two are still on their way
    through another: the new gateway must not take the third as the producer's start, or it would later answer
    the first two DUPLICATE_SEQUENCE_NUMBER, which Kafka clients take as written (PROTOCOL.md 11.9)."""
    LogStore(root).create_topic("orders", 1)

    def batch(first_sequence: int, n: int) -> bytes:
        return _idempotent_batch(first_sequence, n, producer_id=44, producer_epoch=0)

    with running_gateway(GatewayConfig(url=root, port=0, flush_interval_ms=5)) as gw:
        assert _produce_answer(gw.port, batch(10, 5))[0] == 45  # OUT_OF_ORDER: nothing before it is known
        assert _produce_answer(gw.port, batch(0, 5)) == (0, 0)  # the earlier ones arrive and are written
        assert _produce_answer(gw.port, batch(5, 5)) == (0, 5)
        assert _produce_answer(gw.port, batch(10, 5)) == (0, 10)  # the retry of the third goes on after them
        for n in range(3, 9):  # push the first batches out of the gateway's memory of recent ones
            assert _produce_answer(gw.port, batch(5 * n, 5)) == (0, 5 * n)
        assert _produce_answer(gw.port, batch(0, 5))[0] == 45  # old, unknown: out of order, not "duplicate"
    values = LogStore(root).read_topic("orders").read_all().column("value").to_pylist()
    assert values == [f"{i}".encode() for i in range(45)]


def test_consume_transform_produce_commits_offsets_with_the_transaction(gateway: Gateway, root: str) -> None:
    """Kafka's exactly-once loop through the gateway: offsets sent to the transaction become the group's
    committed offsets when it commits, and not when it aborts (PROTOCOL.md 11.2)."""
    from coordinator.groups.client import GroupClient
    from segment_format.root import LogRoot

    bootstrap = _bootstrap(gateway)
    LogStore(root).create_topic("out", 1)
    seed = Producer({"bootstrap.servers": bootstrap})
    for i in range(20):
        seed.produce("orders", value=f"{i}".encode(), partition=0)
    assert seed.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "eos",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([TopicPartition("orders", 0, 0)])
    taken = []
    deadline = time.monotonic() + 30
    while len(taken) < 20 and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            taken.append(message)
    assert len(taken) == 20
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "eos-1"})
    producer.init_transactions(30)
    for commit, upto in ((False, 10), (True, 20)):
        producer.begin_transaction()
        for message in taken[:upto]:
            producer.produce("out", value=message.value().upper())
        producer.send_offsets_to_transaction(
            [TopicPartition("orders", 0, upto)], consumer.consumer_group_metadata(), 30
        )
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
            committed = GroupClient(LogRoot(root).store, "eos").committed()
            assert committed.get(("orders", 0)) is None  # an aborted transaction commits no offset
    consumer.close()
    assert GroupClient(LogRoot(root).store, "eos").committed()[("orders", 0)] == 20
    out = _consume(bootstrap, "out", 1, 20, **{"isolation.level": "read_committed"})
    assert [m.value() for m in out] == [f"{i}".encode() for i in range(20)]


def test_records_the_log_refuses_fail_without_retries_and_write_nothing(root: str) -> None:
    """A null key on a compacted topic is refused with INVALID_RECORD, which a client does not retry."""
    LogStore(root).create_topic("latest", 1, config={"cleanup.policy": "compact"})  # a new root: usable at once
    errors: list[object] = []
    with running_gateway(GatewayConfig(url=root, port=0, flush_interval_ms=20)) as gateway:
        producer = Producer({"bootstrap.servers": _bootstrap(gateway), "message.timeout.ms": 20_000})
        producer.produce("latest", value=b"no key", on_delivery=lambda err, _msg: errors.append(err))
        assert producer.flush(30) == 0  # its own batch: Kafka refuses a whole batch with a bad record
        producer.produce("latest", key=b"k", value=b"kept", on_delivery=lambda err, _msg: errors.append(err))
        assert producer.flush(30) == 0
    refused = [e for e in errors if e is not None]
    assert len(refused) == 1 and refused[0].code() == confluent_kafka.KafkaError.INVALID_RECORD
    assert LogStore(root).read_topic("latest").read_all().column("value").to_pylist() == [b"kept"]


@pytest.mark.parametrize("layout", ["partitioned", "shared"])
def test_pipelined_produce_requests_share_one_flush_and_are_answered_in_order(root: str, layout: str) -> None:
    """A client's produce requests sent back to back while a flush may not start yet (the flush interval) go
    out in one flush, not one each, and come back in request order with each partition's records in request
    order."""
    from kio.index import load_response_schema
    from kio.serial import entity_reader

    LogStore(root).create_topic("orders", 3, {"storage.layout": layout})
    # A long interval: requests handled one after another would need three flushes (three notices).
    with running_gateway(GatewayConfig(url=root, port=0, flush_interval_ms=1000)) as gw:
        # A first flush starts the interval (a quiet gateway flushes a lone request at once).
        send_frames(gw.port, produce_frame(one_record_batch(b"first"), partition=2, correlation_id=10))
        batcher = gw.services["produce"]
        assert (batcher.objects_written, batcher.notices_written) == (1, 1)
        frames = [
            produce_frame(one_record_batch(b"a"), partition=0, correlation_id=11),
            produce_frame(one_record_batch(b"b"), partition=0, correlation_id=12),
            produce_frame(one_record_batch(b"c"), partition=1, correlation_id=13),
        ]
        reply = send_frames(gw.port, b"".join(frames))
        # An object per partition, or one shared object for both partitions (and its commit, 7.3).
        assert (batcher.objects_written, batcher.notices_written) == (3 if layout == "partitioned" else 2, 2)
    answers = []
    position = 0
    while position < len(reply):
        (size,) = struct.unpack_from(">i", reply, position)
        (correlation_id,) = struct.unpack_from(">i", reply, position + 4)
        response, _ = entity_reader(load_response_schema(0, 9))(reply[position + 9 : position + 4 + size], 0)
        part = response.responses[0].partition_responses[0]
        answers.append((correlation_id, int(part.index), int(part.error_code), int(part.base_offset)))
        position += 4 + size
    assert answers == [(11, 0, 0, 0), (12, 0, 0, 1), (13, 1, 0, 0)]
    values = LogStore(root).read_topic("orders").read_all().to_pydict()
    assert sorted(zip(values["partition"], values["offset"], values["value"], strict=True)) == [
        (0, 0, b"a"),
        (0, 1, b"b"),
        (1, 0, b"c"),
        (2, 0, b"first"),
    ]


def test_a_failed_write_refuses_the_producers_batches_queued_after_it(root: str) -> None:
    """Pipelined requests queue a producer's next batch before its previous one is written: when that write
    fails, the next batch must not be written after the gap (Kafka answers OUT_OF_ORDER_SEQUENCE_NUMBER)."""
    import asyncio
    import threading

    from pyspark_logsource.gateway.batcher import OUT_OF_ORDER_SEQUENCE_NUMBER, ProduceBatcher, ProduceError
    from segment_format.errors import PlogError
    from segment_format.records import payload_batch
    from segment_format.segment import BatchMeta

    LogStore(root).create_topic("orders", 1, {"storage.layout": "partitioned"})  # its appends are held one by one
    # batch_bytes=1: every queued batch starts a flush at once (no window to wait for).
    with running_gateway(GatewayConfig(url=root, port=0, flush_interval_ms=10_000, batch_bytes=1)) as gw:
        batcher = ProduceBatcher(gw)
        entered, release = threading.Event(), threading.Event()
        append = batcher._append

        def first_append_fails(key: tuple[str, int], pendings: list[object]) -> dict[tuple[str, int], object]:
            if not entered.is_set():  # the store refuses the first object, once the next batch is queued
                entered.set()
                release.wait(30)
                return {key: PlogError("the store refused the object")}
            return append(key, pendings)  # type: ignore[arg-type]

        batcher._append = first_append_fails  # type: ignore[method-assign]

        def batch(sequence: int, value: bytes) -> list[tuple[object, BatchMeta, int]]:
            payload = payload_batch([0], [None], [value])
            return [(payload, BatchMeta(7, 0, sequence, 0), payload.nbytes)]

        async def scenario() -> tuple[BaseException | None, BaseException | None]:
            loop = asyncio.get_running_loop()
            first = await batcher.enqueue("orders", 0, batch(0, b"a"))  # type: ignore[arg-type]
            await loop.run_in_executor(None, entered.wait, 30)  # its flush is writing
            second = await batcher.enqueue("orders", 0, batch(1, b"b"))  # type: ignore[arg-type]
            release.set()
            outcomes = await asyncio.gather(*first, *second, return_exceptions=True)
            return tuple(o if isinstance(o, BaseException) else None for o in outcomes)  # type: ignore[return-value]

        assert gw._loop is not None
        failed_first, failed_second = asyncio.run_coroutine_threadsafe(scenario(), gw._loop).result(timeout=60)
    assert isinstance(failed_first, PlogError) and not isinstance(failed_first, ProduceError)
    assert isinstance(failed_second, ProduceError)
    assert failed_second.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert LogStore(root).read_topic("orders").read_all().num_rows == 0


def test_a_quiet_gateway_flushes_a_lone_request_at_once(root: str) -> None:
    """Group commit: a produce request to a gateway with nothing in flight is written at once, not after the
    flush interval (a minute here, far past the test's ten-second socket timeout)."""
    LogStore(root).create_topic("orders", 1)
    with running_gateway(GatewayConfig(url=root, port=0, flush_interval_ms=60_000)) as gw:
        reply = send_frames(gw.port, produce_frame(one_record_batch(b"now"), correlation_id=21))
        assert struct.unpack_from(">i", reply, 4)[0] == 21
        assert gw.services["produce"].objects_written == 1
    assert LogStore(root).read_topic("orders").read_all().column("value").to_pylist() == [b"now"]


def test_one_flush_writes_every_shared_topics_batches_as_one_object_and_one_notice(root: str) -> None:
    """Requests to two shared topics that wait for the same flush are written as one shared object (a commit
    per topic) and one change notice, and each topic's records read back in order."""
    for topic in ("orders", "payments"):
        LogStore(root).create_topic(topic, 2, {"storage.layout": "shared"})
    with running_gateway(GatewayConfig(url=root, port=0, flush_interval_ms=1000)) as gw:
        send_frames(gw.port, produce_frame(one_record_batch(b"first"), correlation_id=30))  # starts the interval
        batcher = gw.services["produce"]
        before = (batcher.objects_written, batcher.notices_written)
        frames = [
            produce_frame(one_record_batch(b"o1"), topic="orders", partition=0, correlation_id=31),
            produce_frame(one_record_batch(b"p1"), topic="payments", partition=1, correlation_id=32),
            produce_frame(one_record_batch(b"o2"), topic="orders", partition=0, correlation_id=33),
        ]
        send_frames(gw.port, b"".join(frames))
        assert (batcher.objects_written, batcher.notices_written) == (before[0] + 1, before[1] + 1)
    orders = LogStore(root).read_topic("orders").read_all().to_pydict()
    assert sorted(zip(orders["partition"], orders["offset"], orders["value"], strict=True)) == [
        (0, 0, b"first"),
        (0, 1, b"o1"),
        (0, 2, b"o2"),
    ]
    assert LogStore(root).read_topic("payments").read_all().column("value").to_pylist() == [b"p1"]
    shared = [info.key for info in open_store(root).list("shared/")]
    assert len(shared) == 2


def test_a_gateway_merges_every_tier_its_flushes_complete_however_fast_they_come() -> None:
    """A gateway merges the tiers of small commits it completes (PROTOCOL.md 10.2), at most once a second per
    topic (each merge lists the topic): a tier completed meanwhile is merged by the next merge, even with more
    than a hundred of its commits made since. On a ``memory://`` root no maintenance process runs, so every range
    here is the gateway's own."""
    root = "memory://gateway-tier-spacing"
    LogStore(root).create_topic("orders", 2, {"storage.layout": "shared", "auto.maintenance.interval.ms": "3600000"})
    store = open_store(root)
    with running_gateway(GatewayConfig(url=root, port=0)) as gw:
        producer = Producer({"bootstrap.servers": _bootstrap(gw), "linger.ms": 0})
        for n in range(150):
            producer.produce("orders", f"r{n}".encode(), partition=n % 2)
            assert producer.flush(30) == 0  # a commit each, faster than a merge a second
        time.sleep(TIER_MERGE_SPACING_S)  # the next flush's merge is due
        producer.produce("orders", b"last", partition=0)
        assert producer.flush(30) == 0
        deadline = time.monotonic() + 30
        ranges: list[str] = []
        while len(ranges) < 150 // 16 and time.monotonic() < deadline:  # merged off the produce path
            ranges = [info.key for info in store.list("topics/orders/") if info.key.endswith(".g1.json")]
            time.sleep(0.05)
    assert len(ranges) == 150 // 16, ranges
    assert len(LogStore(root).read_topic("orders").read_all()) == 151


def test_a_producers_state_is_recovered_from_the_runs_that_hold_its_batches(root: str) -> None:
    """A gateway that never saw a producer reads its state from the log (PROTOCOL.md 11.9), and of a shared
    topic's runs only those whose commit entries name one of its batches: each producer's epoch, next sequence
    and last five batches come out right among the others' runs, and a producer with no batch gets None."""
    LogStore(root).create_topic("orders", 1, {"storage.layout": "shared"})
    with running_gateway(GatewayConfig(url=root, port=0)) as gw:
        config = {"bootstrap.servers": _bootstrap(gw), "enable.idempotence": True, "linger.ms": 0}
        producers = [Producer(config) for _ in range(3)]
        for n in range(12):
            for i, producer in enumerate(producers):
                producer.produce("orders", f"p{i}-{n}".encode(), partition=0)
                assert producer.flush(30) == 0  # a run of one batch each, the producers' runs interleaved
    written = LogStore(root).root.partition("orders", 0)
    ids = {int(i) for ref in written.view(refresh=True).segments for i in written.index(ref).producer_ids}
    assert len(ids) == 3
    fresh = LogStore(root).root.partition("orders", 0)
    for producer_id in ids:
        state = recover_producer(fresh, producer_id)
        assert state is not None
        epoch, next_sequence, recent = state
        assert (epoch, next_sequence) == (0, 12)
        assert [sequences for sequences, _ in recent] == [(s, s) for s in range(7, 12)]
    assert recover_producer(fresh, max(ids) + 1) is None


def _maintenance_child(gateway_pid: int) -> int:
    """The pid of the maintenance process ``gateway_pid`` started (it starts at the first flush)."""
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
            cmdline = (status.parent / "cmdline").read_bytes()
        except OSError:
            continue  # exited meanwhile
        if int(fields.get("PPid", "0")) == gateway_pid and b"pyspark_logsource.gateway.maintenance" in cmdline:
            return int(status.parent.name)
    raise AssertionError(f"the gateway {gateway_pid} runs no maintenance process")


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return "State:\tZ" in state  # exited, and not reaped by whatever adopted it


def test_a_gateway_maintains_what_it_writes_and_its_maintainer_dies_with_it(root: str) -> None:
    """``plog serve`` is its topics' writer, and maintains them as a producer does (PROTOCOL.md 10.1), in a
    process of its own: with only Kafka clients writing, the runs of its flushes move into each partition's
    segments, and the records read back as sent. SIGKILLed, the gateway leaves no maintainer running."""
    LogStore(root).create_topic(
        "orders", 2, {"storage.layout": "shared", "shared.move.ms": "0", "auto.maintenance.interval.ms": "0"}
    )
    sent = [f"r{n}".encode() for n in range(40)]
    with gateway_process(root) as (proc, port):
        producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "linger.ms": 0})
        for n, value in enumerate(sent):
            producer.produce("orders", value, partition=n % 2)
            assert producer.flush(30) == 0  # a flush each: many commits, as a gateway's busy clients make
        store = open_store(root)
        deadline = time.monotonic() + 60
        moved: set[str] = set()
        while moved != {"0", "1"} and time.monotonic() < deadline:
            moved = {info.key.split("/")[3] for info in store.list("topics/orders/") if "/log/" in info.key}
            time.sleep(0.2)
        assert moved == {"0", "1"}
        child = _maintenance_child(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        deadline = time.monotonic() + 30
        while not _gone(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(child), "the maintenance process outlived its SIGKILLed gateway"
    assert sorted(LogStore(root).read_topic("orders").read_all().column("value").to_pylist()) == sorted(sent)


def test_an_idle_kafka_consumer_costs_the_gateway_about_one_request_a_second(
    s3_url: tuple[str, dict[str, Any]],
) -> None:
    """A librdkafka consumer waiting at the end of a 6-partition shared topic on S3 (moto): each of its fetches
    (every 500 ms) finds the partitions parked and their view current, so the gateway reads only the topic's
    notice once a second (one probe of the next commit, for all partitions), not a probe per partition per
    fetch; its registration heartbeat adds a PUT and a LIST each 10 s."""
    from tests.fixtures_s3 import REQUESTS

    url, options = s3_url
    bucket = url.split("/")[2]
    with LogStore(url, storage_options=options) as store:
        store.create_topic("quiet", 6, {"storage.layout": "shared"})
    with running_gateway(GatewayConfig(url=url, storage_options=options, port=0)) as gw:
        consumer = Consumer(
            {
                "bootstrap.servers": f"127.0.0.1:{gw.port}",
                "group.id": "idle",
                "log_level": 0,
                "isolation.level": "read_committed",
            }
        )
        try:
            consumer.assign([TopicPartition("quiet", p, 0) for p in range(6)])
            started = time.monotonic()
            while time.monotonic() - started < 3:  # positions, first probes: parked
                consumer.consume(100, timeout=0.5)
            before = REQUESTS.of(bucket)
            started = time.monotonic()
            while time.monotonic() - started < 4:
                assert consumer.consume(100, timeout=0.5) == []
            seconds = time.monotonic() - started
            spent = REQUESTS.of(bucket) - before
        finally:
            consumer.close()
    assert sum(spent.values()) <= 1.5 * seconds + 2, (spent, seconds)


def test_a_gateway_reads_a_shared_object_once_for_the_partitions_its_consumers_split(
    s3_url: tuple[str, dict[str, Any]],
) -> None:
    """Two librdkafka consumers, each assigned three partitions of a 6-partition shared topic, wait at its end
    through one gateway on S3 (moto); then 12 shared objects arrive, each holding a run of every partition. The
    gateway reads an object's runs of every partition its clients fetch as one range and serves each
    partition's fetch from it: about one GET per object, where a range per partition made six."""
    from pyspark_logsource.client.producer import Producer as PlogProducer
    from tests.fixtures_s3 import REQUESTS

    url, options = s3_url
    bucket = url.split("/")[2]
    flushes, per_partition = 12, 20
    expected = flushes * 6 * per_partition
    with LogStore(url, storage_options=options) as store:
        store.create_topic("wide", 6, {"storage.layout": "shared", "auto.maintenance.enable": "false"})
    with running_gateway(GatewayConfig(url=url, storage_options=options, port=0)) as gw:
        consumers = [
            Consumer({"bootstrap.servers": f"127.0.0.1:{gw.port}", "group.id": "split", "log_level": 0})
            for _ in range(2)
        ]
        read = 0

        def consume_round() -> int:
            got = 0
            for consumer in consumers:
                messages = consumer.consume(1000, timeout=0.2)
                assert all(m.error() is None for m in messages)
                got += len(messages)
            return got

        try:
            consumers[0].assign([TopicPartition("wide", p, 0) for p in (0, 1, 2)])
            consumers[1].assign([TopicPartition("wide", p, 0) for p in (3, 4, 5)])
            started = time.monotonic()
            while time.monotonic() - started < 2:  # both fetching, at the (empty) topic's end
                assert consume_round() == 0
            before = REQUESTS.shapes(bucket)
            with PlogProducer(url, storage_options=options) as producer:
                for flush in range(flushes):  # one shared object per flush, holding a run of every partition
                    for partition in range(6):
                        for n in range(per_partition):
                            producer.send("wide", f"{flush}-{partition}-{n}".encode() * 50, partition=partition)
                    producer.flush()
            deadline = time.monotonic() + 60
            while read < expected and time.monotonic() < deadline:
                read += consume_round()
            spent = REQUESTS.shapes(bucket) - before
        finally:
            for consumer in consumers:
                consumer.close()
    assert read == expected
    objects = [info.key for info in open_store(url, storage_options=options).list("shared/")]
    assert len(objects) == flushes
    object_gets = sum(n for (kind, shape), n in spent.items() if kind == "GET" and "/shared/" in shape)
    assert 0 < object_gets <= flushes + 2, spent
