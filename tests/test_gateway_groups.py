"""Kafka's consumer groups through ``plog serve``: real Kafka clients in plog's own groups (PROTOCOL.md 11.4).

Every client here is a real Kafka client (confluent-kafka's librdkafka, kafka-python);
the groups they join are plog's, read back with plog's own ``GroupClient`` and ``Consumer``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer as KafkaConsumer  # noqa: E402
from confluent_kafka import TopicPartition as KafkaTP  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

from coordinator.groups import GroupClient  # noqa: E402
from pyspark_logsource import Consumer as PlogConsumer  # noqa: E402
from pyspark_logsource import LogStore, TopicPartition  # noqa: E402
from pyspark_logsource.gateway import GatewayConfig, running_gateway  # noqa: E402
from segment_format.root import LogRoot  # noqa: E402

from .gateway_fixtures import REPO  # noqa: E402

TOPIC = "t"
#: Short timeouts keep each test to seconds (Kafka's minimum session timeout is 6 s).
FAST = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000, "enable.auto.commit": False, "log_level": 3}


@pytest.fixture
def root(tmp_path: Path) -> str:
    LogStore(str(tmp_path)).create_topic(TOPIC, 6)
    return str(tmp_path)


@pytest.fixture
def bootstrap(root: str) -> Iterator[str]:
    with running_gateway(GatewayConfig(url=root, port=0)) as gw:
        yield f"127.0.0.1:{gw.port}"


def consumer(bootstrap: str, group: str, **extra: Any) -> Any:
    return KafkaConsumer({"bootstrap.servers": bootstrap, "group.id": group, **FAST, **extra})


def poll_until(consumers: list[Any], done: Callable[[], bool], timeout_s: float = 30.0, what: str = "") -> None:
    """Poll every consumer (callbacks run in poll) until ``done()``; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for c in consumers:
            c.poll(0.05)
        if done():
            return
    raise AssertionError(f"not reached within {timeout_s}s: {what}")


def owned(c: Any) -> set[int]:
    return {tp.partition for tp in c.assignment()}


def balanced(consumers: list[Any], each: int) -> Callable[[], bool]:
    def check() -> bool:
        sets = [owned(c) for c in consumers]
        union = set().union(*sets)
        return all(len(s) == each for s in sets) and union == set(range(6)) and sum(map(len, sets)) == 6

    return check


def test_three_consumers_get_two_partitions_each(root: str, bootstrap: str) -> None:
    consumers = [consumer(bootstrap, "g", **{"partition.assignment.strategy": "range"}) for _ in range(3)]
    try:
        for c in consumers:
            c.subscribe([TOPIC])
        poll_until(consumers, balanced(consumers, 2), what="3 x 2 partitions")
        sets = [owned(c) for c in consumers]
        assert sorted(p for s in sets for p in s) == list(range(6))  # disjoint, covering all
        # Range hands out contiguous ranges, as plog's (and Kafka's) range assignor does.
        assert sorted(sorted(s) for s in sets) == [[0, 1], [2, 3], [4, 5]]
        # The group is plog's: its newest generation lists the three Kafka members with that assignment.
        gen = GroupClient(LogRoot(root).store, "g").latest_generation()
        assert gen.protocol == "range" and len(gen.members) == 3
        assert sorted(tp for tps in gen.assignment.values() for tp in tps) == [(TOPIC, p) for p in range(6)]
    finally:
        for c in consumers:
            c.close()


_CHILD = """
import sys, time
from confluent_kafka import Consumer
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": "g", "session.timeout.ms": 6000,
              "heartbeat.interval.ms": 1000, "enable.auto.commit": False, "log_level": 3})
c.subscribe(["t"])
announced = False
while True:
    c.poll(0.1)
    if c.assignment() and not announced:
        print("assigned", sorted(tp.partition for tp in c.assignment()), flush=True)
        announced = True
"""


