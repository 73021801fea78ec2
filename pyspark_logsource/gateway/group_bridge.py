"""Kafka group members run by the gateway as plog group members (PROTOCOL.md 11.4, 11.9).

Every Kafka client that joins a group through a gateway IS a plog group member:
the gateway runs a :class:`KafkaMember` (a :class:`coordinator.groups.GroupMember`)
for it, with the subscription and protocols the client sent in JoinGroup. The
member heartbeats in the root, takes part in plog's rebalances, and commits in
plog's commit logs, exactly like plog's own consumer. Its heartbeats carry the
protocol type and metadata of the client's JoinGroup, so that a completer
anywhere can make a client-assigned generation (PROTOCOL.md 11.4) when the
members' protocol is not one of plog's assignors. The only state the gateway
keeps is these live member objects: membership, generations, assignments and
committed offsets are the root's, the same whichever client or gateway looks.

How Kafka's requests drive the member (the Kafka client plays the part of
plog's ``poll``):

* JoinGroup starts the member, or, for a member that already runs,
  acknowledges the pending rebalance (``joined = g + 1``): the client has
  revoked its partitions (eager) or is ready to (cooperative) by the time it
  rejoins. It then waits for the first newer generation that includes it.
* Heartbeat answers REBALANCE_IN_PROGRESS while the member's generation is
  being replaced (its marker exists, or a newer generation does).
* A member that sends nothing for its session timeout is expired by the
  gateway (its plog member leaves, so the others rebalance), as Kafka's
  coordinator expires it.
"""

from __future__ import annotations

import importlib
import io
import logging
import re
import struct
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from kio.serial import entity_reader, entity_writer

from coordinator.groups import Generation, GroupClient, GroupMember
from coordinator.groups.assignors import TP
from coordinator.groups.completion import encoded_metadata
from coordinator.groups.documents import CONSUMER
from coordinator.keys import members_prefix
from segment_format.errors import InvalidConfigError, UnknownTopicOrPartitionError
from segment_format.root import LogRoot
from segment_format.stores.base import Store

from .errors import GatewayError

log = logging.getLogger(__name__)

#: The JoinGroup ``leader`` of a plog-assigned generation: no member's id, so every Kafka client is a follower
#: (plog's assignors run in the root; no client computes an assignment).
LEADER = "plog-gateway"
#: How often the gateway looks for members whose client went silent.
_REAP_EVERY_S = 0.2
#: Kafka member ids the gateway accepts from clients: they become key segments of the root (so not "." or "..").
_MEMBER_ID = re.compile(r"^(?=.*[a-zA-Z0-9_-])[a-zA-Z0-9._-]{1,255}$")
_VERSION = struct.Struct(">h")


class InconsistentProtocolError(GatewayError):
    """A JoinGroup whose protocols plog cannot serve: not a consumer group, or no assignor plog knows."""

    error_code = 23  # INCONSISTENT_GROUP_PROTOCOL


