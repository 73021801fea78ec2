"""Merges that resolve transactions in a root listing ``boundedHistory`` (PROTOCOL.md 10, *Resolving transactions*).

A topic holds plain batches, batches of committed and aborted transactions, a committed transaction with a
batch its decision does not list (a Spark task retried), and transactions left undecided. After a merge:
read_committed readers read exactly what they read before, even once the decisions are deleted by hand
(the point of the feature: the log stops needing them); the merged objects hold no decided transactional
batch and are named with an id; undecided batches stay transactional until a later merge finds them
decided; a root without the feature still merges byte for byte; and a merging process SIGKILLed mid-pass
leaves a chain that reads the same.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from coordinator.keys import transactions_prefix
from coordinator.maintainer import maintain_written
from coordinator.transactions import Decision, TransactionCoordinator
from pyspark_logsource import Consumer, LogStore, Producer, TopicPartition
from pyspark_logsource.cli.app import main as plog_main
from segment_format.inspect.verify import verify
from segment_format.layout import rewrite_id_of
from segment_format.log.maintenance import MERGE_FANOUT
from segment_format.log.partition_log import PartitionLog
from segment_format.log.reader import ABORTED, COMMITTED, READ_COMMITTED, READ_UNCOMMITTED
from segment_format.protocol import BOUNDED_HISTORY, ProtocolVersion, RootProtocol, upgrade_protocol
from segment_format.records import now_ms, payload_batch
from segment_format.root import LogRoot
from segment_format.segment import ATTR_CONTROL, ATTR_TRANSACTIONAL, BatchMeta, SegmentIndex
from segment_format.stores import open_store

SPAWN = multiprocessing.get_context("spawn")
TOPIC = "t"
#: The tests merge themselves, per-partition segment objects.
CONFIG = {"auto.maintenance.enable": False, "compression.type": "none", "storage.layout": "partitioned"}
#: Producer ids of the hand-made transactions (a Spark sink's, say): far from those the client allocates.
SINK_PID = 900_000
#: Record timestamps: now, so that retention (7 days by default) keeps every record.
BASE_MS = now_ms()


def _create(url: str, older: bool = False) -> None:
    """A root with the topic; ``older``: its protocol object 0 predates ``boundedHistory`` (changeNotices only)."""
    if older:
        upgrade_protocol(open_store(url), ProtocolVersion(1, 1, (), ("changeNotices",)))
    with LogStore(url) as admin:
        admin.create_topic(TOPIC, 1, CONFIG)


def _append(log: PartitionLog, values: list[bytes], meta: BatchMeta, ts: int) -> tuple[int, int]:
    """One appended object holding one batch; returns its first and last offsets."""
    keys = [b"k-" + v for v in values]
    result = log.append([(payload_batch([ts] * len(values), keys, values), meta)], durable=False, notify=False)
    return result.base_offsets[0], result.next_offset - 1


class History:
    """Writes a mixed history, one batch per appended object, and knows what read_committed must return."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.root = LogRoot(url)
        self.log = self.root.partition(TOPIC, 0)
        self.coordinator = TransactionCoordinator(self.root.store)
        self.committed: list[bytes] = []  # in offset order: what read_committed returns once all is decided
        self.objects = 0
        self.txn = 0
        self.sequence = 0  # the producer's next sequence: the batches are idempotent, as a producer's are

    def plain(self, value: bytes, ts: int = BASE_MS) -> None:
        """A non-transactional batch."""
        _append(self.log, [value], BatchMeta(), ts)
        self.committed.append(value)
        self.objects += 1

    def transaction(self, outcome: str | None, values: list[bytes], unlisted: int = -1, ts: int = BASE_MS) -> int:
        """A transaction of one batch per value; ``outcome`` None leaves it undecided. A committed one's
        batch ``unlisted`` is left out of its decision (an attempt that failed). Returns its txn."""
        self.txn += 1
        txn = self.txn
        ranges = []
        for i, value in enumerate(values):
            meta = BatchMeta(SINK_PID, 0, self.sequence, ATTR_TRANSACTIONAL, txn)
            first, last = _append(self.log, [value, value + b"'"], meta, ts)
            self.sequence += 2
            self.objects += 1
            if outcome == COMMITTED and i != unlisted:
                ranges.append([first, last])
                self.committed += [value, value + b"'"]
        if outcome is not None:
            self.decide(txn, outcome, ranges)
        return txn

    def decide(self, txn: int, outcome: str, ranges: list[list[int]] | None = None) -> None:
        """Create the decision of ``txn``."""
        batches = {TOPIC: {"0": ranges}} if outcome == COMMITTED and ranges else {}
        self.coordinator.decide(Decision(outcome, SINK_PID, txn, batches=batches, created_ms=int(time.time() * 1000)))


