"""Compaction with a bounded offset map (PROTOCOL.md 11.6, *Bounded offset maps*): passes with a small
``log.cleaner.dedupe.buffer.size`` end where the map filled, leave the rest dirty, and together read
exactly as one pass with a map that holds every key."""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from segment_format.log.compaction import LogCompactor
from segment_format.log.offset_map import MAP_ENTRY_BYTES, OffsetMap, PassMap, _dedupe, key_hashes
from segment_format.log.partition_log import PartitionLog
from segment_format.records import payload_batch
from segment_format.root import LogRoot
from segment_format.segment import BatchMeta
from tests.test_compaction import COMPACT, HOUR

T0 = 10 * HOUR
CONFIG = {**COMPACT, "min.cleanable.dirty.ratio": 0.01}

Record = tuple[int, bytes | None, bytes | None]


def _append(log: PartitionLog, records: list[tuple[bytes | None, bytes | None]]) -> None:
    batch = payload_batch([1_000] * len(records), [k for k, _ in records], [v for _, v in records])
    log.append([(batch, BatchMeta())], durable=False)


def _all(log: PartitionLog) -> list[Record]:
    out, offset = [], 0
    while True:
        batches, offset = log.read(offset, max_records=50)
        if not batches and offset >= log.view().end_offset:
            return out
        for b in batches:
            out += zip(b.column(0).to_pylist(), b.column(2).to_pylist(), b.column(3).to_pylist(), strict=True)


def _written(appends: list[list[tuple[bytes | None, bytes | None]]]) -> list[Record]:
    out, offset = [], 0
    for records in appends:
        for key, value in records:
            out.append((offset, key, value))
            offset += 1
    return out


def _expected(written: list[Record]) -> list[Record]:
    """Every record without a key, and every key's last record (tombstones included: none expires)."""
    last = {key: offset for offset, key, _ in written if key is not None}
    return [r for r in written if r[1] is None or last[r[1]] == r[0]]


def _make(url: str, appends: list[list[tuple[bytes | None, bytes | None]]], config: dict[str, Any]) -> None:
    root = LogRoot(url)
    root.catalog.create("t", 1, {**CONFIG, **config})
    log = root.partition("t", 0)
    for records in appends:
        _append(log, records)


def _compact_until_done(url: str, limit: int, max_passes: int = 500) -> tuple[list[Record], int, list[Any]]:
    """Compact with the limit until a pass has nothing to do; (records, passes that wrote, their reports)."""
    root = LogRoot(url)
    root.dedupe_buffer_size = limit
    log = root.partition("t", 0)
    compactor = log.cleaner.compactor
    assert compactor is not None
    passes, reports = 0, []
    for _ in range(max_passes):
        written = log.compact(now=T0, force=True)
        if compactor.last_pass is None:
            return _all(log), passes, reports
        reports.append(compactor.last_pass)
        passes += written > 0
    raise AssertionError(f"compaction with limit {limit} did not finish in {max_passes} passes")


def _appends(rng: random.Random, count: int, per: int, keys: int) -> list[list[tuple[bytes | None, bytes | None]]]:
    out = []
    for _ in range(count):
        batch: list[tuple[bytes | None, bytes | None]] = []
        for _ in range(per):
            key = f"k{rng.randrange(keys)}".encode()
            value = None if rng.random() < 0.15 else f"v{rng.random():.6f}".encode()
            batch.append((key, value))
        out.append(batch)
    return out


def test_small_map_passes_read_exactly_as_one_large_pass(tmp_path: Path) -> None:
    """200 keys through a map of 40: several passes, each ending at its map end, read as one large pass."""
    appends = _appends(random.Random(7), 30, 20, 200)
    appends.append([(b"tail-only", b"x")])  # the last element supersedes nothing
    _make(str(tmp_path / "a"), appends, {"segment.bytes": 4_096})
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    large, large_passes, large_reports = _compact_until_done(str(tmp_path / "a"), 128 * 1024 * 1024)
    small, small_passes, reports = _compact_until_done(str(tmp_path / "b"), 40 * MAP_ENTRY_BYTES)
    assert large == _expected(_written(appends))
    # The records fit the large map: it holds the keys themselves; the small one holds hashes.
    assert [r.exact_keys for r in large_reports] == [True] and not any(r.exact_keys for r in reports)
    assert small == large
    assert large_passes == 1
    assert small_passes > 3, small_passes
    assert reports[0].partial and not reports[-1].partial
    # The map stays within its 40 entries, except when it took a single element (one append: 20 offsets).
    assert all(r.map_entries <= 40 or r.map_end - r.map_start <= 20 for r in reports), reports
    assert max(r.map_entries for r in reports) > 20  # and it did take several elements at once


