"""Kafka groups whose assignment a client computes, through ``plog serve`` (PROTOCOL.md 11.4, *Client-assigned
generations*; 11.9, *Consumer groups*).

Kafka's brokers never compute assignments: the group's leader, a client, does, with an assignor plog may never
have heard of, and groups that are not consumer groups (Kafka Connect's ``connect``) carry bytes no broker
reads. Every client here is real: kafka-python consumers with an assignor of this test's own
(:mod:`tests.client_assigned_members`), Connect workers spoken byte for byte with kio, and ``plog serve``
processes SIGKILLed mid-rebalance. What they did is read back from the root with plog's ``GroupClient``.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

kafka = pytest.importorskip("kafka")
pytest.importorskip("confluent_kafka")
from kafka.coordinator.assignors.abstract import ConsumerProtocolAssignment  # noqa: E402
from kafka.coordinator.assignors.range import RangePartitionAssignor  # noqa: E402
from kafka.errors import InconsistentGroupProtocolError  # noqa: E402
from kafka.structs import OffsetAndMetadata  # noqa: E402
from kafka.structs import TopicPartition as KafkaTP  # noqa: E402
from kio.index import load_request_schema, load_response_schema  # noqa: E402
from kio.serial import entity_reader, entity_writer  # noqa: E402

from coordinator.groups import Generation, GroupClient  # noqa: E402
from pyspark_logsource import LogStore  # noqa: E402
from pyspark_logsource.cli.app import main as cli_main  # noqa: E402
from pyspark_logsource.gateway import GatewayConfig, running_gateway  # noqa: E402
from pyspark_logsource.gateway.entities import make  # noqa: E402
from pyspark_logsource.gateway.group_bridge import encode_subscription  # noqa: E402
from segment_format.root import LogRoot  # noqa: E402

from .client_assigned_members import (  # noqa: E402
    FAST,
    NAME,
    LopsidedAssignor,
    OwnCooperativeAssignor,
    lopsided,
    member_id,
)
from .gateway_fixtures import REPO, gateway_process  # noqa: E402
from .test_gateway_groups import brokers_seen, coordinator_port  # noqa: E402

TOPIC = "t"
PARTITIONS = [(TOPIC, p) for p in range(6)]
#: Kafka's error codes the gateway answers with here.
NONE, INCONSISTENT_GROUP_PROTOCOL, REBALANCE_IN_PROGRESS, MEMBER_ID_REQUIRED = 0, 23, 27, 79


@pytest.fixture
def root(tmp_path: Path) -> str:
    LogStore(str(tmp_path)).create_topic(TOPIC, 6)
    return str(tmp_path)


@pytest.fixture
def bootstrap(root: str) -> Iterator[str]:
    with running_gateway(GatewayConfig(url=root, port=0)) as gw:
        yield f"127.0.0.1:{gw.port}"


@pytest.fixture(autouse=True)
def _fresh_assignor() -> None:
    LopsidedAssignor.computed.clear()


def groups(root: str, group: str) -> GroupClient:
    return GroupClient(LogRoot(root).store, group)


class Member:
    """A kafka-python member of a group, polled back to back by its own thread, as an application polls it.

    Why a thread: kafka-python 3.0.12 forgets a JoinGroup + SyncGroup that completes while nobody is inside
    ``poll`` (``ensure_active_group`` starts a new join when it finds the previous one done) and sends JoinGroup
    again. From the leader, that JoinGroup starts a rebalance, as it does on Kafka's brokers; a test polling
    several consumers in turn with short timeouts makes that the common case, and the group rebalances on and
    on. Polled back to back, a member is almost always inside ``poll`` when its join completes.
    """

    def __init__(self, bootstrap: str, group: str, strategy: Any = LopsidedAssignor) -> None:
        self.consumer = kafka.KafkaConsumer(
            TOPIC,
            bootstrap_servers=bootstrap.split(","),
            group_id=group,
            partition_assignment_strategy=[strategy],
            **FAST,
        )
        self._lock = threading.Lock()
        self._held = threading.Event()
        self._stopped = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stopped.is_set():
            if self._held.is_set():
                time.sleep(0.01)
                continue
            with self._lock:
                try:
                    self.consumer.poll(timeout_ms=100)
                except BaseException as exc:  # reported by the test
                    self.error = exc
                    return

    @contextmanager
    def held(self) -> Iterator[Any]:
        """The consumer, not polled meanwhile (to commit, or to keep the member from rejoining)."""
        self._held.set()
        try:
            with self._lock:
                yield self.consumer
        finally:
            self._held.clear()

    @property
    def member_id(self) -> str | None:
        """Its member id while its generation is stable (None: rebalancing)."""
        return member_id(self.consumer)

    def partitions(self) -> list[tuple[str, int]]:
        return sorted((tp.topic, tp.partition) for tp in self.consumer.assignment())

    def close(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=30)
        self.consumer.close()


@contextmanager
def members(bootstrap: str, group: str, n: int) -> Iterator[list[Member]]:
    started = [Member(bootstrap, group) for _ in range(n)]
    try:
        yield started
    finally:
        for m in started:
            m.close()


def stable_id(m: Member) -> str:
    """The member id of a member whose generation is stable (after :func:`settle`)."""
    found = m.member_id
    assert found is not None
    return found


def wait_for(done: Callable[[], bool], timeout_s: float, what: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout_s}s: {what()}")
        time.sleep(0.02)


def settle(
    consumers: list[Member], root: str, group: str, timeout_s: float = 30, others: tuple[str, ...] = ()
) -> tuple[Generation, dict[str, list[tuple[str, int]]]]:
    """Wait until the newest generation is ``consumers``' (and ``others``', members run elsewhere), and each
    holds the share ``lopsided`` gives it: the generation and the shares by member id."""
    state: dict[str, Any] = {}

    def done() -> bool:
        assert not any(c.error for c in consumers), [c.error for c in consumers]
        got = {c.member_id: c.partitions() for c in consumers}
        gen = groups(root, group).latest_generation()
        state.update(gen=gen, got=got)
        ids = [m for m in got if m is not None]
        if len(ids) != len(consumers) or set(gen.members) != {*ids, *others}:
            return False
        return got == {m: s for m, s in lopsided(list(gen.members), PARTITIONS).items() if m in got}

    wait_for(done, timeout_s, lambda: f"{len(consumers)} members hold lopsided shares; last saw {state}")
    return state["gen"], state["got"]


def assert_client_assigned(root: str, group: str, gen: Generation) -> None:
    """``gen`` is the leader's: plog assigned nothing, and the stored assignment is the client's bytes verbatim."""
    assert gen.client_assigned and gen.protocol == NAME and gen.protocol_type == "consumer"
    assert gen.leader in gen.members
    assert gen.assignment == {} and gen.partitions == {}
    stored = groups(root, group).client_assignment(gen.number)
    assert stored is not None and stored.leader == gen.leader and set(stored.assignment) == set(gen.members)
    for m, share in lopsided(list(gen.members), PARTITIONS).items():
        by_topic: dict[str, list[int]] = {}
        for t, p in share:
            by_topic.setdefault(t, []).append(p)
        # kafka-python's encoding (user data b"", where plog's encoder writes null): the client's bytes, stored as sent
        assert stored.bytes_of(m) == ConsumerProtocolAssignment(0, sorted(by_topic.items()), b"").encode()


def commit(m: Member, offsets: dict[int, int]) -> None:
    with m.held() as c:
        c.commit({KafkaTP(TOPIC, p): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()})


def committed(m: Member) -> list[int | None]:
    """The committed offsets of partitions 0-5, as the member's client reads them."""
    with m.held() as c:
        return [c.committed(KafkaTP(TOPIC, p)) for p in range(6)]