def test_sigkilled_member_expires_and_survivors_take_its_partitions(root: str, bootstrap: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_CHILD), bootstrap], env=env, stdout=subprocess.PIPE, text=True
    )
    survivors = [consumer(bootstrap, "g") for _ in range(2)]
    try:
        for c in survivors:
            c.subscribe([TOPIC])
        poll_until(survivors, lambda: all(len(owned(c)) == 2 for c in survivors), what="two of three shares")
        assert child.stdout is not None
        line = child.stdout.readline()  # the child has its share too (it printed it)
        assert line.startswith("assigned"), line
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        killed = time.monotonic()
        # No LeaveGroup was sent: the gateway expires the member after its session timeout (6 s), its plog
        # member leaves, and the survivors' rebalance gives them all six partitions.
        poll_until(survivors, balanced(survivors, 3), timeout_s=25, what="survivors own all partitions")
        assert time.monotonic() - killed < 20
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for c in survivors:
            c.close()


def test_offsets_committed_on_either_side_are_read_on_the_other(root: str, bootstrap: str) -> None:
    # A Kafka member commits in its generation; plog's GroupClient and plog's Consumer read it.
    c = consumer(bootstrap, "g")
    try:
        c.subscribe([TOPIC])
        poll_until([c], lambda: len(owned(c)) == 6, what="the single member owns everything")
        c.commit(offsets=[KafkaTP(TOPIC, 0, 5), KafkaTP(TOPIC, 3, 9)], asynchronous=False)
        committed = GroupClient(LogRoot(root).store, "g").committed()
        assert committed == {(TOPIC, 0): 5, (TOPIC, 3): 9}
        plog = PlogConsumer(root, group_id="g")
        try:
            assert plog.committed(TopicPartition(TOPIC, 3)) == 9
        finally:
            plog.close()
        got = c.committed([KafkaTP(TOPIC, 0), KafkaTP(TOPIC, 1)], timeout=10)
        assert [(tp.partition, tp.offset) for tp in got] == [(0, 5), (1, -1001)]  # -1 on the wire: no offset
    finally:
        c.close()
    # plog's own consumer commits (standalone, no live members); a Kafka consumer reads it.
    plog = PlogConsumer(root, group_id="g2")
    try:
        plog.commit({TopicPartition(TOPIC, 2): 42})
    finally:
        plog.close()
    reader = consumer(bootstrap, "g2")
    try:
        got = reader.committed([KafkaTP(TOPIC, 2)], timeout=10)
        assert got[0].offset == 42
        # A Kafka consumer without a subscription commits standalone too (the group has no live member).
        reader.commit(offsets=[KafkaTP(TOPIC, 4, 11)], asynchronous=False)
    finally:
        reader.close()
    assert GroupClient(LogRoot(root).store, "g2").committed() == {(TOPIC, 2): 42, (TOPIC, 4): 11}


def test_kafka_python_joins_and_gets_an_assignment(root: str, bootstrap: str) -> None:
    kafka = pytest.importorskip("kafka")
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

    c = kafka.KafkaConsumer(
        TOPIC,
        bootstrap_servers=bootstrap,
        group_id="kp",
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
        enable_auto_commit=False,
        partition_assignment_strategy=[RoundRobinPartitionAssignor],
        request_timeout_ms=30000,
    )
    try:
        deadline = time.monotonic() + 30
        while not c.assignment() and time.monotonic() < deadline:
            c.poll(timeout_ms=100)
        assert {tp.partition for tp in c.assignment()} == set(range(6))
        gen = GroupClient(LogRoot(root).store, "kp").latest_generation()
        assert gen.protocol == "roundrobin" and list(gen.members) == [next(iter(gen.members))]
    finally:
        c.close()


