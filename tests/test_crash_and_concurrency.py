"""Crash safety and concurrency, with real processes.

Every writer, reader and maintenance worker here is a separate process started
with multiprocessing's ``spawn`` method, and crashes are real ``SIGKILL``s. The
processes synchronise only through files, pipes and the log itself, and every
wait is bounded. What is checked at the end is what a user relies on:

* every acknowledged record (``future.get()`` or ``send_batch`` returned) is in
  the log exactly once, at the offset it was acknowledged with;
* no record appears twice, every record decodes and every CRC verifies;
* offsets of each partition are contiguous from 0;
* the log can still be appended to after the crashes.

Each child appends what it got acknowledged to an fsync'd "acks" file (one JSON
line per acknowledged write) *after* the acknowledgement, so a line in that
file is a promise the log must keep; a write acknowledged but not yet noted
when the child was killed is merely allowed to be present.

The random seed is printed (``-s``) and can be pinned with ``PLOG_TEST_SEED``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import multiprocessing
import os
import random
import signal
import time
import traceback
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from pyspark_logsource import Consumer, LogStore, Producer, TopicPartition
from segment_format.layout import appended_name
from segment_format.root import LogRoot
from segment_format.segment import raw_messages, read_batches
from segment_format.stores import TEMP_PREFIX, LocalStore

SPAWN = multiprocessing.get_context("spawn")
#: Longest a test waits for any one thing a child process should do.
WAIT_S = 60.0


def _seed(name: str) -> int:
    pinned = os.environ.get("PLOG_TEST_SEED")
    seed = int(pinned) if pinned else random.SystemRandom().randrange(2**32)
    print(f"{name}: seed {seed} (PLOG_TEST_SEED={seed} to repeat)")
    return seed


# ----------------------------------------------------------------------------- waiting


def _wait_until(predicate: Any, what: str, timeout: float = WAIT_S) -> None:
    """Wait until ``predicate()`` holds (a file appeared...); bounded by ``timeout``."""
    deadline = time.monotonic() + timeout
    pause = 0.001
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(pause)
        pause = min(pause * 2, 0.02)


def _wait_for_file(path: Path, timeout: float = WAIT_S) -> None:
    _wait_until(path.exists, f"file {path}", timeout)


def _touch_atomically(path: Path, text: str = "") -> None:
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(text)
    os.replace(tmp, path)


def _recv(conn: Any, proc: Any, what: str, timeout: float = WAIT_S) -> tuple:
    """The next message of a child, failing with its traceback if it reported an error."""
    if not conn.poll(timeout):
        raise TimeoutError(
            f"child {proc.name} sent nothing for {timeout} s while we waited for {what} "
            f"(alive={proc.is_alive()}, exitcode={proc.exitcode})"
        )
    try:
        message = conn.recv()
    except EOFError:
        proc.join(WAIT_S)
        raise AssertionError(f"child {proc.name} exited (code {proc.exitcode}) while we waited for {what}") from None
    if message[0] == "error":
        raise AssertionError(f"child {proc.name} failed:\n{message[1]}")
    return message


def _join_ok(proc: Any, timeout: float = WAIT_S) -> None:
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join(WAIT_S)
        raise AssertionError(f"child {proc.name} did not finish within {timeout} s")
    assert proc.exitcode == 0, f"child {proc.name} exited with code {proc.exitcode}"


def _sigkill(proc: Any) -> None:
    """SIGKILL a child and check it really died of it (not of an error of its own)."""
    if proc.is_alive():
        os.kill(proc.pid, signal.SIGKILL)
    proc.join(WAIT_S)
    assert not proc.is_alive(), f"{proc.name} survived SIGKILL"
    assert proc.exitcode in (-signal.SIGKILL, 0), f"child {proc.name} exited with code {proc.exitcode}"


# ----------------------------------------------------------------------------- acks files


def _note_ack(path: str, entry: dict) -> None:
    """Append one acknowledged write to the acks file, durably."""
    with open(path, "a") as f:
        f.write(json.dumps(entry) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _read_acks(path: Path) -> list[dict]:
    """The complete lines of an acks file (a line torn by a kill is not an acknowledgement)."""
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text.split("\n")[:-1]]


# ----------------------------------------------------------------------------- children


def _child(fn: Any) -> Any:
    """Run a child's body, reporting any exception (with traceback) over ``conn`` before failing."""

    @functools.wraps(fn)  # keeps the name, so spawn can pickle the target
    def run(conn: Any, *args: Any) -> None:
        try:
            fn(conn, *args)
        except BaseException:
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.send(("error", traceback.format_exc()))
            raise

    return run


