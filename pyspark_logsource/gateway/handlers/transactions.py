"""InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn."""

from __future__ import annotations

from typing import Any

from kio.index import load_response_schema

from coordinator.transactions import MAX_TRANSACTION_TIMEOUT_MS
from segment_format.errors import InvalidConfigError, PlogError

from ..batcher import ProduceError
from ..context import Api, RequestContext
from ..entities import has_field, make, one_code_per_partition
from ..transactions import INVALID_TRANSACTION_TIMEOUT, GatewayTransactions

NONE, TRANSACTIONAL_ID_AUTHORIZATION_FAILED, TOPIC_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED = 0, 53, 29, 30
CLUSTER_AUTHORIZATION_FAILED, COORDINATOR_NOT_AVAILABLE = 31, 15


def transactions(ctx: RequestContext) -> GatewayTransactions:
    """The gateway's transaction service, made on first use."""
    gateway = ctx.gateway
    found: GatewayTransactions = gateway.service(
        "transactions",
        lambda: GatewayTransactions(gateway.store, gateway.root.notify_topics, gateway.root.protocol),
    )
    return found


async def init_producer_id(ctx: RequestContext, request: Any) -> Any:
    """InitProducerId: a producer id for an idempotent producer, or a transactional id's fencing init."""
    response_type = load_response_schema(22, ctx.api_version)
    tid = request.transactional_id

    def refused(code: int) -> Any:
        return make(response_type, throttle_time=0, error_code=code, producer_id=-1, producer_epoch=-1)

    if tid is not None and not ctx.allowed("transactional_id", tid, "write"):
        return refused(TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    # Kafka's rule for an idempotent producer: idempotent_write on the cluster, or write on any topic (a
    # principal that may write somewhere may get a producer id to write there without duplicates).
    if tid is None and not (
        ctx.allowed("cluster", "kafka-cluster", "idempotent_write") or ctx.allowed_on_any("topic", "write")
    ):
        return refused(CLUSTER_AUTHORIZATION_FAILED)
    producer_id = int(request.producer_id) if has_field(request, "producer_id") else -1
    producer_epoch = int(request.producer_epoch) if has_field(request, "producer_epoch") else -1
    timeout_ms = int(request.transaction_timeout.total_seconds() * 1000)
    if tid is not None and timeout_ms > MAX_TRANSACTION_TIMEOUT_MS and transactions(ctx).coordinator.bounded_history:
        # Kafka's answer to a timeout above transaction.max.timeout.ms (PROTOCOL.md 11.2, *Collection*).
        return refused(INVALID_TRANSACTION_TIMEOUT)
    try:
        pid, epoch = await ctx.blocking(
            transactions(ctx).init_producer_id,
            tid,
            timeout_ms,
            producer_id,
            producer_epoch,
            ctx.session.client_id or "",
        )
    except InvalidConfigError:  # a transactional id reserved for the Spark sink (PROTOCOL.md 11.3): not retriable
        return refused(TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    except PlogError:
        return refused(COORDINATOR_NOT_AVAILABLE)
    return make(response_type, throttle_time=0, error_code=NONE, producer_id=pid, producer_epoch=epoch)


async def add_partitions_to_txn(ctx: RequestContext, request: Any) -> Any:
    """AddPartitionsToTxn (v0..v3): begins the transaction; the partitions need no registration in plog."""
    tid = (
        request.v3_and_below_transactional_id
        if has_field(request, "v3_and_below_transactional_id")
        else request.transactional_id
    )
    pid = request.v3_and_below_producer_id if has_field(request, "v3_and_below_producer_id") else request.producer_id
    epoch = (
        request.v3_and_below_producer_epoch
        if has_field(request, "v3_and_below_producer_epoch")
        else request.producer_epoch
    )
    topics = request.v3_and_below_topics if has_field(request, "v3_and_below_topics") else request.topics
    code = NONE
    if not ctx.allowed("transactional_id", tid, "write"):
        code = TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    else:
        try:
            await ctx.blocking(transactions(ctx).begin, tid, int(pid), int(epoch))
        except ProduceError as exc:
            code = exc.error_code
        except PlogError:
            code = COORDINATOR_NOT_AVAILABLE
    results = []
    for topic in topics:
        topic_code = code if code or ctx.allowed("topic", topic.name, "write") else TOPIC_AUTHORIZATION_FAILED
        results.append(
            {
                "name": topic.name,
                "results_by_partition": [
                    {"partition_index": p, "partition_error_code": topic_code} for p in topic.partitions
                ],
            }
        )
    response_type = load_response_schema(24, ctx.api_version)
    field_name = (
        "results_by_topic_v3_and_below" if has_field(response_type, "results_by_topic_v3_and_below") else "results"
    )
    return make(response_type, throttle_time=0, **{field_name: results})


async def add_offsets_to_txn(ctx: RequestContext, request: Any) -> Any:
    """AddOffsetsToTxn: begins the transaction if needed; offsets come with TxnOffsetCommit."""
    code = NONE
    if not ctx.allowed("transactional_id", request.transactional_id, "write"):
        code = TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    elif not ctx.allowed("group", request.group_id, "read"):
        code = GROUP_AUTHORIZATION_FAILED
    else:
        try:
            await ctx.blocking(
                transactions(ctx).begin, request.transactional_id, int(request.producer_id), int(request.producer_epoch)
            )
        except ProduceError as exc:
            code = exc.error_code
    return make(load_response_schema(25, ctx.api_version), throttle_time=0, error_code=code)


async def txn_offset_commit(ctx: RequestContext, request: Any) -> Any:
    """TxnOffsetCommit: consumer offsets that become the group's when the transaction commits (11.2)."""
    code = NONE
    if not ctx.allowed("group", request.group_id, "read"):
        code = GROUP_AUTHORIZATION_FAILED
    else:
        offsets = {
            (t.name, int(p.partition_index)): int(p.committed_offset) for t in request.topics for p in t.partitions
        }
        try:
            transactions(ctx).add_offsets(
                request.transactional_id,
                int(request.producer_id),
                int(request.producer_epoch),
                request.group_id,
                offsets,
            )
        except ProduceError as exc:
            code = exc.error_code
    return one_code_per_partition(load_response_schema(28, ctx.api_version), request.topics, code)


async def end_txn(ctx: RequestContext, request: Any) -> Any:
    """EndTxn: commit or abort, by creating the transaction's decision object."""
    if not ctx.allowed("transactional_id", request.transactional_id, "write"):
        code = TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    else:
        try:
            code = await ctx.blocking(
                transactions(ctx).end,
                request.transactional_id,
                int(request.producer_id),
                int(request.producer_epoch),
                bool(request.committed),
            )
        except PlogError:
            code = COORDINATOR_NOT_AVAILABLE
    return make(load_response_schema(26, ctx.api_version), throttle_time=0, error_code=code)


APIS = [
    Api(22, "InitProducerId", 0, 4, init_producer_id),
    Api(24, "AddPartitionsToTxn", 0, 3, add_partitions_to_txn),
    Api(25, "AddOffsetsToTxn", 0, 3, add_offsets_to_txn),
    Api(28, "TxnOffsetCommit", 0, 3, txn_offset_commit),
    Api(26, "EndTxn", 0, 3, end_txn),
]
