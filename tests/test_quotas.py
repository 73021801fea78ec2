"""Quotas (PROTOCOL.md 11.10): Kafka's precedence, the documents in the root, the command, a quota changed at
run time, and the store's request rate. ``test_quotas_bound.py`` runs clients flat out against the byte rates.
Waits poll with deadlines.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from coordinator.quotas import (
    DEFAULT,
    Entity,
    QuotaDocument,
    QuotaReader,
    alter_quota,
    entity_key,
    parse_entity_key,
    precedence,
    read_entity,
    resolve,
)
from pyspark_logsource.cli.app import main as plog
from pyspark_logsource.client.admin import LogStore
from pyspark_logsource.client.producer import Producer
from segment_format.errors import InvalidConfigError
from segment_format.stores import open_store

TOLERANCE = 0.2
VALUE = b"v" * 16_000


@pytest.fixture
def url(tmp_path: Path) -> str:
    """An empty root: the quota commands, like every command, refuse a location that holds none."""
    from pyspark_logsource.cli.common import create_root

    location = str(tmp_path / "root")
    create_root(location, {})
    return location


# ------------------------------------------------------------------ precedence


def test_precedence_is_kafkas_order() -> None:
    assert [e.path() for e in precedence("u", "c")] == [
        "/config/users/u/clients/c",
        "/config/users/u/clients/<default>",
        "/config/users/u",
        "/config/users/<default>/clients/c",
        "/config/users/<default>/clients/<default>",
        "/config/users/<default>",
        "/config/clients/c",
        "/config/clients/<default>",
    ]


def test_each_entity_wins_over_those_after_it_and_loses_to_those_before() -> None:
    """Kafka's table: with the entities from position i onward configured, position i applies."""
    order = precedence("u", "c")
    for i, winner in enumerate(order):
        configs = {entity: {"producer_byte_rate": float(100 + n)} for n, entity in enumerate(order) if n >= i}
        assert resolve(configs, "u", "c", "producer_byte_rate") == (winner, 100.0 + i)
    # Another user's or client's entities never apply.
    others = {Entity("v", "c"): {"producer_byte_rate": 1.0}, Entity(None, "d"): {"producer_byte_rate": 2.0}}
    assert resolve(others, "u", "c", "producer_byte_rate") is None
    # Each quota type resolves on its own: the (user, client) entity sets only the producer's rate.
    mixed = {
        Entity("u", "c"): {"producer_byte_rate": 1.0},
        Entity(DEFAULT, None): {"consumer_byte_rate": 2.0, "producer_byte_rate": 3.0},
    }
    assert resolve(mixed, "u", "c", "producer_byte_rate") == (Entity("u", "c"), 1.0)
    assert resolve(mixed, "u", "c", "consumer_byte_rate") == (Entity(DEFAULT, None), 2.0)


def test_documents_in_the_store_resolve_and_any_name_is_a_safe_key(url: str) -> None:
    store = open_store(url)
    odd = "../we ird/<default>\u00e9"
    alter_quota(store, Entity(odd, DEFAULT), {"producer_byte_rate": 10})
    alter_quota(store, Entity(None, "c"), {"producer_byte_rate": 20, "consumer_byte_rate": 30})
    key = entity_key(Entity(odd, DEFAULT))
    assert "/" not in key[len("_coordinator/quotas/users/") :].split("/clients/")[0]
    assert parse_entity_key(key + "00000000000000000000.json") == (Entity(odd, DEFAULT), 0)
    configs = QuotaReader(store, refresh_s=0).configs()
    assert resolve(configs, odd, "c", "producer_byte_rate") == (Entity(odd, DEFAULT), 10.0)
    assert resolve(configs, odd, "c", "consumer_byte_rate") == (Entity(None, "c"), 30.0)
    assert resolve(configs, "other", "c", "producer_byte_rate") == (Entity(None, "c"), 20.0)
    # A delete of every setting removes the entity; the next one in Kafka's order applies.
    alter_quota(store, Entity(odd, DEFAULT), delete=["producer_byte_rate"])
    configs = QuotaReader(store, refresh_s=0).configs()
    assert resolve(configs, odd, "c", "producer_byte_rate") == (Entity(None, "c"), 20.0)
    # A corrupt document costs its own entity only.
    store.put_if_absent(entity_key(Entity("bad", None)) + "00000000000000000000.json", b'{"version": 0, "quotas": 5}')
    configs = QuotaReader(store, refresh_s=0).configs()
    assert Entity("bad", None) not in configs and Entity(None, "c") in configs
    with pytest.raises(InvalidConfigError, match="unknown quota 'request_percentage'"):
        alter_quota(store, Entity(None, "c"), {"request_percentage": 50})
    with pytest.raises(InvalidConfigError, match="must be a finite number"):
        alter_quota(store, Entity(None, "c"), {"producer_byte_rate": -1})


