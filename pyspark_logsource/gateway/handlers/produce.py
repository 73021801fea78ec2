"""Produce: decode each partition's record batches, check them, gather them, answer with their offsets."""

from __future__ import annotations

import asyncio
from typing import Any

from kio.index import load_response_schema

from segment_format.errors import PlogError, UnknownTopicOrPartitionError
from segment_format.segment import ATTR_TRANSACTIONAL, BatchMeta

from ..batcher import ProduceBatcher, ProduceError, first_offset
from ..context import Api, RequestContext
from ..entities import make
from ..errors import CorruptRecordBatchError
from ..record_batch import decode_batches

NONE, CORRUPT_MESSAGE, UNKNOWN_TOPIC_OR_PARTITION, INVALID_REQUIRED_ACKS = 0, 2, 3, 21
TOPIC_AUTHORIZATION_FAILED, TRANSACTIONAL_ID_AUTHORIZATION_FAILED, KAFKA_STORAGE_ERROR = 29, 53, 56
INVALID_RECORD, UNKNOWN_SERVER_ERROR = 87, -1


def batcher(ctx: RequestContext) -> ProduceBatcher:
    """The gateway's produce batcher, made on first use."""
    services = ctx.gateway.services
    found = services.get("produce")
    if found is None:
        found = services["produce"] = ProduceBatcher(ctx.gateway)
    assert isinstance(found, ProduceBatcher)
    return found


def _failed(answer: dict[str, Any], exc: Exception) -> None:
    """Put Kafka's error for ``exc`` into a partition's answer; re-raises what has no Kafka code."""
    if isinstance(exc, CorruptRecordBatchError):
        answer.update(error_code=CORRUPT_MESSAGE, error_message=str(exc))
    elif isinstance(exc, ProduceError):
        answer.update(error_code=exc.error_code, error_message=str(exc))
    elif isinstance(exc, UnknownTopicOrPartitionError):
        answer.update(error_code=UNKNOWN_TOPIC_OR_PARTITION, error_message=str(exc))
    elif isinstance(exc, PlogError):
        answer.update(error_code=KAFKA_STORAGE_ERROR, error_message=str(exc))
    else:
        raise exc


async def _queue_partition(
    ctx: RequestContext, topic: str, partition: int, records: bytes | None, transactional_id: str | None
) -> tuple[dict[str, Any], list[asyncio.Future[int]] | None]:
    """Decode, check and queue one partition's batches: its answer so far, and the futures of their offsets
    (None when the partition already failed)."""
    answer: dict[str, Any] = {"index": partition, "base_offset": -1, "log_start_offset": -1, "record_errors": []}
    gateway = ctx.gateway
    try:
        meta = await ctx.blocking(gateway.root.topic, topic)
        if not 0 <= partition < meta.partitions:
            raise UnknownTopicOrPartitionError(f"{topic} has no partition {partition}")
        decoded = decode_batches(records or b"", max_uncompressed_bytes=gateway.config.max_request_bytes)
        if any(b.control for b in decoded):
            raise CorruptRecordBatchError(f"{topic}-{partition}: clients may not produce control batches")
        transactions = gateway.services.get("transactions")
        batches = []
        timeout_ms = None
        on_written = None
        for batch in decoded:
            txn = -1
            attributes = batch.attributes & ATTR_TRANSACTIONAL
            if batch.transactional:
                if transactional_id is None or transactions is None:
                    raise ProduceError(f"{topic}-{partition}: a transactional batch outside a transaction", 48)
                txn, timeout_ms, on_written = transactions.produce_context(
                    transactional_id, batch.producer_id, batch.producer_epoch, topic, partition
                )
            meta_of_batch = BatchMeta(
                batch.producer_id, batch.producer_epoch, batch.base_sequence, attributes, transaction=txn
            )
            batches.append((batch.payload, meta_of_batch, batch.payload.nbytes))
        if not batches:
            raise CorruptRecordBatchError(f"{topic}-{partition}: no record batch in the request")
        return answer, await batcher(ctx).enqueue(topic, partition, batches, timeout_ms, on_written)
    except Exception as exc:  # noqa: BLE001 - _failed re-raises what has no Kafka error code
        _failed(answer, exc)
        return answer, None


async def _written(answer: dict[str, Any], futures: list[asyncio.Future[int]] | None) -> dict[str, Any]:
    """A partition's answer once its queued batches are written (or failed)."""
    if futures is None:
        return answer
    try:
        answer["base_offset"] = await first_offset(futures)
        answer["error_code"] = NONE
    except Exception as exc:  # noqa: BLE001 - _failed re-raises what has no Kafka error code
        _failed(answer, exc)
    return answer


async def produce(ctx: RequestContext, request: Any) -> Any:
    """Produce (v3+: record batch v2 only). acks=0 is not answered; acks 1 and -1 are answered once the
    objects exist in the store (a gateway has no replicas: the store's durability is the ISR's)."""
    acks = int(request.acks)
    transactional_id = request.transactional_id
    if transactional_id is not None and not ctx.allowed("transactional_id", transactional_id, "write"):
        code = TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        topics = [
            {
                "name": t.name,
                "partition_responses": [
                    {"index": p.index, "error_code": code, "base_offset": -1} for p in t.partition_data
                ],
            }
            for t in request.topic_data
        ]
        return make(load_response_schema(0, ctx.api_version), responses=topics, throttle_time=0)
    jobs: list[tuple[str, Any]] = []
    denied: dict[str, list[dict[str, Any]]] = {}
    for topic in request.topic_data:
        for part in topic.partition_data:
            if acks not in (0, 1, -1):
                denied.setdefault(topic.name, []).append(
                    {"index": part.index, "error_code": INVALID_REQUIRED_ACKS, "base_offset": -1}
                )
            elif not ctx.allowed("topic", topic.name, "write"):
                denied.setdefault(topic.name, []).append(
                    {"index": part.index, "error_code": TOPIC_AUTHORIZATION_FAILED, "base_offset": -1}
                )
            else:
                records = None if part.records is None else bytes(part.records)
                jobs.append((topic.name, _queue_partition(ctx, topic.name, int(part.index), records, transactional_id)))
    queued = await asyncio.gather(*(job for _, job in jobs))
    if ctx.queued is not None:  # every batch holds its place: the connection's next request may be read
        ctx.queued.set()
    answers = await asyncio.gather(*(_written(answer, futures) for answer, futures in queued))
    if acks == 0:
        return None
    by_topic: dict[str, list[dict[str, Any]]] = {name: list(parts) for name, parts in denied.items()}
    for (name, _), answer in zip(jobs, answers, strict=True):
        by_topic.setdefault(name, []).append(answer)
    return make(
        load_response_schema(0, ctx.api_version),
        responses=[{"name": name, "partition_responses": parts} for name, parts in by_topic.items()],
        throttle_time=0,
    )


APIS = [Api(0, "Produce", 3, 9, produce)]
