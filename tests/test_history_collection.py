"""Producer ids, epochs, decisions and markers are collected in a root listing boundedHistory (PROTOCOL.md 11.1-11.3).

Collection rules count in wall-clock time (D, T); the tests pass the collector a ``now`` that far ahead,
and move the coordinator's clock (``coordinator.transactions.now_ms``) when a reader must see that time.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import coordinator.transactions as transactions_module
from coordinator.collection.transactions import TransactionHistoryCollector
from coordinator.keys import PRODUCER_IDS, TRANSACTIONS, transactional_id_prefix
from coordinator.transactions import (
    COORDINATOR_DELAY_MS,
    MAX_TRANSACTION_TIMEOUT_MS,
    Decision,
    TransactionCoordinator,
    allocate_producer_id,
)
from pyspark_logsource import Consumer, FencedError, InvalidConfigError, LogStore, Producer
from segment_format import numbered
from segment_format.protocol import ProtocolVersion, upgrade_protocol
from segment_format.records import now_ms
from segment_format.root import LogRoot
from tests.counting_store import CountingStore

#: Far enough ahead that every age rule of the collector is met.
LATER_MS = MAX_TRANSACTION_TIMEOUT_MS + 2 * COORDINATOR_DELAY_MS + 60_000

#: Partitioned topics: transactions resolved by merges of per-partition segment objects.
PARTITIONED = {"storage.layout": "partitioned"}


def make_root(path: Path, bounded: bool = True) -> str:
    url = str(path)
    root = LogRoot(url)
    if bounded:
        root.protocol.ensure_written()  # a new root lists boundedHistory from its object 0
        assert "boundedHistory" in root.protocol.version.reader_features
    else:
        upgrade_protocol(root.store, ProtocolVersion(1, 1, (), ("changeNotices",)))  # a root from before it
    root.close()
    LogStore(url).create_topic("a", 2, PARTITIONED)
    return url


@pytest.fixture()
def url(tmp_path: Path) -> str:
    return make_root(tmp_path)


def move_clock_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """The coordinator's wall clock LATER_MS ahead: a reader sees what it would see after the rules' delays."""
    monkeypatch.setattr(transactions_module, "now_ms", lambda: now_ms() + LATER_MS)


def keys_under(root: LogRoot, prefix: str) -> list[str]:
    return [info.key for info in root.store.list(prefix)]


def decisions(root: LogRoot, producer_id: int) -> dict[int, str]:
    coordinator = TransactionCoordinator(root.store)
    prefix = f"{TRANSACTIONS}{producer_id:020d}/"
    return {txn: coordinator.read_decision(producer_id, txn).state for txn in numbered.numbers(root.store, prefix)}  # type: ignore[union-attr]


def test_producer_ids_come_after_the_largest_and_all_but_the_newest_old_one_are_collected(url: str) -> None:
    root = LogRoot(url)
    ids = [allocate_producer_id(root.store, "p", root.protocol) for _ in range(20)]
    assert ids == list(range(20))
    collector = TransactionHistoryCollector(root)
    assert collector.collect(now_ms()).producer_ids == 0  # none is 2D old yet
    assert collector.collect(now_ms() + LATER_MS).producer_ids == 19
    assert numbered.numbers(root.store, PRODUCER_IDS) == [19]
    counting = CountingStore(root.store)
    assert allocate_producer_id(counting, "p", root.protocol) == 20  # never a collected number again
    assert counting.counts == {"list": 1, "put": 1}  # one listing, whatever the history
    root.close()


def test_without_the_feature_producer_ids_stay_contiguous_and_nothing_is_collected(tmp_path: Path) -> None:
    root = LogRoot(make_root(tmp_path, bounded=False))
    assert [allocate_producer_id(root.store, "p", root.protocol) for _ in range(5)] == list(range(5))
    producer = Producer(root.url, transactional_id="t", linger_ms=0)
    producer.init_transactions()
    for _ in range(3):
        producer.begin_transaction()
        producer.send("a", value=b"x")
        producer.abort_transaction()
    producer.close()
    before = sorted(keys_under(root, "_coordinator/"))
    assert TransactionHistoryCollector(root).collect(now_ms() + LATER_MS).deleted == 0
    assert sorted(keys_under(root, "_coordinator/")) == before
    root.close()


def run_transactions(url: str, tid: str, count: int, start: int = 0) -> tuple[int, list[bytes]]:
    """``count`` transactions, every third aborted; returns the producer id and the committed values.

    The timeout is short: a reader meeting an aborted batch whose decision was collected aborts it again
    once it has seen it undecided that long (PROTOCOL.md 11.2, *Collection*, 4)."""
    producer = Producer(url, transactional_id=tid, linger_ms=0, transaction_timeout_ms=1_000)
    producer.init_transactions()
    committed = []
    for i in range(start, start + count):
        producer.begin_transaction()
        value = b"v%d" % i
        producer.send("a", value=value, partition=i % 2)
        if i % 3 == 2:
            producer.abort_transaction()
        else:
            producer.commit_transaction()
            committed.append(value)
    producer_id = producer._transactions._producer_id
    producer.close()
    return producer_id, committed


def read_committed(url: str, expected: int, within_s: float = 60.0) -> list[bytes]:
    consumer = Consumer(url, auto_offset_reset="earliest", isolation_level="read_committed")
    consumer.subscribe(["a"])
    values: list[bytes] = []
    deadline = time.monotonic() + within_s
    while len(values) < expected and time.monotonic() < deadline:
        values.extend(consumer.poll_arrow(max_records=1000, timeout_ms=200).column("value").to_pylist())
    consumer.close()
    return values


def test_epochs_and_old_aborts_are_collected_and_readers_still_read_exactly_the_commits(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    producer_id, committed = run_transactions(url, "app", 12)
    root = LogRoot(url)
    epochs_prefix = transactional_id_prefix("app") + "epochs/"
    assert len(numbered.numbers(root.store, epochs_prefix)) == 13  # the fence and one per transaction
    before = decisions(root, producer_id)
    report = TransactionHistoryCollector(root).collect(now_ms() + LATER_MS)
    # The fence (undecided) and the newest epoch stay; the rest were decided and are 2D old.
    assert numbered.numbers(root.store, epochs_prefix) == [0, 12]
    assert report.epochs == 11
    after = decisions(root, producer_id)
    # Aborts go (all but the newest decision); commits stay while their batches are still transactional.
    assert {t for t, s in after.items() if s == "committed"} == {t for t, s in before.items() if s == "committed"}
    assert [t for t, s in after.items() if s == "aborted"] == [12]  # the newest stays, whatever it is
    assert report.decisions == 3
    move_clock_ahead(monkeypatch)
    # A reader meets aborted batches whose decisions are gone: once it has seen each undecided for the
    # transaction's timeout it aborts it again (the chain, listed afresh, still holds it), and reads exactly
    # the committed records.
    assert sorted(read_committed(url, len(committed))) == sorted(committed)
    assert {t for t, s in decisions(root, producer_id).items() if s == "aborted"} == {
        t for t, s in before.items() if s == "aborted"
    }
    root.close()


def test_initialising_costs_the_same_after_ten_times_the_history(url: str) -> None:
    def init_cost() -> int:
        root = LogRoot(url)
        counting = CountingStore(root.store)
        TransactionCoordinator(counting, root.protocol).init_transactions("flat")
        root.close()
        return counting.total()

    def grow(count: int, start: int) -> int:
        """``count`` more transactions, a maintenance pass (merges resolve them) and a collection pass later
        on; returns how many objects the transactions left under ``_coordinator/``."""
        run_transactions(url, "flat", count, start)
        root = LogRoot(url)
        root.maintain("a", TransactionCoordinator(root.store, root.protocol).resolve)
        TransactionHistoryCollector(root).collect(now_ms() + LATER_MS)
        left = len(keys_under(root, TRANSACTIONS)) + len(keys_under(root, transactional_id_prefix("flat")))
        root.close()
        return left

    assert grow(10, 0) <= 20
    small = init_cost()
    # Ten times the history leaves no more than the decisions of the objects not merged yet (fewer than 16 per
    # partition, of 2) and a few epochs: the bound does not grow with the history.
    assert grow(100, 10) <= 2 * 17 + 6
    assert init_cost() <= small


def test_a_committed_decision_goes_once_its_topic_is_gone_and_never_the_newest(url: str) -> None:
    LogStore(url).create_topic("b", 1, PARTITIONED)
    producer = Producer(url, transactional_id="gone", linger_ms=0)
    producer.init_transactions()
    for i in range(4):
        producer.begin_transaction()
        producer.send("b", value=b"%d" % i)
        producer.send_offsets_to_transaction({("a", 0): i}, "g")
        producer.commit_transaction()
    producer_id = producer._transactions._producer_id
    producer.close()
    root = LogRoot(url)
    collector = TransactionHistoryCollector(root)
    collector.collect(now_ms() + LATER_MS)
    assert sorted(decisions(root, producer_id)) == [1, 2, 3, 4]  # its batches are still transactional in b
    LogStore(url).delete_topic("b")
    report = collector.collect(now_ms() + LATER_MS)
    assert sorted(decisions(root, producer_id)) == [4]  # the newest (and newest committed) stays
    assert report.markers == 3
    assert [k.rsplit("/", 1)[1] for k in keys_under(root, TRANSACTIONS) if k.endswith(".materialized")] == [
        f"{4:020d}.materialized"
    ]
    root.close()


def test_a_zombie_beginning_after_a_long_pause_on_a_collected_epoch_is_fenced(url: str) -> None:
    zombie = Producer(url, transactional_id="z", linger_ms=0)
    zombie.init_transactions()  # fence 0
    zombie.begin_transaction()  # epoch 1
    zombie.send("a", value=b"z")
    zombie.commit_transaction()
    successor = Producer(url, transactional_id="z", linger_ms=0)
    successor.init_transactions()  # fence 2 (undecided)
    successor.close()
    run_transactions(url, "z", 3)  # a third instance: aborts fence 2, then epochs 4, 5, 6
    root = LogRoot(url)
    TransactionHistoryCollector(root).collect(now_ms() + LATER_MS)
    prefix = transactional_id_prefix("z") + "epochs/"
    assert 2 not in numbered.numbers(root.store, prefix)  # the number the zombie tries next is free again
    coordinator = zombie._transactions._coordinator
    number, began = coordinator._began["z"]
    coordinator._began["z"] = (number, began - COORDINATOR_DELAY_MS / 1000 - 1)  # it paused for longer than D
    with pytest.raises(FencedError, match="fenced"):
        zombie.begin_transaction()
    assert 2 in numbered.numbers(root.store, prefix)  # its create landed on the collected number...
    root.close()  # ...and the listing after it found the newer epochs: it writes nothing


def test_a_commit_issued_after_the_timeout_is_an_abort(url: str) -> None:
    producer = Producer(url, transactional_id="slow", linger_ms=0, transaction_timeout_ms=300)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("a", value=b"late")
    producer.flush()
    time.sleep(0.4)  # past the transaction's own timeout on the producer's clock
    with pytest.raises(FencedError, match="transaction_timeout_ms"):
        producer.commit_transaction()
    producer_id = producer._transactions._producer_id
    producer.close()
    root = LogRoot(url)
    assert decisions(root, producer_id) == {1: "aborted"}
    root.close()


def test_a_timeout_above_fifteen_minutes_is_refused_only_where_history_is_collected(tmp_path: Path) -> None:
    bounded = make_root(tmp_path / "bounded")
    producer = Producer(bounded, transactional_id="long", transaction_timeout_ms=MAX_TRANSACTION_TIMEOUT_MS + 1)
    with pytest.raises(InvalidConfigError, match="transaction_timeout_ms"):
        producer.init_transactions()
    producer.close()
    legacy = make_root(tmp_path / "legacy", bounded=False)
    producer = Producer(legacy, transactional_id="long", transaction_timeout_ms=MAX_TRANSACTION_TIMEOUT_MS + 1)
    producer.init_transactions()
    producer.close()


def test_the_root_pass_collects_the_transaction_namespaces(url: str) -> None:
    from coordinator.collection import collect

    run_transactions(url, "pass", 6)
    root = LogRoot(url)
    report = collect(root, now_ms=now_ms() + LATER_MS)
    assert report.errors == {}
    assert report.deleted["transactions"] >= 5  # epochs 1..5 at least
    assert report.requests["transactions"] > 0
    assert collect(root, now_ms=now_ms() + LATER_MS).deleted["transactions"] == 0  # nothing more may go
    root.close()


def test_commits_go_once_resolving_merges_settled_their_batches_and_a_stale_look_aborts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = str(tmp_path)
    root = LogRoot(url)
    root.protocol.ensure_written()
    LogStore(url).create_topic("one", 1, {"auto.maintenance.enable": "false", **PARTITIONED})
    producer = Producer(url, transactional_id="merged", linger_ms=0, transaction_timeout_ms=1_000)
    producer.init_transactions()
    committed = []
    for i in range(40):
        producer.begin_transaction()
        producer.send("one", value=b"m%d" % i)
        if i % 4 == 3:
            producer.abort_transaction()
        else:
            producer.commit_transaction()
            committed.append(b"m%d" % i)
    producer_id = producer._transactions._producer_id
    producer.close()
    coordinator = TransactionCoordinator(root.store, root.protocol)
    log = root.partition("one", 0)
    first_batch = log.index(log.view().segments[0])  # txn 1's batch, still transactional in an appended object
    assert root.maintain("one", coordinator.resolve)["merged"] >= 2  # two groups of 16 resolved, the rest waits
    collector = TransactionHistoryCollector(root)
    collector.collect(now_ms() + LATER_MS)
    left = decisions(root, producer_id)
    # Commits whose batches are plain in merged objects older than D + ε are gone; those still in appended
    # objects (the last eight transactions) stay, and so does the newest.
    assert left == {t: "committed" for t in (33, 34, 35, 37, 38, 39)} | {40: "aborted"}
    # A reader that still holds txn 1's batch from before the merge finds no decision; even past its timeout
    # (the clock moved on) it does not abort: the chain, read again, no longer holds the batch.
    move_clock_ahead(monkeypatch)
    reader = TransactionCoordinator(root.store, root.protocol)
    base, last = int(first_batch.base_offsets[0]), int(first_batch.last_offsets[0])
    for _ in range(3):  # a zero timeout: every look after the first is past it
        assert reader.resolve(producer_id, 1, "one", 0, base, last, 0) is None
        time.sleep(0.01)
    assert reader.read_decision(producer_id, 1) is None  # no abort was created for a committed transaction
    assert read_committed_topic(url, "one", len(committed)) == committed
    root.close()


def read_committed_topic(url: str, topic: str, expected: int) -> list[bytes]:
    consumer = Consumer(url, auto_offset_reset="earliest", isolation_level="read_committed")
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(values) < expected and time.monotonic() < deadline:
        values.extend(consumer.poll_arrow(max_records=1000, timeout_ms=200).column("value").to_pylist())
    consumer.close()
    return values


def test_a_consumer_whose_view_predates_the_merge_reads_on_after_the_decisions_are_collected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lagging read_committed consumer still holds a view naming the appended objects a resolving merge
    replaced; their decisions are then collected. Its first absent decision lists the chain afresh, so it
    reads the plain records instead of waiting at a batch the log no longer holds (PROTOCOL.md 11.2)."""
    url = str(tmp_path)
    root = LogRoot(url)
    root.protocol.ensure_written()
    LogStore(url).create_topic("one", 1, {"auto.maintenance.enable": "false", **PARTITIONED})
    # The default 60 s timeout: the test fails if the consumer waits for it at any batch.
    producer = Producer(url, transactional_id="lag", linger_ms=0)
    producer.init_transactions()
    committed = []
    for i in range(40):
        producer.begin_transaction()
        producer.send("one", value=b"l%d" % i)
        if i % 4 == 3 and i < 32:  # aborts only among the objects the merge replaces
            producer.abort_transaction()
        else:
            producer.commit_transaction()
            committed.append(b"l%d" % i)
    producer.close()
    consumer = Consumer(url, auto_offset_reset="earliest", isolation_level="read_committed")
    consumer.subscribe(["one"])
    values: list[bytes] = []
    while len(values) < 2:
        values.extend(consumer.poll_arrow(max_records=2, timeout_ms=200).column("value").to_pylist())
    assert root.maintain("one", TransactionCoordinator(root.store, root.protocol).resolve)["merged"] >= 2
    assert TransactionHistoryCollector(root).collect(now_ms() + LATER_MS).decisions > 20
    move_clock_ahead(monkeypatch)  # the consumer reads on when the collection could have happened
    deadline = time.monotonic() + 30
    while len(values) < len(committed) and time.monotonic() < deadline:
        values.extend(consumer.poll_arrow(max_records=100, timeout_ms=200).column("value").to_pylist())
    consumer.close()
    assert values == committed
    root.close()


