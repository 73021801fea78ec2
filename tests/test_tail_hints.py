"""Tail hints and planned reads (PROTOCOL.md 11.2, 9): where a Spark task appends and what it reads, without listing.

Every test counts the requests a fresh process (a new ``PartitionLog``, nothing cached) makes, since
the point of both is that a task of a micro-batch makes no listing of its own.
"""

from __future__ import annotations

import uuid
from typing import Any

import pyarrow as pa
import pytest

from coordinator.transactions import Decision, TransactionCoordinator
from pyspark_logsource.spark.sink_commit import PlogCommitMessage
from pyspark_logsource.spark.sink_commit import merge_tails as _merge_tails
from pyspark_logsource.spark.sink_commit import run_producer as _run_producer
from pyspark_logsource.spark.task_writer import _HINTS
from pyspark_logsource.spark.task_writer import TaskWriter as _TaskWriter
from pyspark_logsource.spark.task_writer import hints as _hints
from segment_format.log.partition_log import PartitionLog
from segment_format.log.reader import COMMITTED
from segment_format.records import now_ms, payload_batch
from segment_format.root import LogRoot
from segment_format.segment import BatchMeta
from segment_format.stores import MemoryStore
from segment_format.topic import validate_config
from tests.counting_store import CountingStore

PREFIX = "topics/t/id/0/"
W_MS = 10_000

#: Partitioned topics: tail hints: where a partition's next appended object goes (11.2).
PARTITIONED = {"storage.layout": "partitioned"}


def fresh_store() -> MemoryStore:
    return MemoryStore(f"hints-{uuid.uuid4().hex}")


def payload(n: int, first_ts: int = 1_000) -> list[tuple[pa.RecordBatch, BatchMeta]]:
    return [(payload_batch([first_ts + i for i in range(n)], [None] * n, [b"v%d" % i for i in range(n)]), BatchMeta())]


def log_on(store: Any) -> PartitionLog:
    """A partition log with nothing cached: a new task's process."""
    config = validate_config({"compression.type": "none", "writer.max.staleness.ms": W_MS})
    return PartitionLog(store, PREFIX, config, name="t-0")


def offsets(store: Any) -> list[int]:
    batches, _ = log_on(store).read(0, max_records=10_000)
    return [o for b in batches for o in b.column(0).to_pylist()]


def test_a_fresh_hint_is_where_the_next_append_lands_without_a_listing() -> None:
    inner = fresh_store()
    first = log_on(inner).append(payload(10, first_ts=5_000))
    counted = CountingStore(inner)
    writer = log_on(counted)
    writer.learn_tail(first.next_offset, first.running_max_timestamp, now_ms())
    result = writer.append(payload(5, first_ts=1_000))
    assert result.base_offsets == [10]
    assert counted.counts == {"put": 1}  # no listing, no probe: the hint was the end
    # The running maximum carries on from the hinted object, not from this append's older timestamps.
    assert result.running_max_timestamp == 5_009
    assert offsets(inner) == list(range(15))


def test_a_hint_older_than_the_staleness_bound_is_not_used() -> None:
    inner = fresh_store()
    first = log_on(inner).append(payload(10))
    counted = CountingStore(inner)
    writer = log_on(counted)
    stale = now_ms() - W_MS  # with the 1 s skew bound added, older than W
    writer.learn_tail(first.next_offset, first.running_max_timestamp, stale)
    assert writer.appender.tail is None
    writer.append(payload(5))
    assert counted.counts.get("list") == 1  # resolved the chain instead
    # A hint dated in the future (a fast clock) is still bounded: it counts as learned now, never later.
    late = log_on(inner)
    late.learn_tail(15, 0, now_ms() + 3_600_000)
    assert late.appender.tail is not None and late.appender.tail.end_offset == 15


def test_a_hint_behind_the_end_loses_the_race_and_follows_the_objects_that_won() -> None:
    inner = fresh_store()
    hint = log_on(inner).append(payload(10))
    log_on(inner).append(payload(7))  # another writer appended after the hinted object
    writer = log_on(inner)
    writer.learn_tail(hint.next_offset, hint.running_max_timestamp, now_ms())
    assert writer.append(payload(3)).base_offsets == [17]
    assert offsets(inner) == list(range(20))


def test_a_writer_keeps_its_own_later_end_over_a_hint() -> None:
    inner = fresh_store()
    writer = log_on(inner)
    writer.append(payload(10))
    writer.append(payload(10))
    writer.learn_tail(10, 0, now_ms())
    assert writer.appender.tail is not None and writer.appender.tail.end_offset == 20


