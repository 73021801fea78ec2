"""Completing a rebalance: the next generation from the members that joined (PROTOCOL.md 11.4, steps 2-4).

A completer (any member, :mod:`coordinator.groups.member`) has sealed the old
generation's commit log; what it proposes next is a pure function of the
members that acknowledged, the old generation and the partition counts:
choose the protocol type and protocol by Kafka's vote, reject the members that
do not fit, then either run plog's assignor (11.5) or, for a protocol plog does
not compute, leave the assignment to the leader's client (*Client-assigned
generations*).
"""

from __future__ import annotations

import base64
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence

from segment_format.records import now_ms

from .assignors import STRATEGIES, TP, compute_assignment
from .documents import CONSUMER, Generation, Heartbeat

#: Partition counts of the topics given, read fresh when asked (the completer's metadata).
CountsFor = Callable[[Iterable[str], bool], dict[str, int]]


def choose_protocol(protocols: Mapping[str, Sequence[str]], previous: str | None) -> str | None:
    """The protocol most members support; ties: most first preferences, then the previous, then by name."""
    support = Counter(p for ps in protocols.values() for p in set(ps))
    if not support:
        return None
    best = max(support.values())
    candidates = {p for p, n in support.items() if n == best}
    votes = Counter(next(p for p in ps if p in candidates) for ps in protocols.values() if set(ps) & candidates)
    return sorted(candidates, key=lambda p: (-votes[p], p != previous, p))[0]


def choose_protocol_type(joining: Mapping[str, Heartbeat], latest: Generation) -> str:
    """The group's protocol type: the newest generation's if one of its members joins again, else the majority's."""
    if any(m in latest.members for m in joining):
        return latest.protocol_type
    votes = Counter(hb.protocol_type for hb in joining.values())
    return min(votes, key=lambda t: (-votes[t], t)) if votes else CONSUMER


def fits(hb: Heartbeat, gen: Generation) -> bool:
    """Whether the member supports ``gen``'s protocol type and protocol (a generation without one fits nobody)."""
    return hb.protocol_type == gen.protocol_type and gen.protocol in hb.protocols


def encoded_metadata(metadata: Mapping[str, bytes]) -> dict[str, str]:
    """Protocol metadata as heartbeats carry it: base64 per protocol name."""
    return {name: base64.b64encode(bytes(data)).decode() for name, data in metadata.items()}


def next_generation(
    latest: Generation,
    acked: Mapping[str, Heartbeat],
    state: Mapping[TP, int],
    counts_for: CountsFor,
    proposer: str,
) -> Generation:
    """Generation ``latest + 1`` of the members in ``acked``, with ``state`` (the sealed log's) as its snapshot."""
    protocol_type = choose_protocol_type(acked, latest)
    typed = {m: hb for m, hb in acked.items() if hb.protocol_type == protocol_type}
    protocol = choose_protocol({m: hb.protocols for m, hb in typed.items()}, latest.protocol)
    members = {m: hb for m, hb in typed.items() if protocol in hb.protocols}
    rejected = {
        m: f"supports {hb.protocol_type} protocols {list(hb.protocols)}; the group uses {protocol_type} {protocol}"
        for m, hb in acked.items()
        if m not in members
    }
    if members and protocol is not None and (protocol_type != CONSUMER or protocol not in STRATEGIES):
        return _client_assigned(latest, protocol_type, protocol, members, rejected, state, proposer)
    return _plog_assigned(latest, protocol, members, rejected, state, counts_for, proposer)


def _member_entry(hb: Heartbeat) -> dict[str, object]:
    return {
        "topics": list(hb.topics),
        "client_id": hb.client_id,
        "protocols": list(hb.protocols),
        "session_timeout_ms": hb.session_timeout_ms,
    }


def _client_assigned(
    latest: Generation,
    protocol_type: str,
    protocol: str,
    members: Mapping[str, Heartbeat],
    rejected: Mapping[str, str],
    state: Mapping[TP, int],
    proposer: str,
) -> Generation:
    """The leader's client computes the assignment: the generation records who leads and every member's metadata."""
    leader = latest.leader if latest.leader in members else min(members)
    return Generation(
        latest.number + 1,
        protocol,
        {m: {**_member_entry(hb), "metadata": hb.metadata.get(protocol, "")} for m, hb in sorted(members.items())},
        rejected=dict(rejected),
        committed=dict(state),
        created_ms=now_ms(),
        proposer=proposer,
        reason=f"rebalance of generation {latest.number}",
        protocol_type=protocol_type,
        leader=leader,
        client_assigned=True,
    )


def _plog_assigned(
    latest: Generation,
    protocol: str | None,
    members: Mapping[str, Heartbeat],
    rejected: Mapping[str, str],
    state: Mapping[TP, int],
    counts_for: CountsFor,
    proposer: str,
) -> Generation:
    """plog's assignor (11.5) computes the assignment; cooperative moves are withheld for one rebalance."""
    counts = counts_for((t for hb in members.values() for t in hb.topics), True)
    owned = {m: latest.partitions_of(m) for m in members}
    if members and protocol is not None:
        subscriptions = {m: hb.topics for m, hb in members.items()}
        assignment, withheld = compute_assignment(protocol, counts, subscriptions, owned)
    else:
        assignment, withheld = {}, {}
    revoking: dict[str, list[TP]] = {}
    for tp, owner in sorted(withheld.items()):
        revoking.setdefault(owner, []).append(tp)
    return Generation(
        latest.number + 1,
        protocol,
        {m: _member_entry(hb) for m, hb in sorted(members.items())},
        {m: tuple(tps) for m, tps in sorted(assignment.items())},
        {m: tuple(tps) for m, tps in revoking.items()},
        dict(rejected),
        counts,
        dict(state),
        now_ms(),
        proposer,
        f"rebalance of generation {latest.number}",
    )
