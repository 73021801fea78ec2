"""Consumer groups: membership, rebalances, generation fencing, offsets, the CLI, and a SIGKILLed member.

Timeouts are small (session 1 s, heartbeat 0.1 s) so that rebalances take a
fraction of a second; in-process tests drive every consumer from one thread
(``pump``), as an eager rebalance needs every live member to poll.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from coordinator.groups import (
    Generation,
    GenerationSealed,
    GroupClient,
    Heartbeat,
    choose_protocol,
    commit_key,
    generation_key,
    heartbeat_key,
    list_groups,
    validate_group_id,
)
from pyspark_logsource import (
    CommitFailedError,
    Consumer,
    InvalidConfigError,
    LogStore,
    OffsetOutOfRangeError,
    Producer,
    StorageError,
    TopicPartition,
)
from pyspark_logsource.cli import main as plog
from segment_format.root import LogRoot

TOPIC = "events"
FAST: dict[str, Any] = {
    "session_timeout_ms": 1000,
    "heartbeat_interval_ms": 100,
    "auto_offset_reset": "earliest",
    "enable_auto_commit": False,
}
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def url(tmp_path: Path) -> str:
    root = tmp_path / "root"
    with LogStore(str(root)) as store:
        store.create_topic(TOPIC, 6)
    return str(root)


def produce(url: str, per_partition: int, partitions: int = 6, topic: str = TOPIC, start: int = 0) -> None:
    producer = Producer(url, linger_ms=0)
    for i in range(start, start + per_partition):
        for p in range(partitions):
            producer.send(topic, value=f"{p}:{i}".encode(), partition=p)
    producer.flush()
    producer.close()


class Recorder:
    """A rebalance listener that remembers its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[TopicPartition]]] = []

    def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self.calls.append(("revoked", list(revoked)))

    def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self.calls.append(("assigned", list(assigned)))


def pump(
    consumers: Iterable[Consumer],
    until: Callable[[], bool],
    timeout: float = 10.0,
    sink: dict[int, list[Any]] | None = None,
) -> float:
    """Poll every consumer in turn until ``until()``; returns the seconds it took."""
    consumers = list(consumers)
    started = time.monotonic()
    while not until():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"condition not reached within {timeout} s")
        for i, consumer in enumerate(consumers):
            records = consumer.poll(timeout_ms=10)
            if sink is not None:
                sink.setdefault(i, []).extend(r for rs in records.values() for r in rs)
    return time.monotonic() - started


def partitions(*numbers: int) -> set[TopicPartition]:
    return {TopicPartition(TOPIC, p) for p in numbers}


def consumer(url: str, name: str, **config: Any) -> Consumer:
    return Consumer(url, group_id="g", client_id=name, **{**FAST, **config})


def settled(client: GroupClient, *consumers: Consumer) -> bool:
    """Every consumer adopted the newest generation, and no rebalance is pending."""
    latest = client.latest_generation()
    return not client.rebalance_marker_exists(latest.number) and all(
        c._member is not None and c._member.adopted is not None and c._member.adopted.number == latest.number
        for c in consumers
    )


# ------------------------------------------------------------------------------------------- membership


def test_members_split_the_partitions_and_take_over_when_one_leaves(url: str) -> None:
    a, b = consumer(url, "a"), consumer(url, "b")
    la, lb = Recorder(), Recorder()
    a.subscribe([TOPIC], listener=la)
    pump([a], lambda: len(a.assignment()) == 6)
    assert la.calls == [("assigned", sorted(partitions(*range(6))))]
    b.subscribe([TOPIC], listener=lb)
    pump([a, b], lambda: len(a.assignment()) == 3 and len(b.assignment()) == 3)
    # range over sorted member ids ("a-..." < "b-..."): a keeps 0-2, b gets 3-5; eager: a revoked all first
    assert a.assignment() == partitions(0, 1, 2) and b.assignment() == partitions(3, 4, 5)
    assert la.calls[1:] == [("revoked", sorted(partitions(*range(6)))), ("assigned", sorted(partitions(0, 1, 2)))]
    assert lb.calls == [("assigned", sorted(partitions(3, 4, 5)))]
    generation = GroupClient(LogRoot(url).store, "g").latest_generation()
    assert generation.protocol == "range" and len(generation.members) == 2
    b.close()  # leaving is announced: no need to wait for the session timeout
    took = pump([a], lambda: len(a.assignment()) == 6)
    assert took < 0.9, took
    assert lb.calls[-1] == ("revoked", sorted(partitions(3, 4, 5)))
    a.close()


