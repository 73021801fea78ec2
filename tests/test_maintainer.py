"""Self-maintenance (PROTOCOL.md 10.1): the topic switch, the per-topic lease, the budget, the cost of "not due"."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from coordinator.keys import maintainer_lease_name
from coordinator.maintainer import maybe_maintain
from segment_format.errors import InvalidConfigError
from segment_format.records import now_ms, payload_batch
from segment_format.root import LogRoot
from segment_format.segment import BatchMeta
from segment_format.stores.local import LocalStore
from segment_format.topic import validate_config
from tests.counting_store import CountingStore

#: These tests merge and collect per-partition segment objects: partitioned topics (a shared topic's
#: maintenance, moves and commit ranges, is tested in test_shared_maintenance).
PARTITIONED = {"storage.layout": "partitioned"}


def _root(tmp_path: Path, config: dict[str, Any], partitions: int = 2) -> tuple[LogRoot, CountingStore]:
    store = CountingStore(LocalStore(str(tmp_path / "root")))
    root = LogRoot(str(tmp_path / "root"), store=store)
    root.catalog.create("t", partitions, {"segment.bytes": 16384, "file.delete.delay.ms": 0, **PARTITIONED, **config})
    return root, store


def _append(root: LogRoot, partitions: int, count: int) -> None:
    for _ in range(count):
        for p in range(partitions):
            values = [os.urandom(200) for _ in range(4)]
            batch = payload_batch([now_ms()] * len(values), [None] * len(values), values)
            root.partition("t", p).append([(batch, BatchMeta())], durable=False)


def _objects(root: LogRoot, partition: int) -> int:
    return len(root.partition("t", partition).view().segments)


def test_config_keys_are_validated() -> None:
    assert validate_config({})["auto.maintenance.enable"] is True
    assert validate_config({"auto.maintenance.enable": "FALSE"})["auto.maintenance.enable"] is False
    assert validate_config({"auto.maintenance.interval.ms": "0"})["auto.maintenance.interval.ms"] == 0
    with pytest.raises(InvalidConfigError, match="auto.maintenance.enable"):
        validate_config({"auto.maintenance.enable": "yes"})
    with pytest.raises(InvalidConfigError, match="below its minimum"):
        validate_config({"auto.maintenance.interval.ms": -1})


def test_disabled_keeps_the_objects_unmerged(tmp_path: Path) -> None:
    root, _ = _root(tmp_path, {"auto.maintenance.enable": False, "auto.maintenance.interval.ms": 0})
    _append(root, 2, 20)
    report = maybe_maintain(root, "t", [0, 1], owner="w1")
    assert report.outcome == "disabled" and not report.ran
    assert _objects(root, 0) == 20 and _objects(root, 1) == 20


def test_interval_zero_maintains_on_every_call(tmp_path: Path) -> None:
    root, _ = _root(tmp_path, {"auto.maintenance.interval.ms": 0})
    _append(root, 2, 20)
    report = maybe_maintain(root, "t", [0, 1], owner="w1")
    assert report.outcome == "done" and report.partitions == [0, 1] and report.merged > 0
    # 4.4 KiB objects at segment.bytes 16 KiB: three per merged segment: a few merged segments and a short tail
    assert _objects(root, 0) < 12 and _objects(root, 1) < 12
    assert maybe_maintain(root, "t", [0], owner="w1").ran


def test_two_writers_do_not_both_maintain_within_one_interval(tmp_path: Path) -> None:
    root, store = _root(tmp_path, {"auto.maintenance.interval.ms": 60_000})
    _append(root, 2, 10)
    # Two writers, each with its own root on the same storage: they share nothing but the objects.
    other = LogRoot(root.url, store=CountingStore(LocalStore(root.url)))
    reports: list[Any] = []
    lock = threading.Lock()

    def run(r: LogRoot, owner: str) -> None:
        for _ in range(5):
            got = maybe_maintain(r, "t", [0, 1], owner=owner)
            with lock:
                reports.append(got)

    threads = [threading.Thread(target=run, args=(r, o)) for r, o in ((root, "w1"), (other, "w2"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ran = [r for r in reports if r.ran]
    assert len(ran) == 1, [r.outcome for r in reports]
    assert sum(r.outcome == "not-due" for r in reports) == 9
    lease_objects = store.list("_coordinator/leases/" + maintainer_lease_name("t") + "/")
    assert len(lease_objects) == 1  # one epoch: one pass in the interval


def test_not_due_costs_at_most_one_request(tmp_path: Path) -> None:
    root, store = _root(tmp_path, {"auto.maintenance.interval.ms": 60_000})
    _append(root, 1, 3)
    other = LogRoot(root.url, store=CountingStore(LocalStore(root.url)))
    assert maybe_maintain(other, "t", [0], owner="w2").ran  # another writer took the lease
    root.topic("t")  # metadata cached, as a writer's is
    before = store.total()
    assert maybe_maintain(root, "t", [0], owner="w1").outcome == "not-due"
    first = store.total() - before  # one LIST and one GET of the epoch object, once per epoch
    assert first <= 2
    before = store.total()
    for _ in range(10):
        assert maybe_maintain(root, "t", [0], owner="w1").outcome == "not-due"
    assert store.total() - before == 0  # the expiry read the first time is known: no request until it passes
    # And a writer that only knows the epoch object pays one LIST per call once the expiry is not cached.
    from coordinator import maintainer

    for states in maintainer._STATES.get(store, {}).values():
        states.due_ms = 0
    before = store.total()
    assert maybe_maintain(root, "t", [0], owner="w1").outcome == "not-due"
    assert store.total() - before == 1
    assert store.counts["list"] >= 1


def test_budget_stops_between_partitions_and_the_next_call_continues(tmp_path: Path) -> None:
    root, _ = _root(tmp_path, {"auto.maintenance.interval.ms": 60_000}, partitions=3)
    _append(root, 3, 10)
    first = maybe_maintain(root, "t", None, owner="w1", budget_s=0.0)
    assert first.outcome == "budget" and first.partitions == [0]
    second = maybe_maintain(root, "t", None, owner="w1", budget_s=0.0)  # released: due at once
    assert second.partitions == [1]
    third = maybe_maintain(root, "t", None, owner="w1", budget_s=60.0)
    assert third.outcome == "done" and third.partitions == [2]  # 0 and 1 were visited in this cycle
    assert maybe_maintain(root, "t", None, owner="w1").outcome == "not-due"


def test_old_lease_epochs_are_pruned(tmp_path: Path) -> None:
    root, store = _root(tmp_path, {"auto.maintenance.interval.ms": 60_000})
    for _ in range(6):
        maybe_maintain(root, "t", [0], owner="w1", budget_s=0.0)  # one partition of two: not cut, all given
        from coordinator import maintainer

        for states in maintainer._STATES.get(store, {}).values():
            states.due_ms = 0
            assert states.lease is not None
            states.lease.release()  # pretend the interval passed
    keys = [i.key for i in store.list("_coordinator/leases/" + maintainer_lease_name("t") + "/")]
    epochs = {k.split("/")[3].split(".")[0] for k in keys}
    assert len(epochs) <= 3, keys


def _chain_length(tmp_path: Path, topic: str) -> int:
    """Objects a reader of partition 0 reads (superseded ones wait file.delete.delay.ms before deletion)."""
    return len(LogRoot(str(tmp_path)).partition(topic, 0).view().segments)


@pytest.mark.parametrize("enabled", [True, False])
def test_a_producer_maintains_what_it_writes(tmp_path: Path, enabled: bool) -> None:
    """The producer's sender merges the partitions it wrote after each write, unless the topic says not to."""
    from pyspark_logsource import LogStore, Producer

    config = {
        "segment.bytes": 16384,
        "auto.maintenance.interval.ms": 0,
        "auto.maintenance.enable": enabled,
        **PARTITIONED,
    }
    LogStore(str(tmp_path)).create_topic("t", partitions=1, config=config)
    with Producer(str(tmp_path), linger_ms=0) as producer:
        for i in range(40):
            producer.send("t", value=b"v" * 400 + str(i).encode(), partition=0).get(timeout=30)
    objects = _chain_length(tmp_path, "t")
    if enabled:
        assert objects <= 16, objects  # 40 appended objects of 3.5 KiB: 4 per 16 KiB segment, plus an open group
    else:
        assert objects == 40
    from pyspark_logsource import Consumer, TopicPartition

    consumer = Consumer(str(tmp_path), auto_offset_reset="earliest")
    consumer.assign([TopicPartition("t", 0)])
    values = consumer.read_to_end(timeout_ms=10_000).column("value").to_pylist()
    assert values == [b"v" * 400 + str(i).encode() for i in range(40)]


