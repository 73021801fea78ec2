"""Fetch: read the partitions from the client's offsets, as Kafka record batches; long-poll at the end."""

from __future__ import annotations

import logging
import time
from typing import Any

import pyarrow as pa
from kio.index import load_response_schema

from coordinator.transactions import TransactionCoordinator
from segment_format.errors import OffsetOutOfRangeError, PlogError, UnknownTopicOrPartitionError
from segment_format.log.reader import READ_COMMITTED, READ_UNCOMMITTED
from segment_format.log.shared_spans import SharedSpans
from segment_format.notice import default_notice_interval_ms

from ..context import Api, RequestContext
from ..entities import make
from ..record_batch import encode_batch
from ..tails import TailWatch

NONE, OFFSET_OUT_OF_RANGE, UNKNOWN_TOPIC_OR_PARTITION, TOPIC_AUTHORIZATION_FAILED = 0, 1, 3, 29
KAFKA_STORAGE_ERROR, UNKNOWN_SERVER_ERROR = 56, -1
#: A partition fetched through any connection within this long is among those whose runs are read together.
FETCHED_LATELY_S = 30.0

log = logging.getLogger(__name__)


class FetchedPartitions:
    """The partitions of each topic that the gateway's clients fetched lately, through any connection, said to
    the root's shared spans (``SharedSpans.want``): a shared object's runs of all of them are then read as one
    range, once, and each partition's fetch takes its run from it, instead of one range read per partition.

    Consumers of one group split a topic's partitions over connections, each fetching its own few; what
    the gateway reads for them is the union. A partition no one fetched for :data:`FETCHED_LATELY_S` leaves
    the union when its topic is next fetched. Used from the event loop only, and only on a store billed per
    request: on a local root a range read costs nothing, and a gateway writing there at dozens of flushes a
    second held hundreds of MiB more at its peak with spans than without."""

    def __init__(self, spans: SharedSpans) -> None:
        self._spans = spans
        self._seen: dict[str, dict[int, float]] = {}

    def note(self, fetched: dict[str, set[int]], now: float) -> None:
        """``fetched``: the partitions of each topic one Fetch request asks for, at ``now`` (monotonic)."""
        for topic, partitions in fetched.items():
            seen = self._seen.setdefault(topic, {})
            known = set(seen)
            for partition in partitions:
                seen[partition] = now
            for partition in [p for p, at in seen.items() if now - at > FETCHED_LATELY_S]:
                del seen[partition]
            if set(seen) != known:
                self._spans.want(topic, seen)


def fetched_partitions(ctx: RequestContext) -> FetchedPartitions:
    """The gateway's record of the partitions fetched lately, made on first use."""
    found: FetchedPartitions = ctx.gateway.service(
        "fetched", lambda: FetchedPartitions(ctx.gateway.root.index_cache.spans)
    )
    return found


def tails(ctx: RequestContext) -> TailWatch:
    """The gateway's shared tail watch, made on first use."""
    root = ctx.gateway.root
    found: TailWatch = ctx.gateway.service(
        "fetch",
        lambda: TailWatch(
            ctx.gateway.store,
            default_notice_interval_ms(ctx.gateway.store) / 1000,
            features=lambda: root.protocol.version.writer_features,
            read_topic=root.topic_change,
        ),
    )
    return found


def resolver(ctx: RequestContext) -> Any:
    root = ctx.gateway.root
    return ctx.gateway.service(
        "resolver", lambda: TransactionCoordinator(root.store, root.protocol).for_reader(root).resolve
    )


