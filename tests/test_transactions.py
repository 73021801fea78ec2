"""Transactional and idempotent producers (PROTOCOL.md 11.1-11.3), including a SIGKILLed read-process-write loop."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from coordinator.transactions import TransactionCoordinator
from pyspark_logsource import Consumer, FencedError, InvalidConfigError, LogStore, Producer, TopicPartition
from segment_format.log.maintenance import MERGE_FANOUT
from segment_format.root import LogRoot


def read_all(url: str, topic: str, isolation: str = "read_committed") -> list[bytes]:
    consumer = Consumer(url, auto_offset_reset="earliest", isolation_level=isolation)
    consumer.subscribe([topic])
    values: list[bytes] = []
    while True:
        table = consumer.poll_arrow(max_records=100_000)
        if table.num_rows == 0:
            break
        values.extend(table.column("value").to_pylist())
    consumer.close()
    return values


@pytest.fixture()
def url(tmp_path: Path) -> str:
    store = LogStore(str(tmp_path))
    store.create_topic("a", 3)
    store.create_topic("b", 2)
    return str(tmp_path)


def test_commit_is_atomic_across_partitions_and_topics(url: str) -> None:
    producer = Producer(url, transactional_id="app-1", linger_ms=0)
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(30):
        producer.send("a", value=b"a%d" % i, key=b"k%d" % i)
        producer.send("b", value=b"b%d" % i, key=b"k%d" % i)
    producer.flush()
    assert read_all(url, "a") == [] and read_all(url, "b") == []  # written, not visible
    assert len(read_all(url, "a", "read_uncommitted")) == 30
    consumer = Consumer(url, isolation_level="read_committed")
    tps = [TopicPartition("a", p) for p in range(3)]
    assert consumer.end_offsets(tps) == dict.fromkeys(tps, 0)  # the last stable offset
    producer.commit_transaction()
    assert sorted(read_all(url, "a")) == sorted(b"a%d" % i for i in range(30))
    assert sorted(read_all(url, "b")) == sorted(b"b%d" % i for i in range(30))
    producer.close()


def test_abort_leaves_nothing_visible(url: str) -> None:
    producer = Producer(url, transactional_id="app-2")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("a", value=b"gone")
    producer.abort_transaction()
    producer.begin_transaction()
    producer.send("a", value=b"kept")
    producer.commit_transaction()
    assert read_all(url, "a") == [b"kept"]
    assert sorted(read_all(url, "a", "read_uncommitted")) == [b"gone", b"kept"]
    producer.close()


def test_second_instance_fences_the_first(url: str) -> None:
    zombie = Producer(url, transactional_id="app-3")
    zombie.init_transactions()
    zombie.begin_transaction()
    zombie.send("a", value=b"zombie")
    zombie.flush()
    fresh = Producer(url, transactional_id="app-3")
    fresh.init_transactions()  # aborts the zombie's open transaction
    with pytest.raises(FencedError):
        zombie.commit_transaction()
    with pytest.raises(FencedError):
        zombie.begin_transaction()
    fresh.begin_transaction()
    fresh.send("a", value=b"fresh")
    fresh.commit_transaction()
    assert read_all(url, "a") == [b"fresh"]
    fresh.close()
    zombie.close()


def test_transactional_misuse_is_a_clear_error(url: str) -> None:
    producer = Producer(url, transactional_id="app-4")
    with pytest.raises(InvalidConfigError, match="init_transactions"):
        producer.begin_transaction()
    producer.init_transactions()
    with pytest.raises(InvalidConfigError, match="begin_transaction"):
        producer.send("a", value=b"x")
    with pytest.raises(InvalidConfigError, match="without begin_transaction"):
        producer.commit_transaction()
    producer.close()
    with pytest.raises(InvalidConfigError, match="transactional_id"):
        Producer(url).init_transactions()


def test_idempotent_by_default_stamps_ids_and_sequences(url: str) -> None:
    with Producer(url, linger_ms=0) as producer:
        for i in range(5):
            producer.send("a", value=b"v%d" % i, partition=0).get(5)
    log = LogStore(url).root.partition("a", 0)
    indexes = [log.index(ref) for ref in log.view().segments]
    pids = {int(i) for idx in indexes for i in idx.producer_ids}
    sequences = [int(s) for idx in indexes for s in idx.base_sequences]
    assert len(pids) == 1 and min(pids) >= 0
    assert sequences == list(range(5))


LOOP = textwrap.dedent(
    """
    import sys, time
    from pyspark_logsource import Consumer, Producer, TopicPartition
    url, = sys.argv[1:]
    producer = Producer(url, transactional_id="etl", linger_ms=0)
    producer.init_transactions()
    consumer = Consumer(url, group_id="etl-group", auto_offset_reset="earliest", enable_auto_commit=False,
                        session_timeout_ms=1500, heartbeat_interval_ms=200)
    consumer.subscribe(["in"])
    idle = 0
    while idle < 20:
        records = consumer.poll(timeout_ms=100, max_records=7)
        if not records:
            idle += 1
            continue
        idle = 0
        producer.begin_transaction()
        offsets = {}
        for tp, batch in records.items():
            for r in batch:
                producer.send("out", key=r.key, value=r.value.upper())
            offsets[tp] = batch[-1].offset + 1
        producer.send_offsets_to_transaction(offsets, "etl-group")
        producer.commit_transaction()
        print("committed", flush=True)
    print("done", flush=True)
    """
)


@pytest.mark.slow
def test_read_process_write_loop_is_exactly_once_under_sigkill(tmp_path: Path) -> None:
    url = str(tmp_path)
    store = LogStore(url)
    store.create_topic("in", 2)
    store.create_topic("out", 2)
    expected = [b"rec-%04d" % i for i in range(400)]
    with Producer(url) as producer:
        for value in expected:
            producer.send("in", key=value[-1:], value=value)
    rng = random.Random(int(os.environ.get("PLOG_TEST_SEED", "7")))
    kills = 0
    for _ in range(12):
        child = subprocess.Popen(
            [sys.executable, "-c", LOOP, url], stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        assert child.stdout is not None
        commits_before_kill = rng.randint(1, 6)
        finished = False
        for _ in range(commits_before_kill):
            line = child.stdout.readline()
            if not line or line.startswith("done"):
                finished = True
                break
        time.sleep(rng.random() * 0.05)
        if child.poll() is None and not finished:
            os.killpg(child.pid, signal.SIGKILL)
            kills += 1
        child.wait(timeout=60)
        if finished:
            break
    # A last run to completion.
    final = subprocess.run([sys.executable, "-c", LOOP, url], capture_output=True, text=True, timeout=120)
    assert final.returncode == 0, final.stderr
    assert kills >= 5
    out = read_all(url, "out")
    assert sorted(out) == sorted(v.upper() for v in expected)  # each input exactly once
    assert len(read_all(url, "out", "read_uncommitted")) >= len(out)  # aborted work stays invisible


def test_read_to_end_stops_at_the_last_stable_offset_and_resumes_after_the_commit(url: str) -> None:
    with Producer(url, linger_ms=0) as plain:
        for i in range(6):
            plain.send("b", value=b"before%d" % i, key=b"k%d" % i)
    producer = Producer(url, transactional_id="app-5", linger_ms=0)
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(4):
        producer.send("b", value=b"open%d" % i, key=b"k%d" % i)
    producer.flush()
    with Consumer(url, isolation_level="read_committed", auto_offset_reset="earliest") as consumer:
        tps = [TopicPartition("b", 0), TopicPartition("b", 1)]
        consumer.assign(tps)
        first = consumer.read_to_end(timeout_ms=10_000)
        assert sorted(first.column("value").to_pylist()) == sorted(b"before%d" % i for i in range(6))
        keys = list(zip(first.column("partition").to_pylist(), first.column("offset").to_pylist(), strict=True))
        assert keys == sorted(keys)  # ordered by partition and offset
        producer.commit_transaction()
        second = consumer.read_to_end(timeout_ms=10_000)  # goes on from its positions, now past the commit
        assert sorted(second.column("value").to_pylist()) == sorted(b"open%d" % i for i in range(4))
        assert consumer.read_to_end(timeout_ms=10_000).num_rows == 0
    with Consumer(url, isolation_level="read_uncommitted", auto_offset_reset="earliest") as everything:
        everything.assign([TopicPartition("b", 0), TopicPartition("b", 1)])
        assert everything.read_to_end().num_rows == 10
    producer.close()


DIES_MID_TRANSACTION = """
import sys, time
from pyspark_logsource import Producer
url = sys.argv[1]
producer = Producer(url, transactional_id="doomed", transaction_timeout_ms=3000)
producer.init_transactions()
producer.begin_transaction()
producer.send("a", b"never-visible", partition=0)
producer.flush()
print("SENT", flush=True)
time.sleep(600)
"""


def test_a_transaction_whose_producer_was_sigkilled_is_aborted_once_its_timeout_passed(url: str) -> None:
    """Kafka aborts a transaction after ``transaction.timeout.ms``; so do read_committed readers here, on their
    own clock (PROTOCOL.md 11.2), so a dead producer holds the last stable offset for about its timeout."""
    child = subprocess.Popen(
        [sys.executable, "-c", DIES_MID_TRANSACTION, url], stdout=subprocess.PIPE, env={**os.environ}
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == b"SENT"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    with Producer(url) as plain:
        plain.send("a", b"after", partition=0).get(30)
    with Consumer(url, isolation_level="read_committed", auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("a", 0)])
        started = time.monotonic()
        blocked = consumer.poll(timeout_ms=1000)
        # Under the 3 s timeout on this consumer's own clock: it stays stopped at the open transaction.
        assert time.monotonic() - started < 3 and not blocked
        seen: list[bytes] = []
        deadline = time.monotonic() + 30
        while not seen and time.monotonic() < deadline:
            seen = [r.value for batch in consumer.poll(timeout_ms=500).values() for r in batch]
        assert seen == [b"after"], "the dead transaction still holds the last stable offset, or leaked"
        assert time.monotonic() - started >= 3, "aborted before its timeout"
    assert read_all(url, "a", "read_uncommitted") == [b"never-visible", b"after"]
    assert read_all(url, "a") == [b"after"]


def test_a_live_transaction_kept_open_past_its_timeout_is_aborted_and_its_commit_fails(url: str) -> None:
    producer = Producer(url, transactional_id="slow", transaction_timeout_ms=1000)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("a", b"too-late", partition=0)
    producer.flush()
    root = LogRoot(url)
    log = root.partition("a", 0)

    def decided() -> bool:  # a fresh coordinator's clock starts now: it aborts nothing within this test
        return log.last_stable_offset(TransactionCoordinator(root.store).resolve) == log.view().end_offset

    with Consumer(url, isolation_level="read_committed", auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("a", 0)])
        started = time.monotonic()
        # A parked partition is probed again every few seconds (BLOCKED_RECHECK_S): the first probe after the
        # timeout, on the consumer's own clock, aborts.
        while not decided() and time.monotonic() - started < 30:
            assert not consumer.poll(timeout_ms=200)
        assert time.monotonic() - started >= 1, "aborted before its timeout"
    root.close()
    with pytest.raises(FencedError, match="transaction_timeout_ms"):
        producer.commit_transaction()
    producer.close()
    assert read_all(url, "a") == [] and read_all(url, "a", "read_uncommitted") == [b"too-late"]


def test_a_merged_undecided_transaction_keeps_its_timeout(tmp_path: Path) -> None:
    """Merging an open transaction's objects carries the largest of their timeouts into the merged
    object, so readers still abort it once that passes (it held the last stable offset forever when
    merging dropped the field)."""
    url = str(tmp_path)
    LogStore(url).create_topic("m", 1, {"auto.maintenance.enable": False, "storage.layout": "partitioned"})  # merged
    producer = Producer(url, transactional_id="merged-open", transaction_timeout_ms=1000)
    producer.init_transactions()
    producer.begin_transaction()
    for n in range(MERGE_FANOUT + 1):  # a full group of appended objects, and a tail that is never merged
        producer.send("m", b"v%d" % n, partition=0)
        producer.flush()  # one appended object each
    root = LogRoot(url)
    log = root.partition("m", 0)
    assert log.merge_segments() == 1
    merged = [ref for ref in log.view().segments if ref.generation > 0]
    assert len(merged) == 1
    assert log.chain.index(merged[0]).meta.transaction_timeout_ms == 1000
    with Consumer(url, isolation_level="read_committed", auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("m", 0)])
        started = time.monotonic()
        while log.last_stable_offset(TransactionCoordinator(root.store).resolve) < log.view().end_offset:
            assert not consumer.poll(timeout_ms=200)
            assert time.monotonic() - started < 30, "the merged transaction was never aborted"
    root.close()
    with pytest.raises(FencedError, match="transaction_timeout_ms"):
        producer.commit_transaction()
    producer.close()
    assert read_all(url, "m") == []
