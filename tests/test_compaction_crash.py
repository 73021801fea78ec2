"""Compaction under crashes and concurrency: a hypothesis state machine against a real compactor process.

A compactor process maintains (compacts, merges, collects garbage) a compacted topic in a tight loop
while two writers append keyed records and tombstones concurrently (separate roots, racing on the
same partition) and a reader reads the whole partition after every step. The machine SIGKILLs the
compactor at random points, mid-pass more often than not, and starts another. After every step:

* offsets never change: every record read is the one acknowledged at that offset, in offset order;
* the log start and end only move forward, and the chain resolves without a hole (``verify``);
* every key's last acknowledged record is readable, unless it is a tombstone old enough to have
  expired, and then no older record of that key is readable either (no value comes back);

and at the end, one more pass leaves no superseded record below the last element.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from segment_format.inspect.verify import verify
from segment_format.records import now_ms, payload_batch
from segment_format.root import LogRoot
from segment_format.segment import BatchMeta
from tests.soak import soak

SPAWN = multiprocessing.get_context("spawn")
DELETE_RETENTION_MS = 1_500
CONFIG = {
    "cleanup.policy": "compact",
    "storage.layout": "partitioned",  # compaction of appended objects under kills (shared: once moved, 10.2)
    "compression.type": "none",
    "file.delete.delay.ms": 4_000,
    "writer.max.staleness.ms": 1_500,  # a pass on a loaded CI machine takes hundreds of ms: W must cover it
    "delete.retention.ms": DELETE_RETENTION_MS,
    "min.cleanable.dirty.ratio": 0.2,
    "segment.bytes": 4_096,
    "auto.maintenance.enable": False,
}
#: A tombstone older than this may have expired: delete.retention.ms after its append, and
#: max(delete.retention.ms, D) + ε after its first compaction, which comes after its append.
EXPIRY_MS = max(DELETE_RETENTION_MS, CONFIG["file.delete.delay.ms"]) + 1_000


def compactor_loop(url: str, started: Any, dedupe_buffer_size: int) -> None:
    """The compactor process: maintain the topic again and again until killed."""
    root = LogRoot(url)
    root.dedupe_buffer_size = dedupe_buffer_size
    started.set()
    while True:
        root.partition("t", 0, root.topic("t", refresh=True)).maintain()


#: What the runs did, summed over every example, so that the test can show it exercised what it claims.
SEEN = {"kills": 0, "compacted_objects": 0, "expired_tombstones": 0, "superseded_dropped": 0, "checks": 0}


class CompactionMachine(RuleBasedStateMachine):
    """The model: every acknowledged record by offset, with when it was acknowledged."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="plog-compaction-")
        self.url = os.path.join(self.dir, "root")
        LogRoot(self.url).catalog.create("t", 1, CONFIG)
        self.writers = [LogRoot(self.url).partition("t", 0) for _ in range(2)]
        self.acked: dict[int, tuple[bytes, bytes | None, int]] = {}  # offset -> (key, value, acknowledged ms)
        self.start = self.end = 0
        self.kills = self.sequence = 0
        self.compactor: Any = None
        self._start_compactor()

    def _start_compactor(self) -> None:
        started = SPAWN.Event()
        # Every other compactor has an offset map of a few keys: its passes end at the map end (11.6).
        limit = 6 * 24 if self.kills % 2 else 128 * 1024 * 1024
        self.compactor = SPAWN.Process(target=compactor_loop, args=(self.url, started, limit), daemon=True)
        self.compactor.start()
        assert started.wait(60), "the compactor process did not start"

    @rule(
        batches=st.lists(
            st.lists(st.tuples(st.integers(0, 24), st.integers(0, 4)), min_size=1, max_size=12), min_size=2, max_size=2
        ),
        kill_after_ms=st.one_of(st.none(), st.none(), st.integers(0, 300)),
    )
    def append_concurrently(self, batches: list[list[tuple[int, int]]], kill_after_ms: int | None) -> None:
        """Both writers append at once, each append acknowledged with its offsets; the compactor may be
        SIGKILLed while they do."""
        errors: list[BaseException] = []

        def write(log: Any, records: list[tuple[int, int]]) -> None:
            try:
                keys = [b"k%d" % k for k, _ in records]
                values = []
                for _, kind in records:
                    self.sequence += 1
                    values.append(None if kind == 0 else b"v%d" % self.sequence)  # one in five is a tombstone
                result = log.append([(payload_batch([now_ms()] * len(keys), keys, values), BatchMeta())], durable=False)
                at = now_ms()
                for i, (key, value) in enumerate(zip(keys, values, strict=True)):
                    self.acked[result.base_offsets[0] + i] = (key, value, at)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(w, b)) for w, b in zip(self.writers, batches, strict=True)]
        for t in threads:
            t.start()
        if kill_after_ms is not None:
            self.kill_compactor(kill_after_ms)
        for t in threads:
            t.join(60)
        assert not errors, errors

    @rule(delay_ms=st.integers(0, 400))
    def kill_compactor(self, delay_ms: int) -> None:
        """SIGKILL the compactor after ``delay_ms`` (most likely mid-pass: it never rests), start another."""
        time.sleep(delay_ms / 1000)
        os.kill(self.compactor.pid, signal.SIGKILL)
        self.compactor.join(30)
        assert self.compactor.exitcode == -signal.SIGKILL, self.compactor.exitcode
        self.kills += 1
        SEEN["kills"] += 1
        self._start_compactor()

    @rule(ms=st.sampled_from([300, 1_500, 3_500]))
    def let_time_pass(self, ms: int) -> None:
        """Let the compactor work, D pass, tombstones age."""
        time.sleep(ms / 1000)

    @invariant()
    def log_keeps_its_guarantees(self) -> None:
        reader = LogRoot(self.url).partition("t", 0)
        view = reader.view()
        assert view.start_offset >= self.start and view.end_offset >= self.end, (view, self.start, self.end)
        self.start, self.end = view.start_offset, view.end_offset
        read = _read_all(reader)
        offsets = [o for o, _, _ in read]
        assert offsets == sorted(set(offsets))
        for offset, key, value in read:
            assert offset in self.acked, f"offset {offset} was never acknowledged"
            assert self.acked[offset][:2] == (key, value), (offset, self.acked[offset], key, value)
        present = {o for o, _, _ in read}
        last: dict[bytes, int] = {}
        for offset in sorted(self.acked):
            last[self.acked[offset][0]] = offset
        now = now_ms()
        for key, offset in last.items():
            if offset in present:
                continue
            _, value, acked_ms = self.acked[offset]
            assert value is None and now - acked_ms >= min(EXPIRY_MS, DELETE_RETENTION_MS), (
                f"the last record of {key!r} (offset {offset}) is gone"
            )
            older = [o for o, k, _ in read if k == key]
            assert not older, f"{key!r}'s tombstone at {offset} expired, but older records came back: {older}"
            SEEN["expired_tombstones"] += 1
        assert verify(LogRoot(self.url), "t").ok
        SEEN["checks"] += 1
        SEEN["superseded_dropped"] = max(SEEN["superseded_dropped"], len(self.acked) - len(read))
        compacted = sum(".c" in ref.key.rsplit("/", 1)[-1] for ref in view.segments)
        SEEN["compacted_objects"] = max(SEEN["compacted_objects"], compacted)

    def teardown(self) -> None:
        try:
            if SEEN["compacted_objects"] == 0:
                self._let_the_live_compactor_compact()
            if self.compactor is not None and self.compactor.is_alive():
                os.kill(self.compactor.pid, signal.SIGKILL)
                self.compactor.join(30)
            if self.acked:
                self._check_a_last_pass_leaves_nothing_superseded()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _let_the_live_compactor_compact(self) -> None:
        """A run that has not shown the claims above about compacted objects yet (its compactors were all
        killed before their first compaction, or it appended little or nothing): keep both writers appending
        keys written before, as the live compactor works, until it has written a compacted object, checking
        every invariant after each round."""
        deadline = time.monotonic() + 90
        round_ = 0
        while time.monotonic() < deadline:
            view = LogRoot(self.url).partition("t", 0).view()
            if any(".c" in ref.key.rsplit("/", 1)[-1] for ref in view.segments):
                break
            round_ += 1
            self.append_concurrently([[(k % 6, 1 + (k + round_) % 4) for k in range(12)]] * 2, None)
            self.log_keeps_its_guarantees()
            time.sleep(0.3)
        self.log_keeps_its_guarantees()

    def _check_a_last_pass_leaves_nothing_superseded(self) -> None:
        log = LogRoot(self.url).partition("t", 0)
        log.compact(force=True)
        view = log.view()
        tail_base = view.segments[-1].base_offset
        read = _read_all(log)
        last: dict[bytes, int] = {}
        for offset, key, _ in read:
            last[key] = offset
        superseded = [(o, k) for o, k, _ in read if o < tail_base and last[k] != o]
        assert not superseded, f"records superseded below the last element after a full pass: {superseded[:5]}"


def _read_all(log: Any) -> list[tuple[int, bytes, bytes | None]]:
    out: list[tuple[int, bytes, bytes | None]] = []
    offset = log.view().start_offset
    while True:
        batches, offset = log.read(offset)
        if not batches and offset >= log.view(refresh=False).end_offset:
            return out
        for b in batches:
            out += zip(b.column(0).to_pylist(), b.column(2).to_pylist(), b.column(3).to_pylist(), strict=True)


@pytest.mark.slow
def test_compaction_keeps_its_guarantees_through_sigkills_and_concurrent_writers() -> None:
    machine = settings(
        max_examples=soak(ci=2, long=8),
        stateful_step_count=soak(ci=12, long=20),
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=False,
    )(CompactionMachine)
    machine.TestCase().runTest()
    print("compaction state machine:", SEEN)
    # The runs compacted, dropped superseded records, and killed compactors; a tombstone expiring is
    # likelier in long runs and is not required of every one.
    assert SEEN["kills"] >= 2 and SEEN["compacted_objects"] >= 1 and SEEN["superseded_dropped"] > 0, SEEN