def test_the_decider_keeps_the_highest_whole_report_per_partition_and_drops_future_clocks() -> None:
    now = now_ms()
    messages = [
        PlogCommitMessage(tails={"b": {"id1": {"0": [10, 500, now - 50], "1": [7, 9, now]}}}),
        PlogCommitMessage(tails={"b": {"id1": {"0": [20, 100, now - 80]}}}),
        PlogCommitMessage(tails={"b": {"id1": {"1": [99, 9, now + 60_000]}}}),  # a clock a minute fast
        None,
    ]
    assert _merge_tails(messages) == {"b": {"id1": {"0": [20, 100, now - 80], "1": [7, 9, now]}}}


def test_hints_of_an_earlier_incarnation_of_the_topic_are_not_used(tmp_path: Any) -> None:
    with LogRoot(str(tmp_path)) as root:
        root.catalog.create("b", 1, PARTITIONED)
        old = root.topic("b")
        old_log = root.partition("b", 0, old)
        landed = old_log.append(payload(50))
        hints = Decision(
            COMMITTED,
            1,
            4,
            tails={"b": {old.topic_id: {"0": [landed.next_offset, landed.running_max_timestamp, now_ms()]}}},
        )
        root.catalog.delete("b")
        root.forget_topic("b")
        root.catalog.create("b", 1, PARTITIONED)
        new = root.topic("b", refresh=True)
        log = root.partition("b", 0, new)
        writer = _TaskWriter(None, root, 1, 5, hints)  # type: ignore[arg-type]
        try:
            writer._learn_hint(old_log)
            assert old_log.appender.tail is not None and old_log.appender.tail.end_offset == 50
            writer._learn_hint(log)
            assert log.appender.tail is None  # the hint names the old topic id: not this partition's
        finally:
            writer.close()
        assert log.append(payload(3)).base_offsets == [0]


def test_a_task_looks_up_its_micro_batch_decision_once_per_worker_and_run() -> None:
    store = CountingStore(fresh_store())
    coordinator = TransactionCoordinator(store)
    url, tid = f"memory://{id(store)}", "sink-under-test"
    producer_id, decided = _run_producer(url, "{}", coordinator, tid, 3, "run-1")
    assert decided is None
    gets = store.counts.get("get", 0)
    for txn in (3, 4, 5):  # another task of the first micro-batch, then later micro-batches of the run
        assert _run_producer(url, "{}", coordinator, tid, txn, "run-1") == (producer_id, None)
    assert store.counts.get("get", 0) == gets
    # A new run may start with a replay: its first micro-batch is looked up, and found decided.
    coordinator.decide(Decision(COMMITTED, producer_id, 5, batches={"b": {"0": [[0, 1]]}}))
    again, decided = _run_producer(url, "{}", coordinator, tid, 5, "run-2")
    assert again == producer_id and decided is not None and decided.state == COMMITTED


def test_a_read_from_planned_segments_makes_no_listing_and_keeps_the_planned_start() -> None:
    inner = fresh_store()
    planner = log_on(inner)
    for _ in range(3):
        planner.append(payload(10))
    planner.delete_records(12)
    view = planner.view()
    assert view.start_offset == 12
    counted = CountingStore(inner)
    task = log_on(counted)
    assert [ref.base_offset for ref in view.segments] == [10, 20]
    task.chain.seed(view.segments)  # the elements holding [12, 30)
    batches, next_offset = task.read(12, max_records=18)
    assert [o for b in batches for o in b.column(0).to_pylist()] == list(range(12, 30)) and next_offset == 30
    assert "list" not in counted.counts
    assert task.chain.listed_start == 0  # a seeded view gives no log start of its own
    # A second piece of the same partition read earlier in the same worker does not hide the first.
    task.chain.seed(view.segments[1:])
    batches, _ = task.read(12, max_records=8)
    assert [o for b in batches for o in b.column(0).to_pylist()] == list(range(12, 20))


@pytest.mark.parametrize("hinted", [True, False])
def test_a_sink_task_appends_at_the_hinted_end_with_one_put(tmp_path: Any, hinted: bool) -> None:
    """What a task of micro-batch N costs per partition: one PUT with the hint of N-1; a listing without."""
    with LogRoot(str(tmp_path)) as root:
        root.catalog.create("b", 1, PARTITIONED)
        landed = root.partition("b", 0).append(payload(40), notify=False)
        meta = root.topic("b")
    with LogRoot(str(tmp_path)) as task_root:
        counted = CountingStore(task_root.data_store)
        log = PartitionLog(counted, task_root.partition("b", 0, meta).prefix, meta.config, name="b-0", topic="b")
        if hinted:
            log.learn_tail(landed.next_offset, landed.running_max_timestamp, now_ms())
        result = log.append(payload(5), notify=False)
    assert result.base_offsets == [40]
    assert counted.counts == ({"put": 1} if hinted else {"list": 1, "get": 1, "put": 1})


