"""Log compaction (PROTOCOL.md 11.6): each key's last record kept, offsets unchanged, Kafka's guarantees.

Time is passed to compaction as ``now`` (its wall clock), so that lags and tombstone retention are
tested without waiting; the local store and real files are used throughout.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from coordinator.transactions import TransactionCoordinator
from pyspark_logsource import LogStore, Producer
from segment_format.errors import InvalidConfigError, InvalidRecordError
from segment_format.inspect.verify import verify
from segment_format.layout import parse_segment_name
from segment_format.log.partition_log import PartitionLog
from segment_format.protocol import PROTOCOL_RECHECK_S, ProtocolVersion, RootProtocol, protocol_key, upgrade_protocol
from segment_format.records import now_ms, payload_batch
from segment_format.root import LogRoot
from segment_format.segment import BatchMeta
from segment_format.stores import open_store

HOUR = 3600 * 1000
#: D and W small enough that a test's clock arithmetic stays readable, and large enough for A4.
COMPACT = {
    "cleanup.policy": "compact",
    # Per-partition segment objects (a shared topic compacts what moved into them: test_shared_maintenance).
    "storage.layout": "partitioned",
    "compression.type": "none",
    "file.delete.delay.ms": 60_000,
    "writer.max.staleness.ms": 30_000,
    "delete.retention.ms": HOUR,
    "auto.maintenance.enable": False,
}


def _root(tmp_path: Path, **config: Any) -> LogRoot:
    root = LogRoot(str(tmp_path / "root"))
    root.catalog.create("t", 1, {**COMPACT, **config})
    return root


def _append(log: PartitionLog, records: list[tuple[bytes, bytes | None]], ts: int = 1_000) -> None:
    keys = [k for k, _ in records]
    values = [v for _, v in records]
    log.append([(payload_batch([ts] * len(records), keys, values), BatchMeta())], durable=False)


def _all(log: PartitionLog, start: int = 0) -> list[tuple[int, bytes | None, bytes | None]]:
    """Every record from ``start`` as (offset, key, value), reading in small steps so gaps are crossed."""
    out, offset = [], start
    while True:
        batches, offset = log.read(offset, max_records=7)
        if not batches and offset >= log.view().end_offset:
            return out
        for b in batches:
            out += zip(b.column(0).to_pylist(), b.column(2).to_pylist(), b.column(3).to_pylist(), strict=True)


def _last_per_key(records: list[tuple[int, bytes | None, bytes | None]]) -> dict[bytes, tuple[int, bytes | None]]:
    last: dict[bytes, tuple[int, bytes | None]] = {}
    for offset, key, value in records:
        if key is not None:
            last[key] = (offset, value)
    return last


def _fill(log: PartitionLog, appends: int, per_append: int, keys: int, seed: int) -> list[tuple[int, bytes, bytes]]:
    rng = random.Random(seed)
    written = []
    for _ in range(appends):
        batch = [(f"k{rng.randrange(keys)}".encode(), f"v{rng.random()}".encode()) for _ in range(per_append)]
        base = log.view().end_offset
        _append(log, list(batch))
        written += [(base + i, k, v) for i, (k, v) in enumerate(batch)]
    return written


def test_compaction_keeps_every_keys_last_record_at_its_offset(tmp_path: Path) -> None:
    root = _root(tmp_path)
    log = root.partition("t", 0)
    written = _fill(log, appends=12, per_append=40, keys=25, seed=1)
    before = log.view()
    assert log.compact(force=True) >= 1
    after = log.view()
    # Offsets never change: same start and end; every record read is the one written at its offset.
    assert (after.start_offset, after.end_offset) == (before.start_offset, before.end_offset)
    read = _all(log)
    by_offset = {o: (k, v) for o, k, v in written}
    assert all(by_offset[o] == (k, v) for o, k, v in read)
    assert [o for o, _, _ in read] == sorted(o for o, _, _ in read)
    # Every key's last record is there, and nothing superseded is left below the last element.
    assert _last_per_key(read) == _last_per_key(written)
    tail_base = after.segments[-1].base_offset
    below = [(o, k) for o, k, _ in read if o < tail_base]
    last = _last_per_key(written)
    assert all(last[k][0] == o for o, k in below)
    assert len(read) < len(written)
    # The rewritten elements are compacted objects with a rewrite id, and the partition verifies.
    assert all(parse_segment_name(ref.key.rsplit("/", 1)[-1]).rewrite_id for ref in after.segments[:-1])
    assert verify(root, "t").ok


def test_a_read_at_a_removed_offset_returns_the_next_record_and_time_lookups_cross_gaps(tmp_path: Path) -> None:
    root = _root(tmp_path)
    log = root.partition("t", 0)
    for ts, key in enumerate([b"a", b"b", b"a", b"b", b"c", b"a", b"d"]):
        _append(log, [(key, b"x%d" % ts)], ts=10_000 + ts * 1_000)
    assert log.compact(force=True) == 1
    assert [o for o, _, _ in _all(log)] == [3, 4, 5, 6]  # 0 (a), 1 (b), 2 (a) superseded
    batches, _ = log.read(1, max_records=1)
    assert batches[0].column(0).to_pylist() == [3]
    # offsets_for_times: the first kept record at or after the time, past records compacted away.
    assert log.offset_for_timestamp(10_000) == 3
    assert log.offset_for_timestamp(14_000) == 4
    assert log.offset_for_timestamp(16_500) is None
    # A consumer's seek to a removed offset reads from the next kept one; offsets_for_times agrees.
    from pyspark_logsource import Consumer, TopicPartition

    tp = TopicPartition("t", 0)
    consumer = Consumer(str(tmp_path / "root"), auto_offset_reset="earliest")
    try:
        consumer.assign([tp])
        consumer.seek(tp, 1)
        assert [r.offset for r in consumer.poll(timeout_ms=1_000)[tp]] == [3, 4, 5, 6]
        assert consumer.offsets_for_times({tp: 11_000})[tp].offset == 3
    finally:
        consumer.close()


def test_an_element_left_with_no_record_becomes_an_empty_compacted_object(tmp_path: Path) -> None:
    root = _root(tmp_path, **{"segment.bytes": 1024})  # the second element's kept bytes fill an object alone
    log = root.partition("t", 0)
    _append(log, [(b"a", b"1"), (b"b", b"1")], ts=5_000)
    _append(log, [(b"a", b"2" * 2000), (b"b", b"2")], ts=6_000)
    _append(log, [(b"c", b"tail")], ts=7_000)
    assert log.compact(force=True) >= 1
    view = log.view()
    empties = [ref for ref in view.segments if log.index(ref).meta.record_count == 0]
    assert len(empties) == 1, view.segments
    idx = log.index(empties[0])
    assert (idx.meta.base_offset, idx.meta.next_offset) == (0, 2)
    assert (idx.meta.min_timestamp, idx.meta.max_timestamp) == (5_000, 5_000)  # retention judges it as before
    assert [(o, k) for o, k, _ in _all(log)] == [(2, b"a"), (3, b"b"), (4, b"c")]
    assert verify(root, "t").ok


def test_tombstones_are_kept_for_delete_retention_after_append_and_first_compaction(tmp_path: Path) -> None:
    root = _root(tmp_path)
    log = root.partition("t", 0)
    t0 = now_ms()
    _append(log, [(b"a", b"1"), (b"b", b"1")])
    _append(log, [(b"a", None)])  # tombstone for a
    _append(log, [(b"z", b"tail")])
    assert log.compact(now=t0, force=True) >= 1
    assert [(k, v) for _, k, v in _all(log)] == [(b"b", b"1"), (b"a", None), (b"z", b"tail")]

    def compact_at(at: int) -> list[tuple[bytes | None, bytes | None]]:
        _append(log, [(b"z", b"tail-%d" % at)])  # makes the previous tail part of the run, dirty
        log.compact(now=at, force=True)
        return [(k, v) for _, k, v in _all(log) if k != b"z"]

    # Before delete.retention.ms (1 h) has passed since the append and the first compaction: kept.
    assert (b"a", None) in compact_at(t0 + HOUR - 5_000)
    # After it (and after D, 60 s, which is smaller), with every element below clean: expired.
    assert compact_at(t0 + HOUR + 5_000) == [(b"b", b"1")]
    assert verify(root, "t").ok


def test_a_tombstone_first_compacted_late_is_not_expired_by_an_older_neighbours_time(tmp_path: Path) -> None:
    root = _root(tmp_path)
    log = root.partition("t", 0)
    t0 = now_ms()
    _append(log, [(b"a", b"1"), (b"b", b"1")])
    _append(log, [(b"x", b"tail")])
    log.compact(now=t0, force=True)  # the first element is compacted at t0
    _append(log, [(b"b", None)])  # a tombstone appended much later, compacted for the first time at t1
    _append(log, [(b"y", b"tail")])
    t1 = t0 + 10 * HOUR
    log.compact(now=t1, force=True)
    _append(log, [(b"w", b"tail")])
    log.compact(now=t1 + 60_000, force=True)  # its own append is old, its first compaction is not
    assert (b"b", None) in [(k, v) for _, k, v in _all(log)]


def test_a_consumer_that_keeps_up_within_min_compaction_lag_sees_every_record(tmp_path: Path) -> None:
    root = _root(tmp_path, **{"min.compaction.lag.ms": HOUR})
    log = root.partition("t", 0)
    written = _fill(log, appends=6, per_append=10, keys=3, seed=2)
    _append(log, [(b"tail", b"x")])
    now = now_ms()
    assert log.compact(now=now + HOUR - 120_000, force=True) == 0  # D - W + lag + ε not yet past
    assert [(o, k, v) for o, k, v in _all(log)][: len(written)] == written
    assert log.compact(now=now + HOUR + 120_000, force=True) >= 1
    assert len(_all(log)) < len(written)


def test_max_compaction_lag_makes_a_partition_due_whatever_its_dirty_ratio(tmp_path: Path) -> None:
    root = _root(tmp_path, **{"min.cleanable.dirty.ratio": 1.0, "max.compaction.lag.ms": HOUR})
    log = root.partition("t", 0)
    _fill(log, appends=8, per_append=50, keys=5, seed=3)
    _append(log, [(b"tail", b"x")])
    t0 = now_ms()
    assert log.compact(now=t0) >= 1  # all dirty: due at ratio 1.0
    _append(log, [(b"k1", b"new")])  # a little dirt after a large clean part
    _append(log, [(b"tail", b"y")])
    assert log.cleaner.compactor is not None
    assert not log.cleaner.compactor.plan(log.view(), t0 + 1_000, None).due
    assert log.compact(now=t0 + 1_000) == 0
    plan = log.cleaner.compactor.plan(log.view(), t0 + HOUR + 1_000, None)
    assert plan.due and plan.dirty_bytes < plan.cleanable_bytes
    assert log.compact(now=t0 + HOUR + 1_000) >= 1
    assert [v for _, k, v in _all(log) if k == b"k1"] == [b"new"]  # the superseded k1 in the clean part went


def test_transactions_aborted_records_go_committed_stay_undecided_stop_the_run(tmp_path: Path) -> None:
    url = str(tmp_path / "root")
    with LogStore(url) as admin:
        admin.create_topic("t", 1, config={**COMPACT, "auto.maintenance.enable": False})
    with Producer(url, transactional_id="tx") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("t", b"committed-1", key=b"a")
        producer.commit_transaction()
        producer.begin_transaction()
        producer.send("t", b"aborted", key=b"b")
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send("t", b"committed-2", key=b"a")
        producer.send("t", b"committed-3", key=b"c")
        producer.commit_transaction()
    with Producer(url) as plain:
        plain.send("t", b"tail", key=b"z").get(10)
    root = LogRoot(url)
    log = root.partition("t", 0)
    # Without a resolver nothing transactional is decided: the cleanable run stops at the first transaction.
    assert log.cleaner.compactor is not None
    assert log.cleaner.compactor.plan(log.view(), now_ms(), None).lso == 0
    assert log.compact(force=True) == 0
    coordinator = TransactionCoordinator(root.store)
    assert log.compact(resolver=coordinator.resolve, decided_ms=coordinator.decided_ms, force=True) >= 1
    kept = [(k, v) for _, k, v in _all(log)]
    assert (b"b", b"aborted") not in kept and (b"a", b"committed-1") not in kept
    assert [kv for kv in kept if kv[1]] == [(b"a", b"committed-2"), (b"c", b"committed-3"), (b"z", b"tail")]
    # Kept records of a committed transaction are no longer transactional: their outcome is known.
    compacted = log.index(log.view().segments[0])
    data_rows = [i for i in range(compacted.batch_count) if not compacted.attributes[i] & (1 << 5)]
    assert data_rows and all(int(compacted.transactions[i]) == -1 for i in data_rows)


def test_records_without_a_key_are_refused_and_nothing_is_written(tmp_path: Path) -> None:
    root = _root(tmp_path)
    log = root.partition("t", 0)
    with pytest.raises(InvalidRecordError, match=r"without a key; topic 't' is compacted"):
        _append(log, [(b"a", b"1"), (None, b"2")])  # type: ignore[list-item]
    assert log.view().end_offset == 0
    url = str(tmp_path / "root")
    with Producer(url) as producer:
        producer.send("t", b"keyed", key=b"k").get(10)  # opens the buffer: the short path would follow
        with pytest.raises(InvalidRecordError, match="without a key sent to topic 't', which is compacted"):
            producer.send("t", b"no key")
        with pytest.raises(InvalidRecordError, match=r"1 row\(s\) without a key .* nothing of the batch"):
            producer.send_batch("t", pa.table({"key": [b"a", None], "value": [b"1", b"2"]}))
        producer.flush()
    assert [(k, v) for _, k, v in _all(LogRoot(url).partition("t", 0))] == [(b"k", b"keyed")]


def test_merges_on_a_compacted_topic_name_their_objects_and_keep_clean_prefixes(tmp_path: Path) -> None:
    root = _root(tmp_path, **{"min.cleanable.dirty.ratio": 1.0, "segment.bytes": 8_000})  # groups of two objects
    log = root.partition("t", 0)
    _fill(log, appends=3, per_append=5, keys=100, seed=4)
    _append(log, [(b"tail", b"x")])
    assert log.compact(force=True) == 1
    _fill(log, appends=4, per_append=5, keys=100, seed=5)
    _append(log, [(b"tail", b"y")])
    assert log.merge_segments() >= 1  # not due at ratio 1.0, so the pass merges the appended objects
    rewritten = [ref for ref in log.view().segments if ref.generation > 0]
    assert len(rewritten) >= 2
    assert all(parse_segment_name(ref.key.rsplit("/", 1)[-1]).rewrite_id for ref in rewritten)  # type: ignore[union-attr]
    merged = log.index(rewritten[1])
    assert merged.meta.clean_end is None  # its inputs were appended objects: dirty
    assert verify(root, "t").ok


def test_a_compacted_topic_in_a_new_root_needs_no_wait_in_an_old_root_it_waits(tmp_path: Path) -> None:
    with LogStore(str(tmp_path / "new")) as fresh:
        fresh.create_topic("c", 1, config={"cleanup.policy": "compact"})
        assert "compaction" in fresh.root.protocol.version.reader_features
    _older_root(tmp_path / "old")
    with LogStore(str(tmp_path / "old")) as old:
        old.create_topic("plain", 1)
        with pytest.raises(InvalidConfigError, match=r"feature 'compaction' was enabled .* it may be used from"):
            old.create_topic("c", 1, config={"cleanup.policy": "compact"})
        with pytest.raises(InvalidConfigError, match="it may be used from"):
            old.alter_config("plain", {"cleanup.policy": "compact"})
        assert not old.root.catalog.exists("c")
        assert "compaction" in old.root.protocol.version.reader_features  # enabled: the clock is running


def test_a_process_re_reads_the_protocol_and_learns_a_feature_enabled_after_it_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _older_root(tmp_path / "r")
    with LogStore(str(tmp_path / "r")) as admin:
        admin.create_topic("plain", 1)
    opened = LogRoot(str(tmp_path / "r"))
    assert "compaction" not in opened.protocol.version.reader_features
    RootProtocol(opened.store).upgrade(opened.protocol.version.merged(_compaction_only()))
    assert opened.store.get(protocol_key(1))
    assert "compaction" not in opened.protocol.version.reader_features  # cached until the re-check
    monkeypatch.setattr("segment_format.protocol.PROTOCOL_RECHECK_S", 0.0)
    assert "compaction" in opened.protocol.version.reader_features
    assert PROTOCOL_RECHECK_S == 300.0


def _older_root(path: Path) -> None:
    """A root whose protocol object 0 predates compaction in new roots' object 0 (only ``changeNotices``)."""
    upgrade_protocol(open_store(str(path)), ProtocolVersion(1, 1, (), ("changeNotices",)))


