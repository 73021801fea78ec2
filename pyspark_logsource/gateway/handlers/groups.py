"""Kafka's classic group protocol, on plog's own groups (PROTOCOL.md 11.4, 11.9).

JoinGroup, SyncGroup, Heartbeat, LeaveGroup, DescribeGroups, ListGroups,
DeleteGroups (offsets are in :mod:`.group_offsets`). A Kafka member is a plog
group member run by the gateway (:mod:`..group_bridge`). When the members'
protocol is one of plog's assignors, plog assigns and every client is a
follower; otherwise (any other assignor, any protocol type such as Connect's)
the generation is client-assigned: the leader's JoinGroup answer carries every
member's metadata, its SyncGroup's assignment is kept in the root, and every
member's SyncGroup answers from it. Static membership (``group.instance.id``)
is accepted and treated as dynamic.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import time
from typing import Any

from kio.index import load_response_schema

from coordinator.collection.groups import expire_group
from coordinator.groups import Generation, GroupClient, make_member_id
from coordinator.groups.client import list_groups
from coordinator.groups.documents import CONSUMER
from coordinator.keys import group_prefix, validate_group_id
from segment_format.errors import InvalidConfigError
from segment_format.records import now_ms

from ..context import Api, RequestContext
from ..entities import has_field, make
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
#: How often a follower's SyncGroup looks for its leader's assignment (one GET each, while the leader computes).
_SYNC_POLL_S = 0.05


def bridge_of(ctx: RequestContext) -> GroupBridge:
    """The gateway's group bridge (created on first use; the gateway closes it at shutdown)."""
    bridge: GroupBridge = ctx.gateway.service("groups", lambda: GroupBridge(ctx.gateway.root))
    return bridge


def _ms(value: Any) -> int:
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    return int(value)


def valid_group(group: str) -> bool:
    """Whether ``group`` is a valid group id (Kafka's topic-name rule)."""
    try:
        validate_group_id(group)
    except InvalidConfigError:
        return False
    return True


def group_error(ctx: RequestContext, group: str) -> int:
    """Kafka's error for a request on ``group`` that may not read it or names no valid group; NONE if neither."""
    if not ctx.allowed("group", group, "read"):
        return GROUP_AUTHORIZATION_FAILED
    return NONE if valid_group(group) else INVALID_GROUP_ID


def _host(ctx: RequestContext) -> str:
    return "/" + ctx.session.peer.rsplit(":", 1)[0]


# ---------------------------------------------------------------------- JoinGroup


def _join_answer(ctx: RequestContext, error: int, member_id: str = "", gen: Generation | None = None) -> Any:
    """JoinGroup's answer: for a client-assigned generation, its leader, and to the leader every member's metadata."""
    leader, members = LEADER, []
    if gen is not None and gen.client_assigned:
        leader = str(gen.leader)
        if member_id == leader:
            members = [
                {"member_id": m, "group_instance_id": None, "metadata": base64.b64decode(info.get("metadata", ""))}
                for m, info in gen.members.items()
            ]
    return make(
        load_response_schema(11, ctx.api_version),
        throttle_time=0,
        error_code=error,
        generation_id=gen.number if gen is not None else -1,
        protocol_type=gen.protocol_type if gen is not None else CONSUMER,
        protocol_name=(gen.protocol if gen is not None else None) or "",  # not nullable before v7
        leader=leader,
        skip_assignment=False,
        member_id=member_id,
        members=members,
    )