def _read(url: str, isolation: str = READ_COMMITTED) -> list[bytes]:
    """Every value a fresh reader of the partition returns from its start (read_committed stops at the LSO)."""
    with LogRoot(url) as root:
        log = root.partition(TOPIC, 0)
        resolver = TransactionCoordinator(root.store).resolve
        offset, values = log.view().start_offset, []
        while True:
            batches, offset = log.read(offset, isolation=isolation, resolver=resolver)
            if not batches:
                return values
            values += [v for batch in batches for v in batch.column("value").to_pylist()]


def _consume(url: str) -> list[bytes]:
    """What the client's read_committed consumer returns from the start (the reference reader)."""
    with Consumer(url, isolation_level="read_committed", auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(TOPIC, 0)])
        values: list[bytes] = []
        while True:
            table = consumer.poll_arrow(max_records=100_000)
            if table.num_rows == 0:
                return values
            values += table.column("value").to_pylist()


def _rewritten(url: str) -> list[tuple[str, SegmentIndex]]:
    """(key, index) of every rewritten object on the partition's chain."""
    with LogRoot(url) as root:
        log = root.partition(TOPIC, 0)
        return [(ref.key, log.index(ref)) for ref in log.view().segments if ref.generation > 0]


def _transactional_batches(index: SegmentIndex) -> list[int]:
    """The txn of every transactional (not control) batch of an object."""
    attributes = index.attributes
    rows = ((attributes & ATTR_TRANSACTIONAL) != 0) & ((attributes & ATTR_CONTROL) == 0)
    return [int(t) for t in index.transactions[rows]]


def _delete_decisions(url: str) -> int:
    """Delete every transaction decision by hand (what collection, 11.2, will do); returns how many."""
    store = open_store(url)
    return store.delete_prefix(transactions_prefix(SINK_PID))


def _maintain(url: str) -> int:
    """One ``plog maintain``-like pass (with the coordinator's resolver); returns the objects rewritten."""
    with LogStore(url) as store:
        return store.maintain(TOPIC)["merged"]


# --------------------------------------------------------------------------- the protocol


def test_new_roots_list_the_feature_and_enabling_it_enables_compaction(tmp_path: Path) -> None:
    fresh = str(tmp_path / "fresh")
    _create(fresh)
    with LogRoot(fresh) as root:
        assert root.protocol.number == 0
        assert {BOUNDED_HISTORY, "compaction"} <= set(root.protocol.version.reader_features)
        assert root.protocol.is_settled(BOUNDED_HISTORY, 20 * 60 * 1000)  # object 0 lists it: no wait
    older = str(tmp_path / "older")
    _create(older, older=True)
    assert plog_main(["protocol", "--url", older, "--enable", BOUNDED_HISTORY]) == 0
    with LogRoot(older) as root:
        assert root.protocol.number == 1
        assert {BOUNDED_HISTORY, "compaction"} <= set(root.protocol.version.reader_features)  # one object, both
        assert not root.protocol.is_settled(BOUNDED_HISTORY, 1000)  # listed just now: processes may not know


# --------------------------------------------------------------------------- (a) (b) (c)


