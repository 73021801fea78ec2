"""What an idle group member costs on S3 (issue 11): requests counted at the moto server, by key shape.

An idle member (subscribed, assignment stable, nothing arriving) writes one
heartbeat and makes one listing of its group per heartbeat interval
(PROTOCOL.md 11.4), deletes its old heartbeats in a batch now and then, and
commits nothing while its positions stay where they are.
"""

from __future__ import annotations

import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from pyspark_logsource import Consumer, LogStore, Producer
from tests.fixtures_s3 import REQUESTS


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
        heartbeat_interval_ms=200,
        session_timeout_ms=5000,
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


def test_idle_member_makes_one_put_and_one_list_per_heartbeat(s3_url: tuple[str, dict[str, Any]]) -> None:
    url, options = s3_url
    consumer = idle_member(url, options, 4, auto_commit_interval_ms=100)
    try:
        member = consumer._member
        assert member is not None
        # Settle: the first auto-commit of the positions read, and a few quiet cycles.
        settled = member._cycles + 3
        wait_until("the member to settle", lambda: member._cycles >= settled, consumer)
        bucket = bucket_of(url)
        before, start = group_requests(bucket), member._cycles
        cycles = 20  # more than HEARTBEATS_KEPT, so the batched deletion of old heartbeats is counted too
        wait_until(f"{cycles} heartbeat cycles", lambda: member._cycles >= start + cycles, consumer, 60)
        spent = group_requests(bucket) - before
        done = member._cycles - start
    finally:
        consumer.close()
    # Per cycle: one PUT (the heartbeat) and one LIST (members, generations, markers at once); one
    # DeleteObjects per HEARTBEATS_KEPT cycles. No GET (nothing new to read), no HEAD, no commits.
    assert spent["PUT"] <= done + 1, spent
    assert spent["LIST"] <= done + 1, spent
    assert spent["GET"] == 0 and spent["HEAD"] == 0, spent
    assert spent["DELETE"] + spent["POST"] <= done // 16 + 1, spent
    assert sum(spent.values()) <= 2 * done + 2 + done // 16 + 1, spent


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
