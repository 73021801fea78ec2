"""What an idle group member costs on S3 (issue 11): requests counted at the moto server, by key shape.

An idle member (subscribed, assignment stable, nothing arriving) makes one
request per heartbeat interval (PROTOCOL.md 11.4): a listing of its group, or,
every session timeout / 3, its heartbeat in place of the listing; it deletes
its old heartbeats in a batch now and then, and commits nothing while its
positions stay where they are. The slower heartbeat must not get a live
member expired, nor slow down noticing a rebalance beyond about two intervals.
"""

from __future__ import annotations

import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from coordinator.groups.member import GroupMember
from coordinator.keys import rebalance_key
from pyspark_logsource import Consumer, LogStore, Producer
from segment_format.root import LogRoot
from tests.fixtures_s3 import REQUESTS

#: The timing the tests use: a heartbeat cycle every 0.2 s, a refresh due every 3 s / 3 = 1 s.
HEARTBEAT_S = 0.2
SESSION_MS = 3000


def wait_until(what: str, condition: Callable[[], bool], consumer: Consumer, timeout_s: float = 30.0) -> None:
    """Poll ``consumer`` until ``condition()`` holds; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        consumer.poll(timeout_ms=20)


def group_requests(bucket: str) -> Counter[str]:
    """Requests so far on the group's objects (``groups/``), by kind: the fetcher's tail probes do not count."""
    out: Counter[str] = Counter()
    for (kind, shape), n in REQUESTS.shapes(bucket).items():
        if "/groups/" in shape:
            out[kind] += n
    return out


def bucket_of(url: str) -> str:
    """The bucket of an ``s3://bucket/root`` URL."""
    return urllib.parse.urlparse(url).netloc


def idle_member(url: str, options: dict[str, Any], partitions: int, **config: Any) -> Consumer:
    """A group member of a fresh topic that has read everything there is and owns every partition."""
    with LogStore(url, storage_options=options) as store:
        store.create_topic("t", partitions)
    with Producer(url, storage_options=options) as producer:
        for p in range(partitions):
            producer.send("t", value=b"x", partition=p)
        producer.flush()
    consumer = Consumer(
        url,
        storage_options=options,
        group_id="g",
        auto_offset_reset="earliest",
        heartbeat_interval_ms=int(HEARTBEAT_S * 1000),
        session_timeout_ms=SESSION_MS,
        **config,
    )
    consumer.subscribe(["t"])
    read: list[Any] = []

    def everything_read() -> bool:
        for records in consumer.poll(timeout_ms=20).values():
            read.extend(records)
        return len(read) >= partitions

    deadline = time.monotonic() + 60
    while not everything_read():
        if time.monotonic() > deadline:
            pytest.fail(f"the member read {len(read)} of {partitions} records")
    return consumer


def test_idle_member_makes_one_request_per_heartbeat_interval(s3_url: tuple[str, dict[str, Any]]) -> None:
    url, options = s3_url
    consumer = idle_member(url, options, 4, auto_commit_interval_ms=100)
    try:
        member = consumer._member
        assert member is not None and member.sparse
        # Settle: the first auto-commit of the positions read, and a few quiet cycles.
        settled = member._cycles + 3
        wait_until("the member to settle", lambda: member._cycles >= settled, consumer)
        bucket = bucket_of(url)
        before, start, listed, began = group_requests(bucket), member._cycles, member.listings, time.monotonic()
        cycles = 40  # 8 refresh periods; more than HEARTBEATS_KEPT heartbeats would need ~64, see below
        wait_until(f"{cycles} heartbeat cycles", lambda: member._cycles >= start + cycles, consumer, 60)
        spent = group_requests(bucket) - before
        elapsed = time.monotonic() - began
        done, lists = member._cycles - start, member.listings - listed
    finally:
        consumer.close()
    # Per cycle ONE request: the listing (members, generations, markers at once), or every R = 1 s (about
    # every 4th cycle) the heartbeat in its place; one DeleteObjects per HEARTBEATS_KEPT heartbeats. No GET
    # (nothing new to read), no HEAD, no commits. Before, every cycle made a PUT and a LIST: 2 per cycle.
    deletes = spent["DELETE"] + spent["POST"]
    assert deletes <= done // (2 * 16) + 1, spent
    assert sum(spent.values()) - deletes <= done + 1, (spent, done)
    assert sum(spent.values()) - deletes <= elapsed / HEARTBEAT_S + 1, (spent, elapsed)
    assert spent["GET"] == 0 and spent["HEAD"] == 0, spent
    # The heartbeat is still refreshed (about every R), and never two cycles in a row go without a listing.
    refresh_s = SESSION_MS / 1000 / 3
    assert elapsed / refresh_s - 1 <= spent["PUT"] <= done // 2 + 1, (spent, done, elapsed)
    # The heartbeat thread runs on while the two are read: the server and the member may differ by one listing.
    assert abs(spent["LIST"] - lists) <= 1 and lists >= done // 2, (spent, done, lists)