def test_a_resolving_merge_keeps_read_committed_and_outlives_the_decisions(tmp_path: Path) -> None:
    url = str(tmp_path)
    _create(url)
    history = History(url)
    for n in range(3):
        history.plain(b"p%d" % n)
        history.transaction(COMMITTED, [b"c%da" % n, b"c%db" % n])
        history.transaction(ABORTED, [b"x%d" % n])
        history.plain(b"q%d" % n)
        history.transaction(COMMITTED, [b"s%da" % n, b"retried%d" % n, b"s%db" % n], unlisted=1)  # a sink's retry
        history.transaction(ABORTED, [b"y%d" % n, b"z%d" % n])
    while history.objects < 2 * MERGE_FANOUT:
        history.plain(b"fill%d" % history.objects)
    history.plain(b"tail")  # never merged
    before = _read(url)
    assert before == history.committed and _consume(url) == before
    assert any(b.startswith(b"x") for b in _read(url, READ_UNCOMMITTED))

    assert _maintain(url) == 2
    rewritten = _rewritten(url)
    assert len(rewritten) == 2 and rewritten[-1][1].meta.next_offset == history.log.view().end_offset - 1
    for key, index in rewritten:
        assert rewrite_id_of(key) is not None, key  # (b): named with an id
        assert _transactional_batches(index) == [], key  # (b): every decided batch resolved
        assert index.meta.created_ms > 0  # collection counts from it
    assert _read(url) == before  # (a)
    assert _read(url, READ_UNCOMMITTED) == before  # aborted and unlisted records are gone once merged
    assert verify(LogRoot(url), TOPIC).ok

    assert _delete_decisions(url) > 0
    assert _read(url) == before  # (c): the merged log no longer needs a decision
    assert _consume(url) == before


@pytest.mark.parametrize("typed", [False, True], ids=["untyped", "typed"])
def test_a_real_transactional_producer_is_resolved_by_the_maintainer(tmp_path: Path, typed: bool) -> None:
    """The client's transactional producer (its own producer id and txn numbers), merged by ``plog maintain``;
    a typed topic's committed batches are written again in their version's columns (PROTOCOL.md 11.8)."""
    url = str(tmp_path)
    with LogStore(url) as admin:
        admin.create_topic(TOPIC, 1, CONFIG, value_schema="n int, s string" if typed else None)
    producer = Producer(url, transactional_id="resolving", linger_ms=0)
    producer.init_transactions()
    expected: list[Any] = []
    for n in range(MERGE_FANOUT + 1):
        value: Any = {"n": n, "s": f"v{n}"} if typed else b"v%d" % n
        producer.begin_transaction()
        producer.send(TOPIC, value, partition=0)
        producer.flush()
        if n % 3 == 1:
            producer.abort_transaction()
        else:
            producer.commit_transaction()
            expected.append(value)
    producer.close()
    assert _consume(url) == expected
    assert plog_main(["maintain", TOPIC, "--url", url]) == 0
    rewritten = _rewritten(url)
    assert rewritten and all(_transactional_batches(index) == [] for _, index in rewritten)
    assert all(rewrite_id_of(key) for key, _ in rewritten)
    if typed:
        merged = rewritten[0][1]
        assert merged.meta.value_schema_version == 1
        assert merged.value_stats is not None and merged.value_stats.to_pylist()[0]["n"]["min"] == 0
    assert _consume(url) == expected


# --------------------------------------------------------------------------- (d)