def test_merging_a_run_of_small_appends_reads_each_object_once() -> None:
    """The maintainer of a Spark sink's partition: index and batches of each merged object in one GET."""
    inner = fresh_store()
    writer = log_on(inner)
    for i in range(17):  # 16 sealed objects close a group (the fan-out), the 17th is the tail
        writer.append(payload(20, first_ts=1_000 + 100 * i))
    counted = CountingStore(inner)
    maintainer = log_on(counted)
    assert maintainer.merge_segments() == 1
    assert counted.counts["get"] <= 16 + 2  # each merged object once, plus the tail and the group's first index
    assert counted.counts["put"] == 1
    assert offsets(inner) == list(range(17 * 20))


def test_hints_are_read_once_per_micro_batch_and_not_kept_beyond_the_last() -> None:
    store = CountingStore(fresh_store())
    coordinator = TransactionCoordinator(store)
    url = f"memory://{id(store)}"
    for txn in range(3):
        TransactionCoordinator(store).decide(Decision(COMMITTED, 7, txn, batches={"b": {"0": [[txn, txn]]}}))
    store.calls.clear()
    for _ in range(3):  # three tasks of micro-batch 2 in one worker
        found = _hints(url, "{}", coordinator, 7, 2)
        assert found is not None and found.txn == 1
    assert store.counts == {"get": 1}
    assert _hints(url, "{}", coordinator, 7, 3) is not None and store.counts == {"get": 2}
    assert _hints(url, "{}", coordinator, 7, 9) is None  # micro-batch 8 decided nothing
    assert [k for k in _HINTS if k[0] == url] == [(url, "{}", 7)]  # one entry per producer, whatever ran
    assert (7, 1) not in coordinator._decisions  # the coordinator's cache does not grow with hints


def test_a_malformed_hint_leaves_the_decision_readable_and_is_ignored(tmp_path: Any) -> None:
    raw = (
        b'{"state": "committed", "producer_id": 1, "txn": 4, "batches": {"b": {"0": [[0, 9]]}},'
        b' "tails": {"b": {"id1": {"0": [1.5, null, "x"]}, "id2": 3}}}'
    )
    decision = Decision.from_json(raw)
    assert decision.includes("b", 0, 0, 9)
    with LogRoot(str(tmp_path)) as root:
        root.catalog.create("b", 1, PARTITIONED)
        log = root.partition("b", 0)
        writer = _TaskWriter(None, root, 1, 5, decision)  # type: ignore[arg-type]
        try:
            writer._learn_hint(log)
        finally:
            writer.close()
        assert log.appender.tail is None


def test_a_writer_with_epochs_keeps_its_tail_over_a_hint() -> None:
    inner = fresh_store()
    writer = log_on(inner)
    writer.append(payload(10), writer_epoch=3)
    writer.learn_tail(50, 0, now_ms())
    assert writer.appender.tail is not None and writer.appender.tail.end_offset == 10


class _AlwaysBeaten(CountingStore):
    """A store where another writer appends one record just before each of this writer's creates."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.rival = log_on(inner)

    def put_if_absent(self, key: str, data: bytes, *, durable: bool = True) -> bool:  # noqa: D102
        if "/log/" in key:
            self.rival.append(payload(1))
        return super().put_if_absent(key, data, durable=durable)


def test_a_writer_beaten_every_time_pauses_between_lost_races_and_gives_up_after_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from segment_format.errors import ConcurrentAppendError
    from segment_format.log import appender

    monkeypatch.setattr(appender, "CONTENTION_TIMEOUT_S", 0.5)
    inner = fresh_store()
    log_on(inner).append(payload(2))
    beaten = _AlwaysBeaten(inner)
    writer = log_on(beaten)
    with pytest.raises(ConcurrentAppendError, match=r"append to t-0 lost the race for offsets \d+ times"):
        writer.append(payload(5))
    lost = beaten.counts["put"]
    # The pauses (up to 2^k ms after the k-th loss) bound the creates a loser spends: without them a
    # loser beaten this fast makes thousands in 0.5 s.
    assert 5 <= lost <= 200, lost
    # Nothing of the refused append was written: the log is the first 2 and the rival's one per create.
    assert offsets(inner) == list(range(2 + lost))