def test_cooperative_sticky_never_owns_a_partition_twice(root: str, bootstrap: str) -> None:
    owners: dict[str, set[int]] = {"a": set(), "b": set()}
    overlaps: list[tuple[set[int], set[int]]] = []

    def tracker(name: str) -> dict[str, Any]:
        def on_assign(c: Any, parts: list[Any]) -> None:
            owners[name] |= {p.partition for p in parts}
            other = owners["b" if name == "a" else "a"]
            if owners[name] & other:
                overlaps.append((set(owners["a"]), set(owners["b"])))

        def on_revoke(c: Any, parts: list[Any]) -> None:
            owners[name] -= {p.partition for p in parts}

        return {"on_assign": on_assign, "on_revoke": on_revoke}

    strategy = {"partition.assignment.strategy": "cooperative-sticky"}
    a = consumer(bootstrap, "coop", **strategy)
    b = consumer(bootstrap, "coop", **strategy)
    try:
        a.subscribe([TOPIC], **tracker("a"))
        poll_until([a], lambda: owners["a"] == set(range(6)), what="a owns all six")
        b.subscribe([TOPIC], **tracker("b"))
        poll_until([a, b], lambda: len(owners["a"]) == 3 and len(owners["b"]) == 3, what="3 + 3")
        assert not overlaps, overlaps
        assert owners["a"] | owners["b"] == set(range(6))
        assert owned(a) == owners["a"] and owned(b) == owners["b"]
        # plog withheld the moved partitions for one generation, then gave them to b (the follow-up).
        gens = GroupClient(LogRoot(root).store, "coop")
        latest = gens.latest_generation()
        assert latest.protocol == "cooperative-sticky" and not latest.revoking
        assert any(g is not None and g.revoking for g in map(gens.generation, range(1, latest.number)))
    finally:
        a.close()
        b.close()


def test_admin_client_lists_and_describes_the_group(root: str, bootstrap: str) -> None:
    consumers = [consumer(bootstrap, "listed") for _ in range(2)]
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    try:
        for c in consumers:
            c.subscribe([TOPIC])
        poll_until(consumers, balanced(consumers, 3), what="2 x 3 partitions")
        listing = admin.list_consumer_groups(request_timeout=10).result()
        groups = {g.group_id: g for g in listing.valid}
        assert "listed" in groups
        assert groups["listed"].state == confluent_kafka.ConsumerGroupState.STABLE
        description = admin.describe_consumer_groups(["listed"], request_timeout=10)["listed"].result()
        member_ids = {m.member_id for m in description.members}
        assert len(member_ids) == 2 and description.partition_assignor == "range"
        assigned = sorted(tp.partition for m in description.members for tp in m.assignment.topic_partitions)
        assert assigned == list(range(6))
        assert member_ids == set(GroupClient(LogRoot(root).store, "listed").latest_generation().members)
    finally:
        for c in consumers:
            c.close()


def test_admin_delete_groups_clears_the_offsets_and_keeps_the_numbering(root: str, bootstrap: str) -> None:
    """DeleteGroups expires the group (PROTOCOL.md 11.4, *Expiry*): its offsets are gone, and a later consumer of
    the name continues at a higher generation, so a commit that raced the deletion is never read."""
    c = consumer(bootstrap, "doomed")
    c.subscribe([TOPIC])
    poll_until([c], balanced([c], 6), what="6 partitions")
    c.commit(offsets=[KafkaTP(TOPIC, p, 1) for p in range(6)], asynchronous=False)
    c.close()
    client = GroupClient(LogRoot(root).store, "doomed")
    before = client.latest_generation().number
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    deadline = time.monotonic() + 30
    while True:  # the member's leave may still be settling: Kafka answers NON_EMPTY_GROUP meanwhile
        try:
            admin.delete_consumer_groups(["doomed"], request_timeout=10)["doomed"].result()
            break
        except confluent_kafka.KafkaException:
            assert time.monotonic() < deadline, "DeleteGroups kept failing"
            time.sleep(0.2)
    assert client.committed() == {}
    assert client.latest_generation().number == before + 1
    missing = admin.delete_consumer_groups(["never-was"], request_timeout=10)["never-was"]
    with pytest.raises(confluent_kafka.KafkaException, match="GROUP_ID_NOT_FOUND"):
        missing.result()


def group_coordinated_by(gw: Any, port: int, prefix: str) -> str:
    """A group name that ``gw`` (an in-process gateway) says the gateway on ``port`` coordinates."""
    deadline = time.monotonic() + 30
    while not any(info.port == port for info in gw.directory.live):  # it lists the other at its next refresh
        assert time.monotonic() < deadline, f"gateway {gw.port} never listed the one on {port}"
        gw.directory.refresh()
        time.sleep(0.05)
    return next(
        f"{prefix}-{i}" for i in range(1000) if gw.directory.coordinator_for("group", f"{prefix}-{i}").port == port
    )


