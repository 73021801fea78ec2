"""Leases, epochs, fencing, idempotent appends and transaction decisions (PROTOCOL.md 11)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from coordinator.leases import Lease
from coordinator.transactions import Decision, TransactionCoordinator, allocate_producer_id
from segment_format.errors import FencedError, OutOfOrderSequenceError, StorageError
from segment_format.log.partition_log import PartitionLog
from segment_format.log.reader import ABORTED, COMMITTED, READ_COMMITTED, READ_UNCOMMITTED
from segment_format.records import payload_batch
from segment_format.segment import ATTR_TRANSACTIONAL, BatchMeta
from segment_format.stores import LocalStore, MemoryStore
from segment_format.topic import validate_config

CONFIG = validate_config({"writer.max.staleness.ms": 1})


def payload(values: list[bytes]) -> pa.RecordBatch:
    return payload_batch([1_000] * len(values), [None] * len(values), values)


def all_values(log: PartitionLog, **read_args: object) -> list[bytes]:
    batches, _ = log.read(log.view().start_offset, **read_args)  # type: ignore[arg-type]
    return [v for b in batches for v in b.column("value").to_pylist()]


# ---------------------------------------------------------------- producer ids and decisions


def test_producer_ids_are_unique_across_threads(tmp_path: Path) -> None:
    import concurrent.futures

    store = LocalStore(str(tmp_path))
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(lambda _: allocate_producer_id(store), range(40)))
    assert sorted(ids) == list(range(40))


def test_producer_id_allocation_looks_up_log_n_ids_and_never_lists(tmp_path: Path) -> None:
    """Ids stay contiguous from 0, and finding the next one costs O(log n) lookups, not a listing of all."""
    store = LocalStore(str(tmp_path))
    for n in range(1000):
        store.put_if_absent(f"_coordinator/producer-ids/{n:020d}.json", b"{}")
    lookups: list[str] = []
    real_exists = store.exists

    def counting_exists(key: str) -> bool:
        lookups.append(key)
        return real_exists(key)

    real_list = store.list

    def no_listing(prefix: str) -> list:
        if prefix.startswith("_coordinator/"):  # the protocol object (_protocol/) is read once per root
            raise AssertionError(f"listed {prefix!r}")
        return real_list(prefix)

    store.exists = counting_exists  # type: ignore[method-assign]
    store.list = no_listing  # type: ignore[method-assign]
    assert allocate_producer_id(store) == 1000
    assert len(lookups) <= 2 * 11 + 2, lookups  # gallop to 1024, bisect down: about 2 log2(n)
    assert allocate_producer_id(store) == 1001
    # A stale start (another allocator took ids meanwhile) only moves the create along.
    store.exists = lambda key: key.endswith(f"{0:020d}.json")  # type: ignore[method-assign]
    assert allocate_producer_id(store) == 1002


def test_first_decision_wins_and_is_cached() -> None:
    coord = TransactionCoordinator(MemoryStore(f"coord-{time.time_ns()}"))
    committed = Decision(COMMITTED, 7, 3, batches={"t": {"0": [[10, 19]]}})
    assert coord.decide(committed).state == COMMITTED
    assert coord.abort_if_undecided(7, 3).state == COMMITTED  # the commit stands
    assert coord.resolve(7, 3, "t", 0, 10, 19) == COMMITTED
    assert coord.resolve(7, 3, "t", 0, 20, 29) == ABORTED  # same txn, not listed: a failed attempt's batch
    assert coord.resolve(7, 4, "t", 0, 30, 39) is None


def test_init_transactions_fences_and_aborts_the_zombie() -> None:
    coord = TransactionCoordinator(MemoryStore(f"coord-{time.time_ns()}"))
    pid, fence_a, holder_a = coord.init_transactions("app")
    txn_a = coord.next_epoch("app", holder_a, fence_a)  # the zombie's open transaction
    pid_b, fence_b, holder_b = coord.init_transactions("app")
    assert pid_b == pid and fence_b > txn_a
    assert coord.decision(pid, txn_a).state == ABORTED  # type: ignore[union-attr]
    with pytest.raises(FencedError):
        coord.next_epoch("app", holder_a, txn_a)  # the zombie cannot begin another transaction
    late = coord.decide(Decision(COMMITTED, pid, txn_a, batches={"t": {"0": [[0, 0]]}}))
    assert late.state == ABORTED  # nor commit the old one


# ---------------------------------------------------------------- idempotence


class FlakyStore(MemoryStore):
    """Creates the object, then reports a failure: the ambiguous timeout of PROTOCOL.md 11.1."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.fail_next = 0

    def put_if_absent(self, key: str, data: bytes, *, durable: bool = True) -> bool:
        created = super().put_if_absent(key, data, durable=durable)
        if self.fail_next and key.endswith(".arrow"):
            self.fail_next -= 1
            self.fail_reads = self.fail_reads_after_put
            raise StorageError(f"timeout writing {key} (it landed)")
        return created

    def get_range(self, key: str, start: int, end: int) -> bytes:
        if self.fail_reads:
            raise StorageError(f"timeout reading {key}")
        return super().get_range(key, start, end)

    fail_reads = False
    fail_reads_after_put = False


