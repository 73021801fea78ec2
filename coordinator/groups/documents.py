"""The documents of a consumer group: heartbeats, generations, descriptions, offsets as JSON (PROTOCOL.md 11.4).

What is stored under ``groups/<group>/`` (names in :mod:`coordinator.keys`) and
how the tools describe a group. Imports segment_format and coordinator.groups.assignors only.
"""

from __future__ import annotations

import base64
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from segment_format.documents import JsonDocument
from segment_format.errors import (
    PlogError,
)

from .assignors import TP

#: Kafka's protocol type of consumer groups (the only one plog's own assignors serve).
CONSUMER = "consumer"
#: ε: how far apart the wall clocks of the machines using a group are assumed to be. Used only where a
#: heartbeat's ``sent_ms`` is compared with a local clock (first impressions, the CLI, standalone commits).
MAX_CLOCK_SKEW_MS = 1_000


def make_member_id(client_id: str = "") -> str:
    """A new member id: the client id's safe characters, a random suffix (Kafka: ``<client.id>-<uuid>``)."""
    base = re.sub(r"[^a-zA-Z0-9._-]", "", client_id)[:64] or "consumer"
    return f"{base}-{uuid.uuid4().hex[:16]}"


def offsets_to_json(offsets: Mapping[TP, int]) -> dict[str, dict[str, int]]:
    """``{(t, p): o}`` as ``{"t": {"p": o}}``, in one canonical order: topics sorted, partitions numerically.

    Spark's checkpoints hold offsets in this form too and compare them by their JSON text, so the order matters.
    """
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = int(offset)
    return out


def offsets_from_json(doc: Mapping[str, Mapping[str, int]] | None) -> dict[TP, int]:
    """Inverse of :func:`offsets_to_json`.

    Raises ``TypeError`` or ``ValueError`` unless ``doc`` is offsets by
    partition (PROTOCOL.md 3.1): decimal partition keys, integer offsets
    (``true`` is not one); document readers report that as corruption.
    """
    if doc is None:
        return {}
    if not isinstance(doc, Mapping):
        raise TypeError("offsets by partition: expected an object")
    out: dict[TP, int] = {}
    for topic, per in doc.items():
        if not isinstance(per, Mapping):
            raise TypeError(f"offsets of topic {topic!r}: expected an object")
        for p, o in per.items():
            if not isinstance(p, str) or not p.isdecimal() or type(o) is not int:
                raise TypeError(f"offset of {topic!r} partition {p!r}: expected an integer, got {o!r}")
            out[(topic, int(p))] = o
    return out


def _tps_to_json(tps: Iterable[TP]) -> list[list[Any]]:
    return [[t, int(p)] for t, p in tps]


