"""How gateways serving one root find each other (PROTOCOL.md 11.9).

On storage::

    _coordinator/gateways/<gateway_id>/<seq:020d>.json   registration heartbeats of one gateway
        {"gateway_id", "node_id", "host", "port", "seq", "sent_ms", "registration_ms", "leaving"}

A gateway creates heartbeat ``seq + 1`` every ``heartbeat_ms`` and deletes its
older ones in batches; it counts as live while its newest heartbeat is not
leaving and is younger than its ``registration_ms`` plus the clock-skew bound.
Every live gateway computes the same leader for a partition and the same
coordinator for a group by rendezvous hashing over the live set, so that
clients spread over them; no safety property rests on this choice, because a
gateway writes only through the protocol's conditional creates and keeps no
state of its own: any gateway may serve any partition and any group.

A registration outlives a gateway that dies without saying goodbye (SIGKILL,
OOM) by up to ``registration_ms`` plus ε, and clients told to go there (as a
partition's leader or a group's coordinator) could not be served for that
long: their group would not rebalance, their produce and fetch would stall.
So every ``probe_ms`` a gateway also opens a TCP connection to each peer it
holds live, and leaves out of what it tells clients the ones that refuse it
(a dead process on a live host refuses at once) until one accepts again. A
probe only narrows the set clients are sent to, which is safe for the same
reason as above; a gateway that still accepts connections but is otherwise
stuck is left to the registration's expiry.
"""

from __future__ import annotations

import hashlib
import logging
import random
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field

from segment_format.documents import JsonDocument
from segment_format.errors import CorruptRecordError, ObjectNotFoundError, PlogError
from segment_format.numbered import numbered_key, numbers_in
from segment_format.records import now_ms
from segment_format.stores.base import Store

log = logging.getLogger(__name__)

GATEWAYS = "_coordinator/gateways/"
#: PROTOCOL.md 11.4's clock-skew bound ε.
CLOCK_SKEW_MS = 1_000
#: A gateway whose newest heartbeat is this old (PROTOCOL.md 10's D) has its registration deleted by the others.
COLLECT_AFTER_MS = 20 * 60 * 1000
#: Older heartbeats of this gateway are deleted once there are more than this many.
KEEP_HEARTBEATS = 16
#: How often a gateway checks that the peers it holds live accept connections (0: never).
DEFAULT_PROBE_MS = 1_000
#: How long a probe waits for a peer's connection (a host that is gone does not refuse, it is silent).
PROBE_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class GatewayHeartbeat(JsonDocument):
    """One registration heartbeat (PROTOCOL.md 11.9)."""

    gateway_id: str
    node_id: int
    host: str
    port: int
    seq: int
    sent_ms: int
    registration_ms: int = 30_000
    leaving: bool = False

    def alive_at(self, now: int) -> bool:
        """The wall-clock rule: not leaving, and younger than its registration plus ε."""
        return not self.leaving and now - self.sent_ms <= self.registration_ms + CLOCK_SKEW_MS


@dataclass(frozen=True, order=True)
class GatewayInfo:
    """A live gateway as clients see it: a Kafka broker."""

    node_id: int
    host: str
    port: int
    gateway_id: str = field(compare=False)


def _weight(owner: GatewayInfo, key: str) -> bytes:
    return hashlib.sha256(f"{owner.gateway_id}\0{key}".encode()).digest()


def rendezvous(candidates: list[GatewayInfo], key: str) -> GatewayInfo:
    """The candidate with the highest hash weight for ``key``: every gateway that sees the same live set
    picks the same one, and a gateway leaving moves only the keys it had."""
    return max(candidates, key=lambda c: _weight(c, key))


