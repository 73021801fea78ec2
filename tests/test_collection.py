"""The root collector (PROTOCOL.md 3.2, *The root collector*): each rule deletes what it
may and nothing it may not, a pass keeps its budget, concurrent passes agree, group joins stay flat."""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path
from typing import Any

import pytest

from coordinator import collection
from coordinator.collection import CountingView, collect, maybe_collect
from coordinator.collection.groups import OFFSETS_RETENTION_MS, GroupsCollector, expire_group
from coordinator.collection.leases import LeasesCollector
from coordinator.collection.topics import TopicsCollector
from coordinator.groups import Generation, GroupClient, Heartbeat, generation_key, heartbeat_key
from coordinator.keys import lease_prefix, maintainer_lease_name
from coordinator.leases import Lease
from pyspark_logsource import Consumer, TopicPartition
from segment_format.numbered import numbered_key
from segment_format.records import now_ms, payload_batch
from segment_format.root import LogRoot
from segment_format.segment import BatchMeta
from segment_format.stores.base import Store
from segment_format.stores.local import LocalStore
from tests.fixtures_cli import Run, run, url  # noqa: F401 - fixtures

DAY_MS = 24 * 3600 * 1000


def _heartbeat(store: Store, group: str, member: str, sent_ms: int, seq: int = 0) -> None:
    hb = Heartbeat(member, seq, sent_ms, topics=("t",), session_timeout_ms=10_000, generation=1)
    assert store.put_if_absent(heartbeat_key(group, member, seq), hb.to_json())


def _group(store: Store, group: str, at_ms: int, member: str = "m-1", commit: bool = True) -> None:
    """A group with one generation (member ``member``), a commit and a heartbeat, all written at ``at_ms``."""
    client = GroupClient(store, group)
    gen = Generation(
        1, "range", members={member: {"topics": ["t"]}}, assignment={member: (("t", 0),)}, created_ms=at_ms
    )
    assert client.create_generation(gen)
    if commit:
        body = {
            "generation": 1,
            "seq": 0,
            "member": member,
            "created_ms": at_ms,
            "offsets": {"t": {"0": 5}},
            "state": {"t": {"0": 5}},
        }
        assert store.put_if_absent(
            numbered_key("groups/" + group + "/commits/00000000000000000001/", 0), json.dumps(body).encode()
        )
    _heartbeat(store, group, member, at_ms)


def _keys(store: Store, prefix: str) -> list[str]:
    return [info.key for info in store.list(prefix)]


def _assert_expired(store: Store, group: str, number: int) -> None:
    """``group`` expired (PROTOCOL.md 11.4, *Expiry*): its one object is the empty generation ``number``, and its
    committed offsets, read as every client reads them, are empty."""
    assert _keys(store, f"groups/{group}/") == [generation_key(group, number)]
    client = GroupClient(store, group)
    latest = client.latest_generation()
    assert (latest.number, dict(latest.members), dict(latest.committed)) == (number, {}, {})
    assert latest.proposer == "collector"
    assert client.committed() == {}


def test_groups_rules(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))
    now = now_ms()
    _group(store, "live", now)  # a member heard from now: untouched, whatever its age otherwise
    _group(store, "dead-old", now - 8 * DAY_MS)  # no live member, nothing newer than 7 days: expired whole
    _group(store, "dead-young", now - 2 * DAY_MS)  # no live member, but younger than the retention: kept
    _group(store, "lag-only", now - 30 * DAY_MS, commit=False)
    store.delete_prefix("groups/lag-only/")
    assert store.put_if_absent("groups/lag-only/offsets/00000000000000000000.json", b'{"t": {"0": 1}}')
    # An old dead group whose one member is alive: untouched.
    _group(store, "dead-but-one", now - 9 * DAY_MS)
    _heartbeat(store, "dead-but-one", "m-2", now)
    before = {g: _keys(store, f"groups/{g}/") for g in ("live", "dead-young", "lag-only", "dead-but-one")}
    report = collect(store, now_ms=now, collectors=[GroupsCollector()])
    _assert_expired(store, "dead-old", 2)
    assert report.deleted["groups"] == 4  # its generation, commit, seal and heartbeat, and nothing of anybody else
    for group, keys in before.items():
        assert _keys(store, f"groups/{group}/") == keys, group
    # The retention is a setting: a shorter one expires the young dead group too, never the live ones.
    collect(store, now_ms=now, collectors=[GroupsCollector(retention_ms=DAY_MS)])
    _assert_expired(store, "dead-young", 2)
    assert _keys(store, "groups/live/") == before["live"]
    assert _keys(store, "groups/lag-only/") == before["lag-only"]  # offsets/ is its writer's to bound
    # An expired group with nothing else left is not expired again, however old: the pass leaves it as it is.
    kept = _keys(store, "groups/dead-old/")
    collect(store, now_ms=now + 30 * DAY_MS, collectors=[GroupsCollector()])
    assert _keys(store, "groups/dead-old/") == kept


