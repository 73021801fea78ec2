"""ListOffsets: the earliest, the latest (or last stable) and the first offset at a timestamp."""

from __future__ import annotations

from typing import Any

from kio.index import load_response_schema

from segment_format.errors import PlogError, UnknownTopicOrPartitionError

from ..context import Api, RequestContext
from ..entities import has_field, make
from .fetch import _resolver

NONE, UNKNOWN_TOPIC_OR_PARTITION, TOPIC_AUTHORIZATION_FAILED, KAFKA_STORAGE_ERROR = 0, 3, 29, 56
LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3


def _offset(ctx: RequestContext, topic: str, partition: int, timestamp: int, committed: bool) -> dict[str, Any]:
    answer: dict[str, Any] = {"partition_index": partition, "timestamp": -1, "offset": -1, "leader_epoch": 0}
    try:
        meta = ctx.gateway.root.topic(topic)
        if not 0 <= partition < meta.partitions:
            raise UnknownTopicOrPartitionError(f"{topic} has no partition {partition}")
        log = ctx.gateway.root.partition(topic, partition, meta)
        view = log.view(refresh=True)
        if timestamp == EARLIEST:
            answer["offset"] = view.start_offset
        elif timestamp in (LATEST, MAX_TIMESTAMP) or timestamp < 0:
            answer["offset"] = log.last_stable_offset(_resolver(ctx)) if committed else view.end_offset
        else:
            found = log.offset_for_timestamp(timestamp)
            if found is not None:
                answer.update(offset=found, timestamp=timestamp)
        answer["error_code"] = NONE
        answer["old_style_offsets"] = [answer["offset"]]
    except UnknownTopicOrPartitionError:
        answer["error_code"] = UNKNOWN_TOPIC_OR_PARTITION
    except PlogError:
        answer["error_code"] = KAFKA_STORAGE_ERROR
    return answer


async def list_offsets(ctx: RequestContext, request: Any) -> Any:
    """ListOffsets (v1..v7)."""
    committed = has_field(request, "isolation_level") and int(request.isolation_level) == 1

    def collect() -> list[dict[str, Any]]:
        topics = []
        for topic in request.topics:
            parts = []
            for p in topic.partitions:
                if not ctx.allowed("topic", topic.name, "describe"):
                    parts.append({"partition_index": p.partition_index, "error_code": TOPIC_AUTHORIZATION_FAILED})
                else:
                    parts.append(_offset(ctx, topic.name, int(p.partition_index), int(p.timestamp), committed))
            topics.append({"name": topic.name, "partitions": parts})
        return topics

    return make(load_response_schema(2, ctx.api_version), throttle_time=0, topics=await ctx.blocking(collect))


APIS = [Api(2, "ListOffsets", 1, 7, list_offsets)]
