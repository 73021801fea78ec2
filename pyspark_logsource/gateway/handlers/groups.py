"""Kafka's classic consumer-group protocol, mapped onto plog's own groups (PROTOCOL.md 11.4).

JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch,
DescribeGroups, ListGroups, DeleteGroups. A Kafka member is a plog group member
run by the gateway (:mod:`..group_bridge`); committed offsets are plog's commit
logs. Static membership (``group.instance.id``) is accepted and ignored: such a
member is treated as a dynamic one. Commit metadata strings are not kept
(OffsetFetch answers ``""``).
"""

from __future__ import annotations

import asyncio
import datetime
import time
from typing import Any

from kio.index import load_response_schema

from coordinator.collection.groups import expire_group
from coordinator.groups import GroupClient, make_member_id
from coordinator.groups.assignors import STRATEGIES
from coordinator.groups.client import list_groups
from coordinator.keys import group_prefix, validate_group_id
from segment_format.errors import CommitFailedError, InvalidConfigError, PlogError, UnknownTopicOrPartitionError
from segment_format.records import now_ms

from ..context import Api, RequestContext
from ..entities import has_field, make, one_code_per_partition
from ..group_bridge import (
    LEADER,
    GroupBridge,
    InconsistentProtocolError,
    KafkaMember,
    encode_assignment,
    encode_subscription,
    parse_subscription,
)

#: Kafka error codes used here.
NONE, UNKNOWN_TOPIC_OR_PARTITION = 0, 3
ILLEGAL_GENERATION, INCONSISTENT_GROUP_PROTOCOL, INVALID_GROUP_ID, UNKNOWN_MEMBER_ID = 22, 23, 24, 25
INVALID_SESSION_TIMEOUT, REBALANCE_IN_PROGRESS = 26, 27
TOPIC_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED = 29, 30
NON_EMPTY_GROUP, GROUP_ID_NOT_FOUND, MEMBER_ID_REQUIRED = 68, 69, 79
UNKNOWN_SERVER_ERROR = -1
#: Sent as ``authorized_operations`` when the client did not ask for them (Kafka's INT32_MIN).
NO_OPERATIONS = -2147483648
#: How long past its rebalance timeout a JoinGroup waits for plog (completers take over at the timeout).
_JOIN_MARGIN_S = 5.0
_JOIN_POLL_S = 0.02


def bridge_of(ctx: RequestContext) -> GroupBridge:
    """The gateway's group bridge (created on first use; the gateway closes it at shutdown)."""
    bridge: GroupBridge = ctx.gateway.service("groups", lambda: GroupBridge(ctx.gateway.root))
    return bridge


def _ms(value: Any) -> int:
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    return int(value)


def _valid_group(group: str) -> bool:
    try:
        validate_group_id(group)
    except InvalidConfigError:
        return False
    return True


def _host(ctx: RequestContext) -> str:
    return "/" + ctx.session.peer.rsplit(":", 1)[0]


# ---------------------------------------------------------------------- JoinGroup


def _join_answer(
    ctx: RequestContext, error: int, member_id: str = "", generation: int = -1, protocol: Any = None
) -> Any:
    return make(
        load_response_schema(11, ctx.api_version),
        throttle_time=0,
        error_code=error,
        generation_id=generation,
        protocol_type="consumer",
        protocol_name=protocol or "",  # not nullable before v7
        leader=LEADER,
        skip_assignment=False,
        member_id=member_id,
        members=[],
    )