def test_tiers_bound_the_objects_of_small_appends_under_the_default_segment_size(tmp_path: Path) -> None:
    """With 64 MiB segments, 600 one-record appends end as a few tiers of merged objects, not 600 (issue #11)."""
    from segment_format.inspect.verify import verify
    from segment_format.log.maintenance import MERGE_FANOUT

    root = LogRoot(str(tmp_path / "root"))
    root.catalog.create("t", 1, {"retention.ms": -1, **PARTITIONED})
    log = root.partition("t", 0)
    longest = 0
    for i in range(600):
        batch = payload_batch([now_ms()], [None], [b"%d" % i])
        log.append([(batch, BatchMeta())], durable=False)
        if i % 25 == 24:
            log.maintain()
            longest = max(longest, len(log.view().segments))
    log.maintain()
    chain = log.view().segments
    generations = [ref.generation for ref in chain]
    assert generations.count(2) == 2  # 16 appends in a g1 object, 16 of those in a g2: 512 records in 2 objects
    assert all(generations.count(g) < MERGE_FANOUT for g in set(generations) if g > 0)
    assert longest < 3 * MERGE_FANOUT, longest  # never a long chain, at any moment of the run
    batches, _ = log.read(0, max_records=1000)
    values = [v for b in batches for v in b.column(3).to_pylist()]
    assert values == [b"%d" % i for i in range(600)]  # every record, once, in order
    assert log.collect_garbage(now=now_ms() + 10 * 3600_000) > 0  # the superseded objects go after D
    assert len(root.store.list(log.prefix + "log/")) == len(chain)
    assert verify(root, "t").problems.empty