def test_an_undecided_transaction_stays_transactional_until_a_later_merge_finds_it_decided(tmp_path: Path) -> None:
    """Three groups of appended objects; the first holds a transaction left open. The first pass merges
    the groups and copies the open batches as they are; once decided, the next pass merges the first two
    groups again (a tier run closed by the third group's late records) and resolves them."""
    url = str(tmp_path)
    _create(url)
    with LogStore(url) as admin:
        admin.alter_config(TOPIC, {"segment.ms": 10_000})
    history = History(url)
    history.plain(b"before")
    open_txn = history.transaction(None, [b"open-a", b"open-b"])
    history.transaction(COMMITTED, [b"done"])
    while history.objects < 2 * MERGE_FANOUT:
        history.plain(b"early%d" % history.objects, ts=BASE_MS + history.objects)
    while history.objects < 3 * MERGE_FANOUT + 1:
        history.plain(b"late%d" % history.objects, ts=BASE_MS + 20_000 + history.objects)  # past segment.ms
    before = _read(url)
    assert before == [b"before"]  # read_committed stops at the open transaction
    assert _read(url, READ_UNCOMMITTED)[:3] == [b"before", b"open-a", b"open-a'"]

    assert _maintain(url) == 3
    first = _rewritten(url)[0][1]
    assert _transactional_batches(first) == [open_txn, open_txn]  # copied as they were: undecided
    assert _read(url) == before  # the same last stable offset

    history.decide(open_txn, COMMITTED, [[1, 2], [3, 4]])
    expected = [b"before", b"open-a", b"open-a'", b"open-b", b"open-b'"] + history.committed[1:]
    assert _read(url) == expected
    assert _maintain(url) == 1
    rewritten = _rewritten(url)
    assert [index.meta.generation for _, index in rewritten] == [2, 1]  # the first two groups, merged again
    assert rewritten[0][1].meta.base_offset == 0
    assert all(_transactional_batches(index) == [] for _, index in rewritten)
    assert _read(url) == expected
    _delete_decisions(url)
    assert _read(url) == expected


# --------------------------------------------------------------------------- (e)


def _merged_copies_inputs(url: str) -> None:
    """One pass merges byte for byte without ids: the merged batches' CRCs are their inputs', transactional
    ones still transactional."""
    with LogRoot(url) as root:
        log = root.partition(TOPIC, 0)
        appended = [log.index(ref) for ref in log.view().segments if ref.generation == 0][:MERGE_FANOUT]
        crcs = [int(c) for idx in appended for c in idx.crcs]
    assert _maintain(url) == 1
    [(key, merged)] = _rewritten(url)
    assert rewrite_id_of(key) is None, key
    assert [int(c) for c in merged.crcs] == crcs
    assert _transactional_batches(merged)


def test_a_root_without_the_feature_merges_byte_for_byte(tmp_path: Path) -> None:
    url = str(tmp_path)
    _create(url, older=True)
    history = History(url)
    history.transaction(COMMITTED, [b"c1", b"c2"])
    history.transaction(ABORTED, [b"x"])
    while history.objects < MERGE_FANOUT + 1:
        history.plain(b"p%d" % history.objects)
    before = _read(url)
    _merged_copies_inputs(url)
    assert _read(url) == before and _read(url, READ_UNCOMMITTED)[2:4] == [b"c2", b"c2'"]


def _enabled_just_now(url: str) -> History:
    """A root from before the feature that enables it now, with one committed transaction."""
    _create(url, older=True)
    RootProtocol(open_store(url)).upgrade(ProtocolVersion(1, 1, (BOUNDED_HISTORY,), (BOUNDED_HISTORY,)))
    history = History(url)
    history.transaction(COMMITTED, [b"c1", b"c2"])
    return history


def test_a_root_that_enabled_the_feature_just_now_still_merges_byte_for_byte(tmp_path: Path) -> None:
    """Until the feature has been listed for max(D, 10 min), processes that opened the root before may not
    know it: merges stay as in a root without it."""
    url = str(tmp_path)
    history = _enabled_just_now(url)
    while history.objects < MERGE_FANOUT + 1:
        history.plain(b"p%d" % history.objects)
    _merged_copies_inputs(url)


def test_a_root_that_enabled_the_feature_long_ago_resolves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = str(tmp_path)
    history = _enabled_just_now(url)
    history.transaction(ABORTED, [b"x"])
    while history.objects < MERGE_FANOUT + 1:
        history.plain(b"p%d" % history.objects)
    before = _read(url)
    later = int(time.time() * 1000) + 21 * 60 * 1000  # past max(D = 20 min, 10 min)
    monkeypatch.setattr("segment_format.protocol.now_ms", lambda: later)
    assert _maintain(url) == 1
    [(key, merged)] = _rewritten(url)
    assert rewrite_id_of(key) is not None and _transactional_batches(merged) == []
    assert _read(url) == before