def test_every_record_is_read_once_by_a_stable_group(url: str) -> None:
    members = [consumer(url, n) for n in ("a", "b", "c")]
    for m in members:
        m.subscribe([TOPIC])
    pump(members, lambda: all(len(m.assignment()) == 2 for m in members))
    produce(url, 20)
    got: dict[int, list[Any]] = {}
    pump(members, lambda: sum(len(v) for v in got.values()) >= 120, sink=got)
    seen = [(r.partition, r.offset) for rs in got.values() for r in rs]
    assert sorted(seen) == [(p, o) for p in range(6) for o in range(20)]
    for i, m in enumerate(members):  # each member read exactly its own partitions
        assert {r.partition for r in got.get(i, [])} <= {tp.partition for tp in m.assignment()}
        m.close()


def test_cooperative_sticky_moves_only_what_it_must(url: str) -> None:
    strategy = {"partition_assignment_strategy": "cooperative-sticky"}
    a, b = consumer(url, "a", **strategy), consumer(url, "b", **strategy)
    la, lb = Recorder(), Recorder()
    a.subscribe([TOPIC], listener=la)
    pump([a], lambda: len(a.assignment()) == 6)
    b.subscribe([TOPIC], listener=lb)
    client = GroupClient(LogRoot(url).store, "g")
    pump([a, b], lambda: len(a.assignment()) == 3 and len(b.assignment()) == 3 and settled(client, a, b))
    latest = client.latest_generation()
    withheld = client.generation(latest.number - 1)
    assert withheld is not None and withheld.protocol == "cooperative-sticky"
    # the first rebalance took 3 partitions from a and gave them to nobody; the follow-up gave them to b
    assert b._member is not None
    assert [len(v) for v in withheld.revoking.values()] == [3]
    assert not withheld.partitions_of(b._member.member_id)
    moved = sorted(TopicPartition(*tp) for tps in withheld.revoking.values() for tp in tps)
    # Java's cooperative semantics: on_partitions_assigned after every rebalance, with what was added (maybe
    # nothing); on_partitions_revoked only with what was taken away (never the partitions a keeps)
    assert la.calls == [
        ("assigned", sorted(partitions(*range(6)))),
        ("revoked", moved),
        ("assigned", []),
        ("assigned", []),
    ]
    assert lb.calls == [("assigned", []), ("assigned", moved)]
    assert b.assignment() == set(moved)
    a.close()
    b.close()


def test_partitions_added_to_a_topic_trigger_a_rebalance(url: str) -> None:
    a = consumer(url, "a", metadata_max_age_ms=100)
    a.subscribe([TOPIC])
    pump([a], lambda: len(a.assignment()) == 6)
    with LogStore(url) as store:
        store.create_partitions(TOPIC, 8)
    pump([a], lambda: len(a.assignment()) == 8, timeout=5)
    a.close()


def test_pattern_subscription_follows_new_topics(url: str) -> None:
    a = consumer(url, "a", metadata_max_age_ms=100)
    a.subscribe(pattern="ev.*")
    pump([a], lambda: len(a.assignment()) == 6)
    with LogStore(url) as store:
        store.create_topic("evolved", 2)
    pump([a], lambda: len(a.assignment()) == 8, timeout=5)
    a.close()


# ------------------------------------------------------------------------------------------- offsets


def test_commit_committed_and_resume_from_the_committed_offset(url: str) -> None:
    produce(url, 10)
    a = consumer(url, "a")
    a.subscribe([TOPIC])
    got: dict[int, list[Any]] = {}
    pump([a], lambda: len(got.get(0, [])) == 60, sink=got)
    a.commit({TopicPartition(TOPIC, 0): 4, TopicPartition(TOPIC, 1): 7})
    a.commit()  # the positions of every assigned partition (10 each) win over the explicit ones
    assert a.committed(TopicPartition(TOPIC, 0)) == 10
    a.commit({TopicPartition(TOPIC, 0): 4})
    a.close()
    produce(url, 5, start=10)
    b = consumer(url, "b", auto_offset_reset="latest")
    assert b.committed(TopicPartition(TOPIC, 0)) == 4
    b.subscribe([TOPIC])
    got = {}
    pump([b], lambda: len(got.get(0, [])) == 11 + 5 * 5, sink=got)  # 4..14 of p0, 10..14 of the others
    offsets = sorted((r.partition, r.offset) for r in got[0])
    assert offsets == [(0, o) for o in range(4, 15)] + [(p, o) for p in range(1, 6) for o in range(10, 15)]
    b.close()


def test_auto_offset_reset_applies_only_without_a_committed_offset(url: str) -> None:
    produce(url, 3)
    a = consumer(url, "a", auto_offset_reset="latest")
    a.subscribe([TOPIC])
    pump([a], lambda: len(a.assignment()) == 6)
    assert {a.position(tp) for tp in partitions(*range(6))} == {3}
    a.commit({TopicPartition(TOPIC, p): 1 for p in range(5)})
    a.close()
    none = consumer(url, "n", auto_offset_reset="none")
    none.subscribe([TOPIC])
    with pytest.raises(OffsetOutOfRangeError, match="partition=5.*auto_offset_reset is 'none'"):
        pump([none], lambda: False, timeout=5)
    assert [none.position(tp) for tp in sorted(partitions(*range(5)))] == [1] * 5
    none.close()