def test_a_sigkilled_gateway_loses_no_group_state(root: str) -> None:
    from .gateway_fixtures import gateway_process

    # The survivor runs before the crash and would name the dead gateway as the group's coordinator (its
    # registration outlives it by up to 30 s): the survivor must stop sending clients there at once.
    with running_gateway(GatewayConfig(url=root, port=0)) as gw, gateway_process(root) as (proc, port):
        group = group_coordinated_by(gw, port, "crash")
        c = consumer(f"127.0.0.1:{port}", group)
        c.subscribe([TOPIC])
        poll_until([c], lambda: len(owned(c)) == 6, what="the member through the first gateway owns everything")
        c.commit(offsets=[KafkaTP(TOPIC, 1, 17)], asynchronous=False)
        proc.send_signal(signal.SIGKILL)  # the gateway dies without its members leaving
        proc.wait(timeout=10)
        killed = time.monotonic()
        c.close()
        # Nothing lived only in the dead gateway: through the other one, a new member is in the same plog group
        # (once the dead member's heartbeats age out: its session timeout, 6 s) and reads the committed offset.
        other = consumer(f"127.0.0.1:{gw.port}", group)
        try:
            other.subscribe([TOPIC])
            poll_until([other], lambda: len(owned(other)) == 6, timeout_s=30, what="the new member owns everything")
            assert time.monotonic() - killed < 25  # the session timeout and a rebalance, not the registration's 31 s
            assert other.committed([KafkaTP(TOPIC, 1)], timeout=10)[0].offset == 17
            gen = GroupClient(LogRoot(root).store, group).latest_generation()
            assert len(gen.members) == 1 and gen.number >= 2
        finally:
            other.close()


def coordinator_port(root: str, group: str) -> int:
    """The port of the gateway every live gateway names as ``group``'s coordinator (from their registrations)."""
    from pyspark_logsource.gateway.directory import GATEWAYS, GatewayHeartbeat, GatewayInfo, rendezvous

    store = LogRoot(root).store
    newest: dict[str, str] = {}
    for info in store.list(GATEWAYS):
        gateway = info.key[len(GATEWAYS) :].split("/", 1)[0]
        newest[gateway] = max(newest.get(gateway, ""), info.key)
    live = []
    for key in newest.values():
        hb = GatewayHeartbeat.from_json(store.get(key), what=key)
        if not hb.leaving:
            live.append(GatewayInfo(hb.node_id, hb.host, hb.port, hb.gateway_id))
    return rendezvous(live, f"group\0{group}").port


