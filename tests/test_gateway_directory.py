"""The gateways' registrations in the root (PROTOCOL.md 11.9): liveness, leaving, collection, rendezvous."""

from __future__ import annotations

from pyspark_logsource.gateway.directory import (
    COLLECT_AFTER_MS,
    GATEWAYS,
    KEEP_HEARTBEATS,
    GatewayDirectory,
    GatewayHeartbeat,
)
from segment_format.numbered import numbered_key
from segment_format.records import now_ms
from segment_format.stores.memory import MemoryStore


def _directory(store: MemoryStore, port: int) -> GatewayDirectory:
    return GatewayDirectory(store, "127.0.0.1", port, heartbeat_ms=1_000, registration_ms=3_000, probe_ms=0)


def _keys(store: MemoryStore) -> list[str]:
    return [info.key for info in store.list(GATEWAYS)]


def test_a_gateway_keeps_a_bounded_number_of_its_heartbeats() -> None:
    store = MemoryStore("gateways")
    me = _directory(store, 1)
    for _ in range(100):
        me.beat()
    assert 1 <= len(_keys(store)) <= KEEP_HEARTBEATS + 1


def test_peers_see_each_other_and_a_leaving_gateway_drops_out_at_once() -> None:
    store = MemoryStore("gateways")
    first, second = _directory(store, 1), _directory(store, 2)
    first.beat()
    second.beat()
    assert {g.port for g in first.refresh()} == {1, 2}
    second.refresh()
    assert first.coordinator_for("group", "g") == second.coordinator_for("group", "g")
    assert first.leader_for("t", 3) == second.leader_for("t", 3)
    second.close()
    assert {g.port for g in first.refresh()} == {1}


def test_a_shared_topics_partitions_have_one_leader_and_a_partitioned_topics_spread() -> None:
    """Every partition of a shared topic is led by one gateway, the usual committer of its sequence (PROTOCOL.md
    11.9); a partitioned topic's partitions spread over the live gateways."""
    store = MemoryStore("leaders")
    gateways = [_directory(store, port) for port in range(1, 5)]
    for gateway in gateways:
        gateway.beat()
    me = gateways[0]
    me.refresh()
    assert len({me.leader_for("t", p, shared=True).port for p in range(32)}) == 1
    assert len({me.leader_for("t", p).port for p in range(32)}) > 1


def _stale_registration(store: MemoryStore, gateway_id: str, age_ms: int, count: int) -> list[str]:
    keys = []
    for seq in range(count):
        body = GatewayHeartbeat(gateway_id, 7, "127.0.0.1", 9, seq, now_ms() - age_ms, 3_000).to_json()
        key = numbered_key(f"{GATEWAYS}{gateway_id}/", seq)
        store.put_if_absent(key, body)
        keys.append(key)
    return keys


def test_the_registration_of_a_gateway_gone_for_d_is_collected_and_a_recent_one_is_kept() -> None:
    store = MemoryStore("gateways")
    gone = _stale_registration(store, "a" * 32, COLLECT_AFTER_MS + 60_000, 5)
    recent = _stale_registration(store, "b" * 32, 60_000, 5)  # dead, but not for D yet
    me = _directory(store, 1)
    me.beat()
    assert {g.port for g in me.refresh()} == {1}  # neither is live
    left = set(_keys(store))
    assert not left & set(gone)
    assert set(recent) <= left