def test_a_sinks_retry_id_goes_once_the_query_has_passed_its_micro_batch(url: str) -> None:
    """Micro-batch 5 re-run under ``retry:1`` after its own transaction was aborted: the retry id (its mapping
    and its decision, the newest of its producer id) stays while batch 5 can still be replayed, and goes once
    the sink has decided a later micro-batch; user producers may not take a sink's id."""
    from pyspark_logsource.spark.sink_commit import _batch_producer

    root = LogRoot(url)
    coordinator = TransactionCoordinator(root.store, root.protocol)
    sink = "spark-sink:" + "a" * 64
    own = coordinator.producer_id_for(sink)
    coordinator.abort_if_undecided(own, 5)  # timed out while the query was down
    retry, decided = _batch_producer(url, "{}", coordinator, sink, 5)
    assert decided is None and retry != own
    coordinator.decide(Decision("committed", retry, 5, created_ms=now_ms()))
    mapping = transactional_id_prefix(f"{sink}/batch:5/retry:1") + "producer-id.json"
    collector = TransactionHistoryCollector(root)
    for _ in range(2):  # batch 5 may still be replayed: its retry id stays however old
        collector.collect(now_ms() + LATER_MS)
    assert root.store.exists(mapping) and decisions(root, retry) == {5: "committed"}
    assert _batch_producer(url, "{}", coordinator, sink, 5) == (retry, coordinator.decision(retry, 5))

    coordinator.decide(Decision("committed", own, 6, created_ms=now_ms()))  # the query moved on to batch 6
    report = collector.collect(now_ms() + LATER_MS)
    assert report.decisions >= 1 and decisions(root, retry) == {}
    assert collector.collect(now_ms() + LATER_MS).retry_ids == 1
    assert not root.store.exists(mapping)
    assert decisions(root, own) == {6: "committed"}  # the aborted batch 5 went by the abort rule (T + 2D)
    assert _batch_producer(url, "{}", coordinator, sink, 6) == (own, coordinator.decision(own, 6))
    with pytest.raises(InvalidConfigError, match="the Spark sink's own"):
        Producer(url, transactional_id=sink + "/mine").init_transactions()


def test_a_transactional_id_shaped_like_a_retry_id_but_not_a_sinks_is_never_collected(url: str) -> None:
    root = LogRoot(url)
    coordinator = TransactionCoordinator(root.store, root.protocol)
    base = "orders"
    own = coordinator.producer_id_for(base)
    other = coordinator.producer_id_for(f"{base}/batch:5/retry:1")
    coordinator.decide(Decision("committed", other, 5, created_ms=now_ms()))
    coordinator.decide(Decision("committed", own, 6, created_ms=now_ms()))
    collector = TransactionHistoryCollector(root)
    assert collector.collect(now_ms() + LATER_MS).retry_ids == 0
    assert collector.collect(now_ms() + LATER_MS).retry_ids == 0
    assert decisions(root, other) == {5: "committed"}