def test_expiry_keeps_the_numbering_so_a_late_commit_is_never_read(tmp_path: Path) -> None:
    """The race expiry must survive (PROTOCOL.md 11.4, *Expiry*): a commit that lands in the old generation's
    log after the pass deleted it is not read, and the group's next use numbers on from the expiry."""
    root = LogRoot(str(tmp_path))
    root.catalog.create("t")
    root.partition("t", 0).append([(payload_batch([now_ms()] * 10, [None] * 10, [b"x"] * 10), BatchMeta())])
    store = root.store
    now = now_ms()
    _group(store, "g", now - 8 * DAY_MS)  # generation 1, committed t-0 at 5
    old = GroupClient(store, "g").latest_generation()
    assert GroupClient(store, "g").committed() == {("t", 0): 5}
    collect(store, now_ms=now, collectors=[GroupsCollector()])
    _assert_expired(store, "g", 2)
    # A committer that chose generation 1 before the expiry lands its entry now, in the deleted log (its seal
    # went with it, so nothing refuses the create): it is below the newest generation and never read.
    GroupClient(store, "g").append_commit(old, "m-1", {("t", 0): 7})
    assert _keys(store, "groups/g/commits/") == [numbered_key("groups/g/commits/00000000000000000001/", 0)]
    assert GroupClient(store, "g").committed() == {}
    assert GroupClient(store, "g").describe().committed == {}
    # The late entry is young: the next pass only collects garbage, and the committed offsets stay empty.
    collect(store, now_ms=now, collectors=[GroupsCollector()])
    assert GroupClient(store, "g").committed() == {}
    # A new consumer of the group joins in generation 3 and starts where its reset policy says, not at 5 or 7.
    consumer = Consumer(
        str(tmp_path),
        group_id="g",
        client_id="new",
        session_timeout_ms=1000,
        heartbeat_interval_ms=100,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    try:
        consumer.subscribe(["t"])
        deadline = time.monotonic() + 30
        offsets: list[int] = []
        while not offsets and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=100).values():
                offsets.extend(r.offset for r in records)
        assert consumer.assignment() == {TopicPartition("t", 0)}
        assert offsets[0] == 0
        assert consumer.committed(TopicPartition("t", 0)) is None
        latest = GroupClient(store, "g").latest_generation()
        assert latest.number == 3
        assert list(latest.members) == [consumer._member.member_id if consumer._member else None]
    finally:
        consumer.close()


def test_second_expiry_collects_what_landed_after_the_first(tmp_path: Path) -> None:
    """Leftovers below an expiry generation (a late entry) go with the group's next expiry: bounded per group."""
    store = LocalStore(str(tmp_path))
    now = now_ms()
    _group(store, "g", now - 20 * DAY_MS)
    old = GroupClient(store, "g").latest_generation()
    collect(store, now_ms=now - 10 * DAY_MS, collectors=[GroupsCollector()])
    _assert_expired(store, "g", 2)
    GroupClient(store, "g").append_commit(old, "m-1", {("t", 0): 7})  # lands late, dated now - 0
    collect(store, now_ms=now, collectors=[GroupsCollector()])  # the late entry is younger than the retention
    assert len(_keys(store, "groups/g/")) == 2
    collect(store, now_ms=now + 8 * DAY_MS, collectors=[GroupsCollector()])
    _assert_expired(store, "g", 3)