def test_auto_commit_on_poll_and_on_close(url: str) -> None:
    produce(url, 4)
    a = consumer(url, "a", enable_auto_commit=True, auto_commit_interval_ms=50)
    a.subscribe([TOPIC])
    got: dict[int, list[Any]] = {}
    pump([a], lambda: len(got.get(0, [])) == 24, sink=got)
    time.sleep(0.06)
    a.poll(timeout_ms=0)  # the next poll commits what the previous ones returned
    assert a.committed(TopicPartition(TOPIC, 3)) == 4
    produce(url, 2, start=4)
    pump([a], lambda: len(got.get(0, [])) == 36, sink=got)
    a.close()  # commits on the way out
    b = consumer(url, "b")
    assert [b.committed(TopicPartition(TOPIC, p)) for p in range(6)] == [6] * 6
    b.close()


def test_commit_async_calls_back(url: str) -> None:
    produce(url, 2)
    a = consumer(url, "a")
    a.subscribe([TOPIC])
    pump([a], lambda: len(a.assignment()) == 6)
    results: list[tuple[dict[TopicPartition, int], Exception | None]] = []
    future = a.commit_async({TopicPartition(TOPIC, 2): 1}, callback=lambda o, e: results.append((o, e)))
    future.result(timeout=10)
    assert results == [({TopicPartition(TOPIC, 2): 1}, None)]
    assert a.committed(TopicPartition(TOPIC, 2)) == 1
    a.close()


def test_a_member_that_lost_a_partition_cannot_commit_it(url: str) -> None:
    """Generation fencing: a commits partitions it owned in generation g after g+1 gave them to b."""
    a, b = consumer(url, "a"), consumer(url, "b")
    a.subscribe([TOPIC])
    pump([a], lambda: len(a.assignment()) == 6)
    a.commit({TopicPartition(TOPIC, 5): 1})
    client = GroupClient(LogRoot(url).store, "g")
    first = client.latest_generation().number
    b.subscribe([TOPIC])
    # a acknowledges the rebalance in one poll (it revokes), then stops polling: it never adopts g+1
    deadline = time.monotonic() + 5
    while a._member is not None and a._member._marker_for != first:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    a.poll(timeout_ms=0)
    assert a.assignment() == set()
    pump([b], lambda: client.latest_generation().number == first + 1 and len(b.assignment()) == 3)
    with pytest.raises(CommitFailedError, match="events-5 is not assigned"):
        a.commit({TopicPartition(TOPIC, 5): 2})  # b owns events-5 now
    a.commit({TopicPartition(TOPIC, 0): 3})  # a still owns events-0 in g+1: the commit goes there
    assert client.committed() == {(TOPIC, 5): 1, (TOPIC, 0): 3}
    entries = client.commit_entries(first)
    assert entries[-1]["sealed"] and entries[-1]["state"] == {TOPIC: {"5": 1}}
    a.close()
    b.close()


def test_max_poll_interval_exceeded_leaves_the_group_and_poll_rejoins(url: str) -> None:
    a = consumer(url, "a", max_poll_interval_ms=600)
    b = consumer(url, "b")
    la = Recorder()
    a.subscribe([TOPIC], listener=la)
    b.subscribe([TOPIC])
    pump([a, b], lambda: len(a.assignment()) == 3 and len(b.assignment()) == 3)
    took = pump([b], lambda: len(b.assignment()) == 6)  # a stops polling
    assert 0.4 < took < 2.5, took
    with pytest.raises(CommitFailedError, match="max_poll_interval_ms"):
        a.commit()
    pump([a, b], lambda: len(a.assignment()) == 3 and len(b.assignment()) == 3)  # the next poll rejoins
    assert ("revoked", sorted(partitions(0, 1, 2))) in la.calls
    a.close()
    b.close()


def test_standalone_consumer_commits_only_while_the_group_is_empty(url: str) -> None:
    produce(url, 3)
    manual = Consumer(url, group_id="g", client_id="manual", **FAST)
    manual.assign([TopicPartition(TOPIC, 1)])
    manual.poll(timeout_ms=100)
    manual.commit()
    assert manual.committed(TopicPartition(TOPIC, 1)) == 3
    a = consumer(url, "a")
    a.subscribe([TOPIC])
    pump([a], lambda: len(a.assignment()) == 6)
    assert a.position(TopicPartition(TOPIC, 1)) == 3  # started from the standalone commit
    with pytest.raises(CommitFailedError, match="active member"):
        manual.commit({TopicPartition(TOPIC, 1): 0})
    a.close()
    manual.commit({TopicPartition(TOPIC, 1): 1})  # a left: the group is empty again
    assert manual.committed(TopicPartition(TOPIC, 1)) == 1
    manual.close()
    with pytest.raises(InvalidConfigError, match="group_id"):
        Consumer(url, **FAST).commit()