def _write_some(
    producer: Producer,
    topic: str,
    name: str,
    seq: int,
    n: int,
    rng: random.Random,
    pad: int = 0,
    keyed: bool = True,
    p_send: float = 0.5,
) -> dict:
    """One acknowledged write of records ``name-seq .. name-(seq+n-1)``; returns its acks entry.

    With probability ``p_send`` ``send`` + ``flush`` + ``future.get()``, else
    one ``send_batch``. The entry says where the log put each record.
    """
    values = [f"{name}-{s}" for s in range(seq, seq + n)]
    payloads = [(v + "|" + rng.randbytes(pad // 2).hex()).encode() if pad else v.encode() for v in values]
    keys = [f"key-{rng.randrange(10_000)}".encode() if keyed else None for _ in values]
    if rng.random() < p_send:
        futures = [producer.send(topic, value=p, key=k) for p, k in zip(payloads, keys, strict=True)]
        if rng.random() < 0.7:
            producer.flush(timeout=WAIT_S)
        placed = [list(f.get(timeout=WAIT_S)[1:3]) for f in futures]
        return {"kind": "send", "values": values, "placed": placed}
    table = pa.table({"key": pa.array(keys, pa.binary()), "value": pa.array(payloads, pa.binary())})
    result = producer.send_batch(topic, table)
    assert result.record_count == n
    return {"kind": "batch", "values": values, "ranges": {str(p): list(r) for p, r in result.offsets.items()}}


@_child
def _crash_writer(
    conn: Any, root: str, topic: str, name: str, acks_path: str, seed: int, max_records: int, barrier: str | None
) -> None:
    """Write numbered records until ``max_records`` (or a SIGKILL), noting each acknowledged write."""
    rng = random.Random(seed)
    producer = Producer(root, acks="all", linger_ms=rng.choice([0, 1, 5]))
    if barrier is not None:
        Path(barrier, f"ready-{name}").touch()
        _wait_for_file(Path(barrier, "go"))
    conn.send(("started",))
    seq = 0
    while seq < max_records:
        n = min(max_records - seq, rng.randint(1, 12))
        entry = _write_some(producer, topic, name, seq, n, rng)
        _note_ack(acks_path, entry)
        seq += n
        conn.send(("acked", seq))
    producer.close()
    conn.send(("done", seq))


@_child
def _ordered_writer(
    conn: Any, root: str, topic: str, name: str, k: int, barrier: str, result_path: str, seed: int, p_send: float
) -> None:
    """Write ``k`` records in many small batches once the barrier opens; save where each one landed."""
    rng = random.Random(seed)
    producer = Producer(root, acks="all", linger_ms=rng.choice([0, 1]))
    Path(barrier, f"ready-{name}").touch()
    _wait_for_file(Path(barrier, "go"))
    entries = []
    seq = 0
    while seq < k:
        n = min(k - seq, rng.randint(1, 8))
        entries.append(_write_some(producer, topic, name, seq, n, rng, p_send=p_send))
        seq += n
    producer.close()
    _touch_atomically(Path(result_path), json.dumps(entries))
    conn.send(("done", seq))


@_child
def _stream_writer(conn: Any, root: str, topic: str, name: str, total: int, barrier: str, seed: int) -> None:
    """Write ``total`` padded records (so that merges happen often) once the barrier opens."""
    rng = random.Random(seed)
    producer = Producer(root, acks="all", linger_ms=1)
    Path(barrier, f"ready-{name}").touch()
    _wait_for_file(Path(barrier, "go"))
    seq = 0
    while seq < total:
        n = min(total - seq, rng.randint(5, 40))
        _write_some(producer, topic, name, seq, n, rng, pad=200)
        seq += n
        # Paced, so that the reader's pauses come while the writer still writes: on a fast machine an
        # unpaced writer is done before the reader's first pause, and no object is merged away under it.
        time.sleep(0.01)
    producer.close()
    conn.send(("done", seq))


def _drain(consumer: Consumer, tp: TopicPartition, got: list[tuple[int, str]]) -> None:
    """Poll without waiting until nothing is left: the position is then the end of the reader's view."""
    while records := consumer.poll(timeout_ms=0, max_records=5000).get(tp, []):
        got.extend((r.offset, (r.value or b"").split(b"|", 1)[0].decode()) for r in records)


def _merged_away(root: str, topic: str, offset: int) -> bool:
    """Whether the appended object at ``offset`` was merged into a rewritten segment and deleted."""
    log_root = LogRoot(root)
    try:
        log = log_root.partition(topic, 0)
        merged = any(s.generation > 0 and s.base_offset <= offset < (s.end_offset or 0) for s in log.view().segments)
        return merged and not log.store.exists(log.prefix + "log/" + appended_name(offset))
    finally:
        log_root.close()


@_child
def _stream_reader(conn: Any, root: str, topic: str, expected: int, barrier: str, result_path: str, seed: int) -> None:
    """Poll partition 0 from offset 0 until ``expected`` records arrived; save (offset, value) in order.

    Twice it plays a consumer that stops polling for a while: it catches up
    (its position is then the end of what it knows of the log) and, if enough
    is still to be written for a merge to cover that position, waits until
    the next object, written meanwhile, has been merged and deleted by the
    maintainer before polling again. Gives up 20 s after the writer finished
    (``writer-done``), so a reader that stops seeing records fails the test
    instead of hanging it.
    """
    rng = random.Random(seed)
    consumer = Consumer(root, auto_offset_reset="earliest", fetch_poll_max_ms=20)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    Path(barrier, "ready-reader").touch()
    writer_done = Path(barrier, "writer-done")
    got: list[tuple[int, str]] = []
    pause_at = [expected // 4, expected // 2]
    pauses: list[dict] = []
    give_up_at = None
    polls = 0
    while len(got) < expected:
        if pause_at and len(got) >= pause_at[0]:
            pause_at.pop(0)
            _drain(consumer, tp, got)
            position = consumer.position(tp)
            if position > expected - 1000:  # under ~230 KB to come: maybe no merge will cover it
                pauses.append({"position": position, "merged_away": None})
                continue
            deadline = time.monotonic() + 30
            while not _merged_away(root, topic, position):
                assert time.monotonic() < deadline, f"object {position} was never merged away"
                time.sleep(0.02)
            pauses.append({"position": position, "merged_away": True})
        records = consumer.poll(timeout_ms=100, max_records=rng.randint(1, 300)).get(tp, [])
        polls += 1
        got.extend((r.offset, (r.value or b"").split(b"|", 1)[0].decode()) for r in records)
        if not records:
            if give_up_at is None and writer_done.exists():
                give_up_at = time.monotonic() + 20
            if give_up_at is not None and time.monotonic() > give_up_at:
                break
    consumer.close()
    _touch_atomically(Path(result_path), json.dumps({"records": got, "polls": polls, "pauses": pauses}))
    conn.send(("done", len(got)))


@_child
def _maintainer(conn: Any, root: str, topic: str, barrier: str, result_path: str) -> None:
    """Run ``LogStore.maintain`` in a loop until the ``stop`` file appears; save the totals."""
    store = LogStore(root)
    Path(barrier, "ready-maintainer").touch()
    totals = {"rounds": 0, "merged": 0, "garbage_deleted": 0}
    stop = Path(barrier, "stop")
    # After the stop, go on (for at most 10 s) until superseded objects were deleted: on a fast machine the
    # writer and reader finish within the 2 s delete delay of the first merge, and the deletions would
    # never be exercised.
    stopped_at: float | None = None
    while True:
        if stopped_at is None and stop.exists():
            stopped_at = time.monotonic()
        if stopped_at is not None and (
            (totals["garbage_deleted"] or not totals["merged"]) or time.monotonic() - stopped_at > 10
        ):
            break
        done = store.maintain(topic)
        totals["rounds"] += 1
        totals["merged"] += done["merged"]
        totals["garbage_deleted"] += done["garbage_deleted"]
    store.close()
    _touch_atomically(Path(result_path), json.dumps(totals))
    conn.send(("done", totals))


def _start(target: Any, name: str, *args: Any) -> tuple[Any, Any]:
    parent_conn, child_conn = SPAWN.Pipe(duplex=False)
    proc = SPAWN.Process(target=target, args=(child_conn, *args), name=name, daemon=True)
    proc.start()
    child_conn.close()
    return proc, parent_conn


# ----------------------------------------------------------------------------- verification


def _read_partition_log(root: str, topic: str, partition: int) -> list[tuple[int, bytes]]:
    """Every record of a partition through ``PartitionLog.view()`` / ``index()``, fully verified.

    Checks that the chain is contiguous from 0, that each segment's index and
    every batch's CRC32C verify, that the object decodes as a plain Arrow IPC
    stream too, and that offsets inside each segment are contiguous.
    """
    log_root = LogRoot(root)
    try:
        log = log_root.partition(topic, partition)
        view = log.view()
        assert view.start_offset == 0, f"partition {partition} starts at {view.start_offset}"
        out: list[tuple[int, bytes]] = []
        position = 0
        for ref in view.segments:
            assert ref.base_offset == position, (
                f"partition {partition}: segment {ref.key} starts at {ref.base_offset}, expected {position}"
            )
            idx = log.index(ref)  # index CRC, and agreement with the chain
            batches = read_batches(log.store, idx, 0, idx.batch_count - 1)  # every batch CRC
            assert len(raw_messages(log.store, idx)) == idx.batch_count
            if not idx.is_run:  # a segment object is a whole IPC stream; a shared topic's run is part of one
                whole = ipc.open_stream(pa.py_buffer(log.store.get(ref.key))).read_all()
                assert whole.num_rows == idx.meta.record_count
            for batch in batches:
                offsets, values = batch.column("offset").to_pylist(), batch.column("value").to_pylist()
                for offset, value in zip(offsets, values, strict=True):
                    assert offset == position, f"partition {partition}: offset {offset}, expected {position}"
                    out.append((offset, value))
                    position += 1
            assert position == idx.meta.next_offset == ref.end_offset
        assert position == view.end_offset
        return out
    finally:
        log_root.close()


def _consume_all(root: str, topic: str, partitions: int) -> dict[int, list[tuple[int, bytes]]]:
    """Every record of every partition through ``Consumer.poll`` (from offset 0 to the end)."""
    with Consumer(root, auto_offset_reset="earliest", max_poll_records=5000) as consumer:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        ends = consumer.end_offsets(tps)
        out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
        deadline = time.monotonic() + WAIT_S
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, "consumer did not reach the end offsets"
            for tp, records in consumer.poll(timeout_ms=100).items():
                out[tp.partition].extend((r.offset, r.value or b"") for r in records)
        assert not any(consumer.poll(timeout_ms=0).values()), "records past the end offsets"
        return out


def _verified_contents(root: str, topic: str, partitions: int) -> dict[int, list[str]]:
    """Per partition, the record names (``writer-seq``) by offset; both read paths must agree.

    Asserts contiguous offsets from 0 and that no record appears twice (in
    any partition).
    """
    consumed = _consume_all(root, topic, partitions)
    contents: dict[int, list[str]] = {}
    for p in range(partitions):
        direct = _read_partition_log(root, topic, p)
        assert consumed[p] == direct, f"partition {p}: Consumer and PartitionLog disagree"
        assert [o for o, _ in direct] == list(range(len(direct))), f"partition {p}: offsets not contiguous"
        contents[p] = [v.split(b"|", 1)[0].decode() for _, v in direct]
    every = [v for values in contents.values() for v in values]
    duplicates = {v for v in every if every.count(v) > 1} if len(set(every)) != len(every) else set()
    assert not duplicates, f"records appear more than once: {sorted(duplicates)[:10]}"
    return contents


def _check_acks(contents: dict[int, list[str]], acks: list[dict]) -> int:
    """Every acknowledged record is where its acknowledgement said; returns how many were checked."""
    checked = 0
    for entry in acks:
        if entry["kind"] == "send":
            for value, (partition, offset) in zip(entry["values"], entry["placed"], strict=True):
                log = contents[partition]
                assert offset < len(log) and log[offset] == value, (
                    f"acknowledged {value} at {partition}/{offset}, log has "
                    f"{log[offset] if offset < len(log) else 'nothing'} there"
                )
                checked += 1
        else:
            found = []
            for partition, (first, last) in entry["ranges"].items():
                log = contents[int(partition)]
                assert last < len(log), f"acked batch range {partition}/{first}..{last} is past the end"
                found.extend(log[first : last + 1])
            # Each partition's rows are the batch's rows for it, in batch order.
            order = {v: i for i, v in enumerate(entry["values"])}
            assert sorted(found, key=lambda v: order.get(v, -1)) == entry["values"], (
                f"acknowledged batch {entry['values'][:3]}... is not exactly in its ranges {entry['ranges']}"
            )
            for partition, (first, last) in entry["ranges"].items():
                run = contents[int(partition)][first : last + 1]
                positions = [order[v] for v in run]
                assert positions == sorted(positions), f"batch rows out of order: {run}"
            checked += len(entry["values"])
    return checked


def _check_writer_order(log: list[str], names: list[str]) -> None:
    """Within one partition, each writer's records appear in its send order (seq increasing)."""
    last: dict[str, int] = defaultdict(lambda: -1)
    for value in log:
        name, seq = value.rsplit("-", 1)
        if name in names:
            assert int(seq) > last[name], f"{value} comes after {name}-{last[name]}"
            last[name] = int(seq)


def _temp_files(root: Path) -> int:
    return sum(1 for p in root.rglob(f"{TEMP_PREFIX}*") if p.is_file())


def _check_still_appendable(root: str, topic: str, partitions: int) -> None:
    """A new producer appends to every partition right at its end offset."""
    with Consumer(root) as consumer:
        ends = consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
    with Producer(root, acks="all") as producer:
        for p in range(partitions):
            meta = producer.send(topic, value=f"after-{p}".encode(), partition=p).get(timeout=WAIT_S)
            assert meta.offset == ends[TopicPartition(topic, p)]


# ----------------------------------------------------------------------------- tests


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_repeated_sigkill_of_a_writer_loses_no_acknowledged_record(tmp_path: Path) -> None:
    """A writer is SIGKILLed at random moments 24 times over; the log keeps every promise it made."""
    rng = random.Random(_seed("crash"))
    root = str(tmp_path / "root")
    topic, partitions = "crash", 3
    LogStore(root).create_topic(topic, partitions)
    acks_files: list[Path] = []
    kills = 0
    moments = []
    started = time.monotonic()
    for round_ in range(24):
        name = f"w{round_}"
        acks = tmp_path / f"acks-{name}"
        acks_files.append(acks)
        seed = rng.randrange(2**32)
        proc, conn = _start(_crash_writer, name, root, topic, name, str(acks), seed, 10**9, None)
        _recv(conn, proc, "start")
        # Wait for 0..4 acknowledged writes, then kill after a random delay from that report:
        # sometimes before the first write, mostly in the middle of one.
        progress = rng.choice([0, 1, 1, 2, 3, 4])
        for _ in range(progress):
            _recv(conn, proc, "progress")
        delay = rng.choice([0.0, rng.uniform(0, 0.004), rng.uniform(0, 0.03)])
        time.sleep(delay)  # the moment of the kill, not a synchronisation
        _sigkill(proc)
        conn.close()
        kills += proc.exitcode == -signal.SIGKILL
        moments.append((progress, round(delay * 1000, 1)))
    # A writer started after all the crashes runs to completion.
    acks = tmp_path / "acks-final"
    acks_files.append(acks)
    seed = rng.randrange(2**32)
    proc, conn = _start(_crash_writer, "final", root, topic, "final", str(acks), seed, 60, None)
    assert _recv(conn, proc, "start")[0] == "started"
    while _recv(conn, proc, "completion")[0] != "done":
        pass
    _join_ok(proc)
    conn.close()

    contents = _verified_contents(root, topic, partitions)
    entries = [e for path in acks_files for e in _read_acks(path)]
    checked = _check_acks(contents, entries)
    for log in contents.values():
        _check_writer_order(log, [f"w{i}" for i in range(24)] + ["final"])
    total = sum(len(v) for v in contents.values())
    assert checked >= 60
    _check_still_appendable(root, topic, partitions)
    # Killed writers may leave temporary files behind: never listed, and removable once no writer is alive.
    leftovers = _temp_files(tmp_path / "root")
    assert LocalStore(root).cleanup_temp_files(0) == leftovers
    assert _temp_files(tmp_path / "root") == 0
    _verified_contents(root, topic, partitions)
    print(
        f"crash: {kills} SIGKILLs (acks waited, delay ms) {moments}; {checked} acknowledged records "
        f"checked, {total} in the log, {leftovers} temp files left by killed writers, "
        f"{time.monotonic() - started:.1f} s"
    )
    assert kills >= 20


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("writers", "k", "p_send"),
    [(2, 1000, 0.5), (3, 600, 0.5), (3, 1500, 0.0)],
    ids=["2-writers-mixed", "3-writers-mixed", "3-writers-send_batch"],
)
def test_concurrent_writers_interleave_without_gap_or_duplicate(
    tmp_path: Path, writers: int, k: int, p_send: float
) -> None:
    """Writers released together append to one partition; the log is exactly their union, each in order.

    Each writer appends back to back (in the last case with ``send_batch``
    only, no linger between writes) for long enough that a writer which keeps
    losing the race for the next offset would run out of attempts.
    """
    rng = random.Random(_seed(f"concurrent-{writers}"))
    root = str(tmp_path / "root")
    topic = "race"
    LogStore(root).create_topic(topic, 1)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    names = [f"c{i}" for i in range(writers)]
    children = [
        (
            name,
            *_start(
                _ordered_writer,
                name,
                root,
                topic,
                name,
                k,
                str(barrier),
                str(tmp_path / f"result-{name}"),
                rng.randrange(2**32),
                p_send,
            ),
        )
        for name in names
    ]
    for name in names:
        _wait_for_file(barrier / f"ready-{name}")
    _touch_atomically(barrier / "go")
    for _name, proc, conn in children:
        assert _recv(conn, proc, "completion") == ("done", k)
        _join_ok(proc)
        conn.close()

    log = _verified_contents(root, topic, 1)[0]
    assert len(log) == writers * k
    assert set(log) == {f"{name}-{s}" for name in names for s in range(k)}
    _check_writer_order(log, names)
    for name in names:
        entries = json.loads((tmp_path / f"result-{name}").read_text())
        assert _check_acks({0: log}, entries) == k
    owners = [v.rsplit("-", 1)[0] for v in log]
    switches = sum(1 for a, b in zip(owners, owners[1:], strict=False) if a != b)
    print(f"concurrent-{writers}: {len(log)} records, writer changes along the log: {switches}")
    _check_still_appendable(root, topic, 1)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_sigkill_during_concurrent_appends(tmp_path: Path) -> None:
    """Two writers race on one partition, one is SIGKILLed mid-run; the survivor finishes; nothing is lost."""
    rng = random.Random(_seed("crash-race"))
    root = str(tmp_path / "root")
    topic, k = "crash-race", 200
    LogStore(root).create_topic(topic, 1)
    acks_files = []
    kills = 0
    for round_ in range(4):
        barrier = tmp_path / f"barrier-{round_}"
        barrier.mkdir()
        names = [f"r{round_}a", f"r{round_}b"]
        children = []
        for name in names:
            acks = tmp_path / f"acks-{name}"
            acks_files.append(acks)
            children.append(
                _start(_crash_writer, name, root, topic, name, str(acks), rng.randrange(2**32), k, str(barrier))
            )
        for name in names:
            _wait_for_file(barrier / f"ready-{name}")
        _touch_atomically(barrier / "go")
        victim = rng.randrange(2)
        (vproc, vconn), (sproc, sconn) = children[victim], children[1 - victim]
        _recv(vconn, vproc, "start")
        for _ in range(rng.randint(0, 5)):
            _recv(vconn, vproc, "progress")
        time.sleep(rng.uniform(0, 0.02))  # the moment of the kill
        _sigkill(vproc)
        kills += vproc.exitcode == -signal.SIGKILL
        vconn.close()
        while _recv(sconn, sproc, "survivor completion")[0] != "done":
            pass
        _join_ok(sproc)
        sconn.close()
        survivor = names[1 - victim]
        assert sum(len(e["values"]) for e in _read_acks(tmp_path / f"acks-{survivor}")) == k

    log = _verified_contents(root, topic, 1)[0]
    entries = [e for path in acks_files for e in _read_acks(path)]
    checked = _check_acks({0: log}, entries)
    _check_writer_order(log, sorted({v.rsplit("-", 1)[0] for v in log}))
    _check_still_appendable(root, topic, 1)
    print(f"crash-race: {kills} SIGKILLs, {checked} acknowledged records checked, {len(log)} in the log")
    assert kills >= 3


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_reader_sees_everything_once_while_maintenance_merges_and_deletes(tmp_path: Path) -> None:
    """A reader polls while a writer appends and a maintainer merges and deletes superseded objects.

    Merges close every 64 KiB (about every 13 appends) and superseded objects
    are deleted 2 s after the merge. ``file.delete.delay.ms`` is 2000, not 0:
    with 0, a listing that overlaps a merge can see the merged-away objects
    gone but not yet the merged object (LocalStore lists names, then stats
    them), a gap in the chain the resolver rejects. PROTOCOL.md 2, assumption A4, excludes
    that: every request must take effect within D - W, impossible for D = 0.
    The reader's pauses (``_stream_reader``) outlast the delay.
    """
    rng = random.Random(_seed("maintain"))
    root = str(tmp_path / "root")
    topic, total = "maintained", 6000
    # W = 500 ms: merges in a new root (it lists boundedHistory) act within W of their listing (PROTOCOL.md 10,
    # *Resolving transactions*), so a pass must fit in it.
    LogStore(root).create_topic(
        topic, 1, {"segment.bytes": 65536, "file.delete.delay.ms": 2000, "writer.max.staleness.ms": 500}
    )
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    reader, rconn = _start(
        _stream_reader, "reader", root, topic, total, str(barrier), str(tmp_path / "read"), rng.randrange(2**32)
    )
    maintainer, mconn = _start(_maintainer, "maintainer", root, topic, str(barrier), str(tmp_path / "maintained"))
    writer, wconn = _start(_stream_writer, "m", root, topic, "m", total, str(barrier), rng.randrange(2**32))
    for name in ("reader", "maintainer", "m"):
        _wait_for_file(barrier / f"ready-{name}")
    started = time.monotonic()
    _touch_atomically(barrier / "go")
    try:
        assert _recv(wconn, writer, "writer completion") == ("done", total)
        _join_ok(writer)
        _touch_atomically(barrier / "writer-done")
        _recv(rconn, reader, "reader completion", timeout=WAIT_S + 30)
        _join_ok(reader)
    finally:
        _touch_atomically(barrier / "stop")
        _recv(mconn, maintainer, "maintainer completion")
        _join_ok(maintainer)
    elapsed = time.monotonic() - started

    result = json.loads((tmp_path / "read").read_text())
    got = [tuple(r) for r in result["records"]]
    totals = json.loads((tmp_path / "maintained").read_text())
    print(
        f"maintain: reader got {len(got)} records in {result['polls']} polls, pauses {result['pauses']}; "
        f"maintainer {totals}; {elapsed:.1f} s"
    )
    assert [o for o, _ in got] == list(range(len(got))), "reader saw offsets out of order, skipped, repeated"
    assert len(got) == total, f"reader stopped at offset {len(got)} of {total}: it no longer saw the records"
    expected = [f"m-{s}" for s in range(total)]
    assert [v for _, v in got] == expected, "reader did not see each record once, in order"
    assert totals["merged"] > 0 and totals["garbage_deleted"] > 0, "maintenance never merged or deleted"
    assert any(p["merged_away"] for p in result["pauses"]), "no reader pause outlived its next object"
    assert _verified_contents(root, topic, 1)[0] == expected
    _check_still_appendable(root, topic, 1)