def test_expiry_stops_when_the_next_generation_is_someone_elses(tmp_path: Path) -> None:
    """A tool reset that creates generation g + 1 between the pass's listing and its create wins: the group is
    in use again, nothing is deleted and the reset offsets stand."""
    store = LocalStore(str(tmp_path))
    now = now_ms()
    _group(store, "g", now - 8 * DAY_MS)
    keys = _keys(store, "groups/g/")
    GroupClient(store, "g").reset_offsets({("t", 0): 3}, by="tool")  # seals 1, creates generation 2
    assert expire_group(GroupClient(store, "g"), keys, at_ms=now) == 0
    assert GroupClient(store, "g").committed() == {("t", 0): 3}
    assert set(keys) <= set(_keys(store, "groups/g/"))


def test_young_dead_group_gets_its_garbage_collected(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))
    t0 = now_ms() - 3 * DAY_MS
    client = GroupClient(store, "g")
    for n in range(1, 11):
        assert client.create_generation(Generation(n, created_ms=t0 + n * 3600_000))
    _heartbeat(store, "g", "gone", t0)
    collect(store, now_ms=now_ms(), collectors=[GroupsCollector()])
    assert GroupClient(store, "g").generation_numbers() == [9, 10]  # the newest two stay (11.4 Garbage)
    assert _keys(store, "groups/g/members/") == []  # silent for more than D


def test_group_join_listing_flat_over_300_rebalances(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """300 rebalances of a group run by tools (empty generations): the listing a joining member makes stays
    a few objects long and its requests do not grow, with the collector running as the schedule would."""
    store = LocalStore(str(tmp_path))
    clock = [now_ms() - 400 * 1800_000]
    monkeypatch.setattr("coordinator.groups.client.now_ms", lambda: clock[0])
    client = GroupClient(store, "g")
    sizes, requests = [], []
    for n in range(300):
        client.new_empty_generation(client.latest_generation(), "tool", f"rebalance {n}")
        clock[0] += 1800_000  # half an hour between rebalances: each older generation is past D
        if n % 6 == 5:  # the collector's groups step runs on every sixth pass
            collect(store, now_ms=clock[0], collectors=[GroupsCollector()])
            view = CountingView(store)
            joiner = GroupClient(view, "g")
            listing = joiner.listing()  # a join: one listing past commits0, then the newest generation
            joiner.latest_of(listing.generations)
            sizes.append(len(listing.generations) + len(listing.markers))
            requests.append(view.requests)
    assert max(sizes) <= 4, sizes
    assert max(requests) <= 3, requests
    assert len(_keys(store, "groups/g/")) <= 8  # generations, their sealed logs: bounded, not 300 of each


def test_leases_keep_two_epochs_and_deleted_topics_lose_theirs(tmp_path: Path) -> None:
    root = LogRoot(str(tmp_path))
    root.catalog.create("kept")
    store = root.store
    for name in (maintainer_lease_name("kept"), maintainer_lease_name("gone")):
        for _ in range(5):  # a holder whose passes are all cut short: take, release, take, ...
            lease = Lease(store, name, lease_ms=60_000, max_clock_skew_ms=0)
            assert lease.try_acquire()
            lease.release()
    collect(store, collectors=[LeasesCollector()])
    epochs = {k for k in _keys(store, lease_prefix(maintainer_lease_name("kept"))) if k.count("/") == 3}
    assert len(epochs) == 2
    assert len(_keys(store, lease_prefix(maintainer_lease_name("kept")))) == 4  # two epochs, their releases
    report = collect(store, collectors=[TopicsCollector()])
    assert _keys(store, lease_prefix(maintainer_lease_name("gone"))) == []
    assert len(_keys(store, lease_prefix(maintainer_lease_name("kept")))) == 4
    assert report.deleted["topics"] == 4


def test_orphan_incarnation_deleted_after_d_current_untouched(tmp_path: Path) -> None:
    root = LogRoot(str(tmp_path))
    store = root.store
    old = root.catalog.create("t", partitions=2, config={"storage.layout": "partitioned"})  # notices in it
    for p in range(2):
        root.partition("t", p).append([(payload_batch([now_ms()], [None], [b"x"]), BatchMeta())])
    # A delete that crashed after the metadata: the old incarnation's objects remain.
    for info in store.list("topics/t/meta/"):
        store.delete(info.key)
    new = root.catalog.create("t", partitions=1, config={"storage.layout": "partitioned"})
    assert old.topic_id != new.topic_id
    orphans = _keys(store, f"topics/t/{old.topic_id}/")
    current = _keys(store, f"topics/t/{new.topic_id}/")
    assert orphans and current
    collect(store, collectors=[TopicsCollector()])  # its notice is fresh: within D of its last write
    assert _keys(store, f"topics/t/{old.topic_id}/") == orphans
    collect(store, now_ms=now_ms() + 21 * 60_000, collectors=[TopicsCollector()])
    assert _keys(store, f"topics/t/{old.topic_id}/") == []
    assert _keys(store, f"topics/t/{new.topic_id}/") == current
    assert root.catalog.get("t").topic_id == new.topic_id


def test_old_metadata_versions_keep_the_newest_two(tmp_path: Path) -> None:
    root = LogRoot(str(tmp_path))
    root.catalog.create("t")
    for n in range(5):
        root.catalog.update("t", config={"retention.ms": 1000 + n})
    collect(root.store, collectors=[TopicsCollector()])
    assert len(_keys(root.store, "topics/t/meta/")) == 6  # the newest is younger than D: nothing yet
    collect(root.store, now_ms=now_ms() + 21 * 60_000, collectors=[TopicsCollector()])
    assert [k[-25:] for k in _keys(root.store, "topics/t/meta/")] == [
        "00000000000000000004.json",
        "00000000000000000005.json",
    ]
    assert root.catalog.get("t").config["retention.ms"] == 1004


def test_pass_respects_its_budget(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))
    old = now_ms() - 8 * DAY_MS
    for g in range(40):
        _group(store, f"g{g}", old)
    report = collect(store, budget_s=0.0)
    assert report.outcome == "budget"
    assert report.total_deleted == 0
    report = collect(store, budget_s=60.0)
    assert report.outcome == "done"
    assert sorted(_keys(store, "groups/")) == sorted(generation_key(f"g{g}", 2) for g in range(40))