async def join_group(ctx: RequestContext, request: Any) -> Any:
    """JoinGroup: start (or rejoin) the client's plog member, answer with the first generation including it."""
    group = request.group_id
    member_id = request.member_id
    if not ctx.allowed("group", group, "read"):
        return _join_answer(ctx, GROUP_AUTHORIZATION_FAILED, member_id)
    if not _valid_group(group):
        return _join_answer(ctx, INVALID_GROUP_ID, member_id)
    session_ms = _ms(request.session_timeout)
    rebalance_ms = _ms(request.rebalance_timeout) if has_field(request, "rebalance_timeout") else session_ms
    if session_ms <= 0:
        return _join_answer(ctx, INVALID_SESSION_TIMEOUT, member_id)
    rebalance_ms = rebalance_ms if rebalance_ms > 0 else session_ms
    # Protocols plog has no assignor for are dropped; a member left with none is refused.
    protocols = [(str(p.name), bytes(p.metadata)) for p in request.protocols if p.name in STRATEGIES]
    try:
        if request.protocol_type != "consumer" or not protocols:
            raise InconsistentProtocolError(
                f"protocol type {request.protocol_type!r} with protocols {[p.name for p in request.protocols]}: "
                f"plog serves consumer groups with {', '.join(STRATEGIES)}"
            )
        _, topics = parse_subscription(protocols[0][1])
    except InconsistentProtocolError:
        return _join_answer(ctx, INCONSISTENT_GROUP_PROTOCOL, member_id)
    bridge = bridge_of(ctx)
    client_id = ctx.session.client_id or "consumer"
    if not member_id:
        member_id = make_member_id(client_id)
        if ctx.api_version >= 4:  # Kafka's KIP-394: the client learns its id first, then joins with it
            return _join_answer(ctx, MEMBER_ID_REQUIRED, member_id)
    member = bridge.member(group, member_id)
    if member is None and request.member_id and await ctx.blocking(bridge.runs_elsewhere, group, member_id):
        # Kafka's coordinator answers a member it does not know this way: the client forgets its id and joins
        # afresh, and the old member leaves by its session timeout (by its gateway's reaper if that one lives).
        return _join_answer(ctx, UNKNOWN_MEMBER_ID, "")
    if member is None:
        try:
            member = bridge.new_member(
                group,
                member_id,
                client_id=client_id,
                client_host=_host(ctx),
                protocols=protocols,
                session_timeout_ms=session_ms,
                rebalance_timeout_ms=rebalance_ms,
            )
        except InconsistentProtocolError:
            return _join_answer(ctx, INCONSISTENT_GROUP_PROTOCOL, member_id)
        except InvalidConfigError:
            return _join_answer(ctx, UNKNOWN_MEMBER_ID, member_id)
        entry = -1
        member.pending += 1
        try:
            await ctx.blocking(member.start, topics)
        finally:
            member.pending -= 1
    else:
        member.touch()
        member.update(topics, protocols, session_ms)
        adopted = member.adopted
        entry = adopted.number if adopted is not None else -1
        stable = member.stable_in()
        # A rejoin with nothing to change (Kafka answers a follower at once): unless plog is rebalancing
        # already and the member has not seen it yet, which one read tells.
        if stable is not None and not await ctx.blocking(member.client.rebalance_marker_exists, stable.number):
            return _join_answer(ctx, NONE, member_id, stable.number, stable.protocol)
        member.acknowledge()
    return await _wait_for_generation(ctx, bridge, member, entry, rebalance_ms)


async def _wait_for_generation(
    ctx: RequestContext, bridge: GroupBridge, member: KafkaMember, entry: int, rebalance_ms: int
) -> Any:
    deadline = time.monotonic() + rebalance_ms / 1000 + _JOIN_MARGIN_S
    member.pending += 1
    try:
        while True:
            member.touch()
            try:
                gen = member.join_step(entry)
            except InvalidConfigError:  # plog left it out for its protocols
                bridge.remove(member.group, member.member_id)
                await ctx.blocking(member.close)
                return _join_answer(ctx, INCONSISTENT_GROUP_PROTOCOL, member.member_id)
            if gen is not None:
                return _join_answer(ctx, NONE, member.member_id, gen.number, gen.protocol)
            if time.monotonic() > deadline:
                return _join_answer(ctx, REBALANCE_IN_PROGRESS, member.member_id)
            await asyncio.sleep(_JOIN_POLL_S)
    finally:
        member.pending -= 1
        member.touch()


# ---------------------------------------------------------------------- SyncGroup, Heartbeat, LeaveGroup


def _sync_answer(ctx: RequestContext, error: int, assignment: bytes = b"", protocol: Any = None) -> Any:
    return make(
        load_response_schema(14, ctx.api_version),
        throttle_time=0,
        error_code=error,
        protocol_type="consumer" if protocol else None,
        protocol_name=protocol,
        assignment=assignment,
    )


