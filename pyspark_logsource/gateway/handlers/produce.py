"""Produce: decode each partition's record batches, check them, gather them, answer with their offsets."""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Any

from kio.index import load_response_schema

from segment_format.errors import (
    IncompatibleSchemaError,
    InvalidConfigError,
    InvalidRecordError,
    PlogError,
    UnknownTopicOrPartitionError,
)
from segment_format.segment import ATTR_TRANSACTIONAL, BatchMeta
from segment_format.topic import TopicMetadata, is_compacted

from ..batcher import ProduceBatcher, ProduceError
from ..context import Api, RequestContext
from ..entities import make
from ..errors import CorruptRecordBatchError
from ..record_batch import DecodedBatch, decode_batches

log = logging.getLogger(__name__)

NONE, CORRUPT_MESSAGE, UNKNOWN_TOPIC_OR_PARTITION, INVALID_REQUIRED_ACKS = 0, 2, 3, 21
TOPIC_AUTHORIZATION_FAILED, TRANSACTIONAL_ID_AUTHORIZATION_FAILED, KAFKA_STORAGE_ERROR = 29, 53, 56
INVALID_RECORD, UNKNOWN_SERVER_ERROR = 87, -1


def batcher(ctx: RequestContext) -> ProduceBatcher:
    """The gateway's produce batcher, made on first use."""
    found: ProduceBatcher = ctx.gateway.service("produce", lambda: ProduceBatcher(ctx.gateway))
    return found


async def _queued_then_written(ctx: RequestContext, jobs: list[Any]) -> list[dict[str, Any]]:
    """Run the partitions' jobs one after another up to their queueing, in request order, then let the
    connection go on while they wait for their objects together."""
    tasks = []
    gathering = batcher(ctx)
    gathering.hold()  # the request's partitions go into one flush, not the first alone into one
    try:
        for job in jobs:
            queued = asyncio.Event()
            task = asyncio.ensure_future(job(queued))
            waiter = asyncio.ensure_future(queued.wait())
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            tasks.append(task)
    finally:
        gathering.release()
    ctx.in_order_done()
    return list(await asyncio.gather(*tasks))


async def _partition(
    ctx: RequestContext,
    topic: str,
    partition: int,
    records: bytes | None,
    transactional_id: str | None,
    queued: asyncio.Event,
) -> dict[str, Any]:
    answer: dict[str, Any] = {"index": partition, "base_offset": -1, "log_start_offset": -1, "record_errors": []}
    gateway = ctx.gateway
    try:
        meta = await ctx.blocking(gateway.root.topic, topic)
        if not 0 <= partition < meta.partitions:
            raise UnknownTopicOrPartitionError(f"{topic} has no partition {partition}")
        decoded = decode_batches(records or b"", max_uncompressed_bytes=gateway.config.max_request_bytes)
        _check_for_topic(meta, topic, partition, decoded)
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
        answer["base_offset"] = await batcher(ctx).submit(topic, partition, batches, timeout_ms, on_written, queued)
        answer["error_code"] = NONE
    except CorruptRecordBatchError as exc:
        answer.update(error_code=CORRUPT_MESSAGE, error_message=str(exc))
    except ProduceError as exc:
        # Refused batches are rare and each says why (a sequence gap, a fenced epoch): worth an operator's line.
        log.info("produce refused with Kafka error %d: %s", exc.error_code, exc)
        answer.update(error_code=exc.error_code, error_message=str(exc))
    except UnknownTopicOrPartitionError as exc:
        answer.update(error_code=UNKNOWN_TOPIC_OR_PARTITION, error_message=str(exc))
    except (InvalidRecordError, IncompatibleSchemaError, InvalidConfigError) as exc:
        # Records the log refuses (a typed topic's values, a null key on a compacted topic): not retriable.
        answer.update(error_code=INVALID_RECORD, error_message=str(exc))
    except PlogError as exc:
        answer.update(error_code=KAFKA_STORAGE_ERROR, error_message=str(exc))
    return answer


def _check_for_topic(meta: TopicMetadata, topic: str, partition: int, decoded: list[DecodedBatch]) -> None:
    """Refuse, batch by batch, what the log would refuse for the whole object the batch is gathered into,
    so that one client's bad batch never fails another's (as Kafka refuses only the offending batch)."""
    if meta.value_schemas is not None:
        raise InvalidRecordError(f"{topic} is a typed topic: its values are rows, which Kafka clients cannot produce")
    if is_compacted(meta.config):
        for batch in decoded:
            nulls = batch.payload.column("key").null_count
            if nulls:
                raise InvalidRecordError(
                    f"{topic}-{partition}: {nulls} record(s) without a key; {topic!r} is compacted and every record "
                    "needs a key"
                )


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
                jobs.append(
                    (topic.name, partial(_partition, ctx, topic.name, int(part.index), records, transactional_id))
                )
    # Held until the connection's quota allows the request's bytes, before its batches are queued and before
    # the connection's next request is read (PROTOCOL.md 11.10); the time held is the throttle time.
    size = sum(len(p.records or b"") for t in request.topic_data for p in t.partition_data)
    throttle_ms = await ctx.wait_for_quota("producer_byte_rate", size)
    answers = await _queued_then_written(ctx, [job for _, job in jobs])
    if acks == 0:
        return None
    by_topic: dict[str, list[dict[str, Any]]] = {name: list(parts) for name, parts in denied.items()}
    for (name, _), answer in zip(jobs, answers, strict=True):
        by_topic.setdefault(name, []).append(answer)
    return make(
        load_response_schema(0, ctx.api_version),
        responses=[{"name": name, "partition_responses": parts} for name, parts in by_topic.items()],
        throttle_time=throttle_ms,
    )


APIS = [Api(0, "Produce", 3, 9, produce)]