def _lists(store: CountingStore) -> int:
    return store.counts.get("list", 0)


def test_a_pass_over_a_topic_lists_it_once(tmp_path: Path) -> None:
    """A pass visiting most partitions resolves them from one listing of the topic (PROTOCOL.md 10.1)."""
    root, store = _root(tmp_path, {"auto.maintenance.interval.ms": 0, "segment.bytes": 1 << 20}, partitions=8)
    _append(root, 8, 20)  # 20 small appends per partition: a merge group of 16 closes in each
    root.topic("t")  # metadata cached, as a writer's is
    before = _lists(store)
    report = maybe_maintain(root, "t", None, owner="w1", budget_s=60.0)
    assert report.outcome == "done" and report.partitions == list(range(8))
    assert report.merged == 8
    assert _lists(store) - before == 1  # not one per partition, and none again after the merges
    for p in range(8):
        assert _objects(root, p) == 5  # one merged object and the 4 appended after it
    # The next pass sees the merges in its listing and collects what they superseded (D = 0 here).
    before = _lists(store)
    second = maybe_maintain(root, "t", None, owner="w1", budget_s=60.0)
    assert second.garbage_deleted == 8 * 16 and _lists(store) - before == 1


def test_a_pass_over_a_few_partitions_of_a_wide_topic_lists_just_those(tmp_path: Path) -> None:
    root, store = _root(tmp_path, {"auto.maintenance.interval.ms": 0}, partitions=8)
    _append(root, 8, 2)
    root.topic("t")
    before = _lists(store)
    assert maybe_maintain(root, "t", [3, 5], owner="w1").partitions == [3, 5]
    assert _lists(store) - before == 2