def test_a_pass_stops_at_its_map_end_and_leaves_the_rest_dirty(tmp_path: Path) -> None:
    """A small map ends the pass early: what lies above the map end stays dirty and the partition due."""
    url = str(tmp_path / "r")
    appends = [[(f"k{i}-{j}".encode(), b"v") for j in range(10)] for i in range(8)] + [[(b"tail", b"v")]]
    _make(url, appends, {})
    root = LogRoot(url)
    root.dedupe_buffer_size = 25 * MAP_ENTRY_BYTES  # room for two appends of ten new keys, not three
    log = root.partition("t", 0)
    compactor = log.cleaner.compactor
    assert compactor is not None
    assert log.compact(now=T0) >= 1
    report = compactor.last_pass
    assert report is not None and report.partial
    assert (report.map_start, report.map_end, report.cleanable_end) == (0, 20, 80)
    assert report.map_entries == 20
    plan = compactor.plan(log.view(), T0, None)
    assert plan.due and plan.first_dirty == 1  # one compacted object [0, 20), then the dirty appends
    assert log.view().segments[0].end_offset == 20
    assert log.compact(now=T0) >= 1
    report = compactor.last_pass
    assert report is not None and (report.map_start, report.map_end) == (20, 40)


def test_a_value_in_a_later_element_supersedes_across_passes(tmp_path: Path) -> None:
    """A key written early and again after several map-fulls: the early value goes once the map reaches
    the later one, though the passes in between cleaned its element without it."""
    url = str(tmp_path / "r")
    appends = [[(b"hot", b"old")]] + [[(f"k{i}-{j}".encode(), b"v") for j in range(10)] for i in range(6)]
    appends += [[(b"hot", b"new")], [(b"tail", b"v")]]
    _make(url, appends, {})
    records, passes, reports = _compact_until_done(url, 12 * MAP_ENTRY_BYTES)
    assert passes > 2 and reports[0].partial
    assert (b"hot", b"old") not in [(k, v) for _, k, v in records]
    assert (b"hot", b"new") in [(k, v) for _, k, v in records]
    assert records == _expected(_written(appends))


def test_offset_map_keeps_the_greatest_offset_and_refuses_what_does_not_fit() -> None:
    import numpy as np
    import pyarrow as pa

    offset_map = OffsetMap(3 * MAP_ENTRY_BYTES)
    hi, lo = key_hashes(pa.array([b"a", b"b"], pa.binary()))
    assert offset_map.add(hi, lo, np.array([1, 2], np.int64))
    hi2, lo2 = key_hashes(pa.array([b"a", b"c"], pa.binary()))
    assert offset_map.add(hi2, lo2, np.array([5, 6], np.int64))  # 3 keys: fits
    hi3, lo3 = key_hashes(pa.array([b"d"], pa.binary()))
    assert not offset_map.add(hi3, lo3, np.array([7], np.int64))  # a 4th does not
    q_hi, q_lo = key_hashes(pa.array([b"a", b"b", b"c", b"d"], pa.binary()))
    assert offset_map.lookup(q_hi, q_lo).tolist() == [5, 2, 6, -1]
    assert len(offset_map) == 3


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    appends=st.lists(
        st.lists(
            st.tuples(st.integers(0, 40), st.one_of(st.none(), st.integers(0, 3))),
            min_size=1,
            max_size=15,
        ),
        min_size=2,
        max_size=14,
    ),
    limit_entries=st.integers(1, 30),
    segment_bytes=st.sampled_from([1_024, 3_000, 64 * 1024 * 1024]),
)
def test_property_small_limits_read_as_one_large_pass(
    tmp_path_factory: Any, appends: list[list[tuple[int, int | None]]], limit_entries: int, segment_bytes: int
) -> None:
    """Random keys, values and tombstones, random small limits: the same records as one large pass."""
    data: list[list[tuple[bytes | None, bytes | None]]] = [
        [(b"k%d" % k, None if v is None else b"v%d" % v) for k, v in batch] for batch in appends
    ]
    data.append([(b"tail-only", b"x")])
    base = tmp_path_factory.mktemp("prop")
    _make(str(base / "a"), data, {"segment.bytes": segment_bytes})
    shutil.copytree(base / "a", base / "b")
    large, _, large_reports = _compact_until_done(str(base / "a"), 128 * 1024 * 1024)
    small, _, small_reports = _compact_until_done(str(base / "b"), limit_entries * MAP_ENTRY_BYTES)
    assert large == _expected(_written(data))
    assert small == large
    # Both ways of keying the map are exercised: exact keys in the large pass, hashes in a small first pass
    # whose records do not fit.
    assert all(r.exact_keys for r in large_reports)
    if len(_written(data)) > limit_entries:
        assert not small_reports[0].exact_keys