def _refusal(bridge: GroupBridge, group: str, protocol_type: str, names: list[str]) -> str | None:
    """Why Kafka's coordinator would refuse a new member at once: its type or protocols fit no live member's.

    Kafka checks a joining member against the protocols every current member
    supports; plog would reject it when completing anyway (PROTOCOL.md 11.4),
    after a rebalance the others need not go through.
    """
    client = bridge.client(group)
    latest = client.latest_generation()
    if not latest.members:
        return None
    # Members heard from within twice their session timeout: a loaded machine's late refresh must not let in a
    # member the live ones would reject anyway, after a rebalance of them all.
    at = now_ms()
    heard = client.heartbeats()
    live = {m for m in latest.members if m in heard and heard[m].alive_at(at, skew_ms=heard[m].session_timeout_ms)}
    if not live:
        return None
    if protocol_type != latest.protocol_type:
        return f"protocol type {protocol_type!r}; the group's is {latest.protocol_type!r}"
    common = set.intersection(*(set(latest.members[m].get("protocols", ())) for m in live))
    if not common & set(names):
        return f"protocols {names}; every member of the group supports {sorted(common)}"
    return None


async def join_group(ctx: RequestContext, request: Any) -> Any:
    """JoinGroup: start (or rejoin) the client's plog member, answer with the first generation including it."""
    group = request.group_id
    member_id = request.member_id
    error = group_error(ctx, group)
    if error != NONE:
        return _join_answer(ctx, error, member_id)
    session_ms = _ms(request.session_timeout)
    rebalance_ms = _ms(request.rebalance_timeout) if has_field(request, "rebalance_timeout") else session_ms
    if session_ms <= 0:
        return _join_answer(ctx, INVALID_SESSION_TIMEOUT, member_id)
    rebalance_ms = rebalance_ms if rebalance_ms > 0 else session_ms
    protocols = [(str(p.name), bytes(p.metadata)) for p in request.protocols]
    protocol_type = str(request.protocol_type or "")
    topics: tuple[str, ...] = ()
    try:
        if not protocol_type or not protocols:
            raise InconsistentProtocolError(f"protocol type {protocol_type!r} with protocols {protocols}")
        if protocol_type == CONSUMER:  # every consumer protocol's metadata is a ConsumerProtocolSubscription
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
        if await ctx.blocking(_refusal, bridge, group, protocol_type, [name for name, _ in protocols]):
            return _join_answer(ctx, INCONSISTENT_GROUP_PROTOCOL, member_id)
        try:
            member = bridge.new_member(
                group,
                member_id,
                client_id=client_id,
                client_host=_host(ctx),
                protocols=protocols,
                session_timeout_ms=session_ms,
                rebalance_timeout_ms=rebalance_ms,
                protocol_type=protocol_type,
            )
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
            if not (stable.client_assigned and stable.leader == member_id):
                return _join_answer(ctx, NONE, member_id, stable)
            if await ctx.blocking(member.client.client_assignment, stable.number) is None:
                return _join_answer(ctx, NONE, member_id, stable)  # a retried join: it has yet to assign
            # The leader's client rejoins when its view of the topics changed: Kafka's coordinator rebalances.
            reason = f"{member_id}, the leader, rejoined"
            await ctx.blocking(member.client.create_rebalance_marker, stable.number, member_id, reason)
            member.wake()
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
                return _join_answer(ctx, NONE, member.member_id, gen)
            if time.monotonic() > deadline:
                return _join_answer(ctx, REBALANCE_IN_PROGRESS, member.member_id)
            await asyncio.sleep(_JOIN_POLL_S)
    finally:
        member.pending -= 1
        member.touch()


# ---------------------------------------------------------------------- SyncGroup, Heartbeat, LeaveGroup


def _sync_answer(ctx: RequestContext, error: int, assignment: bytes = b"", gen: Generation | None = None) -> Any:
    return make(
        load_response_schema(14, ctx.api_version),
        throttle_time=0,
        error_code=error,
        protocol_type=gen.protocol_type if gen is not None else None,
        protocol_name=gen.protocol if gen is not None else None,
        assignment=assignment,
    )