def test_a_pass_cut_by_its_budget_continues_on_its_listing(tmp_path: Path) -> None:
    root, store = _root(tmp_path, {"auto.maintenance.interval.ms": 0}, partitions=3)
    _append(root, 3, 20)
    root.topic("t")
    before = _lists(store)
    assert maybe_maintain(root, "t", None, owner="w1", budget_s=0.0).partitions == [0]
    assert maybe_maintain(root, "t", None, owner="w1", budget_s=0.0).partitions == [1]
    third = maybe_maintain(root, "t", None, owner="w1", budget_s=0.0)
    assert third.partitions == [2] and third.outcome == "done"  # every partition of the listing visited
    assert _lists(store) - before == 1  # the continuations reuse the first call's listing
    assert maybe_maintain(root, "t", None, owner="w1", budget_s=60.0).partitions == [0, 1, 2]
    assert _lists(store) - before == 2  # the cycle was done: the next pass lists afresh


def test_a_continuation_does_not_redo_the_merges_of_its_cycle(tmp_path: Path) -> None:
    """A partition visited since the reused listing was taken is not visited again on it: the listing predates
    that visit's merge, so the merge would be redone (its objects read again, its create refused)."""
    root, store = _root(tmp_path, {"auto.maintenance.interval.ms": 0, "segment.bytes": 1 << 20}, partitions=3)
    _append(root, 3, 20)  # a merge group of 16 closes in each partition
    root.topic("t")
    for p in range(3):  # one partition per pass: the cycle's listing is reused twice
        assert maybe_maintain(root, "t", None, owner="w1", budget_s=0.0).partitions == [p]
    puts, gets = store.counts.get("put", 0), store.counts.get("get", 0)
    again = maybe_maintain(root, "t", None, owner="w1", budget_s=0.0)
    assert again.partitions == [0] and again.merged == 0
    assert store.counts.get("put", 0) == puts  # no merged object created again (and refused)
    assert store.counts.get("get", 0) - gets <= 1  # at most the merged object's index, not the 16 it replaced
    assert _objects(root, 0) == 5


def test_a_pass_on_a_stale_listing_keeps_every_record(tmp_path: Path) -> None:
    """Another maintainer merged and collected after this pass's listing: the pass still harms nothing."""
    root, _ = _root(tmp_path, {"auto.maintenance.interval.ms": 0}, partitions=1)
    _append(root, 1, 40)
    expected = _values(root)
    listed = time.monotonic()
    stale = root.partition_listings("t")[0]
    other = LogRoot(root.url)
    for _ in range(3):  # merge, collect what the merges superseded (D = 0), merge the tiers
        other.maintain("t")
    root.partition("t", 0).maintain(listing=stale, listed_monotonic=listed)
    for _ in range(2):  # and passes after it, fresh or on the stale writer's state
        assert _values(LogRoot(root.url)) == expected
        maybe_maintain(root, "t", None, owner="w1")
    assert _values(root) == expected


def _values(root: LogRoot) -> list[bytes]:
    """Every value of partition 0, read by a fresh root (nothing cached)."""
    fresh = LogRoot(root.url)
    batches, end = fresh.partition("t", 0).read(0)
    assert end == fresh.partition("t", 0).view().end_offset
    return [v for b in batches for v in b.column("value").to_pylist()]


def test_a_continuation_never_uses_a_listing_of_a_deleted_incarnation(tmp_path: Path) -> None:
    """A topic deleted and created again under its name within the reuse window is listed afresh."""
    root, store = _root(tmp_path, {"auto.maintenance.interval.ms": 0}, partitions=3)
    _append(root, 3, 20)
    root.topic("t")
    assert maybe_maintain(root, "t", None, owner="w1", budget_s=0.0).outcome == "budget"  # listing kept
    root.catalog.delete("t")
    root.forget_topic("t")
    root.catalog.create(
        "t", 3, {"segment.bytes": 16384, "file.delete.delay.ms": 0, "auto.maintenance.interval.ms": 0, **PARTITIONED}
    )
    _append(root, 3, 2)
    root.topic("t")
    before = _lists(store)
    assert maybe_maintain(root, "t", None, owner="w1", budget_s=60.0).outcome == "done"
    assert _lists(store) - before == 1  # the new incarnation's own listing
    assert all(_objects(root, p) == 2 for p in range(3))  # nothing of the old incarnation merged into it


