"""OffsetCommit and OffsetFetch: a group's committed offsets are plog's commit logs (PROTOCOL.md 11.4).

A member commits in its generation through its plog member (run by
:mod:`..group_bridge`); a client without a member commits standalone while the
group has no live member. Commit metadata strings are not kept (OffsetFetch
answers ``""``).
"""

from __future__ import annotations

from typing import Any

from kio.index import load_response_schema

from segment_format.errors import CommitFailedError, PlogError, UnknownTopicOrPartitionError

from ..context import Api, RequestContext
from ..entities import has_field, make, one_code_per_partition
from ..group_bridge import GroupBridge
from .groups import (
    ILLEGAL_GENERATION,
    NONE,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_MEMBER_ID,
    UNKNOWN_TOPIC_OR_PARTITION,
    bridge_of,
    group_error,
)


def _partition_errors(ctx: RequestContext, request: Any, code: int) -> Any:
    return one_code_per_partition(load_response_schema(8, ctx.api_version), request.topics, code)


def _partition_count(ctx: RequestContext, topic: str) -> int | None:
    try:
        return ctx.gateway.root.topic(topic).partitions
    except UnknownTopicOrPartitionError:
        return None
    except PlogError:
        return None


async def offset_commit(ctx: RequestContext, request: Any) -> Any:
    """OffsetCommit: in the member's generation through plog's commit log, or standalone in an empty group."""
    group = request.group_id
    error = group_error(ctx, group)
    if error != NONE:
        return _partition_errors(ctx, request, error)
    generation = int(request.generation_id_or_member_epoch)
    member_id = request.member_id
    bridge = bridge_of(ctx)

    def check() -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
        wanted: dict[tuple[str, int], int] = {}
        errors: dict[tuple[str, int], int] = {}
        for t in request.topics:
            count = _partition_count(ctx, t.name) if ctx.allowed("topic", t.name, "read") else -1
            for p in t.partitions:
                tp = (str(t.name), int(p.partition_index))
                if count == -1:
                    errors[tp] = TOPIC_AUTHORIZATION_FAILED
                elif count is None or not 0 <= tp[1] < count:
                    errors[tp] = UNKNOWN_TOPIC_OR_PARTITION
                else:
                    wanted[tp] = int(p.committed_offset)
        return wanted, errors

    wanted, errors = await ctx.blocking(check)
    if wanted:
        if not member_id and generation < 0:
            by = f"kafka-{ctx.session.client_id or 'consumer'}"
            try:
                await ctx.blocking(bridge.client(group).standalone_commit, wanted, by)
            except CommitFailedError:  # the group has live members: only they commit (PROTOCOL.md 11.4)
                errors.update(dict.fromkeys(wanted, UNKNOWN_MEMBER_ID))
        else:
            errors.update(await _member_commit(ctx, bridge, group, member_id, generation, wanted))
    return make(
        load_response_schema(8, ctx.api_version),
        throttle_time=0,
        topics=[
            {
                "name": t.name,
                "partitions": [
                    {"partition_index": p.partition_index, "error_code": errors.get((t.name, p.partition_index), NONE)}
                    for p in t.partitions
                ],
            }
            for t in request.topics
        ],
    )


async def _member_commit(
    ctx: RequestContext,
    bridge: GroupBridge,
    group: str,
    member_id: str,
    generation: int,
    wanted: dict[tuple[str, int], int],
) -> dict[tuple[str, int], int]:
    """Per-partition errors of a member's commit in its generation."""
    member = bridge.member(group, member_id)
    if member is None:
        return dict.fromkeys(wanted, UNKNOWN_MEMBER_ID)
    member.touch()
    adopted = member.adopted
    if adopted is None or adopted.number != generation:
        return dict.fromkeys(wanted, ILLEGAL_GENERATION)
    # Only a partition's owner commits it in a generation (PROTOCOL.md 11.4, *Who may commit*).
    errors = {tp: ILLEGAL_GENERATION for tp in wanted if not adopted.may_commit(member.member_id, tp)}
    allowed = {tp: o for tp, o in wanted.items() if tp not in errors}
    if allowed:
        try:
            await ctx.blocking(member.commit, allowed)
        except CommitFailedError:  # the group moved on without it: Kafka's CommitFailed, the client rejoins
            errors.update(dict.fromkeys(allowed, ILLEGAL_GENERATION))
    return errors


def _fetch_topics(
    ctx: RequestContext, committed: dict[tuple[str, int], int], topics: Any, v1: bool, error: int = NONE
) -> list[dict[str, Any]]:
    """OffsetFetch's topics: the requested partitions (all committed ones when ``topics`` is None)."""
    wanted: dict[str, list[int]] = {}
    if topics is None:
        for topic, partition in sorted(committed):
            if ctx.allowed("topic", topic, "describe"):
                wanted.setdefault(topic, []).append(partition)
    else:
        for t in topics:
            wanted.setdefault(str(t.name), []).extend(int(p) for p in t.partition_indexes)
    out = []
    for topic, partitions in wanted.items():
        readable = ctx.allowed("topic", topic, "describe")
        entries = []
        for partition in partitions:
            code = error if v1 else NONE
            if not readable:
                code = TOPIC_AUTHORIZATION_FAILED
            entries.append(
                {
                    "partition_index": partition,
                    "committed_offset": committed.get((topic, partition), -1) if code == NONE else -1,
                    "committed_leader_epoch": -1,
                    "metadata": "",
                    "error_code": code,
                }
            )
        out.append({"name": topic, "partitions": entries})
    return out


async def _committed(ctx: RequestContext, group: str) -> tuple[int, dict[tuple[str, int], int]]:
    error = group_error(ctx, group)
    if error != NONE:
        return error, {}
    return NONE, await ctx.blocking(bridge_of(ctx).client(group).committed)


async def offset_fetch(ctx: RequestContext, request: Any) -> Any:
    """OffsetFetch: the group's committed offsets from plog (-1 for a partition without one)."""
    response = load_response_schema(9, ctx.api_version)
    if has_field(request, "groups"):  # v8+: several groups in one request
        groups = []
        for g in request.groups:
            error, committed = await _committed(ctx, g.group_id)
            topics = _fetch_topics(ctx, committed, g.topics, False) if error == NONE else []
            groups.append({"group_id": g.group_id, "topics": topics, "error_code": error})
        return make(response, throttle_time=0, groups=groups)
    error, committed = await _committed(ctx, request.group_id)
    v1 = not has_field(response, "error_code")
    if error != NONE and not v1:
        return make(response, throttle_time=0, topics=[], error_code=error)
    topics = _fetch_topics(ctx, committed, request.topics, v1, error)
    return make(response, throttle_time=0, topics=topics, error_code=NONE)


APIS = [
    Api(8, "OffsetCommit", 2, 8, offset_commit),
    Api(9, "OffsetFetch", 1, 8, offset_fetch),
]