async def sync_group(ctx: RequestContext, request: Any) -> Any:
    """SyncGroup: the member's partitions in its generation (withheld cooperative ones are not included)."""
    group = request.group_id
    if not ctx.allowed("group", group, "read"):
        return _sync_answer(ctx, GROUP_AUTHORIZATION_FAILED)
    member = bridge_of(ctx).member(group, request.member_id)
    if member is None:
        return _sync_answer(ctx, UNKNOWN_MEMBER_ID)
    member.touch()
    adopted = member.adopted
    if adopted is None or int(request.generation_id) != adopted.number:
        return _sync_answer(ctx, ILLEGAL_GENERATION)
    version = member.subscription_version(adopted.protocol)
    assignment = encode_assignment(adopted.partitions_of(member.member_id), version)
    return _sync_answer(ctx, NONE, assignment, adopted.protocol)


async def heartbeat(ctx: RequestContext, request: Any) -> Any:
    """Heartbeat: keeps the member alive; REBALANCE_IN_PROGRESS when plog replaces its generation."""
    response = load_response_schema(12, ctx.api_version)
    group = request.group_id
    if not ctx.allowed("group", group, "read"):
        return make(response, throttle_time=0, error_code=GROUP_AUTHORIZATION_FAILED)
    bridge = bridge_of(ctx)
    member = bridge.member(group, request.member_id)
    if member is None:
        return make(response, throttle_time=0, error_code=UNKNOWN_MEMBER_ID)
    member.touch()
    if member.left:  # the plog member left by itself: the client must join again
        bridge.remove(group, member.member_id)
        await ctx.blocking(member.close)
        return make(response, throttle_time=0, error_code=UNKNOWN_MEMBER_ID)
    adopted = member.adopted
    if adopted is None or int(request.generation_id) != adopted.number:
        return make(response, throttle_time=0, error_code=ILLEGAL_GENERATION)
    error = REBALANCE_IN_PROGRESS if member.rebalancing() else NONE
    return make(response, throttle_time=0, error_code=error)


async def leave_group(ctx: RequestContext, request: Any) -> Any:
    """LeaveGroup: the members leave plog's group (a heartbeat saying so; the others rebalance)."""
    response = load_response_schema(13, ctx.api_version)
    group = request.group_id
    if has_field(request, "members"):
        ids = [(m.member_id, m.group_instance_id) for m in request.members]
    else:
        ids = [(request.member_id, None)]
    if not ctx.allowed("group", group, "read"):
        return make(response, throttle_time=0, error_code=GROUP_AUTHORIZATION_FAILED, members=[])
    bridge = bridge_of(ctx)
    answers = []
    for member_id, instance in ids:
        member = bridge.remove(group, member_id)
        if member is not None:
            await ctx.blocking(member.close)
        error = NONE if member is not None else UNKNOWN_MEMBER_ID
        answers.append({"member_id": member_id, "group_instance_id": instance, "error_code": error})
    top = NONE if has_field(request, "members") or not answers else answers[0]["error_code"]
    return make(response, throttle_time=0, error_code=top, members=answers)


# ---------------------------------------------------------------------- offsets


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
    if not ctx.allowed("group", group, "read"):
        return _partition_errors(ctx, request, GROUP_AUTHORIZATION_FAILED)
    if not _valid_group(group):
        return _partition_errors(ctx, request, INVALID_GROUP_ID)
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
    if not ctx.allowed("group", group, "read"):
        return GROUP_AUTHORIZATION_FAILED, {}
    if not _valid_group(group):
        return INVALID_GROUP_ID, {}
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


# ---------------------------------------------------------------------- describe, list, delete


def _state(description: Any) -> str:
    if description.generation == 0 and not description.members and not description.committed:
        return "Dead"  # Kafka's answer for a group that does not exist
    return str(description.state)