def _read_partition(
    ctx: RequestContext,
    watch: TailWatch,
    topic: str,
    partition: int,
    offset: int,
    max_bytes: int,
    isolation: str,
    max_decoded_bytes: int | None,
) -> tuple[dict[str, Any], int]:
    """One partition's answer and the bytes it carries (runs in a thread)."""
    gateway = ctx.gateway
    answer: dict[str, Any] = {"partition_index": partition, "aborted_transactions": [], "preferred_read_replica": -1}
    try:
        meta = gateway.root.topic(topic)
        if not 0 <= partition < meta.partitions:
            raise UnknownTopicOrPartitionError(f"{topic} has no partition {partition}")
        log = gateway.root.partition(topic, partition, meta)
        generation = watch.generation(topic)
        parked = watch.is_parked(topic, partition, offset)
        if parked:
            batches, next_offset = [], offset
        else:
            batches, next_offset = log.read(
                offset,
                max_bytes=max_bytes,
                isolation=isolation,
                resolver=resolver(ctx) if isolation == READ_COMMITTED else None,
                max_decoded_bytes=max_decoded_bytes,
            )
            if not batches and next_offset == offset:
                watch.park(topic, partition, offset, generation)
        view = log.view(refresh=False)
        high_watermark = max(view.end_offset, next_offset)
        # Parked: its notice says nothing was appended since it was probed, so the view held is current (no probe).
        if isolation == READ_COMMITTED:
            stable = log.last_stable_offset(resolver(ctx), follow=not parked)
        else:
            stable = high_watermark
        records = b"".join(encode_batch(batch) for batch in batches if batch.num_rows)
        answer.update(
            error_code=NONE,
            high_watermark=high_watermark,
            last_stable_offset=stable,
            log_start_offset=view.start_offset,
            records=records,
        )
        return answer, len(records)
    except OffsetOutOfRangeError:
        code = OFFSET_OUT_OF_RANGE
    except UnknownTopicOrPartitionError:
        code = UNKNOWN_TOPIC_OR_PARTITION
    except PlogError:
        code = KAFKA_STORAGE_ERROR
    except (TypeError, ValueError, pa.ArrowException) as exc:
        # A typed topic's values are rows, not bytes: Kafka's records cannot carry them (README: not supported).
        log.warning("fetch from %s-%d cannot be answered: %s", topic, partition, exc)
        code = UNKNOWN_SERVER_ERROR
    answer.update(error_code=code, high_watermark=-1, last_stable_offset=-1, log_start_offset=-1, records=None)
    return answer, 0


async def fetch(ctx: RequestContext, request: Any) -> Any:
    """Fetch (v4..v12): records from each asked offset; waits up to ``max_wait`` for ``min_bytes``."""
    watch = tails(ctx)
    isolation = READ_COMMITTED if int(request.isolation_level) == 1 else READ_UNCOMMITTED
    max_wait_s = request.max_wait.total_seconds()
    deadline = time.monotonic() + max_wait_s
    wanted = [
        (t.topic, int(p.partition), int(p.fetch_offset), int(p.partition_max_bytes))
        for t in request.topics
        for p in t.partitions
    ]
    denied = {topic for topic, *_ in wanted if not ctx.allowed("topic", topic, "read")}
    if ctx.gateway.store.billed_per_request:
        asked: dict[str, set[int]] = {}
        for topic, partition, *_ in wanted:
            if topic not in denied:
                asked.setdefault(topic, set()).add(partition)
        fetched_partitions(ctx).note(asked, time.monotonic())

    def read_all() -> tuple[list[tuple[str, dict[str, Any]]], int]:
        # A round: one probe of a shared topic's next commit serves all its partitions in it (a probe made
        # since the round began, by this fetch or another, is as fresh), not one probe per partition.
        ctx.gateway.root.index_cache.round_started = time.monotonic()
        ids = {}
        for topic in {w[0] for w in wanted} - denied:
            try:
                ids[topic] = ctx.gateway.root.topic(topic).topic_id
            except PlogError:
                continue
        watch.refresh(ids)
        # A response is at most the connection's quota's burst (at least one record), so that it is held for
        # about a second at most and the bound holds over any interval (PROTOCOL.md 11.10).
        step = ctx.quota("consumer_byte_rate").step_bytes()
        budget = int(request.max_bytes) if step is None else min(int(request.max_bytes), step)
        out, total = [], 0
        for topic, partition, offset, partition_max in wanted:
            if topic in denied:
                out.append(
                    (
                        topic,
                        {
                            "partition_index": partition,
                            "error_code": TOPIC_AUTHORIZATION_FAILED,
                            "high_watermark": -1,
                            "records": None,
                        },
                    )
                )
                continue
            answer, size = _read_partition(
                ctx,
                watch,
                topic,
                partition,
                offset,
                max(1, min(partition_max, budget)) if total == 0 else min(partition_max, budget),
                isolation,
                None if step is None else max(1, budget),
            )
            if total and size > budget:  # only the first partition may go over the response's max
                answer["records"] = b""
                size = 0
            total += size
            budget -= size
            out.append((topic, answer))
        return out, total

    while True:
        appended = watch.appended()
        answers, total = await ctx.blocking(read_all)
        remaining = deadline - time.monotonic()
        if total >= max(1, int(request.min_bytes)) or remaining <= 0 or any(a["error_code"] for _, a in answers):
            break
        await watch.wait(appended, min(remaining, watch.interval_s))
    # Held until the connection's quota allows its bytes (PROTOCOL.md 11.10); the time held is the throttle time.
    throttle_ms = await ctx.wait_for_quota("consumer_byte_rate", total)
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for topic, answer in answers:
        by_topic.setdefault(topic, []).append(answer)
    return make(
        load_response_schema(1, ctx.api_version),
        throttle_time=throttle_ms,
        error_code=NONE,
        session_id=0,
        responses=[{"topic": topic, "partitions": parts} for topic, parts in by_topic.items()],
    )


APIS = [Api(1, "Fetch", 4, 12, fetch)]