def _compaction_only() -> Any:
    from segment_format.protocol import ProtocolVersion

    return ProtocolVersion(1, 1, ("compaction",), ("compaction",))


def test_plog_inspect_shows_the_clean_and_dirty_parts_and_plog_maintain_compacts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark_logsource.cli.app import main

    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.delenv("PLOG_URL", raising=False)
    url = str(tmp_path / "root")
    root = _root(tmp_path)
    log = root.partition("t", 0)
    _fill(log, appends=5, per_append=20, keys=10, seed=6)
    _append(log, [(b"tail", b"x")])

    def plog(*args: str) -> str:
        capsys.readouterr()
        assert main([*args, "--url", url]) == 0
        return capsys.readouterr().out

    before = plog("inspect", "t")
    assert "compaction: clean [0, 0), dirty [0, 100)" in before and "due: the next pass compacts it" in before
    assert "dirty" in before.split("compaction:")[0]
    plog("maintain", "t")
    after = plog("inspect", "t")
    assert "compaction: clean [0, 100), dirty [100, 100)" in after and "not due" in after
    assert "clean" in after.split("compaction:")[0]
    assert len(_all(LogRoot(url).partition("t", 0))) < 101


def test_a_producer_compacts_the_topic_it_writes_by_itself(tmp_path: Path) -> None:
    url = str(tmp_path / "root")
    with LogStore(url) as admin:
        admin.create_topic(
            "t", 1, config={**COMPACT, "auto.maintenance.enable": True, "auto.maintenance.interval.ms": 0}
        )
    with Producer(url, linger_ms=0) as producer:
        for round_ in range(6):
            for i in range(30):
                producer.send("t", b"round-%d" % round_, key=b"k%d" % i)
            producer.flush()
    log = LogRoot(url).partition("t", 0)
    assert any(".c" in ref.key.rsplit("/", 1)[-1] for ref in log.view().segments)
    read = _all(log)
    assert len(read) < 180
    assert {k: v for _, k, v in read} == {b"k%d" % i: b"round-5" for i in range(30)}