def plog_heartbeat_ms(session_timeout_ms: int) -> int:
    """The heartbeat interval of the plog member behind a Kafka member (Kafka's 3 s at the 45 s default)."""
    return max(100, min(3000, session_timeout_ms // 10))


def _consumer_protocol(data: bytes, kind: str) -> tuple[int, Any]:
    """(version, entity) of a ConsumerProtocol ``kind`` ("subscription" or "assignment") message."""
    what = f"consumer protocol {kind}"
    if len(data) < _VERSION.size:
        raise InconsistentProtocolError(f"{what} of {len(data)} bytes has no version")
    (version,) = _VERSION.unpack_from(data)
    if version < 0:
        raise InconsistentProtocolError(f"{what} has version {version}")
    # A newer version starts with the fields of the newest one kio knows (Kafka's own rule for the protocol).
    module = importlib.import_module(f"kio.schema.consumer_protocol_{kind}.v{min(version, 3)}.data")
    entity_class = getattr(module, f"ConsumerProtocol{kind.capitalize()}")
    try:
        entity, _ = entity_reader(entity_class)(data, _VERSION.size)
    except Exception as exc:  # noqa: BLE001 - kio's readers raise several kinds on bad bytes; all mean the same
        raise InconsistentProtocolError(f"{what} does not decode: {exc}") from exc
    return int(version), entity


def parse_subscription(metadata: bytes) -> tuple[int, tuple[str, ...]]:
    """(version, topics) of a ConsumerProtocolSubscription (JoinGroup's protocol metadata)."""
    version, entity = _consumer_protocol(metadata, "subscription")
    return version, tuple(str(t) for t in entity.topics)


def decode_assignment(data: bytes) -> list[TP]:
    """The partitions of a ConsumerProtocolAssignment (a client-assigned consumer group's share).

    Raises ``InconsistentProtocolError`` if the bytes are not one.
    """
    _, entity = _consumer_protocol(data, "assignment")
    return [(str(t.topic), int(p)) for t in entity.assigned_partitions for p in t.partitions]


def encode_subscription(topics: Iterable[str], version: int = 0) -> bytes:
    """A ConsumerProtocolSubscription (for DescribeGroups of members not run by this gateway)."""
    from .entities import make

    v = max(0, min(version, 3))
    module = importlib.import_module(f"kio.schema.consumer_protocol_subscription.v{v}.data")
    entity = make(module.ConsumerProtocolSubscription, topics=sorted(topics), user_data=None)
    out = io.BytesIO()
    out.write(_VERSION.pack(v))
    entity_writer(module.ConsumerProtocolSubscription)(out, entity)
    return out.getvalue()


def encode_assignment(partitions: Iterable[TP], version: int = 0) -> bytes:
    """A ConsumerProtocolAssignment of ``partitions`` (SyncGroup's answer), in ``version`` (0..3)."""
    from .entities import make

    v = max(0, min(version, 3))
    module = importlib.import_module(f"kio.schema.consumer_protocol_assignment.v{v}.data")
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(int(partition))
    entity = make(
        module.ConsumerProtocolAssignment,
        assigned_partitions=[{"topic": t, "partitions": ps} for t, ps in by_topic.items()],
        user_data=None,
    )
    out = io.BytesIO()
    out.write(_VERSION.pack(v))
    entity_writer(module.ConsumerProtocolAssignment)(out, entity)
    return out.getvalue()


class _NoHooks:
    """A Kafka client revokes and assigns its partitions itself (from SyncGroup's answer)."""

    def commit_before_revoke(self) -> None:
        return None

    def revoke(self, partitions: list[TP]) -> None:
        return None

    def assign(self, generation: Generation, assigned: list[TP], added: list[TP], retained: list[TP]) -> None:
        return None


_HOOKS = _NoHooks()


class KafkaMember(GroupMember):
    """A Kafka client's membership in a plog group, run by the gateway that client talks to."""

    def __init__(
        self,
        store: Store,
        group: str,
        *,
        member_id: str,
        client_id: str,
        client_host: str,
        protocols: Sequence[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        partitions_for: Any,
        protocol_type: str = CONSUMER,
        client: GroupClient | None = None,
    ) -> None:
        names = [name for name, _ in protocols]
        super().__init__(
            store,
            group,
            client_id=client_id,
            strategies=names,
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=plog_heartbeat_ms(session_timeout_ms),
            # The plog member leaves by itself only after this long without a request; the gateway
            # expires a silent client after its (shorter) session timeout first.
            max_poll_interval_ms=max(rebalance_timeout_ms, session_timeout_ms),
            partitions_for=partitions_for,
            protocol_type=protocol_type,
            metadata=dict(protocols),
            client_assigns=True,
            client=client,
        )
        self.member_id = member_id
        self.client_host = client_host
        self.metadata: dict[str, bytes] = dict(protocols)
        #: monotonic time of the client's last request; requests still being answered (a JoinGroup waiting
        #: for its generation) keep it alive however long they take
        self.last_seen = time.monotonic()
        self.pending = 0

    # ------------------------------------------------------------------ what the client tells us

    def touch(self) -> None:
        """The client sent a request: it is alive, and (for plog) it is polling."""
        self.last_seen = time.monotonic()
        with self._lock:
            self._last_poll = self.last_seen

    def update(self, topics: Iterable[str], protocols: Sequence[tuple[str, bytes]], session_timeout_ms: int) -> None:
        """A rejoin may change the subscription and protocols; a change is announced at once."""
        names = tuple(name for name, _ in protocols)
        with self._lock:
            self.metadata = dict(protocols)
            self.protocol_metadata = encoded_metadata(dict(protocols))
            if names != self.strategies:
                self.strategies = names
                self._announced = None  # what the heartbeat announces changed: write one now
            self.session_timeout_ms = session_timeout_ms
        self.set_topics(topics)

    def expired(self, now: float) -> bool:
        """Whether the client has been silent for its session timeout (and is not waiting on a request)."""
        return self.pending == 0 and (now - self.last_seen) * 1000 > self.session_timeout_ms

    @property
    def takes_part(self) -> bool:
        """Whether the member takes part in rebalances (a subscription, or a group that is not a consumer group)."""
        return bool(self.topics) or self.protocol_type != CONSUMER

    def subscription_version(self, protocol: str | None) -> int:
        """The ConsumerProtocol version the client used for ``protocol`` (its assignment is written in it)."""
        data = self.metadata.get(protocol or "")
        if data is None or len(data) < _VERSION.size:
            return 0
        return int(_VERSION.unpack_from(data)[0])

    # ------------------------------------------------------------------ what plog has decided

    @property
    def left(self) -> bool:
        """Whether the plog member left by itself (no request within ``max_poll_interval_ms``)."""
        return self._left is not None

    def observed(self) -> tuple[Generation | None, bool]:
        """(the newest generation the heartbeat thread has seen, whether it is being replaced)."""
        with self._lock:
            latest, marker_for = self._latest, self._marker_for
        return latest, latest is not None and marker_for == latest.number

    def rebalancing(self) -> bool:
        """Whether the client must rejoin: its generation is being replaced, or it is not in it."""
        adopted = self.adopted
        if adopted is None:
            return True
        latest, marker = self.observed()
        if latest is not None and (latest.number > adopted.number or (marker and latest.number == adopted.number)):
            return True
        return self.takes_part and self.member_id not in adopted.members

    def stable_in(self) -> Generation | None:
        """The adopted generation if the member is in it with its current subscription and nothing is pending."""
        adopted = self.adopted
        if adopted is None or self.rebalancing():
            return None
        info = adopted.members.get(self.member_id)
        if self.topics and (info is None or tuple(sorted(info.get("topics", ()))) != self.topics):
            return None
        if adopted.protocol is not None and adopted.protocol not in self.strategies:
            return None
        if adopted.client_assigned and (
            info is None or self.protocol_metadata.get(str(adopted.protocol)) != info.get("metadata")
        ):
            return None  # its metadata changed: the rebalance it asks for follows (PROTOCOL.md 11.4)
        return adopted

    def acknowledge(self) -> None:
        """The client rejoined: acknowledge the replacement of the adopted generation if one is pending."""
        latest, marker = self.observed()
        adopted = self.adopted
        if adopted is not None and latest is not None and marker and latest.number == adopted.number:
            with self._lock:
                self.joined = adopted.number + 1
            self._wake.set()

    def join_step(self, entry: int) -> Generation | None:
        """One step of a JoinGroup: adopt what plog decided; the generation to answer once it includes us.

        ``entry`` is the generation the member had adopted when the client sent
        JoinGroup (-1 for none): the answer is a newer one. Markers are
        acknowledged only for that generation or one the member is not in, so
        a member never acknowledges a generation its client has not been told
        of (it would let plog hand the client's partitions to another member
        before the client revoked them). Raises ``InvalidConfigError`` if plog
        rejected the member for its protocols.
        """
        with self._lock:
            left = self._left
        if left is not None:  # left by itself meanwhile: rejoin as plog's consumer does on its next poll
            with self._lock:
                self.owned, self.adopted, self.joined, self._left = [], None, -1, None
                self._latest, self._marker_for = None, None
            self._wake.set()
            return None
        latest, marker = self.observed()
        if latest is None:
            return None
        adopted = self.adopted
        if adopted is None or latest.number > adopted.number:
            self._adopt(latest, _HOOKS)
            adopted = self.adopted
        assert adopted is not None
        if adopted.number > entry and (self.member_id in adopted.members or not self.takes_part):
            return adopted
        if marker and latest.number == adopted.number and self.joined != adopted.number + 1:
            with self._lock:
                self.joined = adopted.number + 1
            self._wake.set()
        return None


class GroupBridge:
    """The gateway's Kafka members (``gateway.services["groups"]``): who they are, and their expiry."""

    def __init__(self, root: LogRoot) -> None:
        self.root = root
        self.store = root.store
        self._members: dict[tuple[str, str], KafkaMember] = {}
        self._clients: dict[str, GroupClient] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None

    # ------------------------------------------------------------------ members

    def member(self, group: str, member_id: str) -> KafkaMember | None:
        """The live member ``member_id`` of ``group`` run by this gateway, if any."""
        with self._lock:
            return self._members.get((group, member_id))

    def members_of(self, group: str) -> dict[str, KafkaMember]:
        """The members of ``group`` this gateway runs, by id."""
        with self._lock:
            return {m: member for (g, m), member in self._members.items() if g == group}

    def new_member(
        self,
        group: str,
        member_id: str,
        *,
        client_id: str,
        client_host: str,
        protocols: Sequence[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str = CONSUMER,
    ) -> KafkaMember:
        """Register a member for a Kafka client (not started: :meth:`KafkaMember.start` writes to the root)."""
        if not _MEMBER_ID.match(member_id) or member_id == LEADER:
            raise InvalidConfigError(f"member id {member_id!r} is not one the gateway gives")
        member = KafkaMember(
            self.store,
            group,
            member_id=member_id,
            client_id=client_id,
            client_host=client_host,
            protocols=protocols,
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms,
            partitions_for=self.partition_counts,
            protocol_type=protocol_type,
            client=self.client(group),  # the gateway's members of a group read each heartbeat once between them
        )
        with self._lock:
            self._members[(group, member_id)] = member
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._reap, name="plog-gateway-groups", daemon=True)
                self._reaper.start()
        return member

    def runs_elsewhere(self, group: str, member_id: str) -> bool:
        """Whether ``member_id`` already has heartbeats in ``group``: another gateway runs it (or ran it and died).

        One listing of that member's heartbeats. A client rejoining with such an
        id (its coordinator moved while it was joining) must not get a second
        plog member under the same id: the two would write one heartbeat series,
        the new one's numbers restarting below the old one's (readers take the
        highest, so the new member would look dead), and the old one's eventual
        leave would look like the new one's.
        """
        if not _MEMBER_ID.match(member_id):
            return False  # not a key segment: new_member refuses it
        return bool(self.store.list(f"{members_prefix(group)}{member_id}/"))

    def remove(self, group: str, member_id: str) -> KafkaMember | None:
        """Forget a member (the caller closes it: it leaves the group)."""
        with self._lock:
            return self._members.pop((group, member_id), None)

    def partition_counts(self, topics: Iterable[str], fresh: bool) -> dict[str, int]:
        """Partition counts of the existing ``topics`` (from the root's topic cache unless ``fresh``)."""
        counts = {}
        for name in topics:
            try:
                counts[name] = self.root.topic(name, refresh=fresh, max_age_s=5.0).partitions
            except UnknownTopicOrPartitionError:
                continue
        return counts

    def client(self, group: str) -> GroupClient:
        """A reader of ``group``'s objects (cached: generations never change)."""
        with self._lock:
            client = self._clients.get(group)
            if client is None:
                if len(self._clients) > 1024:  # a gateway serving many groups: drop the caches now and then
                    self._clients.clear()
                client = self._clients[group] = GroupClient(self.store, group)
            return client

    # ------------------------------------------------------------------ the gateway's hooks

    def _reap(self) -> None:
        while not self._stop.wait(_REAP_EVERY_S):
            now = time.monotonic()
            with self._lock:
                gone = [key for key, m in self._members.items() if m.expired(now)]
                expired = [self._members.pop(key) for key in gone]
            for member in expired:
                log.info(
                    "group %s: member %s (%s) sent nothing for its session timeout; it leaves the group",
                    member.group,
                    member.member_id,
                    member.client_host,
                )
                self._close(member)

    @staticmethod
    def _close(member: KafkaMember) -> None:
        try:
            member.close()
        except Exception as exc:  # noqa: BLE001 - one member's failure to leave must not stop the others'
            log.warning("group %s: member %s could not leave: %s", member.group, member.member_id, exc)

    def connection_closed(self, session: Any) -> None:
        """A client's connection closed: its members stay until their session timeout, as in Kafka."""
        return None

    def close(self) -> None:
        """The gateway stops: every member it runs leaves its group cleanly (the others rebalance at once)."""
        self._stop.set()
        with self._lock:
            members = list(self._members.values())
            self._members.clear()
        for member in members:
            self._close(member)