def test_a_topic_listing_files_only_partition_names_under_partitions(tmp_path: Path) -> None:
    """Strays beside the partitions ("01/", "²/", the notice) are in no partition's listing (PROTOCOL.md 3)."""
    root, store = _root(tmp_path, {}, partitions=2)
    _append(root, 2, 1)
    meta = root.topic("t")
    prefix = root.partition("t", 1).prefix.rsplit("1/", 1)[0]
    for stray in ("01/log/00000000000000000000.arrow", "\u00b2/log/00000000000000000000.arrow", "x/y"):
        store.put_if_absent(prefix + stray, b"stray")
    listings = root.partition_listings("t", meta)
    assert sorted(listings) == [0, 1]
    for p, infos in listings.items():
        assert infos and all(i.key.startswith(root.partition("t", p).prefix) for i in infos), infos


def test_append_times_are_written_and_carried_through_merges(tmp_path: Path) -> None:
    """PROTOCOL.md 11.6: an appended object's append times are its created_ms; a merge states the least
    and the greatest of its inputs', so compaction can trust them through any number of rewrites."""
    root, _ = _root(tmp_path, {"auto.maintenance.enable": False}, partitions=1)
    _append(root, 1, 18)
    log = root.partition("t", 0)
    appended = [log.chain.index(ref).meta for ref in log.view().segments]
    assert all(m.min_append_ms == m.max_append_ms == m.created_ms for m in appended)
    assert log.merge_segments() >= 1
    merged = [ref for ref in log.view(refresh=True).segments if ref.generation > 0]
    assert merged
    for ref in merged:
        meta = log.chain.index(ref).meta
        inputs = [m for m in appended if ref.base_offset <= m.base_offset < meta.next_offset]
        assert meta.min_append_ms == min(m.created_ms for m in inputs)
        assert meta.max_append_ms == max(m.created_ms for m in inputs)
        assert meta.append_bounds() == (meta.min_append_ms, meta.max_append_ms)
    legacy = appended[0]
    legacy.min_append_ms = legacy.max_append_ms = None  # as written before the fields existed
    assert legacy.append_bounds() == (0, legacy.created_ms)


@pytest.mark.parametrize("closes_alone_by", ["time", "size"])
def test_a_group_closed_with_one_object_is_copied_so_no_offset_falls_off_the_chain(
    tmp_path: Path, closes_alone_by: str
) -> None:
    # A merge must start at the frontier (PROTOCOL.md 10). An object that closes its group alone (a gap of
    # more than segment.ms after it, or more than segment.bytes by itself) used to be skipped while the next
    # group was merged, so its offsets lay below the new frontier on no chain element: gone for readers.
    root = LogRoot(str(tmp_path / "root"))
    root.catalog.create(
        "t",
        1,
        {
            "segment.ms": 1_000,
            "segment.bytes": 4_096,
            "auto.maintenance.enable": False,
            "retention.ms": -1,
            **PARTITIONED,
        },
    )
    log = root.partition("t", 0)
    first = [os.urandom(3_000)] if closes_alone_by == "size" else [b"v0"]
    stamps = [0, 5_000, 5_100, 9_000, 9_000] if closes_alone_by == "time" else [0, 10, 20, 30, 40]
    for i, ts in enumerate(stamps):
        values = first if i == 0 else [b"v%d" % i]
        log.append([(payload_batch([ts], [None], values), BatchMeta())], durable=False)
    assert log.merge_segments() >= 2
    view = log.view()
    assert (view.start_offset, view.end_offset) == (0, 5)
    batches, _ = log.read(0)
    assert [o for b in batches for o in b.column(0).to_pylist()] == [0, 1, 2, 3, 4]
    assert view.segments[0].generation == 1 and view.segments[0].end_offset == 1