def test_auto_commit_writes_only_when_positions_moved(s3_url: tuple[str, dict[str, Any]]) -> None:
    url, options = s3_url
    consumer = idle_member(url, options, 2, auto_commit_interval_ms=50)
    try:
        member = consumer._member
        assert member is not None and member.adopted is not None
        gen = member.adopted
        group = consumer._group

        def committed() -> dict[tuple[str, int], int]:
            return member.client.committed(gen)

        wait_until("the positions read to be committed", lambda: committed() == {("t", 0): 1, ("t", 1): 1}, consumer)
        entries = len(member.client.commit_entries(gen.number))
        # Several auto-commit intervals pass with nothing read: nothing is written.
        for _ in range(5):
            last = group._last_auto_commit
            wait_until("an auto-commit", lambda last=last: group._last_auto_commit > last, consumer)
        assert len(member.client.commit_entries(gen.number)) == entries
        # Once a position moves, the next auto-commit writes it (the check above can fail).
        with Producer(url, storage_options=options) as producer:
            producer.send("t", value=b"y", partition=0)
            producer.flush()
        wait_until("the new position to be committed", lambda: committed().get(("t", 0)) == 2, consumer)
        assert len(member.client.commit_entries(gen.number)) == entries + 1
    finally:
        consumer.close()


class SlowStore:
    """``store`` with every create and listing delayed: a member whose heartbeat thread runs late."""

    def __init__(self, store: Any, delay_s: float) -> None:
        self._store, self._delay_s = store, delay_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def put_if_absent(self, *args: Any, **kwargs: Any) -> bool:
        time.sleep(self._delay_s)
        return bool(self._store.put_if_absent(*args, **kwargs))

    def list_after(self, *args: Any, **kwargs: Any) -> Any:
        time.sleep(self._delay_s)
        return self._store.list_after(*args, **kwargs)


def local_member(url: str, name: str, heartbeat_s: float) -> Consumer:
    """A subscribed member of group ``g`` on topic ``t`` with session timeout ``SESSION_MS``."""
    consumer = Consumer(
        url,
        group_id="g",
        client_id=name,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        heartbeat_interval_ms=int(heartbeat_s * 1000),
        session_timeout_ms=SESSION_MS,
    )
    consumer.subscribe(["t"])
    return consumer


def test_a_slowly_heartbeating_member_is_never_expired_while_alive(tmp_path: Path) -> None:
    url = str(tmp_path / "root")
    with LogStore(url) as store:
        store.create_topic("t", 4)
    # a: the idle member, refreshing its heartbeat only every 1 s, with every create and listing 0.25 s late;
    # b: an observer that looks four times as often (liveness must not depend on the observer's rate).
    a = local_member(url, "a", HEARTBEAT_S)
    b = local_member(url, "b", HEARTBEAT_S / 4)
    try:
        ma, mb = a._member, b._member
        assert ma is not None and mb is not None and ma.sparse
        ma.client.store = SlowStore(ma.client.store, 0.25)  # type: ignore[assignment]
        verdicts: list[bool] = []
        judge = mb._live

        def live(heartbeats: Any) -> Any:
            out = judge(heartbeats)
            verdicts.append(ma.member_id in out)
            return out

        mb._live = live  # type: ignore[method-assign]

        def both_assigned() -> bool:
            a.poll(timeout_ms=10)
            b.poll(timeout_ms=10)
            return bool(a.assignment()) and bool(b.assignment()) and ma.adopted == mb.adopted

        deadline = time.monotonic() + 30
        while not both_assigned():
            assert time.monotonic() < deadline, "the two members did not share the partitions"

        def adopted(m: GroupMember) -> int:
            return m.adopted.number if m.adopted is not None else -1

        generation, cycles, listed = adopted(ma), ma._cycles, ma.listings
        verdicts.clear()
        watch = time.monotonic() + 3 * SESSION_MS / 1000  # three session timeouts
        while time.monotonic() < watch:
            a.poll(timeout_ms=20)
            b.poll(timeout_ms=20)
            assert adopted(ma) == adopted(mb) == generation, "the group rebalanced"
        assert verdicts and all(verdicts), f"b judged a dead in {verdicts.count(False)} of {len(verdicts)} listings"
        assert ma.listings - listed < ma._cycles - cycles, "a never refreshed in place of a listing"
    finally:
        a.close()
        b.close()


