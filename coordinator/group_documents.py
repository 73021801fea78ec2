"""The documents of a consumer group: heartbeats, generations, descriptions, offsets as JSON (PROTOCOL.md 11.4).

What is stored under ``groups/<group>/`` (names in :mod:`coordinator.keys`) and
how the tools describe a group. Imports segment_format and coordinator.assignors only.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from segment_format.errors import (
    PlogError,
)

from .assignors import TP

#: ε: how far apart the wall clocks of the machines using a group are assumed to be. Used only where a
#: heartbeat's ``sent_ms`` is compared with a local clock (first impressions, the CLI, standalone commits).
MAX_CLOCK_SKEW_MS = 1_000


def make_member_id(client_id: str = "") -> str:
    """A new member id: the client id's safe characters, a random suffix (Kafka: ``<client.id>-<uuid>``)."""
    base = re.sub(r"[^a-zA-Z0-9._-]", "", client_id)[:64] or "consumer"
    return f"{base}-{uuid.uuid4().hex[:16]}"


def offsets_to_json(offsets: Mapping[TP, int]) -> dict[str, dict[str, int]]:
    """``{(t, p): o}`` as ``{"t": {"p": o}}``."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = int(offset)
    return out


def offsets_from_json(doc: Mapping[str, Mapping[str, int]] | None) -> dict[TP, int]:
    """Inverse of :func:`offsets_to_json`."""
    return {(topic, int(p)): int(o) for topic, per in (doc or {}).items() for p, o in per.items()}


def _tps_to_json(tps: Iterable[TP]) -> list[list[Any]]:
    return [[t, int(p)] for t, p in tps]


def _tps_from_json(doc: Iterable[Sequence[Any]]) -> tuple[TP, ...]:
    return tuple((str(t), int(p)) for t, p in doc)


@dataclass(frozen=True)
class Heartbeat:
    """One heartbeat object: a member's announcement of itself at ``sent_ms``."""

    member_id: str
    seq: int
    sent_ms: int
    client_id: str = ""
    topics: tuple[str, ...] = ()
    protocols: tuple[str, ...] = ()
    session_timeout_ms: int = 10_000
    rebalance_timeout_ms: int = 300_000
    generation: int = -1
    joined: int = -1
    leaving: bool = False

    def to_json(self) -> bytes:
        """The object's bytes."""
        return json.dumps(
            {
                "member_id": self.member_id,
                "seq": self.seq,
                "sent_ms": self.sent_ms,
                "client_id": self.client_id,
                "topics": list(self.topics),
                "protocols": list(self.protocols),
                "session_timeout_ms": self.session_timeout_ms,
                "rebalance_timeout_ms": self.rebalance_timeout_ms,
                "generation": self.generation,
                "joined": self.joined,
                "leaving": self.leaving,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Heartbeat:
        """Parse a heartbeat object."""
        d = json.loads(data)
        return cls(
            str(d["member_id"]),
            int(d["seq"]),
            int(d["sent_ms"]),
            str(d.get("client_id", "")),
            tuple(d.get("topics", ())),
            tuple(d.get("protocols", ())),
            int(d.get("session_timeout_ms", 10_000)),
            int(d.get("rebalance_timeout_ms", 300_000)),
            int(d.get("generation", -1)),
            int(d.get("joined", -1)),
            bool(d.get("leaving", False)),
        )

    def alive_at(self, at_ms: int, skew_ms: int = MAX_CLOCK_SKEW_MS) -> bool:
        """One-shot judgement by wall clock: not leaving and sent within the session timeout (+ ε)."""
        return not self.leaving and at_ms - self.sent_ms <= self.session_timeout_ms + skew_ms


@dataclass(frozen=True)
class Generation:
    """A generation: members, their assignment and the committed offsets when it began.

    Generation 0 is implicit (no object): no members, nothing committed.
    ``revoking`` lists, per member, partitions a cooperative rebalance took
    away from it and gave to nobody yet: that member may still commit them in
    this generation. ``rejected`` lists members left out for an assignment
    protocol the group does not use.
    """

    number: int
    protocol: str | None = None
    members: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    assignment: Mapping[str, tuple[TP, ...]] = field(default_factory=dict)
    revoking: Mapping[str, tuple[TP, ...]] = field(default_factory=dict)
    rejected: Mapping[str, str] = field(default_factory=dict)
    partitions: Mapping[str, int] = field(default_factory=dict)
    committed: Mapping[TP, int] = field(default_factory=dict)
    created_ms: int = 0
    proposer: str = ""
    reason: str = ""

    def partitions_of(self, member_id: str) -> list[TP]:
        """The partitions ``member_id`` owns in this generation, in assignor order."""
        return list(self.assignment.get(member_id, ()))

    def owners(self) -> dict[TP, str]:
        """Partition -> owning member."""
        return {tp: m for m, tps in self.assignment.items() for tp in tps}

    def may_commit(self, member_id: str | None, tp: TP) -> bool:
        """Whether ``member_id`` may commit ``tp`` in this generation (anyone, if it has no members)."""
        if not self.members:
            return True
        if member_id is None:
            return False
        return tp in self.assignment.get(member_id, ()) or tp in self.revoking.get(member_id, ())

    def to_json(self) -> bytes:
        """The object's bytes."""
        return json.dumps(
            {
                "generation": self.number,
                "protocol": self.protocol,
                "members": {m: dict(v) for m, v in self.members.items()},
                "assignment": {m: _tps_to_json(tps) for m, tps in self.assignment.items()},
                "revoking": {m: _tps_to_json(tps) for m, tps in self.revoking.items()},
                "rejected": dict(self.rejected),
                "partitions": dict(self.partitions),
                "committed": offsets_to_json(self.committed),
                "created_ms": self.created_ms,
                "proposer": self.proposer,
                "reason": self.reason,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Generation:
        """Parse a generation object."""
        d = json.loads(data)
        return cls(
            int(d["generation"]),
            d.get("protocol"),
            d.get("members", {}),
            {m: _tps_from_json(tps) for m, tps in d.get("assignment", {}).items()},
            {m: _tps_from_json(tps) for m, tps in d.get("revoking", {}).items()},
            d.get("rejected", {}),
            {t: int(n) for t, n in d.get("partitions", {}).items()},
            offsets_from_json(d.get("committed")),
            int(d.get("created_ms", 0)),
            str(d.get("proposer", "")),
            str(d.get("reason", "")),
        )


class GenerationSealed(PlogError):
    """The commit log of a generation is sealed: the group has moved (or is moving) to the next one."""

    def __init__(self, generation: int) -> None:
        super().__init__(f"generation {generation} is sealed")
        self.generation = generation


@dataclass
class MemberInfo:
    """One member as ``describe`` sees it."""

    member_id: str
    client_id: str
    alive: bool
    last_heartbeat_ms: int | None
    generation: int
    topics: tuple[str, ...]
    assignment: list[TP]
    left: bool = False


@dataclass
class GroupDescription:
    """What ``plog groups describe`` shows."""

    group: str
    state: str
    generation: int
    protocol: str | None
    members: list[MemberInfo]
    owners: dict[TP, str]
    committed: dict[TP, int]
    rebalancing: bool
    committed_source: str