async def sync_group(ctx: RequestContext, request: Any) -> Any:
    """SyncGroup: the member's share of its generation: plog's assignment, or the one its leader sent."""
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
    for name, mine in (("protocol_type", adopted.protocol_type), ("protocol_name", adopted.protocol)):
        sent = getattr(request, name, None) if has_field(request, name) else None
        if sent is not None and sent != mine:  # Kafka's check (SyncGroup v5)
            return _sync_answer(ctx, INCONSISTENT_GROUP_PROTOCOL)
    if adopted.client_assigned:
        return await _client_assigned_share(ctx, member, adopted, request)
    version = member.subscription_version(adopted.protocol)
    assignment = encode_assignment(adopted.partitions_of(member.member_id), version)
    return _sync_answer(ctx, NONE, assignment, adopted)


async def _client_assigned_share(ctx: RequestContext, member: KafkaMember, gen: Generation, request: Any) -> Any:
    """The leader stores its assignment once; every member waits for it and takes its bytes (PROTOCOL.md 11.4)."""
    client = member.client
    if member.member_id == gen.leader:
        sent = {str(a.member_id): bytes(a.assignment) for a in request.assignments}
        created = await ctx.blocking(client.create_client_assignment, gen, member.member_id, sent)
        return _sync_answer(ctx, NONE, created.bytes_of(member.member_id), gen)
    deadline = time.monotonic() + member.max_poll_interval_ms / 1000 + _JOIN_MARGIN_S
    member.pending += 1
    try:
        while True:
            member.touch()
            stored = await ctx.blocking(client.client_assignment, gen.number)
            if stored is not None:
                return _sync_answer(ctx, NONE, stored.bytes_of(member.member_id), gen)
            if member.rebalancing() or time.monotonic() > deadline:  # the leader never sent it: rejoin
                return _sync_answer(ctx, REBALANCE_IN_PROGRESS)
            await asyncio.sleep(_SYNC_POLL_S)
    finally:
        member.pending -= 1
        member.touch()


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
        if not valid_group(group):
            answers.append({"error_code": INVALID_GROUP_ID, "group_id": group, "members": []})
            continue
        client = GroupClient(bridge.store, group)
        description = await ctx.blocking(client.describe)
        local = bridge.members_of(group)
        state = _state(description)
        recorded = (await ctx.blocking(client.latest_generation)).members if description.client_assigned else {}
        members = []
        for info in description.members:
            if not info.alive:
                continue
            mine = local.get(info.member_id)
            version = mine.subscription_version(description.protocol) if mine is not None else 0
            metadata = mine.metadata.get(description.protocol or "") if mine is not None else None
            if description.client_assigned:  # as Kafka returns them: the member's metadata, the leader's bytes
                metadata = base64.b64decode(recorded.get(info.member_id, {}).get("metadata", ""))
                assignment = (description.client_assignment or {}).get(info.member_id, b"")
            else:
                metadata = metadata or encode_subscription(info.topics)
                assignment = encode_assignment(info.assignment, version)
            members.append(
                {
                    "member_id": info.member_id,
                    "group_instance_id": None,
                    "client_id": info.client_id,
                    "client_host": mine.client_host if mine is not None else "",
                    "member_metadata": metadata,
                    "member_assignment": assignment,
                }
            )
        answers.append(
            {
                "error_code": NONE,
                "group_id": group,
                "group_state": state,
                "protocol_type": description.protocol_type if state != "Dead" else "",
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
            client = GroupClient(store, group)
            if with_state:
                description = client.describe()
                state, protocol_type = _state(description), description.protocol_type
                if states and state.lower() not in states:
                    continue
            else:
                state, protocol_type = "", client.latest_generation().protocol_type
            row = {"group_id": group, "protocol_type": protocol_type, "group_state": state}
            out.append({**row, "group_type": "classic"})
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
        if not valid_group(group):
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
    Api(15, "DescribeGroups", 0, 5, describe_groups),
    Api(16, "ListGroups", 0, 5, list_groups_api),
    Api(42, "DeleteGroups", 0, 2, delete_groups),
]