def test_a_joining_member_is_noticed_within_two_heartbeat_intervals(tmp_path: Path) -> None:
    url = str(tmp_path / "root")
    with LogStore(url) as store:
        store.create_topic("t", 4)
    a = local_member(url, "a", HEARTBEAT_S)
    b: Consumer | None = None
    try:
        member = a._member
        assert member is not None and member.sparse
        wait_until("a to own every partition", lambda: len(a.assignment()) == 4, a)
        settled = member._cycles + 8  # idle cycles, some of them refreshes in place of a listing
        wait_until("a to idle", lambda: member._cycles >= settled, a)
        assert member.listings < member._cycles
        gen = member.adopted
        assert gen is not None
        # From here on a is not polled: its heartbeat thread alone must notice the rebalance b starts.
        b = local_member(url, "b", HEARTBEAT_S)
        marker = rebalance_key("g", gen.number)
        deadline = time.monotonic() + 10
        while not member.client.store.exists(marker):
            assert time.monotonic() < deadline, "b did not start a rebalance"
            time.sleep(0.005)
        created, cycles = time.monotonic(), member._cycles
        while member._marker_for != gen.number:
            assert time.monotonic() < deadline, "a did not notice the rebalance"
            time.sleep(0.005)
        noticed_s, noticed_cycles = time.monotonic() - created, member._cycles - cycles
    finally:
        a.close()
        if b is not None:
            b.close()
    # The cycle under way may have listed before the marker existed; of the next two, one lists.
    assert noticed_cycles <= 2, noticed_cycles
    assert noticed_s <= 2 * HEARTBEAT_S + 2.0, noticed_s  # two intervals, with room for a loaded machine


def test_the_heartbeat_schedule(tmp_path: Path) -> None:
    def member(heartbeat_ms: int) -> GroupMember:
        m = GroupMember(
            LogRoot(str(tmp_path / "root")).store,
            "g",
            client_id="m",
            strategies=("range",),
            session_timeout_ms=45_000,
            heartbeat_interval_ms=heartbeat_ms,
            max_poll_interval_ms=300_000,
            partitions_for=lambda topics, fresh: {},
        )
        m._topics = ("t",)
        m._announced, m._written_at = m._announcement(m._own_heartbeat()), time.monotonic()  # just written
        return m

    # At Kafka's defaults (3 s, 45 s) a refresh every 12 to 15 s replaces a listing.
    m = member(3000)
    assert m.sparse
    assert m._plan() == (False, True)  # idle, heartbeat fresh: list
    m._written_at -= 12.0
    assert m._plan() == (True, False)  # refresh due: the heartbeat instead of the listing
    assert m._plan() == (True, True)  # still due (the create failed, or the thread runs late): never 2 unlisted
    m._written_at = time.monotonic()
    assert m._plan() == (False, True)
    with m._lock:
        m.joined = 1  # what the heartbeat announces changed: write it at once, and list
    assert m._plan() == (True, True)
    # Fewer than two cycles per refresh period (h > S/6): both every cycle, as before.
    assert member(7500).sparse and not member(7501).sparse
    m = member(15_000)
    assert [m._plan() for _ in range(3)] == [(True, True)] * 3