def test_retry_after_ambiguous_failure_is_not_appended_twice() -> None:
    store = FlakyStore(f"flaky-{time.time_ns()}")
    log = PartitionLog(store, "p/", CONFIG)
    log.append([(payload([b"a"]), BatchMeta(5, 0, 0))])
    store.fail_next = 2
    result = log.append([(payload([b"b", b"c"]), BatchMeta(5, 0, 1))])
    assert result.base_offsets == [1]
    assert all_values(log) == [b"a", b"b", b"c"]


def test_retry_after_a_failed_append_finds_the_landed_batch_past_other_writers() -> None:
    store = FlakyStore(f"seq-{time.time_ns()}")
    log = PartitionLog(store, "p/", CONFIG)
    log.append([(payload([b"a"]), BatchMeta(9, 0, 0))])
    store.fail_next, store.fail_reads_after_put = 1, True  # the write lands, its answer and the check are lost
    with pytest.raises(StorageError):
        log.append([(payload([b"b"]), BatchMeta(9, 0, 1))])
    store.fail_next, store.fail_reads, store.fail_reads_after_put = 0, False, False
    PartitionLog(store, "p/", CONFIG).append([(payload([b"other"]), BatchMeta())])  # someone appends meanwhile
    result = log.append([(payload([b"b"]), BatchMeta(9, 0, 1))])  # the producer retries the same batch
    assert result.base_offsets == [1]
    assert all_values(log) == [b"a", b"b", b"other"]


def test_sequence_gap_is_an_error_and_writes_nothing() -> None:
    log = PartitionLog(MemoryStore(f"gap-{time.time_ns()}"), "p/", CONFIG)
    log.append([(payload([b"a", b"b"]), BatchMeta(3, 0, 0))])
    with pytest.raises(OutOfOrderSequenceError, match="expected 2"):
        log.append([(payload([b"c"]), BatchMeta(3, 0, 5))])
    assert all_values(log) == [b"a", b"b"]


# ---------------------------------------------------------------- read_committed


def test_read_committed_hides_open_and_aborted_transactions() -> None:
    store = MemoryStore(f"rc-{time.time_ns()}")
    coord = TransactionCoordinator(store)
    log = PartitionLog(store, "topics/t/x/0/", CONFIG, topic="t", partition=0)
    txn = BatchMeta(11, 0, -1, ATTR_TRANSACTIONAL, transaction=1)
    log.append([(payload([b"plain1"]), BatchMeta())])
    open_txn = log.append([(payload([b"t1", b"t2"]), txn)])
    log.append([(payload([b"plain2"]), BatchMeta())])
    read = {"isolation": READ_COMMITTED, "resolver": coord.resolve}
    assert all_values(log, **read) == [b"plain1"]  # stops at the last stable offset
    assert log.last_stable_offset(coord.resolve) == open_txn.base_offsets[0]
    assert all_values(log, isolation=READ_UNCOMMITTED) == [b"plain1", b"t1", b"t2", b"plain2"]
    coord.decide(Decision(COMMITTED, 11, 1, batches={"t": {"0": [[1, 2]]}}))
    assert all_values(log, **read) == [b"plain1", b"t1", b"t2", b"plain2"]
    aborted = BatchMeta(11, 0, -1, ATTR_TRANSACTIONAL, transaction=2)
    log.append([(payload([b"gone"]), aborted)])
    coord.abort_if_undecided(11, 2)
    assert all_values(log, **read) == [b"plain1", b"t1", b"t2", b"plain2"]
    assert log.last_stable_offset(coord.resolve) == log.view().end_offset


# ---------------------------------------------------------------- leases with real processes