def test_tombstones_expire_on_a_partition_that_keeps_being_written_and_objects_stay_few(tmp_path: Path) -> None:
    # Joining clean objects takes the latest of their clocks; a member holding a tombstone must already have
    # it, or every pass would reset the tombstone's clock and it would never expire (found by a second reader).
    root = _root(tmp_path)
    log = root.partition("t", 0)
    t0 = now_ms()
    _append(log, [(b"a", b"1"), (b"b", b"1")])
    _append(log, [(b"a", None)])
    _append(log, [(b"z", b"tail")])
    log.compact(now=t0, force=True)
    gone_at = None
    for k in range(1, 19):  # a pass every 10 minutes for 3 hours, each after an update and a new tail
        _append(log, [(b"b", b"%d" % k)])
        _append(log, [(b"z", b"tail-%d" % k)])
        log.compact(now=t0 + k * 600_000, force=True)
        if gone_at is None and (b"a", None) not in [(key, v) for _, key, v in _all(log)]:
            gone_at = k * 600_000
        assert len(log.view().segments) <= 4
    assert gone_at is not None and HOUR < gone_at <= 2 * HOUR, gone_at


def test_a_log_held_by_a_process_takes_the_topics_newer_config(tmp_path: Path) -> None:
    url = str(tmp_path / "root")
    with LogStore(url) as admin:
        admin.create_topic("first", 1, config={"cleanup.policy": "compact"})  # object 0 lists the feature
        # Partitioned: the test reads the codec from the appended object's header.
        admin.create_topic("t", 1, config={"auto.maintenance.enable": False, "storage.layout": "partitioned"})
    held = LogRoot(url, metadata_max_age_s=0.0)
    log = held.partition("t", 0)
    assert log.config["cleanup.policy"] == "delete"
    with LogStore(url) as admin:
        admin.alter_config("t", {"cleanup.policy": "compact", "compression.type": "zstd"})
    again = held.partition("t", 0)
    assert again is log and log.config["cleanup.policy"] == "compact"
    assert log.chain.config is log.config and log.appender.config is log.config  # one dict, all see it
    with pytest.raises(InvalidRecordError, match="compacted"):
        _append(log, [(b"a", b"1"), (None, b"2")])  # type: ignore[list-item]
    _append(log, [(b"a", b"1")])
    assert log.index(log.view().segments[-1]).meta.compression == "zstd"