# ---------------------------------------------------------------------- a custom assignor


def test_the_leaders_own_assignor_assigns_two_then_three_members(
    root: str, bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with members(bootstrap, "custom", 2) as consumers:
        gen, got = settle(consumers, root, "custom")
        assert_client_assigned(root, "custom", gen)
        # The leader's process ran the assignor on both members; plog's assignors would have balanced 3 + 3.
        assert LopsidedAssignor.computed[-1] == tuple(sorted(gen.members))
        assert sorted(map(len, got.values())) == [1, 5]
        # Each member commits its partitions in the client-assigned generation; both sides read them back.
        offsets = {p: 10 + p for p in range(6)}
        for m in consumers:
            commit(m, {p: offsets[p] for _, p in got[stable_id(m)]})
        assert groups(root, "custom").committed() == {(TOPIC, p): o for p, o in offsets.items()}
        assert committed(consumers[0]) == [offsets[p] for p in range(6)]

        consumers.append(Member(bootstrap, "custom"))  # closed by members() too
        gen3, got3 = settle(consumers, root, "custom")
        assert gen3.number > gen.number and len(gen3.members) == 3
        assert_client_assigned(root, "custom", gen3)
        assert LopsidedAssignor.computed[-1] == tuple(sorted(gen3.members))
        assert sorted(map(len, got3.values())) == [1, 1, 4]
        # The offsets committed in the earlier generation carry over; the newcomer commits in the new one.
        assert committed(consumers[2]) == [offsets[p] for p in range(6)]
        mine = {p: 100 + p for _, p in got3[stable_id(consumers[2])]}
        commit(consumers[2], mine)
        offsets.update(mine)
        assert groups(root, "custom").committed() == {(TOPIC, p): o for p, o in offsets.items()}
        assert committed(consumers[0]) == [offsets[p] for p in range(6)]
        # plog's own tool shows the leader's assignment, decoded, and who owns what.
        capsys.readouterr()
        assert cli_main(["groups", "describe", "custom", "--url", root]) == 0
        shown = capsys.readouterr().out
        assert f"assigned by its leader {gen3.leader}" in shown and "type consumer" in shown
        for member, tps in got3.items():
            line = next(row for row in shown.splitlines() if member in row and "yes" in row)
            assert all(f"{t}-{p}" in line for t, p in tps)


def test_a_cooperative_protocol_the_clients_run_themselves_never_owns_a_partition_twice(
    root: str, bootstrap: str
) -> None:
    """KIP-429 over the classic protocol, run by the clients: a member that must give partitions up keeps the
    rest, revokes, and rejoins with what it still owns; its changed metadata starts the follow-up rebalance
    (PROTOCOL.md 11.4, *Triggers*) in which the leader hands the withheld partitions out."""
    consumers = [Member(bootstrap, "coop", OwnCooperativeAssignor) for _ in range(2)]
    seen_twice: list[dict[str, list[tuple[str, int]]]] = []
    try:

        def balanced(sizes: list[int]) -> Callable[[], bool]:
            def done() -> bool:
                assert not any(c.error for c in consumers), [c.error for c in consumers]
                owned = {c.member_id or f"?{i}": c.partitions() for i, c in enumerate(consumers)}
                flat = [tp for tps in owned.values() for tp in tps]
                if len(flat) != len(set(flat)):
                    seen_twice.append(owned)
                gen = groups(root, "coop").latest_generation()
                return sorted(map(len, owned.values())) == sizes and len(gen.members) == len(consumers)

            return done

        wait_for(balanced([3, 3]), 30, lambda: f"two members own 3 each; saw {[c.partitions() for c in consumers]}")
        first = groups(root, "coop").latest_generation()
        assert first.client_assigned and first.protocol == "own-cooperative"
        consumers.append(Member(bootstrap, "coop", OwnCooperativeAssignor))
        wait_for(
            balanced([2, 2, 2]), 45, lambda: f"three members own 2 each; saw {[c.partitions() for c in consumers]}"
        )
        # The newcomer's share was withheld for one rebalance, then handed out: at least two generations.
        assert groups(root, "coop").latest_generation().number >= first.number + 2
        assert not seen_twice, seen_twice[:3]
    finally:
        for c in consumers:
            c.close()


class ChildMember:
    """``python -m tests.client_assigned_members`` as a real process, and the lines it printed."""

    def __init__(self, bootstrap: str, group: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.client_assigned_members", bootstrap, group, TOPIC],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(json.loads(line))

    def last(self) -> dict[str, Any]:
        return self.lines[-1] if self.lines else {}

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)


def test_survivors_of_a_sigkilled_member_get_all_partitions_from_their_leader(root: str, bootstrap: str) -> None:
    child = ChildMember(bootstrap, "killed")
    try:
        with members(bootstrap, "killed", 2) as survivors:
            wait_for(lambda: bool(child.lines), 30, lambda: "the child member joined")
            dead = child.last()["member"]
            gen, _ = settle(survivors, root, "killed", others=(dead,))
            partitions = [p for _, p in lopsided(list(gen.members), PARTITIONS)[dead]]
            wanted = {"member": dead, "generation": gen.number, "partitions": partitions}
            wait_for(
                lambda: child.last() == wanted, 30, lambda: f"the child printed {wanted}; it printed {child.lines}"
            )
            child.kill()
            killed = time.monotonic()
            # No LeaveGroup: the gateway expires the child after its session timeout (6 s), and the survivors'
            # leader assigns all six partitions to the two of them.
            after, got = settle(survivors, root, "killed", timeout_s=30)
            assert time.monotonic() - killed < 25
            assert dead not in after.members and after.number > gen.number
            assert_client_assigned(root, "killed", after)
            assert sorted(tp for share in got.values() for tp in share) == PARTITIONS
    finally:
        child.kill()


def test_a_gateway_sigkilled_mid_rebalance_loses_neither_the_group_nor_its_offsets(root: str) -> None:
    fast = ("--heartbeat-ms", "300", "--registration-ms", "60000")
    with gateway_process(root, *fast) as (proc_a, port_a), gateway_process(root, *fast) as (_, port_b):
        both = f"127.0.0.1:{port_a},127.0.0.1:{port_b}"
        deadline = time.monotonic() + 30
        while not brokers_seen(f"127.0.0.1:{port_a}") == brokers_seen(f"127.0.0.1:{port_b}") == {port_a, port_b}:
            assert time.monotonic() < deadline, "the two gateways never listed each other"
            time.sleep(0.1)
        group = next(f"ca-crash-{i}" for i in range(1000) if coordinator_port(root, f"ca-crash-{i}") == port_a)
        with members(both, group, 2) as consumers:
            # kafka-python rejoins when a join completes outside poll (see Member), and a leader's rejoin starts a
            # rebalance, as on Kafka's brokers: on a loaded machine the first settling can take a few rounds.
            before, got = settle(consumers, root, group, timeout_s=90)
            assert_client_assigned(root, group, before)
            offsets = {p: 50 + p for p in range(6)}
            for m in consumers:
                commit(m, {p: offsets[p] for _, p in got[stable_id(m)]})
            assert groups(root, group).committed() == {(TOPIC, p): o for p, o in offsets.items()}

            # A third member starts joining while the other two are not polled, so that they cannot rejoin:
            # the rebalance is in progress (its marker exists, the newcomer is in no generation) when A dies.
            client = groups(root, group)
            with consumers[0].held(), consumers[1].held():
                consumers.append(Member(both, group))
                wait_for(
                    lambda: client.rebalance_marker_exists(before.number),
                    30,
                    lambda: "the third member's join started a rebalance",
                )
                proc_a.send_signal(signal.SIGKILL)
                proc_a.wait(timeout=10)
                killed = time.monotonic()
                assert client.latest_generation().number == before.number  # killed mid-rebalance

            # The members rejoin through B with new ids (A's members expire after their session timeout, 6 s),
            # and the leader's client assigns every partition once.
            after, got = settle(consumers, root, group, timeout_s=90)
            assert time.monotonic() - killed < 90
            assert len(after.members) == 3 and not set(after.members) & set(before.members)
            assert_client_assigned(root, group, after)
            assert sorted(tp for share in got.values() for tp in share) == PARTITIONS
            assert groups(root, group).committed() == {(TOPIC, p): o for p, o in offsets.items()}
            assert committed(consumers[2]) == [offsets[p] for p in range(6)]


# ---------------------------------------------------------------------- Kafka Connect's protocol type


class Wire:
    """One connection to a gateway, requests and answers encoded with kio (as a Connect worker's client sends them)."""

    def __init__(self, port: int, client_id: str = "connect-worker") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.client_id = client_id
        self.correlation = 0

    def close(self) -> None:
        self.sock.close()

    def call(self, api_key: int, version: int, **fields: Any) -> Any:
        request = make(load_request_schema(api_key, version), **fields)
        header_schema = request.__header_schema__
        self.correlation += 1
        header = header_schema(
            request_api_key=api_key,
            request_api_version=version,
            correlation_id=self.correlation,
            client_id=self.client_id,
        )
        out = io.BytesIO()
        entity_writer(header_schema)(out, header)
        entity_writer(type(request))(out, request)
        self.sock.sendall(struct.pack(">i", len(out.getvalue())) + out.getvalue())
        (size,) = struct.unpack(">i", self._read(4))
        body = self._read(size)
        schema = load_response_schema(api_key, version)
        answer_header, offset = entity_reader(schema.__header_schema__)(body, 0)
        assert answer_header.correlation_id == self.correlation
        response, _ = entity_reader(schema)(body, offset)
        return response

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            assert chunk, "the gateway closed the connection"
            data += chunk
        return data


def join(
    wire: Wire,
    group: str,
    member: str,
    protocol_type: str,
    protocols: list[tuple[str, bytes]],
    rebalance_ms: int = 10_000,
) -> Any:
    """JoinGroup v7 (its answer names the protocol type)."""
    return wire.call(
        11,
        7,
        group_id=group,
        session_timeout=6000,
        rebalance_timeout=rebalance_ms,
        member_id=member,
        group_instance_id=None,
        protocol_type=protocol_type,
        protocols=[{"name": name, "metadata": data} for name, data in protocols],
    )


def assignment_for(member: str) -> bytes:
    """What a Connect leader assigns ``member``: bytes no broker could parse, that must come back verbatim."""
    return b"\x00\xffconnect-assignment\x00" + member.encode() + b"\xfe"


@dataclass
class Round:
    """One completed join and sync of a Connect worker."""

    join: Any
    sync: Any


class ConnectWorker(threading.Thread):
    """A Kafka Connect worker's group protocol: join (learning its id first), sync (the leader sends everyone's
    assignment), heartbeat until told to rejoin. Every completed round is kept."""

    def __init__(self, port: int, group: str, metadata: bytes) -> None:
        super().__init__(daemon=True)
        self.port, self.group, self.metadata = port, group, metadata
        self.member = ""
        self.rounds: list[Round] = []
        self.error: BaseException | None = None
        self.stopped = threading.Event()

    def run(self) -> None:
        wire = Wire(self.port)
        try:
            while not self.stopped.is_set():
                joined = join(wire, self.group, self.member, "connect", [("sessioned", self.metadata)])
                if joined.error_code == MEMBER_ID_REQUIRED:
                    self.member = joined.member_id
                    continue
                if joined.error_code == REBALANCE_IN_PROGRESS:
                    continue
                assert joined.error_code == NONE, joined
                self.member = joined.member_id
                assignments = []
                if joined.leader == self.member:
                    assignments = [
                        {"member_id": m.member_id, "assignment": assignment_for(m.member_id)} for m in joined.members
                    ]
                synced = wire.call(
                    14,
                    5,
                    group_id=self.group,
                    generation_id=joined.generation_id,
                    member_id=self.member,
                    group_instance_id=None,
                    protocol_type="connect",
                    protocol_name=joined.protocol_name,
                    assignments=assignments,
                )
                if synced.error_code == REBALANCE_IN_PROGRESS:
                    continue
                assert synced.error_code == NONE, synced
                self.rounds.append(Round(joined, synced))
                while not self.stopped.wait(1.0):
                    beat = wire.call(
                        12,
                        4,
                        group_id=self.group,
                        generation_id=joined.generation_id,
                        member_id=self.member,
                        group_instance_id=None,
                    )
                    if beat.error_code == REBALANCE_IN_PROGRESS:
                        break
                    assert beat.error_code == NONE, beat
            if self.member:
                wire.call(
                    13, 3, group_id=self.group, members=[{"member_id": self.member, "group_instance_id": None}]
                )  # LeaveGroup
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            wire.close()


def test_connect_workers_leader_gets_the_metadata_and_followers_its_bytes(root: str, bootstrap: str) -> None:
    port = int(bootstrap.rsplit(":", 1)[1])
    metadata = [b'\x01worker-a\x00\xff{"url": "http://a:8083"}', b'\x01worker-b\x00\xfe{"url": "http://b:8083"}']
    workers = [ConnectWorker(port, "connect-cluster", m) for m in metadata]
    for w in workers:
        w.start()
    try:

        def both_synced() -> bool:
            assert not any(w.error for w in workers), [w.error for w in workers]
            if not all(w.rounds for w in workers):
                return False
            rounds = [w.rounds[-1] for w in workers]
            gens = {r.join.generation_id for r in rounds}
            leaders = [r for r in rounds if r.join.leader == r.join.member_id]
            return len(gens) == 1 and len(leaders) == 1 and len(leaders[0].join.members) == 2

        wait_for(both_synced, 30, lambda: f"two workers synced one generation: {[w.rounds for w in workers]}")
        rounds = [w.rounds[-1] for w in workers]
        ids = [w.member for w in workers]
        (leader,) = [r for r in rounds if r.join.leader == r.join.member_id]
        (follower,) = [r for r in rounds if r is not leader]
        for r in rounds:
            assert (r.join.protocol_type, r.join.protocol_name, r.join.leader) == (
                "connect",
                "sessioned",
                leader.join.member_id,
            )
            assert (r.sync.protocol_type, r.sync.protocol_name) == ("connect", "sessioned")
            # Each worker's SyncGroup answer is exactly what the leader assigned it.
            assert r.sync.assignment == assignment_for(r.join.member_id)
        # Only the leader learns the members, with each one's metadata exactly as its worker sent it.
        assert {m.member_id: m.metadata for m in leader.join.members} == dict(zip(ids, metadata, strict=True))
        assert follower.join.members == ()

        gen = groups(root, "connect-cluster").latest_generation()
        assert gen.client_assigned and gen.protocol_type == "connect" and gen.protocol == "sessioned"
        assert gen.leader == leader.join.member_id and set(gen.members) == set(ids)
        assert gen.number == leader.join.generation_id
        stored = groups(root, "connect-cluster").client_assignment(gen.number)
        assert stored is not None and {m: stored.bytes_of(m) for m in ids} == {m: assignment_for(m) for m in ids}

        wire = Wire(port, "admin")
        try:
            (described,) = wire.call(15, 5, groups=["connect-cluster"], include_authorized_operations=False).groups
            assert (described.error_code, described.group_state) == (NONE, "Stable")
            assert (described.protocol_type, described.protocol_data) == ("connect", "sessioned")
            assert {m.member_id: (m.member_metadata, m.member_assignment) for m in described.members} == {
                m: (data, assignment_for(m)) for m, data in zip(ids, metadata, strict=True)
            }
            listed = wire.call(16, 4, states_filter=[])
            assert listed.error_code == NONE
            assert {(g.group_id, g.protocol_type) for g in listed.groups} == {("connect-cluster", "connect")}
            # A consumer cannot join a Connect cluster's group: Kafka's INCONSISTENT_GROUP_PROTOCOL.
            asked = join(wire, "connect-cluster", "", "consumer", [("range", encode_subscription([TOPIC]))])
            assert asked.error_code == MEMBER_ID_REQUIRED
            refused = join(
                wire, "connect-cluster", asked.member_id, "consumer", [("range", encode_subscription([TOPIC]))]
            )
            assert refused.error_code == INCONSISTENT_GROUP_PROTOCOL
        finally:
            wire.close()
        assert groups(root, "connect-cluster").latest_generation().number == gen.number  # nobody rebalanced
    finally:
        for w in workers:
            w.stopped.set()
        for w in workers:
            w.join(timeout=20)
    assert not any(w.error for w in workers), [w.error for w in workers]


# ---------------------------------------------------------------------- no protocol in common


def refused(bootstrap: str, group: str, strategy: Any, timeout_s: float = 30) -> None:
    """A kafka-python consumer of ``group`` with ``strategy`` only is refused with INCONSISTENT_GROUP_PROTOCOL."""
    c = kafka.KafkaConsumer(
        TOPIC, bootstrap_servers=[bootstrap], group_id=group, partition_assignment_strategy=[strategy], **FAST
    )
    try:
        deadline = time.monotonic() + timeout_s
        with pytest.raises(InconsistentGroupProtocolError):  # noqa: PT012 (polling until it raises)
            while time.monotonic() < deadline:
                c.poll(timeout_ms=100)
        assert not c.assignment()
    finally:
        c.close()


def test_members_with_no_protocol_in_common_are_refused(root: str, bootstrap: str) -> None:
    ranged, custom = Member(bootstrap, "ranged", RangePartitionAssignor), Member(bootstrap, "custom")
    try:
        wait_for(
            lambda: all(m.member_id is not None and len(m.partitions()) == 6 for m in (ranged, custom)),
            30,
            lambda: "each group's single member owns all six partitions",
        )
        ranged_gen = groups(root, "ranged").latest_generation()
        custom_gen = groups(root, "custom").latest_generation()
        assert ranged_gen.protocol == "range" and not ranged_gen.client_assigned
        assert custom_gen.protocol == NAME and custom_gen.client_assigned

        # A member whose only protocol is the custom one, in a group whose live member uses only range ...
        refused(bootstrap, "ranged", LopsidedAssignor)
        # ... and the reverse.
        refused(bootstrap, "custom", RangePartitionAssignor)
        # A Connect worker in a consumer group.
        wire = Wire(int(bootstrap.rsplit(":", 1)[1]))
        try:
            asked = join(wire, "ranged", "", "connect", [("sessioned", b"\x01worker")])
            assert asked.error_code == MEMBER_ID_REQUIRED
            answer = join(wire, "ranged", asked.member_id, "connect", [("sessioned", b"\x01worker")])
            assert answer.error_code == INCONSISTENT_GROUP_PROTOCOL
        finally:
            wire.close()
        # Refused at once: the groups never rebalanced, and their members kept everything.
        assert groups(root, "ranged").latest_generation().number == ranged_gen.number
        assert groups(root, "custom").latest_generation().number == custom_gen.number
        assert len(ranged.partitions()) == len(custom.partitions()) == 6
        assert not ranged.error and not custom.error
    finally:
        ranged.close()
        custom.close()