HOLDER = textwrap.dedent(
    """
    import sys, time
    from segment_format.stores import LocalStore
    from coordinator.leases import Lease
    lease = Lease(LocalStore(sys.argv[1]), "partition=t-0", holder_id="victim", lease_ms=800)
    assert lease.try_acquire()
    print(lease.epoch, flush=True)
    while True:
        lease.renew()
        time.sleep(0.1)
    """
)


@pytest.mark.slow
def test_lease_survives_a_killed_holder(tmp_path: Path) -> None:
    for round_ in range(3):
        child = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
        )
        assert child.stdout is not None
        victim_epoch = int(child.stdout.readline())
        rival = Lease(LocalStore(str(tmp_path)), "partition=t-0", holder_id=f"rival-{round_}", lease_ms=800)
        assert not rival.try_acquire()  # renewed and live: no takeover
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        deadline = time.monotonic() + 10
        while not rival.try_acquire():
            assert time.monotonic() < deadline, "the lease of a killed holder was never taken over"
            time.sleep(0.05)
        assert rival.epoch == victim_epoch + 1
        rival.release()


# ---------------------------------------------------------------- a stateful model of writers, takeovers and crashes


class WritersAndLeases(RuleBasedStateMachine):
    """Random interleavings of lease takeovers, appends by current and zombie holders, and crashes.

    Invariants: no two live holders of one epoch; writer epochs along the chain
    never decrease; the log holds exactly the acknowledged records, in order.
    """

    def __init__(self) -> None:
        super().__init__()
        self.store = MemoryStore(f"sm-{time.time_ns()}")
        self.writers: dict[str, tuple[Lease, PartitionLog]] = {}
        self.acked: list[bytes] = []
        self.counter = 0
        self.clock_offset = 0

    def _writer(self, name: str) -> tuple[Lease, PartitionLog]:
        if name not in self.writers:
            lease = Lease(self.store, "partition=t-0", holder_id=name, lease_ms=60_000, max_clock_skew_ms=0)
            self.writers[name] = (lease, PartitionLog(self.store, "p/", CONFIG))
        return self.writers[name]

    @rule(name=st.sampled_from(["w1", "w2", "w3"]))
    def take_over(self, name: str) -> None:
        lease, _ = self._writer(name)
        state = lease.state()
        if state.holder is not None and state.holder != name:
            # Force expiry of the current holder: its lease object stays, a new epoch supersedes it.
            body = json.dumps({"holder": name, "epoch": state.epoch + 1, "expires_ms": 2**62, "created_ms": 0})
            if self.store.put_if_absent(
                f"_coordinator/leases/partition=t-0/{state.epoch + 1:020d}.json", body.encode()
            ):
                lease.epoch, lease._expires_ms = state.epoch + 1, 2**62
        else:
            lease.try_acquire()

    @rule(name=st.sampled_from(["w1", "w2", "w3"]), n=st.integers(1, 3))
    def append(self, name: str, n: int) -> None:
        lease, log = self._writer(name)
        if lease.epoch is None:
            return
        values = [f"{name}-{self.counter + i}".encode() for i in range(n)]
        self.counter += n
        log._tail = None if self.counter % 2 else log._tail  # sometimes stale knowledge, sometimes fresh
        try:
            log.append([(payload(values), BatchMeta())], writer_epoch=lease.epoch)
        except FencedError:
            assert lease.state().epoch > lease.epoch  # fenced only by a newer epoch
            return
        self.acked.extend(values)

    @rule(name=st.sampled_from(["w1", "w2", "w3"]))
    def crash(self, name: str) -> None:
        self.writers.pop(name, None)  # its memory is gone; its objects stay

    @invariant()
    def epochs_never_decrease_and_log_is_exactly_the_acks(self) -> None:
        log = PartitionLog(self.store, "p/", CONFIG)
        view = log.view()
        stamped = [log.index(s).meta.writer_epoch for s in view.segments]
        epochs = [-1 if epoch is None else epoch for epoch in stamped]
        assert epochs == sorted(epochs)
        assert all_values(log) == self.acked
        heads = [i.key for i in self.store.list("_coordinator/leases/partition=t-0/") if i.key.count("/") == 3]
        assert len(heads) == len(set(heads))


TestWritersAndLeases = WritersAndLeases.TestCase
TestWritersAndLeases.settings = settings(max_examples=30, stateful_step_count=25, deadline=None)