def test_verify_lists_again_when_maintenance_deletes_an_object_it_listed(tmp_path: Path) -> None:
    from segment_format.inspect.verify import verify

    root, _ = _root(tmp_path, {"auto.maintenance.enable": False}, partitions=1)
    _append(root, 1, 12)
    log = root.partition("t", 0)
    assert log.merge_segments() >= 1
    superseded = [info.key for info, _ in log.view().superseded][:1]
    assert superseded
    store = LocalStore(str(tmp_path / "root"))
    listed = store.list

    def list_then_collect(prefix: str) -> Any:
        found = listed(prefix)
        if "/log/" not in prefix and superseded and any(i.key == superseded[0] for i in found):
            store.delete(superseded.pop(0))  # a maintainer collects it right after this listing
        return found

    store.list = list_then_collect  # type: ignore[method-assign]
    report = verify(LogRoot(str(tmp_path / "root"), store=store), "t")
    assert report.ok, report
    assert not superseded  # the deletion really happened during the check


def test_objects_a_writer_hands_over_are_merged_without_reading_them(tmp_path: Path) -> None:
    """A writer that offers the bytes of the objects it created (the Spark sink's driver does, from its tasks'
    commit messages) has them merged with no request for them (PROTOCOL.md 10.1), into the same records."""
    root, store = _root(tmp_path, {"auto.maintenance.interval.ms": 0, "segment.bytes": 1 << 20}, partitions=1)
    log = root.partition("t", 0)
    for _ in range(20):
        values = [os.urandom(200) for _ in range(4)]
        batch = payload_batch([now_ms()] * len(values), [None] * len(values), values)
        result = log.append([(batch, BatchMeta())], durable=False, keep_bytes=1 << 20)
        assert result.data is not None and result.data == root.store.get(result.key)
        root.index_cache.offer(result.key, result.data)
    expected = _values(root)
    store.calls.clear()
    report = maybe_maintain(root, "t", None, owner="w1")
    assert report.merged == 1
    appended_reads = [n for (op, _), n in store.calls.items() if op == "get"]
    assert sum(appended_reads) == 0, store.calls  # not one GET: indexes and batches came from the offered bytes
    assert _values(root) == expected
    small = log.append([(payload_batch([now_ms()], [None], [b"x"]), BatchMeta())], durable=False, keep_bytes=10)
    assert small.data is None  # larger than asked to keep


def test_offered_bytes_that_are_not_the_object_are_dropped_and_the_object_read(tmp_path: Path) -> None:
    root, _ = _root(tmp_path, {"auto.maintenance.interval.ms": 0, "segment.bytes": 1 << 20}, partitions=1)
    log = root.partition("t", 0)
    keys = []
    for _ in range(20):
        batch = payload_batch([now_ms()], [None], [os.urandom(200)])
        result = log.append([(batch, BatchMeta())], durable=False, keep_bytes=1 << 20)
        assert result.data is not None
        keys.append(result.key)
        damaged = bytearray(result.data)
        damaged[-40] ^= 0xFF  # inside the index: its checksum fails
        root.index_cache.offer(result.key, bytes(damaged))
    expected = _values(root)
    fresh = LogRoot(root.url)  # a maintainer of its own, given the damaged bytes
    for key in keys:
        fresh.index_cache.offer(key, root.index_cache.objects.take(key) or b"")
    assert maybe_maintain(fresh, "t", None, owner="w2").merged == 1
    assert _values(root) == expected


def test_passes_over_a_few_partitions_starve_no_partition_of_a_cycle(tmp_path: Path) -> None:
    """Budget-cut passes over the whole topic alternate with passes over partition 0 (a writer of it): the
    cycle goes on through partitions 1 and 2 rather than being ended by the small passes, and partition 0,
    visited already in the cycle, is maintained on a fresh listing of its own instead of being skipped."""
    root, store = _root(tmp_path, {"auto.maintenance.interval.ms": 0, "segment.bytes": 1 << 20}, partitions=3)
    _append(root, 3, 20)
    root.topic("t")
    visits = {0: 0, 1: 0, 2: 0}
    for _ in range(6):
        for wanted in (None, [0]):
            report = maybe_maintain(root, "t", wanted, owner="w1", budget_s=0.0)
            assert report.partitions, report  # every pass does something
            for p in report.partitions:
                visits[p] += 1
    assert visits[1] >= 2 and visits[2] >= 2, visits
    assert all(_objects(root, p) <= 5 for p in range(3))  # each partition's group of 16 was merged