def brokers_seen(bootstrap: str) -> set[int]:
    """The broker ports one gateway names in Metadata."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    return {b.port for b in admin.list_topics(timeout=10).brokers.values()}


def test_members_move_to_the_surviving_gateway_and_lose_no_record(root: str) -> None:
    from confluent_kafka import KafkaException, Producer

    from .gateway_fixtures import gateway_process

    # The two gateways list each other within a second; a registration outlives its gateway by a minute, so
    # that only noticing the dead gateway at once (not the registration's expiry) passes the deadline below.
    fast = ("--heartbeat-ms", "300", "--registration-ms", "60000")
    with gateway_process(root, *fast) as (proc_a, port_a), gateway_process(root, *fast) as (proc_b, port_b):
        both = f"127.0.0.1:{port_a},127.0.0.1:{port_b}"
        deadline = time.monotonic() + 30
        while not brokers_seen(f"127.0.0.1:{port_a}") == brokers_seen(f"127.0.0.1:{port_b}") == {port_a, port_b}:
            assert time.monotonic() < deadline, "the two gateways never listed each other"
            time.sleep(0.1)
        # The group is one that both gateways say A coordinates: every member runs in A, and A dies.
        group = next(f"failover-{i}" for i in range(1000) if coordinator_port(root, f"failover-{i}") == port_a)

        delivered: dict[int, int] = {}  # partition -> next offset
        failures: list[Any] = []

        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                failures.append(err)
            else:
                delivered[msg.partition()] = max(delivered.get(msg.partition(), 0), msg.offset() + 1)

        producer = Producer({"bootstrap.servers": both, "linger.ms": 5, "log_level": 3})
        expected: set[str] = set()

        def produce(start: int, count: int) -> None:
            for i in range(start, start + count):
                producer.produce(TOPIC, value=f"v{i}".encode(), partition=i % 6, on_delivery=on_delivery)
                expected.add(f"v{i}")
            assert producer.flush(60) == 0, "records not delivered within 60 s"
            assert not failures, failures

        seen: set[str] = set()

        def consume(consumers: list[Any]) -> None:
            """One round: every member reads what it has and commits it (at least once: commit after reading)."""
            for c in consumers:
                msgs = c.consume(200, 0.05)
                got = [m for m in msgs if m.error() is None]
                seen.update(m.value().decode() for m in got)
                if got:
                    # Rebalancing, or the coordinator is gone: the commit fails and the records come again.
                    with contextlib.suppress(KafkaException):
                        c.commit(asynchronous=False)

        produce(0, 300)
        extra = {"auto.offset.reset": "earliest", "partition.assignment.strategy": "range"}
        consumers = [consumer(both, group, **extra) for _ in range(3)]
        try:
            for c in consumers:
                c.subscribe([TOPIC])

            def started() -> bool:
                consume(consumers)
                return balanced(consumers, 2)()

            poll_until([], started, timeout_s=60, what="3 x 2 partitions")
            first = GroupClient(LogRoot(root).store, group).latest_generation()
            assert len(first.members) == 3
            proc_a.send_signal(signal.SIGKILL)  # the group's gateway dies; its members never leave
            proc_a.wait(timeout=10)
            killed = time.monotonic()
            produce(300, 300)  # through B (A's partitions too: B no longer names A as their leader)
            committed_all = dict.fromkeys(((TOPIC, p) for p in range(6)), 0)

            def done() -> bool:
                consume(consumers)
                if not (balanced(consumers, 2)() and seen >= expected):
                    return False
                committed_all.update(GroupClient(LogRoot(root).store, group).committed())
                return all(committed_all[(TOPIC, p)] == delivered[p] for p in range(6))

            # The dead members' session timeout (6 s), a rebalance, and reading: well under the minute.
            poll_until([], done, timeout_s=45, what="all partitions reassigned, every record read and committed")
            assert time.monotonic() - killed < 45
            assert seen == expected and len(expected) == 600
            # The members now run in B as new plog members: the dead ones are gone from the group.
            last = GroupClient(LogRoot(root).store, group).latest_generation()
            assert len(last.members) == 3 and not set(last.members) & set(first.members)
            assert sorted(tp for tps in last.assignment.values() for tp in tps) == [(TOPIC, p) for p in range(6)]
        finally:
            for c in consumers:
                c.close()
            producer.flush(10)


def test_kafka_python_and_confluent_members_share_the_partitions(root: str, bootstrap: str) -> None:
    kafka = pytest.importorskip("kafka")
    from kafka.coordinator.assignors.range import RangePartitionAssignor

    kp = kafka.KafkaConsumer(
        TOPIC,
        bootstrap_servers=bootstrap,
        group_id="mixed",
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
        enable_auto_commit=False,
        partition_assignment_strategy=[RangePartitionAssignor],
        request_timeout_ms=30000,
    )
    ck = consumer(bootstrap, "mixed", **{"partition.assignment.strategy": "range"})
    try:
        ck.subscribe([TOPIC])

        def shared() -> bool:
            kp.poll(timeout_ms=50)
            mine, theirs = {tp.partition for tp in kp.assignment()}, owned(ck)
            return len(mine) == len(theirs) == 3 and mine | theirs == set(range(6))

        poll_until([ck], shared, timeout_s=60, what="kafka-python and confluent-kafka own 3 partitions each")
        gen = GroupClient(LogRoot(root).store, "mixed").latest_generation()
        assert gen.protocol == "range" and len(gen.members) == 2
        by_member = sorted(sorted(p for _, p in tps) for tps in gen.assignment.values())
        assert by_member == [[0, 1, 2], [3, 4, 5]]
        assert sorted([sorted(owned(ck)), sorted(tp.partition for tp in kp.assignment())]) == by_member
    finally:
        kp.close()
        ck.close()


def _join_group_v5(port: int, group: str, member_id: str) -> Any:
    """One JoinGroup v5 on a fresh connection (as a client whose coordinator moved mid-join sends it)."""
    import datetime
    import io
    import socket
    import struct

    from kio.schema.join_group.v5.request import JoinGroupRequest, JoinGroupRequestProtocol
    from kio.schema.join_group.v5.response import JoinGroupResponse
    from kio.serial import entity_reader, entity_writer

    from pyspark_logsource.gateway.group_bridge import encode_subscription

    request = JoinGroupRequest(
        group_id=group,
        session_timeout=datetime.timedelta(seconds=6),
        rebalance_timeout=datetime.timedelta(seconds=10),
        member_id=member_id,
        group_instance_id=None,
        protocol_type="consumer",
        protocols=(JoinGroupRequestProtocol(name="range", metadata=encode_subscription([TOPIC])),),
    )
    body = io.BytesIO()
    entity_writer(JoinGroupRequest)(body, request)
    client_id = b"raw"
    header = struct.pack(">hhih", 11, 5, 7, len(client_id)) + client_id
    frame = header + body.getvalue()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
            chunk = sock.recv(65536)
            assert chunk, "the gateway closed the connection"
            data += chunk
    assert struct.unpack(">i", data[4:8])[0] == 7
    response, _ = entity_reader(JoinGroupResponse)(data, 8)
    return response


def test_a_rejoin_with_a_member_id_another_gateway_runs_is_told_to_forget_it(root: str, bootstrap: str) -> None:
    c = consumer(bootstrap, "moved")
    try:
        c.subscribe([TOPIC])
        poll_until([c], lambda: len(owned(c)) == 6, what="the member owns everything")
        gen = GroupClient(LogRoot(root).store, "moved").latest_generation()
        (member_id,) = gen.members
        with running_gateway(GatewayConfig(url=root, port=0)) as other:
            # A second plog member under the same id would share its heartbeat series with the first: the
            # other gateway answers as Kafka's coordinator does for a member it does not know.
            answer = _join_group_v5(other.port, "moved", member_id)
            assert answer.error_code == 25 and answer.member_id == ""  # UNKNOWN_MEMBER_ID: join afresh
            bridge = other.services.get("groups")
            assert bridge is None or not bridge.members_of("moved")
            # A fresh id is welcome there (KIP-394: the client is given its id first).
            fresh = _join_group_v5(other.port, "moved", "")
            assert fresh.error_code == 79 and fresh.member_id  # MEMBER_ID_REQUIRED
        assert GroupClient(LogRoot(root).store, "moved").latest_generation().number == gen.number
    finally:
        c.close()


def test_a_registered_gateway_that_refuses_connections_is_not_named_to_clients(root: str) -> None:
    import socket

    from pyspark_logsource.gateway.directory import GatewayDirectory

    from .gateway_fixtures import free_port

    store = LogRoot(root).store
    port = free_port()  # nobody listens: a gateway SIGKILLed a moment ago, its registration still fresh
    dead = GatewayDirectory(store, "127.0.0.1", port, heartbeat_ms=10_000, registration_ms=60_000)
    dead.beat()
    me = GatewayDirectory(store, "127.0.0.1", free_port(), heartbeat_ms=10_000, registration_ms=60_000)
    me.refresh()
    assert {g.port for g in me._live} == {me.me.port, port}  # live by its registration
    me.probe()
    assert me.live == [me.me]  # but never named: not as a broker, a leader or a coordinator
    assert me.coordinator_for("group", "g") == me.leader_for(TOPIC, 0) == me.me
    with socket.socket() as listener:  # it comes back: named again after the next probe
        listener.bind(("127.0.0.1", port))
        listener.listen()
        me.probe()
        assert {g.port for g in me.live} == {me.me.port, port}