def test_alter_keeps_only_the_newest_versions_and_merges_changes(url: str) -> None:
    store = open_store(url)
    entity = Entity("u", None)
    for rate in range(5):
        alter_quota(store, entity, {"producer_byte_rate": rate})
    alter_quota(store, entity, {"consumer_byte_rate": 7})
    prefix = entity_key(entity)
    assert [i.key[len(prefix) :] for i in store.list(prefix)] == [
        "00000000000000000004.json",
        "00000000000000000005.json",
    ]
    assert read_entity(store, entity) == {"producer_byte_rate": 4.0, "consumer_byte_rate": 7.0}
    doc = QuotaDocument.from_json(store.get(prefix + "00000000000000000005.json"))
    assert doc.version == 5


# ------------------------------------------------------------------ plog's clients


def _producer(url: str, **config: Any) -> Producer:
    settings: dict[str, Any] = {
        "client_id": "ingest",
        "quota_user": "alice",
        "quota_refresh_ms": 200,
        "batch_size": 64 * 1024,
        "buffer_memory": 256 * 1024,
        "linger_ms": 5,
    }
    return Producer(url, **{**settings, **config})


def test_raising_the_quota_with_the_cli_speeds_the_producer_up(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    LogStore(url).create_topic("t", partitions=1)
    low = 256 * 1024
    entity = ["--entity-type", "users", "--entity-name", "alice", "--entity-type", "clients", "--entity-name", "ingest"]
    assert plog(["quotas", "alter", "--url", url, "--add-config", f"producer_byte_rate={low}", *entity]) == 0
    producer = _producer(url, batch_size=32 * 1024, buffer_memory=64 * 1024)
    sent: list[tuple[float, int]] = []  # (time, bytes sent so far)
    total = 0

    def rate_over_last(seconds: float) -> float:
        now = time.monotonic()
        earlier = [b for t, b in sent if t <= now - seconds]
        return (total - earlier[-1]) / seconds if earlier else 0.0

    start = time.monotonic()
    while time.monotonic() - start < 2.5:  # at the low quota
        producer.send("t", VALUE)
        total += len(VALUE)
        sent.append((time.monotonic(), total))
    slow = rate_over_last(1.5)
    whole = total / (time.monotonic() - start)
    assert slow <= low * (1 + TOLERANCE) + 64 * 1024 / 1.5, slow  # the low quota, give or take the buffer
    assert plog(["quotas", "alter", "--url", url, "--add-config", "producer_byte_rate=8388608", *entity]) == 0
    assert plog(["quotas", "describe", "--url", url, "--json", *entity]) == 0
    described = json.loads(capsys.readouterr().out)
    assert described[0]["quotas"] == {"producer_byte_rate": 8388608.0}
    raised_at = time.monotonic()
    fast = 0.0
    while time.monotonic() - raised_at < 5 and fast < 3 * low:
        producer.send("t", VALUE)
        total += len(VALUE)
        sent.append((time.monotonic(), total))
        if sent[-1][0] - raised_at > 1.0:
            fast = rate_over_last(0.5)
    producer.close()
    print(f"producer: {whole / low:.2f} of the low quota ({slow / low:.2f} in its last 1.5 s), then {fast / low:.2f}")
    assert fast >= 3 * low, f"still {fast:.0f} B/s 5 s after the quota went from {low} to 8 MiB/s"


# ------------------------------------------------------------------ the command


def test_cli_alters_describes_deletes_and_refuses_bad_entities(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    # Clients first and users second pair up the same as the other way round (kafka-configs).
    clients_then_users = [
        "--entity-type",
        "clients",
        "--entity-name",
        "c",
        "--entity-type",
        "users",
        "--entity-default",
    ]
    assert (
        plog(
            [
                "quotas",
                "alter",
                "--url",
                url,
                "--add-config",
                "producer_byte_rate=100,store_request_rate=5",
                *clients_then_users,
            ]
        )
        == 0
    )
    assert (
        plog(
            [
                "quotas",
                "alter",
                "--url",
                url,
                "--add-config",
                "consumer_byte_rate=7",
                "--entity-type",
                "clients",
                "--entity-default",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert plog(["quotas", "describe", "--url", url, "--json"]) == 0
    described = {row["entity"]["path"]: row["quotas"] for row in json.loads(capsys.readouterr().out)}
    assert described == {
        "/config/users/<default>/clients/c": {"producer_byte_rate": 100.0, "store_request_rate": 5.0},
        "/config/clients/<default>": {"consumer_byte_rate": 7.0},
    }
    assert plog(["quotas", "describe", "--url", url, "--entity-type", "users"]) == 0
    table = capsys.readouterr().out
    assert "/config/users/<default>/clients/c" in table and "/config/clients/<default>" not in table
    assert (
        plog(
            [
                "quotas",
                "alter",
                "--url",
                url,
                "--delete-config",
                "producer_byte_rate,store_request_rate",
                *clients_then_users,
            ]
        )
        == 0
    )
    assert read_entity(open_store(url), Entity(DEFAULT, "c")) == {}
    # Refused, naming what is wrong: no entity, a name without a type, a type twice, an unknown key, nothing to do.
    for args, message in [
        (["--add-config", "producer_byte_rate=1"], "name the entity"),
        (["--add-config", "producer_byte_rate=1", "--entity-type", "users"], "give each --entity-type once"),
        (
            [
                "--add-config",
                "producer_byte_rate=1",
                "--entity-type",
                "users",
                "--entity-name",
                "a",
                "--entity-type",
                "users",
                "--entity-name",
                "b",
            ],
            "give each --entity-type once",
        ),
        (
            ["--add-config", "request_percentage=50", "--entity-type", "users", "--entity-name", "a"],
            "unknown quota 'request_percentage'",
        ),
        (["--add-config", "producer_byte_rate", "--entity-type", "users", "--entity-name", "a"], "is not KEY=VALUE"),
        (["--entity-type", "users", "--entity-name", "a"], "nothing to change"),
    ]:
        assert plog(["quotas", "alter", "--url", url, *args]) == 2
        assert message in capsys.readouterr().err


def test_producer_is_slowed_to_its_store_request_rate(url: str) -> None:
    """``store_request_rate`` bounds the requests a producer makes of the store (an append is one PUT per
    partition written and one notice per topic), whatever the bytes."""
    LogStore(url).create_topic("t", partitions=1)
    rate = 5.0  # far below what the producer makes unthrottled, even on a busy machine
    alter_quota(open_store(url), Entity("alice", DEFAULT), {"store_request_rate": rate})
    producer = _producer(url)
    flushes = 20  # each flush is one append: its object and the topic's notice, two requests
    start = time.monotonic()
    for _ in range(flushes):
        producer.send("t", b"x")
        producer.flush()
    elapsed = time.monotonic() - start
    throttle_avg = producer.metrics()["produce-throttle-time-avg"]
    producer.close()
    requests = 2 * flushes
    print(f"producer: {requests / elapsed:.1f} store requests/s, quota {rate}, throttle avg {throttle_avg:.1f} ms")
    # A lower bound only (Kafka's first-window burst allowed): without the quota this takes well under a second.
    assert elapsed >= requests / rate - 2.0, elapsed
    assert throttle_avg > 0