def test_keys_too_long_for_an_exact_map_are_hashed_and_the_pass_still_maps_everything(tmp_path: Path) -> None:
    """60 records fit a map of 100 entries, but their 300-byte keys do not fit its 2,400 bytes as keys: the
    map turns to hashes midway, still in one pass, and reads as a large pass keyed exactly."""
    rng = random.Random(5)
    appends = [[(b"%0300d" % rng.randrange(30), b"v%d" % i) for i in range(6)] for _ in range(10)]
    appends.append([(b"tail", b"x")])
    _make(str(tmp_path / "a"), appends, {})
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    records, passes, reports = _compact_until_done(str(tmp_path / "a"), 100 * MAP_ENTRY_BYTES)
    large, _, large_reports = _compact_until_done(str(tmp_path / "b"), 128 * 1024 * 1024)
    assert records == large == _expected(_written(appends))
    assert passes == 1 and not reports[0].partial and not reports[0].exact_keys
    assert large_reports[0].exact_keys


def test_a_pass_whose_map_is_small_reads_each_element_once(tmp_path: Path, monkeypatch: Any) -> None:
    """Elements kept from the map step within the limit the map leaves unused are not read again; with a
    map that fills its limit, only ``segment.bytes`` of them are kept and the rest are read twice."""
    appends = _appends(random.Random(3), 12, 20, 50) + [[(b"tail", b"x")]]
    _make(str(tmp_path / "a"), appends, {"segment.bytes": 1_024})
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    reads: list[str] = []
    original = LogCompactor._read

    def counting(self: LogCompactor, ref: Any) -> Any:
        reads.append(ref.key)
        return original(self, ref)

    monkeypatch.setattr(LogCompactor, "_read", counting)
    _compact_until_done(str(tmp_path / "a"), 1024 * 1024)
    assert len(reads) == len(set(reads)) == 13  # every element once (the tail for the map only)
    reads.clear()
    _compact_until_done(str(tmp_path / "b"), 60 * MAP_ENTRY_BYTES)
    assert len(reads) > len(set(reads))


def test_dedupe_keeps_the_greatest_offset_per_hash_when_high_halves_are_shared() -> None:
    """Few distinct high halves (as if 64-bit collisions were common): one entry per (high, low), sorted."""
    import numpy as np

    rng = np.random.default_rng(3)
    for trial in range(200):
        n = int(rng.integers(0, 60))
        hi = rng.integers(0, 4, n).astype(np.uint64)
        lo = rng.integers(0, 3 if trial % 2 else 1, n).astype(np.uint64)
        off = rng.permutation(1000)[:n].astype(np.int64)
        h, low, o = _dedupe([hi], [lo], [off])
        want: dict[tuple[int, int], int] = {}
        for a, b, c in zip(hi.tolist(), lo.tolist(), off.tolist(), strict=True):
            want[(a, b)] = max(want.get((a, b), -1), c)
        got = {(a, b): c for a, b, c in zip(h.tolist(), low.tolist(), o.tolist(), strict=True)}
        assert got == want and len(h) == len(want)
        assert list(zip(h.tolist(), low.tolist(), strict=True)) == sorted(want)


def test_pass_map_answers_alike_with_exact_keys_and_with_hashes() -> None:
    """Both kinds of map, by offset (records of elements the map took) and by key (records below it)."""
    import numpy as np
    import pyarrow as pa

    def build(exact: bool) -> PassMap:
        pass_map = PassMap(1024 * 1024, exact=exact)
        assert pass_map.add(pa.array([b"a", b"b", b"a"]), pa.array([10, 11, 12], pa.int64()))
        assert pass_map.add(pa.array([b"c", b"b"]), pa.array([13, 14], pa.int64()))
        pass_map.finish()
        return pass_map

    for exact in (True, False):
        pass_map = build(exact)
        assert pass_map.exact is exact and len(pass_map) == 3
        mapped = pass_map.superseded(pa.array([b"a", b"b", b"a", b"c", b"b"]), np.arange(10, 15), True)
        assert mapped.tolist() == [True, True, False, False, False]
        below = pass_map.superseded(pa.array([b"a", b"b", b"c", b"z"]), np.array([1, 2, 3, 4]), False)
        assert below.tolist() == [True, True, True, False]  # z: not in the map, nothing supersedes it


def test_an_exact_map_whose_keys_outgrow_its_limit_turns_to_hashes_and_keeps_every_entry() -> None:
    import numpy as np
    import pyarrow as pa

    pass_map = PassMap(40 * MAP_ENTRY_BYTES, exact=True)  # 960 bytes
    keys = [b"%0100d" % i for i in range(6)]  # 6 distinct keys of 100 bytes: more than half the limit
    assert pass_map.add(pa.array(keys), pa.array(np.arange(6), pa.int64()))
    assert pass_map.exact
    assert pass_map.add(pa.array(keys[:3]), pa.array(np.arange(6, 9), pa.int64()))
    assert not pass_map.exact
    pass_map.finish()
    assert len(pass_map) == 6
    found = pass_map.superseded(pa.array(keys), np.arange(6), False)
    assert found.tolist() == [True, True, True, False, False, False]