def test_a_heartbeat_failing_for_a_session_timeout_surfaces_in_poll(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    a = consumer(url, "a", session_timeout_ms=300, heartbeat_interval_ms=50)
    a.subscribe([TOPIC])
    pump([a], lambda: len(a.assignment()) == 6)
    assert a._member is not None

    def broken(*args: object, **kwargs: object) -> bool:
        raise StorageError("disk on fire")

    monkeypatch.setattr(a._member.client.store, "put_if_absent", broken)
    with pytest.raises(StorageError, match="disk on fire"):
        pump([a], lambda: False, timeout=5)
    monkeypatch.undo()
    a.close()


@pytest.mark.s3
def test_a_group_on_s3_splits_commits_and_fences(s3_url: tuple[str, dict[str, Any]]) -> None:
    """The same protocol on an object store: put-if-absent is a conditional PUT (moto server)."""
    root, options = s3_url
    with LogStore(root, options) as store:
        store.create_topic(TOPIC, 4)
    producer = Producer(root, options)
    for p in range(4):
        for i in range(5):
            producer.send(TOPIC, value=f"{p}:{i}".encode(), partition=p)
    producer.flush()
    producer.close()
    config = {**FAST, "session_timeout_ms": 3000, "heartbeat_interval_ms": 200}
    a = Consumer(root, options, group_id="g", client_id="a", **config)
    b = Consumer(root, options, group_id="g", client_id="b", **config)
    a.subscribe([TOPIC])
    pump([a], lambda: len(a.assignment()) == 4, timeout=20)
    a.commit({TopicPartition(TOPIC, 3): 2})
    b.subscribe([TOPIC])
    got: dict[int, list[Any]] = {}
    pump([a, b], lambda: len(b.assignment()) == 2 and len(got.get(1, [])) == 5 + 3, timeout=20, sink=got)
    assert b.assignment() == {TopicPartition(TOPIC, 2), TopicPartition(TOPIC, 3)}
    assert sorted(r.offset for r in got[1] if r.partition == 3) == [2, 3, 4]  # from a's commit
    with pytest.raises(CommitFailedError):
        a.commit({TopicPartition(TOPIC, 3): 5})
    b.commit({TopicPartition(TOPIC, 3): 4})
    assert a.committed(TopicPartition(TOPIC, 3)) == 4
    a.close()
    b.close()


# --------------------------------------------------------------------------------------- the protocol objects


def test_commit_log_is_sealed_by_the_next_generation(tmp_path: Path) -> None:
    store = LogRoot(str(tmp_path / "r")).store
    client = GroupClient(store, "g")
    g1 = Generation(1, "range", {"m1": {"topics": ["t"]}}, {"m1": (("t", 0),)}, created_ms=1)
    assert client.create_generation(g1) and not client.create_generation(g1)  # exactly one proposal wins
    assert client.append_commit(g1, "m1", {("t", 0): 5}) == (0, {("t", 0): 5})
    assert client.append_commit(g1, "m1", {("t", 0): 7}) == (1, {("t", 0): 7})
    assert client.seal(g1, "m2") == {("t", 0): 7}
    assert client.seal(g1, "m3") == {("t", 0): 7}  # idempotent: the second finalizer finds the seal
    with pytest.raises(GenerationSealed):
        client.append_commit(g1, "m1", {("t", 0): 9})
    assert [e["seq"] for e in client.commit_entries(1)] == [0, 1, 2]
    # a lost put-if-absent race: the entry number is taken, the committer lists again and is refused
    g2 = Generation(2, "range", {"m1": {}}, {"m1": (("t", 0),)}, committed={("t", 0): 7})
    seal = {"generation": 2, "seq": 0, "sealed": True, "state": {"t": {"0": 7}}}  # the table's required fields
    store.put_if_absent(commit_key("g", 2, 0), json.dumps(seal).encode())
    with pytest.raises(GenerationSealed):
        client.append_commit(g2, "m1", {("t", 0): 8})
    # ownership: assigned, or revoking (cooperative), or anyone in an empty generation
    g3 = Generation(
        3, "cooperative-sticky", {"a": {}, "b": {}}, {"a": (("t", 0),), "b": ()}, revoking={"a": (("t", 1),)}
    )
    assert g3.may_commit("a", ("t", 0)) and g3.may_commit("a", ("t", 1)) and not g3.may_commit("b", ("t", 1))
    assert Generation(4).may_commit(None, ("t", 1))
    assert Generation.from_json(g3.to_json()) == g3
    assert list_groups(store) == ["g"]


def test_heartbeats_liveness_and_protocol_choice(tmp_path: Path) -> None:
    store = LogRoot(str(tmp_path / "r")).store
    hb = Heartbeat("m-1", 3, sent_ms=1_000_000, topics=("t",), protocols=("range",), session_timeout_ms=1000)
    assert hb.alive_at(1_001_000) and hb.alive_at(1_001_000 + 999) and not hb.alive_at(1_003_000)
    assert Heartbeat.from_json(hb.to_json()) == hb
    store.put_if_absent(heartbeat_key("g", "m-1", 3), hb.to_json())
    assert GroupClient(store, "g").active_members(at_ms=1_000_500) == ["m-1"]
    assert GroupClient(store, "g").active_members(at_ms=1_010_000) == []
    votes = {"a": ["range", "sticky"], "b": ["sticky", "range"], "c": ["sticky"]}
    assert choose_protocol(votes, None) == "sticky"
    assert choose_protocol({"a": ["range", "sticky"], "b": ["sticky", "range"]}, "range") == "range"
    assert choose_protocol({"a": ["range"], "b": ["roundrobin"]}, None) == "range"
    for bad in ("", "a/b", "..", "x" * 250, 5):
        with pytest.raises(InvalidConfigError):
            validate_group_id(bad)
    assert generation_key("g", 2).endswith("generations/00000000000000000002.json")


def test_garbage_is_collected_only_after_the_delay(tmp_path: Path) -> None:
    store = LogRoot(str(tmp_path / "r")).store
    client = GroupClient(store, "g")
    day = 24 * 3600 * 1000
    for n in range(1, 5):
        gen = Generation(n, "range", {"m": {}}, {"m": (("t", 0),)}, created_ms=n * day)
        assert client.create_generation(gen)
        client.append_commit(gen, "m", {("t", 0): n})
        client.seal(gen, "m")
    dead = Heartbeat("gone-1", 0, sent_ms=day)
    store.put_if_absent(heartbeat_key("g", "gone-1", 0), dead.to_json())
    latest = client.latest_generation()
    # at day 3: generation 1 goes (its successor is a day old), generation 2 stays (its successor is new)
    assert client.collect_garbage(latest, at_ms=3 * day + 1000) == 3  # 2 log entries and the dead heartbeat
    assert client.generation_numbers() == [2, 3, 4] and client.commit_entries(1) == []
    assert client.heartbeats() == {}
    client.collect_garbage(latest, at_ms=10 * day)
    assert client.generation_numbers() == [3, 4]  # the newest two stay, whatever their age
    assert len(client.commit_entries(3)) == 2
    assert client.committed() == {("t", 0): 4}


def test_a_long_commit_log_is_trimmed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import coordinator.groups.client as groups

    client = GroupClient(LogRoot(str(tmp_path / "r")).store, "g")
    gen = Generation(1, "range", {"m": {}}, {"m": (("t", 0),)})
    monkeypatch.setattr(groups, "now_ms", lambda: 1_000)  # entries written long ago...
    for i in range(64):
        client.append_commit(gen, "m", {("t", 0): i})
    monkeypatch.setattr(groups, "now_ms", lambda: 1_000 + groups.GC_DELAY_MS + 1)  # ...are collected now
    client.append_commit(gen, "m", {("t", 0): 64})
    assert [e["seq"] for e in client.commit_entries(1)] == [63, 64]  # the newest two always stay
    assert client.append_commit(gen, "m", {("t", 0): 65}) == (65, {("t", 0): 65})


def test_describe_falls_back_to_the_offsets_a_spark_query_records(tmp_path: Path) -> None:
    store = LogRoot(str(tmp_path / "r")).store
    store.put_if_absent("groups/lag/offsets/00000000000000000003.json", b'{"events": {"0": 5, "1": 7}}')
    info = GroupClient(store, "lag").describe()
    assert info.committed == {(TOPIC, 0): 5, (TOPIC, 1): 7} and info.committed_source == "spark-lag"
    assert info.state == "Empty" and list_groups(store) == ["lag"]


def test_inconsistent_protocols_are_refused(url: str) -> None:
    a = consumer(url, "a", partition_assignment_strategy="range")
    a.subscribe([TOPIC])
    pump([a], lambda: len(a.assignment()) == 6)
    b = consumer(url, "b", partition_assignment_strategy="roundrobin")
    b.subscribe([TOPIC])
    with pytest.raises(InvalidConfigError, match="InconsistentGroupProtocol"):
        pump([a, b], lambda: False, timeout=5)
    pump([a], lambda: len(a.assignment()) == 6)
    client = GroupClient(LogRoot(url).store, "g")
    settled_at = client.latest_generation().number
    time.sleep(0.5)  # the rejected member keeps heartbeating without causing rebalances
    a.poll(timeout_ms=0)
    assert client.latest_generation().number == settled_at and len(a.assignment()) == 6
    a.close()
    b.close()


# ------------------------------------------------------------------------------------------- CLI


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = plog(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_list_describe_and_reset_offsets(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    produce(url, 10)
    a = consumer(url, "a")
    a.subscribe([TOPIC])
    pump([a], lambda: len(a.assignment()) == 6)
    a.commit({TopicPartition(TOPIC, p): p for p in range(6)})
    code, out, _ = run_cli(capsys, "groups", "list", "--url", url)
    assert code == 0 and "g" in out and "Stable" in out and "range" in out
    code, out, _ = run_cli(capsys, "groups", "describe", "g", "--url", url)
    assert code == 0 and a._member is not None and a._member.member_id in out
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.splitlines() if "│ events" in line]
    assert [TOPIC, "4", a._member.member_id, "4", "10", "6"] in rows  # owner, committed, end, lag of events-4
    code, _, err = run_cli(
        capsys, "groups", "reset-offsets", "g", "--url", url, "--topic", TOPIC, "--to-earliest", "--execute"
    )
    assert code == 2 and "live member" in err
    a.close()
    code, out, err = run_cli(capsys, "groups", "reset-offsets", "g", "--url", url, "--topic", TOPIC, "--to-latest")
    assert code == 0 and "dry run" in err
    client = GroupClient(LogRoot(url).store, "g")
    assert client.committed()[(TOPIC, 5)] == 5
    code, out, _ = run_cli(
        capsys,
        "groups",
        "reset-offsets",
        "g",
        "--url",
        url,
        "--topic",
        f"{TOPIC}:1,2",
        "--to-offset",
        "99",
        "--execute",
    )
    assert code == 0 and client.committed()[(TOPIC, 1)] == 10 and client.committed()[(TOPIC, 0)] == 0
    code, _, _ = run_cli(
        capsys, "groups", "reset-offsets", "g", "--url", url, "--all-topics", "--to-earliest", "--execute"
    )
    assert code == 0 and set(client.committed().values()) == {0}
    code, _, _ = run_cli(
        capsys,
        "groups",
        "reset-offsets",
        "g",
        "--url",
        url,
        "--topic",
        TOPIC,
        "--to-datetime",
        "2999-01-01T00:00:00Z",
        "--execute",
    )
    assert code == 0 and set(client.committed().values()) == {10}
    b = consumer(url, "b")
    b.subscribe([TOPIC])
    pump([b], lambda: len(b.assignment()) == 6)
    assert {b.position(tp) for tp in partitions(*range(6))} == {10}
    b.close()
    code, out, _ = run_cli(capsys, "groups", "describe", "g", "--url", url)
    assert code == 0 and "Empty" in out


# ------------------------------------------------------------------------------------------- a killed member

WORKER = textwrap.dedent("""
    import os, sys, time
    from pyspark_logsource import CommitFailedError, Consumer
    url, out, name, strategy = sys.argv[1:5]
    c = Consumer(url, group_id="kill", client_id=name, session_timeout_ms=1500, heartbeat_interval_ms=150,
                 auto_offset_reset="earliest", enable_auto_commit=False, max_poll_records=20,
                 partition_assignment_strategy=strategy)
    c.subscribe(["events"])
    with open(os.path.join(out, name + ".member"), "w") as f:
        f.write(c._member.member_id)
    log = open(os.path.join(out, name + ".processed"), "a", buffering=1)  # a record is logged once processed
    while not os.path.exists(os.path.join(out, "stop")):
        records = c.poll(timeout_ms=100)
        for tp, rs in records.items():
            for r in rs:
                time.sleep(0.004)  # the processing
                log.write(f"{tp.partition} {r.offset}\\n")
        os.fsync(log.fileno())  # processed durably, then committed
        if records:
            try:
                c.commit({tp: rs[-1].offset + 1 for tp, rs in records.items()})
            except CommitFailedError:
                pass  # lost the partition in a rebalance: its new owner reprocesses from the committed offset
    c.close()
""")


def _processed(path: Path) -> set[tuple[int, int]]:
    out = set()
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and all(x.isdigit() for x in parts):
            out.add((int(parts[0]), int(parts[1])))
    return out


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_sigkilled_member_partitions_are_reassigned_and_every_record_is_committed_once(
    url: str, tmp_path: Path, strategy: str
) -> None:
    produce(url, 250)
    out = tmp_path / "work"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    names = ["w0", "w1", "w2"]
    procs = {
        n: subprocess.Popen([sys.executable, "-c", WORKER, url, str(out), n, strategy], env=env, cwd=str(REPO))
        for n in names
    }
    client = GroupClient(LogRoot(url).store, "kill")
    try:
        deadline = time.monotonic() + 30
        while True:  # all three in one generation, and the victim busy processing its share
            latest = client.latest_generation()
            victim = out / "w1.processed"
            if (
                len(latest.members) == 3
                and victim.exists()
                and len(_processed(victim)) > 40
                and all(latest.partitions_of(m) for m in latest.members)
            ):
                break
            assert time.monotonic() < deadline, "the group never formed"
            time.sleep(0.05)
        victim_id = (out / "w1.member").read_text()
        victim_partitions = latest.partitions_of(victim_id)
        procs["w1"].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        procs["w1"].wait()
        while victim_id in client.latest_generation().members:
            assert time.monotonic() - killed_at < 10, "the dead member was never removed"
            time.sleep(0.02)
        reassigned_after = time.monotonic() - killed_at
        after_kill = client.latest_generation()
        assert set(after_kill.owners()) == {(TOPIC, p) for p in range(6)}
        assert victim_id not in after_kill.members
        assert all(tp in after_kill.owners() for tp in victim_partitions)
        assert reassigned_after < 1.5 + 1.5, reassigned_after  # session timeout + a few heartbeats
        produce(url, 50, start=250)  # the survivors keep consuming
        ends = {(TOPIC, p): 300 for p in range(6)}
        while client.committed() != ends:
            assert time.monotonic() - killed_at < 60, f"not all committed: {client.committed()}"
            time.sleep(0.1)
    finally:
        (out / "stop").touch()
        for proc in procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert procs["w0"].returncode == 0 and procs["w2"].returncode == 0

    # every record was processed at least once
    processed = {n: _processed(out / f"{n}.processed") for n in names}
    member_names = {(out / f"{n}.member").read_text(): n for n in names}
    assert set().union(*processed.values()) == {(p, o) for p in range(6) for o in range(300)}
    # and committed exactly once: walking every generation's commit log in order, each commit moves a
    # partition forward from the group's previous committed offset, was made by the partition's owner in
    # its generation, and covers only records that member processed; each generation's snapshot continues
    # the previous log exactly
    state: dict[tuple[str, int], int] = {}
    covered: dict[tuple[str, int], list[tuple[int, int, str]]] = {}
    numbers = client.generation_numbers()
    assert numbers == list(range(1, numbers[-1] + 1))
    for number in [0, *numbers]:
        gen = client.generation(number)
        assert gen is not None and dict(gen.committed) == state
        for entry in client.commit_entries(number):
            if entry.get("sealed"):
                continue
            member = entry["member"]
            for topic, per in entry["offsets"].items():
                for p, offset in per.items():
                    tp = (topic, int(p))
                    assert gen.may_commit(member, tp), (member, tp, number)
                    start = state.get(tp, 0)
                    assert offset >= start
                    done = processed[member_names[member]]
                    assert all((tp[1], o) in done for o in range(start, offset)), (member, tp, start, offset)
                    covered.setdefault(tp, []).append((start, offset, member))
                    state[tp] = offset
            assert offsets_state(entry) == state
    assert state == ends
    for ranges in covered.values():  # the ranges tile [0, end): no gap, no overlap
        position = 0
        for start, end, _ in ranges:
            assert start == position
            position = end
        assert position == 300
    committers = {m for ranges in covered.values() for _, _, m in ranges}
    assert victim_id in committers and len(committers) == 3
    redelivered = sum(len(v) for v in processed.values()) - 6 * 300
    print(
        f"reassigned {reassigned_after:.2f} s after SIGKILL; {redelivered} record(s) processed twice; "
        f"{len(numbers)} generations"
    )


def offsets_state(entry: dict[str, Any]) -> dict[tuple[str, int], int]:
    return {(t, int(p)): int(o) for t, per in entry["state"].items() for p, o in per.items()}


# ------------------------------------------------------------------------------------ damaged heartbeats


def _damage_next_heartbeat(store: Any, member: Any) -> str:
    """Store damaged bytes where ``member``'s next heartbeat goes, as if it had been written and then damaged."""
    key = heartbeat_key("g", member.member_id, member._seq + 1)
    assert store.put_if_absent(key, b'{"member_id": "' + member.member_id.encode() + b'", "seq": ')
    return key


def test_a_damaged_heartbeat_is_a_missing_one_and_its_member_rejoins_when_it_beats_again(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """One member's damaged heartbeat stalled everyone: each liveness check raised CorruptRecordError."""
    warnings: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("coordinator.groups.client").addHandler(handler)
    a, b, c = (consumer(url, n) for n in ("a", "b", "c"))
    for m in (a, b, c):
        m.subscribe([TOPIC])
    client = GroupClient(LogRoot(url).store, "g")
    pump([a, b, c], lambda: settled(client, a, b, c) and all(len(m.assignment()) == 2 for m in (a, b, c)))
    member = c._member
    assert member is not None
    member._cycle = lambda: None  # type: ignore[method-assign]  # c's heartbeat thread stops writing...
    time.sleep(0.3)  # ...after any cycle in flight
    key = _damage_next_heartbeat(client.store, member)  # ...and its newest heartbeat is damaged
    # the others expire c once its last good heartbeat ages out (1 s) and split the partitions between them
    pump([a, b], lambda: settled(client, a, b) and len(a.assignment()) == 3 and len(b.assignment()) == 3)
    assert member.member_id not in client.latest_generation().members
    logging.getLogger("coordinator.groups.client").removeHandler(handler)
    assert any(key in message for message in warnings), warnings
    assert a._member is not None and a._member.last_error is None
    description = client.describe()
    assert description.damaged_heartbeats == [key] and description.state in ("Stable", "PreparingRebalance")
    code, _, err = run_cli(capsys, "groups", "describe", "g", "--url", url)
    assert code == 0 and key in err.replace("\n", "")
    # c beats again (its next create finds the damaged key taken and takes the next number): it rejoins
    del member._cycle
    pump([a, b, c], lambda: settled(client, a, b, c) and all(len(m.assignment()) == 2 for m in (a, b, c)))
    assert member.member_id in client.latest_generation().members
    for m in (a, b, c):
        m.close()


def test_damaged_heartbeats_are_collected_once_their_member_is_silent_for_the_delay(tmp_path: Path) -> None:
    store = LogRoot(str(tmp_path / "r")).store
    day = 24 * 3600 * 1000
    client = GroupClient(store, "g")
    latest = Generation(1, "range", {"kept": {}}, {}, created_ms=day)
    assert client.create_generation(latest)
    # "old": a good heartbeat from day 1, then a damaged one: judged by the good one, so dead for D at day 2
    store.put_if_absent(heartbeat_key("g", "old", 0), Heartbeat("old", 0, sent_ms=day).to_json())
    store.put_if_absent(heartbeat_key("g", "old", 1), b"not json")
    # "kept": damaged, but a member of the newest generation: never collected
    store.put_if_absent(heartbeat_key("g", "kept", 0), b"{}")
    assert client.collect_garbage(latest, at_ms=day + 1000) == 0
    assert client.collect_garbage(latest, at_ms=2 * day) == 2
    assert sorted(client.heartbeat_keys()) == ["kept"]
    # "lost": nothing readable at all; judged by how long this collector has seen the damaged key as its newest
    store.put_if_absent(heartbeat_key("g", "lost", 7), b"\xff")
    first = time.time() * 1000
    assert client.collect_garbage(latest) == 0  # found damaged now
    assert client.heartbeats() == {}
    assert client.collect_garbage(latest, at_ms=int(first) + 1000) == 0
    assert client.collect_garbage(latest, at_ms=int(first) + 21 * 60 * 1000 + 1000) == 1
    assert sorted(client.heartbeat_keys()) == ["kept"]
    # a new collector has not seen it for D yet: a damaged key is never deleted on a first sighting
    store.put_if_absent(heartbeat_key("g", "lost", 8), b"\xff")
    assert GroupClient(store, "g").collect_garbage(latest, at_ms=10 * day) == 0


def test_members_of_one_process_share_a_listing_begun_within_delta() -> None:
    """PROTOCOL.md 11.4, *Members of one process share listings*: a listing begun no earlier than a cycle's
    bound is reused; an older one never is, so no member decides on a listing older than Δ before its cycle."""
    from coordinator.groups.client import GroupClient as Client
    from segment_format.stores import MemoryStore
    from segment_format.stores.counting import CountingStore

    store = CountingStore(MemoryStore(f"share-{time.monotonic_ns()}"))
    client = Client(store, "g")
    before = time.monotonic()
    first = client.listing(began_after=before)
    assert store.counts()["LIST"] == 1
    assert client.listing(began_after=before) is first  # began after the bound: shared, no request
    store.put_if_absent("groups/g/rebalances/00000000000000000000.json", b"{}")
    assert client.listing(began_after=time.monotonic()) is not first  # too old for this cycle: listed again
    assert store.counts()["LIST"] == 2 and client.listing().markers == {0}


def test_a_member_waits_for_the_listing_another_member_of_its_process_began() -> None:
    """Members whose cycles start together share the listing under way instead of all listing at once."""
    import threading

    from coordinator.groups.client import GroupClient as Client
    from segment_format.stores import MemoryStore
    from segment_format.stores.counting import CountingStore

    release, listing_started = threading.Event(), threading.Event()

    class SlowListing(MemoryStore):
        def list_after(self, prefix: str, start_after: str) -> Any:
            listing_started.set()
            release.wait(10)
            return super().list_after(prefix, start_after)

    store = CountingStore(SlowListing(f"share-{time.monotonic_ns()}"))
    client = Client(store, "g")
    bound = time.monotonic()
    results: list[Any] = []
    first = threading.Thread(target=lambda: results.append(client.listing(began_after=bound)))
    first.start()
    assert listing_started.wait(10)
    second = threading.Thread(target=lambda: results.append(client.listing(began_after=bound)))
    second.start()
    time.sleep(0.05)  # the second is waiting on the first's listing (if it listed, the count below would show it)
    release.set()
    first.join(10)
    second.join(10)
    assert len(results) == 2 and results[0] is results[1]
    assert store.counts()["LIST"] == 1