# --------------------------------------------------------------------------- (f)


def merge_loop(url: str, started: Any) -> None:
    """The merging process: maintain the topic, pass after pass, until killed."""
    started.set()
    while True:
        with LogStore(url) as store:
            store.maintain(TOPIC)


def _log_names(url: str) -> set[str]:
    with LogRoot(url) as root:
        log = root.partition(TOPIC, 0)
    return set(os.listdir(os.path.join(url, log.prefix, "log")))


def test_a_merge_sigkilled_mid_pass_leaves_a_chain_that_reads_the_same(tmp_path: Path) -> None:
    url = str(tmp_path)
    _create(url)
    history = History(url)
    rounds = 4
    for n in range(rounds * MERGE_FANOUT // 4):
        history.transaction(COMMITTED, [b"c%d" % n], ts=BASE_MS + n)
        history.transaction(ABORTED, [b"x%d" % n], ts=BASE_MS + n)
        history.transaction(COMMITTED, [b"s%d" % n, b"r%d" % n], unlisted=1, ts=BASE_MS + n)
    history.plain(b"tail")
    expected = history.committed
    assert _read(url) == expected
    kills = mid_pass = 0
    for _ in range(rounds):
        names = {n for n in _log_names(url) if ".c" in n}
        started = SPAWN.Event()
        child = SPAWN.Process(target=merge_loop, args=(url, started), daemon=True)
        child.start()
        assert started.wait(60), "the merging process did not start"
        deadline = time.monotonic() + 60
        while not ({n for n in _log_names(url) if ".c" in n} - names) and time.monotonic() < deadline:
            time.sleep(0.001)
        os.kill(child.pid, signal.SIGKILL)  # just after one of its creates: most likely before its next
        child.join(30)
        assert child.exitcode == -signal.SIGKILL, child.exitcode
        kills += 1
        with LogRoot(url) as root:
            appended = [ref for ref in root.partition(TOPIC, 0).view().segments if ref.generation == 0]
        mid_pass += len(appended) > MERGE_FANOUT  # a closed group the pass had not written yet
        assert _read(url) == expected
        assert _read(url, READ_UNCOMMITTED)[-1:] == [b"tail"]
        assert verify(LogRoot(url), TOPIC).ok
    print(f"{kills} kills, {mid_pass} mid-pass")
    assert kills == rounds and mid_pass >= 1, (kills, mid_pass)
    while _maintain(url):
        pass
    assert all(_transactional_batches(index) == [] for _, index in _rewritten(url))
    _delete_decisions(url)
    assert _read(url) == expected


def test_the_sinks_decision_handed_to_the_maintainer_is_not_read_again(tmp_path: Path) -> None:
    """``maintain_written(decisions=...)`` (the Spark sink's commit): the maintainer's merges resolve with the
    decision the writer made, without reading it. Here it is never stored, so a read would find the
    transaction undecided and leave its batches transactional."""
    url = str(tmp_path)
    _create(url)
    with LogStore(url) as admin:
        admin.alter_config(TOPIC, {"auto.maintenance.enable": True, "auto.maintenance.interval.ms": 0})
    history = History(url)
    txn = history.transaction(None, [b"a", b"b"])
    while history.objects < MERGE_FANOUT + 1:
        history.plain(b"p%d" % history.objects)
    decision = Decision(COMMITTED, SINK_PID, txn, batches={TOPIC: {"0": [[0, 1], [2, 3]]}}, created_ms=now_ms())
    with LogRoot(url) as root:
        maintain_written(root, {TOPIC: [0]}, owner="test-sink", decisions=[decision])
    [(_, merged)] = _rewritten(url)
    assert _transactional_batches(merged) == []
    assert _read(url)[:4] == [b"a", b"a'", b"b", b"b'"]