def test_scheduled_pass_costs_one_list_when_not_due(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))
    first = maybe_collect(store, owner="w1", budget_s=5.0)
    assert first.outcome == "done"
    view = CountingView(store)
    assert maybe_collect(view, owner="w2", budget_s=5.0).outcome == "not-due"
    assert view.requests == 2  # the lease's listing, and its newest epoch, read once
    assert maybe_collect(view, owner="w2", budget_s=5.0).outcome == "not-due"
    assert view.requests == 2  # the expiry read is still ahead: no request at all


def _worker(path: str, seed: int) -> None:
    store = LocalStore(path)
    for _ in range(3):
        collect(store, now_ms=now_ms() + 21 * 60_000)


def test_concurrent_passes_leave_a_consistent_root(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))
    now = now_ms()
    for g in range(30):
        _group(store, f"old{g}", now - 8 * DAY_MS)
        _group(store, f"live{g}", now)
    root = LogRoot(str(tmp_path), store=store)
    root.catalog.create("t")
    live = {g: _keys(store, f"groups/live{g}/") for g in range(30)}
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(str(tmp_path), i)) for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    for g in range(30):  # two passes raced on every expiry: one empty generation each, numbered after the old
        _assert_expired(store, f"old{g}", 2)
    assert all(_keys(store, f"groups/live{g}/") == live[g] for g in range(30))
    assert root.catalog.get("t").partitions == 1


def test_plog_maintain_reports_the_collector(run: Run, url: str) -> None:  # noqa: F811
    code, _, _ = run("topics", "create", "t")
    assert code == 0
    _group(LocalStore(url), "expired", now_ms() - 8 * DAY_MS)
    code, out, _ = run("maintain")
    assert code == 0, out
    assert "collected groups: 4" in out
    assert _keys(LocalStore(url), "groups/") == [generation_key("expired", 2)]


def test_collectors_list_is_the_extension_point() -> None:
    assert [c.namespace for c in collection.COLLECTORS][:3] == ["leases", "groups", "topics"]
    assert OFFSETS_RETENTION_MS == 7 * DAY_MS
    assert all(isinstance(c.every, int) and c.every >= 1 for c in collection.COLLECTORS)
    assert time.monotonic() > 0 and isinstance(Any, object)
