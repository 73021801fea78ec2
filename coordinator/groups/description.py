"""What ``plog groups describe`` and Kafka's DescribeGroups show of a group (PROTOCOL.md 11.4).

Read through a :class:`GroupReader` (a group's client): the newest
generation, the members' heartbeats, whether a rebalance is on, the committed
offsets and, for a client-assigned generation, the leader's assignment.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from segment_format.records import now_ms

from .assignors import TP
from .documents import ClientAssignment, Generation, GroupDescription, Heartbeat, MemberInfo


class GroupReader(Protocol):
    """What a description reads of a group (a :class:`~coordinator.groups.client.GroupClient` is one)."""

    group: str

    def latest_generation(self) -> Generation: ...

    def heartbeats(self, keys: Mapping[str, list[str]] | None = None) -> dict[str, Heartbeat]: ...

    def rebalance_marker_exists(self, generation: int) -> bool: ...

    def committed_with_source(self, gen: Generation | None = None) -> tuple[dict[TP, int], str]: ...

    def client_assignment(self, generation: int) -> ClientAssignment | None: ...

    def damaged_heartbeats(self) -> list[str]: ...


def describe_group(client: GroupReader, at_ms: int | None = None) -> GroupDescription:
    """Members, their liveness and assignment, the owners and the committed offsets."""
    at = now_ms() if at_ms is None else at_ms
    latest = client.latest_generation()
    heartbeats = client.heartbeats()
    rebalancing = client.rebalance_marker_exists(latest.number)
    committed, source = client.committed_with_source(latest)
    members = []
    for member in sorted(set(latest.members) | set(heartbeats)):
        hb = heartbeats.get(member)
        if member not in latest.members and (hb is None or not hb.alive_at(at)):
            continue  # a departed member not yet collected
        info = latest.members.get(member, {})
        members.append(
            MemberInfo(
                member,
                str(hb.client_id if hb else info.get("client_id", "")),
                bool(hb and hb.alive_at(at)),
                hb.sent_ms if hb else None,
                hb.generation if hb else -1,
                tuple(hb.topics if hb else info.get("topics", ())),
                latest.partitions_of(member),
                bool(hb and hb.leaving),
            )
        )
    alive = any(m.alive for m in members)
    live = {m.member_id for m in members if m.alive}
    if rebalancing and alive:
        state = "PreparingRebalance"
    elif not alive:
        state = "Empty"
    else:
        state = "Stable"
    owners = {tp: m for tp, m in latest.owners().items() if m in live}  # a dead member owns nothing
    client_assignment = None
    if latest.client_assigned:
        found = client.client_assignment(latest.number)
        if found is not None:
            client_assignment = {m: found.bytes_of(m) for m in latest.members}
        elif alive and not rebalancing:
            state = "CompletingRebalance"  # Kafka's name: the leader has not sent its assignment yet
    return GroupDescription(
        client.group,
        state,
        latest.number,
        latest.protocol,
        members,
        owners,
        committed,
        rebalancing,
        source,
        client.damaged_heartbeats(),
        latest.protocol_type,
        latest.leader,
        latest.client_assigned,
        client_assignment,
    )