def _without(out: dict[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``out`` without the fields of ``defaults`` that hold their default value."""
    return {k: v for k, v in out.items() if k not in defaults or v != defaults[k]}


@dataclass(frozen=True)
class Heartbeat(JsonDocument):
    """One heartbeat object: a member's announcement of itself at ``sent_ms``."""

    json_separators: ClassVar[tuple[str, str]] = (", ", ": ")  # the spacing stored objects have always had

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
    protocol_type: str = CONSUMER
    #: protocol name -> the client's metadata for it, base64 (only members whose client may assign)
    metadata: Mapping[str, str] = field(default_factory=dict, metadata={"encode": dict})

    #: Fields written only when they differ from their default (client-assigned members, PROTOCOL.md 11.4):
    #: plog's own consumer writes neither, so its heartbeats keep the bytes they always had.
    _written_if_set: ClassVar[Mapping[str, Any]] = {"protocol_type": CONSUMER, "metadata": {}}

    def to_dict(self) -> dict[str, Any]:
        """The JSON object; a consumer's has no ``protocol_type`` or ``metadata``."""
        return _without(super().to_dict(), self._written_if_set)

    @property
    def takes_part(self) -> bool:
        """Whether the member takes part in rebalances: it subscribes, or its group is not a consumer group."""
        return bool(self.topics) or self.protocol_type != CONSUMER

    def alive_at(self, at_ms: int, skew_ms: int = MAX_CLOCK_SKEW_MS) -> bool:
        """One-shot judgement by wall clock: not leaving and sent within the session timeout (+ ε)."""
        return not self.leaving and at_ms - self.sent_ms <= self.session_timeout_ms + skew_ms


def _tps_map_to_json(doc: Mapping[str, Iterable[TP]]) -> dict[str, list[list[Any]]]:
    return {m: _tps_to_json(tps) for m, tps in doc.items()}


def _tps_field() -> Any:
    return field(default_factory=dict, metadata={"encode": _tps_map_to_json})


@dataclass(frozen=True)
class Generation(JsonDocument):
    """A generation: members, their assignment and the committed offsets when it began.

    Generation 0 is implicit (no object): no members, nothing committed.
    ``revoking`` lists, per member, partitions a cooperative rebalance took
    away from it and gave to nobody yet: that member may still commit them in
    this generation. ``rejected`` lists members left out for an assignment
    protocol the group does not use.
    """

    json_separators: ClassVar[tuple[str, str]] = (", ", ": ")  # the spacing stored objects have always had

    number: int = field(metadata={"json": "generation"})
    protocol: str | None = None
    members: Mapping[str, Mapping[str, Any]] = field(
        default_factory=dict, metadata={"encode": lambda d: {m: dict(v) for m, v in d.items()}}
    )
    assignment: Mapping[str, tuple[TP, ...]] = _tps_field()
    revoking: Mapping[str, tuple[TP, ...]] = _tps_field()
    rejected: Mapping[str, str] = field(default_factory=dict, metadata={"encode": dict})
    partitions: Mapping[str, int] = field(default_factory=dict, metadata={"encode": dict})
    committed: Mapping[TP, int] = field(
        default_factory=dict, metadata={"encode": offsets_to_json, "decode": offsets_from_json}
    )
    created_ms: int = 0
    proposer: str = ""
    reason: str = ""
    protocol_type: str = CONSUMER
    leader: str | None = None
    client_assigned: bool = False

    #: Fields written only when they differ from their default (client-assigned generations, PROTOCOL.md 11.4):
    #: plog-assigned generations keep the bytes they always had.
    _written_if_set: ClassVar[Mapping[str, Any]] = {"protocol_type": CONSUMER, "leader": None, "client_assigned": False}

    def to_dict(self) -> dict[str, Any]:
        """The JSON object; a plog-assigned consumer generation's has no client-assigned fields."""
        return _without(super().to_dict(), self._written_if_set)

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
        if self.client_assigned:  # plog does not read the leader's assignment: members commit (PROTOCOL.md 11.4)
            return member_id in self.members
        return tp in self.assignment.get(member_id, ()) or tp in self.revoking.get(member_id, ())


@dataclass(frozen=True)
class CommitEntry(JsonDocument):
    """One entry ``commits/<generation>/<seq>.json`` of a generation's commit log (PROTOCOL.md 11.4).

    Written by :meth:`~coordinator.groups.client.GroupClient.append_commit`; read
    through this class, so that a damaged entry is reported as corrupt.
    """

    generation: int
    seq: int
    state: Mapping[TP, int] = field(metadata={"encode": offsets_to_json, "decode": offsets_from_json})
    member: str | None = None
    offsets: Mapping[TP, int] = field(
        default_factory=dict, metadata={"encode": offsets_to_json, "decode": offsets_from_json}
    )
    sealed: bool = False
    created_ms: int = 0


@dataclass(frozen=True)
class ClientAssignment(JsonDocument):
    """``assignments/<generation>.json``: the assignment a client-assigned generation's leader computed (11.4)."""

    generation: int
    leader: str
    #: member id -> the bytes the leader assigned it, base64
    assignment: Mapping[str, str] = field(metadata={"encode": dict})
    created_ms: int = 0

    def bytes_of(self, member_id: str) -> bytes:
        """What the leader assigned ``member_id`` (empty if nothing)."""
        return base64.b64decode(self.assignment.get(member_id, ""))


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
    #: heartbeat objects that did not decode and were taken as absent (PROTOCOL.md 11.4, *Damaged heartbeats*)
    damaged_heartbeats: list[str] = field(default_factory=list)
    protocol_type: str = CONSUMER
    #: a client-assigned generation's leader (its assignment is the leader's, PROTOCOL.md 11.4)
    leader: str | None = None
    client_assigned: bool = False
    #: a client-assigned generation's assignment bytes by member (None while the leader has not sent it)
    client_assignment: Mapping[str, bytes] | None = None