class GatewayDirectory:
    """This gateway's registration, and the live gateways it last listed."""

    def __init__(
        self,
        store: Store,
        host: str,
        port: int,
        heartbeat_ms: int,
        registration_ms: int,
        gateway_id: str | None = None,
        probe_ms: int = DEFAULT_PROBE_MS,
    ) -> None:
        self.store = store
        self.gateway_id = gateway_id or uuid.uuid4().hex
        # Kafka's node ids are int32; a random 31-bit id collides with another live gateway's with
        # probability about n²/2³¹, and a collision only makes clients share one connection for two.
        self.node_id = random.SystemRandom().randrange(1, 2**31 - 1)
        self.me = GatewayInfo(self.node_id, host, port, self.gateway_id)
        self.heartbeat_ms = heartbeat_ms
        self.registration_ms = registration_ms
        self.prefix = f"{GATEWAYS}{self.gateway_id}/"
        self._seq = -1
        self._own: list[str] = []
        self._live: list[GatewayInfo] = [self.me]
        self._read: dict[str, GatewayHeartbeat] = {}
        self.probe_ms = probe_ms
        #: peers (by gateway id) that refused the last probe: left out of ``live`` until one succeeds;
        #: replaced whole (never mutated), so the event loop reads it without a lock
        self._unreachable: frozenset[str] = frozenset()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- registration

    def beat(self, leaving: bool = False) -> None:
        """Create this gateway's next heartbeat; delete its older ones in one batch now and then."""
        self._seq += 1
        body = GatewayHeartbeat(
            self.gateway_id,
            self.node_id,
            self.me.host,
            self.me.port,
            self._seq,
            now_ms(),
            self.registration_ms,
            leaving,
        ).to_json()
        key = numbered_key(self.prefix, self._seq)
        self.store.put_if_absent(key, body)  # our own ids: nobody else creates them
        self._own.append(key)
        if len(self._own) > KEEP_HEARTBEATS:
            doomed, self._own = self._own[:-1], self._own[-1:]
            self.store.delete_many(doomed)

    def refresh(self) -> list[GatewayInfo]:
        """List the registrations and keep the live gateways (this one always among them)."""
        now = now_ms()
        newest: dict[str, str] = {}
        keys = [info.key for info in self.store.list(GATEWAYS)]
        by_gateway: dict[str, list[str]] = {}
        for key in keys:
            gateway = key[len(GATEWAYS) :].split("/", 1)[0]
            by_gateway.setdefault(gateway, []).append(key)
        for gateway, its_keys in by_gateway.items():
            prefix = f"{GATEWAYS}{gateway}/"
            seqs = numbers_in(its_keys, prefix)
            if seqs:
                newest[gateway] = numbered_key(prefix, max(seqs))
        live = [self.me]
        for gateway, key in newest.items():
            if gateway == self.gateway_id:
                continue
            heartbeat = self._read.get(key)
            if heartbeat is None:
                try:
                    heartbeat = GatewayHeartbeat.from_json(self.store.get(key), what=key)
                except (ObjectNotFoundError, CorruptRecordError) as exc:
                    log.warning("gateway registration %s skipped: %s", key, exc)
                    continue
                self._read[key] = heartbeat
            if now - heartbeat.sent_ms > COLLECT_AFTER_MS:
                # Gone for D: its heartbeats go, so the listing stays as short as the live set (PROTOCOL.md 11.9).
                self._collect(by_gateway[gateway])
                continue
            if heartbeat.alive_at(now):
                live.append(GatewayInfo(heartbeat.node_id, heartbeat.host, heartbeat.port, heartbeat.gateway_id))
        self._read = {k: v for k, v in self._read.items() if k in set(newest.values())}
        self._live = sorted(live)
        return self.live

    def _collect(self, keys: list[str]) -> None:
        try:
            self.store.delete_many(keys)
        except PlogError as exc:  # deletion is idempotent: the next listing tries again
            log.warning("collecting a gone gateway's registration failed: %s", exc)

    @property
    def live(self) -> list[GatewayInfo]:
        """The live gateways as of the last listing and probe, sorted by node id (this one always among them)."""
        unreachable = self._unreachable
        return [g for g in self._live if g.gateway_id not in unreachable]

    def probe(self) -> frozenset[str]:
        """Try a TCP connection to every peer held live; keep the ids of those that refuse (or time out).

        The peers are probed concurrently, so one silent host costs one
        ``PROBE_TIMEOUT_S``, not one per peer.
        """
        peers = [g for g in self._live if g.gateway_id != self.gateway_id]
        failed: list[str] = []

        def one(peer: GatewayInfo) -> None:
            try:
                with socket.create_connection((peer.host, peer.port), timeout=PROBE_TIMEOUT_S):
                    pass
            except OSError:
                failed.append(peer.gateway_id)

        threads = [threading.Thread(target=one, args=(p,), name="plog-gateway-probe", daemon=True) for p in peers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(PROBE_TIMEOUT_S + 1.0)
        unreachable = frozenset(failed)
        for gone in sorted(unreachable - self._unreachable):
            log.warning("gateway %s refuses connections: clients are no longer sent there", gone)
        for back in sorted(self._unreachable - unreachable):
            if any(g.gateway_id == back for g in peers):
                log.info("gateway %s accepts connections again", back)
        self._unreachable = unreachable
        return unreachable

    def leader_for(self, topic: str, partition: int, shared: bool = False) -> GatewayInfo:
        """The gateway clients are told leads a partition (a hint: any gateway accepts any partition). Every
        partition of a ``shared`` topic has one leader, the usual committer of its sequence (PROTOCOL.md 11.9)."""
        return rendezvous(self.live, f"topic\0{topic}" if shared else f"partition\0{topic}\0{partition}")

    def coordinator_for(self, kind: str, key: str) -> GatewayInfo:
        """The gateway clients are told coordinates a group or a transactional id."""
        return rendezvous(self.live, f"{kind}\0{key}")

    # ---------------------------------------------------------------- the beat thread

    def start(self) -> None:
        """Register now, then keep the registration alive and the live set fresh in a thread."""
        self.beat()
        self.refresh()
        if self.probe_ms > 0:  # a gateway started after another died must not send clients to the dead one
            self.probe()
        self._thread = threading.Thread(target=self._run, name="plog-gateway-directory", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        tick_ms = min(self.heartbeat_ms, self.probe_ms) if self.probe_ms > 0 else self.heartbeat_ms
        next_beat = time.monotonic() + self.heartbeat_ms / 1000
        while not self._stop.wait(tick_ms / 1000):
            if time.monotonic() >= next_beat:
                next_beat = time.monotonic() + self.heartbeat_ms / 1000
                try:
                    self.beat()
                    self.refresh()
                except PlogError as exc:  # a store hiccup: the next beat tries again, well within the registration
                    log.warning("gateway registration failed: %s", exc)
            if self.probe_ms > 0:
                self.probe()

    def close(self) -> None:
        """Stop beating and say goodbye, so the others drop this gateway at once (a gateway that never
        registered, its listener refused, writes nothing)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if not self._own:
            return
        try:
            self.beat(leaving=True)
            self.store.delete_many(self._own[:-1])
        except PlogError as exc:
            log.warning("gateway deregistration failed: %s", exc)