async def describe_groups(ctx: RequestContext, request: Any) -> Any:
    """DescribeGroups: plog's view of each group: state, protocol, live members and their assignments."""
    bridge = bridge_of(ctx)
    answers = []
    for group in request.groups:
        if not ctx.allowed("group", group, "describe"):
            answers.append({"error_code": GROUP_AUTHORIZATION_FAILED, "group_id": group, "members": []})
            continue
        if not _valid_group(group):
            answers.append({"error_code": INVALID_GROUP_ID, "group_id": group, "members": []})
            continue
        description = await ctx.blocking(GroupClient(bridge.store, group).describe)
        local = bridge.members_of(group)
        state = _state(description)
        members = []
        for info in description.members:
            if not info.alive:
                continue
            mine = local.get(info.member_id)
            version = mine.subscription_version(description.protocol) if mine is not None else 0
            metadata = mine.metadata.get(description.protocol or "") if mine is not None else None
            members.append(
                {
                    "member_id": info.member_id,
                    "group_instance_id": None,
                    "client_id": info.client_id,
                    "client_host": mine.client_host if mine is not None else "",
                    "member_metadata": metadata or encode_subscription(info.topics),
                    "member_assignment": encode_assignment(info.assignment, version),
                }
            )
        answers.append(
            {
                "error_code": NONE,
                "group_id": group,
                "group_state": state,
                "protocol_type": "consumer" if state != "Dead" else "",
                "protocol_data": description.protocol or "",
                "members": members,
                "authorized_operations": NO_OPERATIONS,
            }
        )
    return make(load_response_schema(15, ctx.api_version), throttle_time=0, groups=answers)


async def list_groups_api(ctx: RequestContext, request: Any) -> Any:
    """ListGroups: the groups under the root (with their state from v4, filtered as asked)."""
    store = ctx.gateway.store
    states = {s.lower() for s in request.states_filter} if has_field(request, "states_filter") else set()
    types = {s.lower() for s in request.types_filter} if has_field(request, "types_filter") else set()
    if types and not types & {"classic", "consumer"}:
        return make(load_response_schema(16, ctx.api_version), throttle_time=0, error_code=NONE, groups=[])
    with_state = ctx.api_version >= 4

    def collect() -> list[dict[str, Any]]:
        out = []
        for group in list_groups(store):
            if not ctx.allowed("group", group, "describe"):
                continue
            state = ""
            if with_state:
                state = _state(GroupClient(store, group).describe())
                if states and state.lower() not in states:
                    continue
            out.append({"group_id": group, "protocol_type": "consumer", "group_state": state, "group_type": "classic"})
        return out

    groups = await ctx.blocking(collect)
    return make(load_response_schema(16, ctx.api_version), throttle_time=0, error_code=NONE, groups=groups)


async def delete_groups(ctx: RequestContext, request: Any) -> Any:
    """DeleteGroups: a group without live members is expired: its committed offsets are cleared (PROTOCOL.md 11.4)."""
    store = ctx.gateway.store
    results = []
    for group in request.groups_names:
        if not ctx.allowed("group", group, "delete"):
            results.append({"group_id": group, "error_code": GROUP_AUTHORIZATION_FAILED})
            continue
        if not _valid_group(group):
            results.append({"group_id": group, "error_code": INVALID_GROUP_ID})
            continue

        def delete(group: str = group) -> int:
            client = GroupClient(store, group)
            if client.active_members():
                return NON_EMPTY_GROUP
            keys = [info.key for info in store.list(group_prefix(group))]
            if not keys:
                return GROUP_ID_NOT_FOUND
            # Expired, not wiped: its committed offsets go, its generation numbering goes on, so a commit
            # racing the deletion is never read as a later group's (PROTOCOL.md 11.4, *Expiry*).
            expire_group(client, keys, at_ms=now_ms(), by="delete-groups")
            return NONE

        results.append({"group_id": group, "error_code": await ctx.blocking(delete)})
    return make(load_response_schema(42, ctx.api_version), throttle_time=0, results=results)


APIS = [
    Api(11, "JoinGroup", 0, 9, join_group),
    Api(14, "SyncGroup", 0, 5, sync_group),
    Api(12, "Heartbeat", 0, 4, heartbeat),
    Api(13, "LeaveGroup", 0, 5, leave_group),
    Api(8, "OffsetCommit", 2, 8, offset_commit),
    Api(9, "OffsetFetch", 1, 8, offset_fetch),
    Api(15, "DescribeGroups", 0, 5, describe_groups),
    Api(16, "ListGroups", 0, 5, list_groups_api),
    Api(42, "DeleteGroups", 0, 2, delete_groups),
]
