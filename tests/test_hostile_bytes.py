"""Hostile bytes (issue 12): every stored object mutated, every reader either right or a PlogError naming it.

A small real log is written once into a memory store: a topic of two
partitions with several appended objects each, one merged object per
partition (and the appended objects it superseded), a start marker, a
committed and an aborted transaction, a consumer group with a commit log in
two generations and a dead member's heartbeat, two topic metadata
versions, and a shared topic (its flushes in shared objects and commits, the
first moved into segments). What every reader returns from it is recorded.

Each example copies that store, mutates one object (bit flips, truncation,
extension, another object's bytes, a re-encoded index that looks valid but
lies, JSON that parses but has the wrong types or misses fields) and runs
every reader path: the consumer from the beginning under both isolation
levels, offset lookups by timestamp, end offsets, the group's committed
offsets, topic metadata, transaction decisions, and the CLI's ``consume``,
``inspect`` (with ``--index`` and ``--batch``), ``groups describe``,
``groups list`` and ``topics describe``; one fuzzer copies the log to a local
directory instead of memory. Each must return exactly what it
returned before, or raise a :class:`PlogError` whose message names the
mutated object; never another exception, never a hang (each path runs under
an alarm), never other data returned as good.

Some changes are beyond what a reader can detect, so the oracle accepts
other answers for them as long as nothing but a PlogError escapes: a JSON
document whose bytes still parse to a well-typed document with other values
or without an optional field (JSON documents carry no checksum; see
``_json_value_changed``, ``_same_types``, ``_required``), and a document of
another kind swapped in. Re-encoded indexes lie only in the columns a reader
can check against the batches (``CHECKED_COLUMNS``): attributes, producer
fields and timestamps are facts only the index states. Segment objects do
not name their topic or partition, so the fixture gives no two objects the
same offset range: swapping such twins would be undetectable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import shutil
import signal
import struct
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from coordinator.groups.client import GroupClient
from coordinator.groups.documents import CommitEntry, Generation, Heartbeat
from coordinator.keys import heartbeat_key, transactions_prefix
from coordinator.transactions import (
    Decision,
    EpochClaim,
    ProducerIdClaim,
    TransactionalIdMapping,
    TransactionCoordinator,
)
from pyspark_logsource import Consumer, LogStore, Producer, TopicPartition
from pyspark_logsource.cli.app import main as cli_main
from segment_format.documents import JsonDocument
from segment_format.errors import CorruptRecordError, PlogError
from segment_format.notice import ChangeNotice
from segment_format.protocol import ProtocolVersion
from segment_format.root import LogRoot
from segment_format.segment import INDEX_SCHEMA, TAIL, SegmentMeta, crc32c, read_index
from segment_format.stores import open_store
from segment_format.stores.memory import _MEMORY_STORES, MemoryStore
from segment_format.topic import TopicMetadata
from tests.soak import soak

PRISTINE = "hostile-pristine"
TOPIC = "t"
PARTITIONS = (0, 1)
TPS = [TopicPartition(TOPIC, p) for p in PARTITIONS]
#: A shared topic (PROTOCOL.md 7.3): its records in shared objects and commits, its first flush moved into segments.
SHARED_TOPIC = "sh"
SHARED_TPS = [TopicPartition(SHARED_TOPIC, p) for p in PARTITIONS]
GROUP = "g"
#: Seconds any one reader path may take before it counts as a hang.
PATH_DEADLINE_S = 10


class Hang(Exception):
    """A reader path overran :data:`PATH_DEADLINE_S`."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`Hang` in the main thread if the block takes longer than ``seconds``."""

    def fire(_signum: int, _frame: Any) -> None:
        raise Hang(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ---------------------------------------------------------------------------------------------- the log


def build_pristine() -> None:
    """Write the log every example starts from into the memory store :data:`PRISTINE`."""
    _MEMORY_STORES.pop(PRISTINE, None)
    url = f"memory://{PRISTINE}"
    admin = LogStore(url)
    # First, so that the root's protocol object 0 lists sharedObjects (a later create would wait for it).
    admin.create_topic(
        SHARED_TOPIC, 2, config={"storage.layout": "shared", "auto.maintenance.enable": False, "shared.move.ms": 0}
    )
    # segment.bytes fits two appended objects, so the first two of each partition are merged into one.
    admin.create_topic(
        TOPIC,
        2,
        config={
            "compression.type": "lz4",
            "auto.maintenance.enable": False,
            "segment.bytes": 8000,
            "storage.layout": "partitioned",  # the root offers shared topics: this one is not
        },
    )
    admin.alter_config(TOPIC, {"retention.ms": -1})  # a second metadata version
    ts = 1_700_000_000_000
    producer = Producer(url, linger_ms=0)
    for flush in range(4):
        for partition in PARTITIONS:
            # Different record counts per partition, so that no two objects of the log cover the same range.
            for i in range(2 + partition + flush):
                headers = [("h", b"x%d" % i)] if i % 2 else None
                value = b"v-%d-%d-%d|" % (partition, flush, i) * 3
                producer.send(TOPIC, value=value, key=b"k%d" % i, partition=partition, timestamp_ms=ts, headers=headers)
                ts += 1000
        producer.flush()
    producer.close()
    with LogRoot(url) as root:
        for partition in PARTITIONS:
            assert root.partition(TOPIC, partition).merge_segments() == 1
        root.partition(TOPIC, 1).delete_records(2)
    txn = Producer(url, transactional_id="tx", linger_ms=0)
    txn.init_transactions()
    txn.begin_transaction()
    txn.send(TOPIC, value=b"committed-0", partition=0, timestamp_ms=ts)
    txn.send(TOPIC, value=b"committed-1", partition=1, timestamp_ms=ts + 1)
    txn.commit_transaction()
    txn.begin_transaction()
    txn.send(TOPIC, value=b"aborted-0", partition=0, timestamp_ms=ts + 2)
    txn.flush()
    txn.abort_transaction()
    txn.close()
    producer = Producer(url, linger_ms=0)
    for partition in PARTITIONS:
        producer.send(TOPIC, value=b"after", partition=partition, timestamp_ms=ts + 3 + partition)
    producer.close()
    consumer = Consumer(url, group_id=GROUP)
    consumer.assign(TPS)
    consumer.commit({TPS[0]: 3, TPS[1]: 4})
    consumer.commit({TPS[0]: 5})
    consumer.close(autocommit=False)
    # Generation 1 (no members) snapshots generation 0's state; one more commit in its log.
    client = GroupClient(MemoryStore(PRISTINE), GROUP)
    state = client.committed(client.latest_generation())
    assert client.create_generation(Generation(1, committed=state, created_ms=1))
    consumer = Consumer(url, group_id=GROUP)
    consumer.assign(TPS)
    consumer.commit({TPS[1]: 6})
    consumer.close(autocommit=False)
    # The shared topic: three flushes of both partitions (different counts: no two runs cover one range), the
    # first moved into each partition's segment.
    with Producer(url) as producer:
        for flush in range(3):
            rows = [(p, b"s-%d-%d-%d" % (p, flush, i)) for p in PARTITIONS for i in range(2 + p + flush)]
            table = pa.table(
                {
                    "value": [v for _, v in rows],
                    "partition": [p for p, _ in rows],
                    "timestamp": [ts + 10 + n for n in range(len(rows))],
                }
            )
            producer.send_batch(SHARED_TOPIC, table)
            if flush == 0:
                admin.maintain(SHARED_TOPIC)
    # A member that died long ago: its last heartbeat stays until collected; describe reads it (and hides it).
    gone = Heartbeat("gone-1", 3, 1_000, client_id="gone", topics=(TOPIC,), generation=1)
    assert MemoryStore(PRISTINE).put_if_absent(heartbeat_key(GROUP, gone.member_id, gone.seq), gone.to_json())


def fresh_copy(objects: dict[str, bytes], local: Path | None = None) -> str:
    """A new store holding ``objects``, in memory or (``local``) as files under that directory; returns its URL."""
    if local is not None:
        root = local / uuid.uuid4().hex
        for key, data in objects.items():
            path = root.joinpath(*key.split("/"))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return str(root)
    name = "hostile-" + uuid.uuid4().hex
    _MEMORY_STORES[name] = dict(objects)
    return f"memory://{name}"


def drop(url: str) -> None:
    """Forget the store behind ``url``."""
    if url.startswith("memory://"):
        _MEMORY_STORES.pop(url[len("memory://") :], None)
    else:
        shutil.rmtree(url, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- reader paths

Row = tuple[int, int, bytes | None, bytes | None, Any]


def table_rows(table: pa.Table) -> list[tuple[int, Row]]:
    """(partition, record) of each row of a consumer's Arrow table."""
    cols = table.to_pydict()
    out = []
    for n in range(table.num_rows):
        stamp = cols["timestamp"][n]
        ms = stamp if isinstance(stamp, int) else int(stamp.timestamp() * 1000)
        out.append(
            (cols["partition"][n], (cols["offset"][n], ms, cols["key"][n], cols["value"][n], cols["headers"][n]))
        )
    return out


def read_records(url: str, isolation: str, tps: list[TopicPartition] = TPS) -> Callable[[dict[int, list[Row]]], None]:
    """A path that reads every partition of ``tps`` from its start into the dict it is given (partial on error)."""

    def run(into: dict[int, list[Row]]) -> None:
        consumer = Consumer(url, auto_offset_reset="earliest", isolation_level=isolation)
        try:
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            for _ in range(100):
                table = consumer.poll_arrow(max_records=7)  # small polls: reads stop inside batches
                if table.num_rows == 0:
                    break
                for partition, row in table_rows(table):
                    into.setdefault(partition, []).append(row)
        finally:
            consumer.close(autocommit=False)

    return run


@dataclass
class Answers:
    """What each reader path returned, or the PlogError it raised."""

    values: dict[str, Any]
    errors: dict[str, PlogError]


def cli(argv: list[str]) -> tuple[int, str, str]:
    """Run ``plog`` in-process; (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(argv)
    return code, out.getvalue(), err.getvalue()


#: Timestamps the lookups ask for: before, inside, between objects, after the log.
LOOKUP_TIMESTAMPS = (0, 1_700_000_000_000, 1_700_000_004_500, 1_700_000_020_000, 1_700_000_033_000, 1_800_000_000_000)


def run_paths(url: str) -> Answers:
    """Run every reader path against the root at ``url``."""
    answers = Answers({}, {})
    store = open_store(url)

    def uncommitted() -> Any:
        got: dict[int, list[Row]] = {}
        answers.values["uncommitted.partial"] = got
        read_records(url, "read_uncommitted")(got)
        return got

    def committed() -> Any:
        got: dict[int, list[Row]] = {}
        answers.values["committed.partial"] = got
        read_records(url, "read_committed")(got)
        return got

    def shared() -> Any:
        got: dict[int, list[Row]] = {}
        answers.values["shared.partial"] = got
        read_records(url, "read_committed", SHARED_TPS)(got)
        return got

    def lookups() -> Any:
        consumer = Consumer(url)
        try:
            return {ts: consumer.offsets_for_times(dict.fromkeys(TPS, ts)) for ts in LOOKUP_TIMESTAMPS}
        finally:
            consumer.close(autocommit=False)

    def ends() -> Any:
        out = {}
        for isolation in ("read_uncommitted", "read_committed"):
            consumer = Consumer(url, isolation_level=isolation)
            try:
                out[isolation] = (consumer.beginning_offsets(TPS), consumer.end_offsets(TPS))
            finally:
                consumer.close(autocommit=False)
        return out

    def group_offsets() -> Any:
        consumer = Consumer(url, group_id=GROUP)
        try:
            consumer.assign(TPS)
            return {tp: consumer.committed(tp) for tp in TPS}
        finally:
            consumer.close(autocommit=False)

    def metadata() -> Any:
        with LogRoot(url) as root:
            meta = root.topic(TOPIC, refresh=True)
            return (meta.name, meta.topic_id, meta.partitions, dict(meta.config), meta.version)

    def decisions() -> Any:
        coordinator = TransactionCoordinator(store)
        out = {}
        for pid, txn in DECISIONS:
            found = coordinator.read_decision(pid, txn)
            # What readers act on; created_ms, epoch, tails and offsets are informational or another path's.
            out[(pid, txn)] = None if found is None else (found.state, found.producer_id, found.txn, found.batches)
        return out

    def consume_cli() -> Any:
        code, out, err = cli(
            ["consume", TOPIC, "--url", url, "--from-beginning", "--format", "json", "--timeout-ms", "0"]
        )
        answers.values["cli-consume.partial"] = out
        return code, out, err

    def inspect_cli() -> Any:
        return cli(["inspect", TOPIC, "--url", url, "--index"])

    def batch_cli() -> Any:
        return cli(["inspect", TOPIC, "--url", url, "--partition", "0", "--batch", "3"])

    def describe_cli() -> Any:
        return cli(["groups", "describe", GROUP, "--url", url])

    def groups_cli() -> Any:
        return cli(["groups", "list", "--url", url])

    def topic_cli() -> Any:
        return cli(["topics", "describe", TOPIC, "--url", url])

    paths: dict[str, Callable[[], Any]] = {
        "uncommitted": uncommitted,
        "committed": committed,
        "shared": shared,
        "lookups": lookups,
        "ends": ends,
        "group": group_offsets,
        "metadata": metadata,
        "decisions": decisions,
        "cli-consume": consume_cli,
        "cli-inspect": inspect_cli,
        "cli-batch": batch_cli,
        "cli-describe": describe_cli,
        "cli-groups": groups_cli,
        "cli-topic": topic_cli,
    }
    for name, path in paths.items():
        try:
            with deadline(PATH_DEADLINE_S):
                answers.values[name] = path()
        except PlogError as exc:
            answers.errors[name] = exc
    return answers


# ---------------------------------------------------------------------------------------------- the baseline


@dataclass(repr=False)
class Baseline:
    """The pristine log and what every path read from it."""

    objects: dict[str, bytes]
    answers: Answers

    def __repr__(self) -> str:  # hypothesis prints the arguments of a failing example: keep that short
        return f"Baseline({len(self.objects)} objects)"


DECISIONS: list[tuple[int, int]] = []


@pytest.fixture(scope="module")
def baseline() -> Baseline:
    build_pristine()
    objects = dict(_MEMORY_STORES[PRISTINE])
    DECISIONS.clear()
    prefix = transactions_prefix(0).rsplit("/", 2)[0] + "/"
    for key in sorted(objects):
        if key.startswith(prefix) and key.endswith(".json"):
            pid, txn = key[len(prefix) : -len(".json")].split("/")
            DECISIONS.append((int(pid), int(txn)))
    url = fresh_copy(objects)
    try:
        answers = run_paths(url)
    finally:
        drop(url)
    assert not answers.errors, answers.errors
    data = answers.values
    # The log is what the fixture meant to write.
    assert len(DECISIONS) == 2
    assert sorted(data["uncommitted"]) == [0, 1] and data["uncommitted"][1][0][0] == 2  # the start marker
    assert b"aborted-0" in [r[3] for r in data["uncommitted"][0]]
    assert b"aborted-0" not in [r[3] for r in data["committed"][0]]
    assert b"committed-0" in [r[3] for r in data["committed"][0]]
    assert data["group"] == {TPS[0]: 5, TPS[1]: 6}
    assert data["metadata"][4] == 1
    assert any(".g1." in k for k in objects)
    assert {p: len(rows) for p, rows in data["shared"].items()} == {0: 2 + 3 + 4, 1: 3 + 4 + 5}
    assert sum(k.startswith("shared/") for k in objects) == 3 and any("/commits/" in k for k in objects)
    for name in ("cli-consume", "cli-inspect", "cli-batch", "cli-describe", "cli-groups", "cli-topic"):
        assert data[name][0] == 0, data[name]
    return Baseline(objects, answers)


# ---------------------------------------------------------------------------------------------- the oracle

#: Paths whose output may change with bytes no reader checks (sizes, listings of superseded objects).
DESCRIPTIVE = {"cli-inspect", "cli-describe", "cli-groups", "cli-topic"}


def _json_value_changed(original: bytes, mutated: bytes) -> bool:
    """Whether ``mutated`` is still a JSON object (with other values): undetectable without a checksum."""
    try:
        doc = json.loads(mutated)
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(doc, dict) and doc != json.loads(original)


def check(base: Baseline, key: str, mutated: bytes, answers: Answers, *, lenient: bool = False) -> None:
    """Every path returned the baseline's answer or raised a PlogError naming ``key``.

    ``lenient``: the mutation is one no reader can detect (see the module
    docstring); answers may then differ, but still only PlogErrors escape.
    """
    for name, exc in answers.errors.items():
        message = str(exc)
        if isinstance(exc, CorruptRecordError) and exc.offset is not None:
            assert f"offset {exc.offset}" in message
        if not lenient:
            assert key in message, f"{name}: {type(exc).__name__} does not name {key!r}: {message}"
    original = base.answers.values
    for name, value in answers.values.items():
        if name.endswith(".partial"):
            continue
        if name.startswith("cli-"):
            code, out, err = value
            assert code in (0, 2), (name, code, err)
            if code == 2:
                if not lenient:
                    assert key in err.replace("\n", ""), f"{name}: error does not name {key!r}: {err}"
                continue
        if lenient or name in DESCRIPTIVE:
            continue
        assert value == original[name], f"{name} returned other data after mutating {key!r}"
    if lenient:
        return
    # Records returned before an error are the baseline's records, at their offsets.
    for name in ("uncommitted", "committed"):
        if name in answers.errors:
            for partition, rows in answers.values[name + ".partial"].items():
                truth = {row[0]: row for row in original[name][partition]}
                assert all(truth.get(row[0]) == row for row in rows), f"{name}: wrong records before the error"
    if "cli-consume" not in answers.values:
        lines = set(original["cli-consume"][1].splitlines())
        assert set(answers.values.get("cli-consume.partial", "").splitlines()) <= lines


def run_and_check(
    base: Baseline, key: str, mutated: bytes, *, lenient: bool = False, local: Path | None = None
) -> Answers:
    """Copy the log (to files under ``local`` if given), put ``mutated`` at ``key``, run every path, check them."""
    objects = dict(base.objects)
    objects[key] = mutated
    url = fresh_copy(objects, local)
    try:
        answers = run_paths(url)
    finally:
        drop(url)
    check(base, key, mutated, answers, lenient=lenient)
    return answers


# ---------------------------------------------------------------------------------------------- mutations


def flip_bits(data: bytes, positions: list[int], bits: list[int]) -> bytes:
    """``data`` with one bit flipped at each position (positions taken modulo the length)."""
    out = bytearray(data)
    for pos, bit in zip(positions, bits, strict=False):
        out[pos % len(out)] ^= 1 << bit
    return bytes(out)


@st.composite
def byte_mutation(draw: st.DrawFn, data: bytes, others: list[bytes]) -> bytes:
    """Bit flips, truncation, extension, or another object's bytes."""
    kind = draw(st.sampled_from(["flip", "flips", "truncate", "extend", "swap", "empty"]))
    if kind == "flip":
        return flip_bits(data, [draw(st.integers(0, len(data) - 1))], [draw(st.integers(0, 7))])
    if kind == "flips":
        n = draw(st.integers(2, 8))
        positions = draw(st.lists(st.integers(0, len(data) - 1), min_size=n, max_size=n, unique=True))
        return flip_bits(data, positions, draw(st.lists(st.integers(0, 7), min_size=n, max_size=n)))
    if kind == "truncate":
        return data[: draw(st.integers(0, len(data) - 1))]
    if kind == "extend":
        return data + draw(st.binary(min_size=1, max_size=64))
    if kind == "swap":
        return draw(st.sampled_from(others))
    return b""


def object_keys(base: Baseline, suffix: str) -> list[str]:
    """Keys of the baseline's objects ending in ``suffix``."""
    return sorted(k for k in base.objects if k.endswith(suffix))


#: Examples per fuzzer (tests/soak.py: CI's 40, the long form's 300); ``PLOG_HOSTILE_EXAMPLES`` sets any number,
#: ``PLOG_HOSTILE_RANDOM=1`` draws new examples each run instead of CI's fixed ones.
EXAMPLES = int(os.environ.get("PLOG_HOSTILE_EXAMPLES") or soak(ci=40, long=300))

SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("PLOG_HOSTILE_RANDOM") != "1",
    # No shrinking: each example runs every reader path; the drawn key and mutation are printed as they are.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)


@SETTINGS
@given(data=st.data())
def test_damaged_segment_objects(baseline: Baseline, data: st.DataObject) -> None:
    """Any byte-level damage to a segment object: the original records or a PlogError naming it."""
    keys = object_keys(baseline, ".arrow")
    key = data.draw(st.sampled_from(keys), label="key")
    original = baseline.objects[key]
    others = [v for k, v in sorted(baseline.objects.items()) if k != key]  # other segments, and documents
    mutated = data.draw(byte_mutation(original, others), label="mutation")
    run_and_check(baseline, key, mutated)


@SETTINGS
@given(data=st.data())
def test_damaged_documents(baseline: Baseline, data: st.DataObject) -> None:
    """Any byte-level damage to a JSON document: the original answers or a PlogError naming it.

    Damage that leaves a JSON object with other values (a digit flipped) is
    beyond detection; the paths must then still raise nothing but PlogErrors.
    """
    keys = object_keys(baseline, ".json")
    key = data.draw(st.sampled_from(keys), label="key")
    original = baseline.objects[key]
    others = [v for k, v in sorted(baseline.objects.items()) if k != key]  # other documents, and segments
    mutated = data.draw(byte_mutation(original, others), label="mutation")
    lenient = _json_value_changed(original, mutated) and not _is_sibling_swap(key, mutated, baseline)
    run_and_check(baseline, key, mutated, lenient=lenient)


def _is_sibling_swap(key: str, mutated: bytes, base: Baseline) -> bool:
    """Whether ``mutated`` is the bytes of another object of the same kind, whose key numbers differ.

    Such a swap is detectable: a field that repeats a number of the key must equal it (PROTOCOL.md 3.1).
    """
    folder = key.rsplit("/", 1)[0]
    return any(k != key and k.rsplit("/", 1)[0] == folder and v == mutated for k, v in base.objects.items())


@settings(SETTINGS, max_examples=max(EXAMPLES // 4, 5))
@given(data=st.data())
def test_damaged_objects_on_local_disk(
    baseline: Baseline, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    """The same byte damage to any object of a log on a local disk (LocalStore's reads, not the memory store's)."""
    keys = sorted(baseline.objects)
    key = data.draw(st.sampled_from(keys), label="key")
    original = baseline.objects[key]
    others = [v for k, v in sorted(baseline.objects.items()) if k != key]
    mutated = data.draw(byte_mutation(original, others), label="mutation")
    lenient = (
        key.endswith(".json")
        and _json_value_changed(original, mutated)
        and not _is_sibling_swap(key, mutated, baseline)
    )
    run_and_check(baseline, key, mutated, lenient=lenient, local=tmp_path_factory.mktemp("hostile"))


#: Values that break a field's JSON type (PROTOCOL.md 3.1), one of each kind.
WRONG_TYPES: list[Any] = [None, True, 1.5, -1, 2**70, "x", "", [], [1], {}, {"a": 1}, [[1, 2, 3]], [["a"]]]


@st.composite
def json_mutation(draw: st.DrawFn, doc: Any) -> Any:
    """``doc`` with one field, at any depth, missing or of a wrong type; or not an object at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from([[doc], "doc", 7, None]))
    paths: list[tuple[Any, ...]] = []

    def walk(node: Any, path: tuple[Any, ...]) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                paths.append((*path, k))
                walk(v, (*path, k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                paths.append((*path, i))
                walk(v, (*path, i))

    walk(doc, ())
    if not paths:
        return draw(st.sampled_from(WRONG_TYPES))
    path = draw(st.sampled_from(paths))
    out = json.loads(json.dumps(doc))
    parent = out
    for step in path[:-1]:
        parent = parent[step]
    # Only a top-level field can go missing: an entry missing from a map inside (a partition's offset) is
    # another value of the right type, as undetectable as a changed digit.
    if len(path) == 1 and draw(st.booleans()):
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(st.sampled_from(WRONG_TYPES))
    return out


#: The document class of each kind of JSON object the log holds, by a fragment of its key.
DOCUMENT_KINDS: list[tuple[str, type[JsonDocument]]] = [
    ("/transactions/", Decision),
    ("/producer-ids/", ProducerIdClaim),
    ("/epochs/", EpochClaim),
    ("/producer-id.json", TransactionalIdMapping),
    ("/commits/", CommitEntry),
    ("/generations/", Generation),
    ("/members/", Heartbeat),
    ("/meta/", TopicMetadata),
    ("_protocol/", ProtocolVersion),
    ("notice.json", ChangeNotice),
]


def _required(key: str, name: str) -> bool:
    """Whether field ``name`` of the document at ``key`` is required (else it has a default, 3.1)."""
    for fragment, kind in DOCUMENT_KINDS:
        if fragment in key:
            for f in dataclasses.fields(kind):  # type: ignore[arg-type]
                if f.metadata.get("json", f.name) == name:
                    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            return False
    return name in ("offset", "created_ms")  # a start marker (7.1)


@SETTINGS
@given(data=st.data())
def test_well_formed_documents_with_wrong_types(baseline: Baseline, data: st.DataObject) -> None:
    """Valid JSON with a field missing or wrongly typed: the original answers or a PlogError naming it.

    A value of the right JSON type but another value (``-1`` for an offset), or
    an optional field missing, is a content change no reader can tell from the
    truth; those are run leniently. A missing required field must be reported.
    """
    keys = object_keys(baseline, ".json")
    key = data.draw(st.sampled_from(keys), label="key")
    doc = json.loads(baseline.objects[key])
    mutated = data.draw(json_mutation(doc), label="document")
    # Kept types, or an optional field missing (it takes its default): another value, which no reader can tell.
    missing = set(doc) - set(mutated) if isinstance(mutated, dict) else set()
    lenient = _same_types(doc, mutated) or (
        bool(missing)
        and not any(_required(key, name) for name in missing)
        and _same_types({k: v for k, v in doc.items() if k not in missing}, mutated)
    )
    run_and_check(baseline, key, json.dumps(mutated).encode(), lenient=lenient)


def _same_types(a: Any, b: Any) -> bool:
    """Whether ``b`` has ``a``'s shape: the same keys and JSON types (bool apart from int) everywhere."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_types(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):  # an array of other length is another value, as undetectable
        return all(any(_same_types(x, y) for x in a) for y in b) if a else not b
    if isinstance(a, float) and isinstance(b, int) and not isinstance(b, bool):
        return True  # a JSON number field (min.cleanable.dirty.ratio) holding an integer: another value
    return type(a) is type(b)


# ---------------------------------------------------------------------------------------------- lying indexes

#: Index columns that have a second source of truth a reader can check them against: the batch bytes
#: (their length and CRC32C) and the decoded batch (its offsets and row count). Attributes and producer
#: fields are facts only the index states; timestamps are checked when a batch is decoded, but a time
#: lookup that a lowered ``max_timestamp`` steers past a batch never decodes it: not detectable either.
CHECKED_COLUMNS = ("base_offset", "last_offset", "record_count", "position", "length", "crc32c")
#: Segment JSON fields the index rows or the object's name determine.
CHECKED_META = ("base_offset", "next_offset", "record_count", "batch_count")


def reindex(data: bytes, rows: list[dict[str, Any]], meta: dict[str, Any]) -> bytes:
    """``data`` with its index replaced by ``rows`` and ``meta``, encoded as a writer would: a valid CRC and tail."""
    index_position = struct.unpack_from("<Q", data, len(data) - TAIL.size)[0]
    table = pa.Table.from_pylist(rows, schema=INDEX_SCHEMA).replace_schema_metadata(
        {"plog.segment": json.dumps(meta, sort_keys=True)}
    )
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    index = sink.getvalue().to_pybytes()
    return data[:index_position] + index + TAIL.pack(index_position, crc32c(index), 1, b"PLOGSEG1")


def index_parts(key: str, data: bytes) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The index rows and segment JSON of a segment object's bytes."""
    store = MemoryStore("hostile-scratch")
    store.replace(key, data)
    idx = read_index(store, key)
    store.delete(key)
    return idx.table.to_pylist(), SegmentMeta.to_dict(idx.meta)


@st.composite
def lying_index(draw: st.DrawFn, rows: list[dict[str, Any]], meta: dict[str, Any]) -> tuple[list[Any], Any]:
    """Rows and segment JSON with one consistent-looking lie."""
    rows = [dict(r) for r in rows]
    meta = dict(meta)
    delta = draw(st.sampled_from([-8, -2, -1, 1, 2, 8, 1 << 20]))
    kind = draw(st.sampled_from(["row", "row", "meta", "swap", "drop", "duplicate"]))
    i = draw(st.integers(0, len(rows) - 1))
    if kind == "row":
        column = draw(st.sampled_from(CHECKED_COLUMNS))
        rows[i][column] = (rows[i][column] + delta) % (1 << 32) if column == "crc32c" else rows[i][column] + delta
    elif kind == "meta":
        column = draw(st.sampled_from(CHECKED_META))
        meta[column] += delta
    elif kind == "swap" and len(rows) > 1:
        j = (i + 1) % len(rows)
        rows[i], rows[j] = rows[j], rows[i]
    elif kind == "drop" and len(rows) > 1:
        del rows[i]
        if draw(st.booleans()):  # and the counts made to agree with what is left
            meta["batch_count"] = len(rows)
            meta["record_count"] = sum(r["record_count"] for r in rows)
    else:
        rows.insert(i, dict(rows[i]))
        if draw(st.booleans()):
            meta["batch_count"] = len(rows)
            meta["record_count"] = sum(r["record_count"] for r in rows)
    return rows, meta


@SETTINGS
@given(data=st.data())
def test_valid_looking_but_inconsistent_indexes(baseline: Baseline, data: st.DataObject) -> None:
    """An index re-encoded with a valid CRC that lies about its batches: the original records or a PlogError.

    Segment objects only: readers of a shared object never read its index (a commit's rows stand for it,
    PROTOCOL.md 7.3), which ``plog verify`` checks."""
    keys = [k for k in object_keys(baseline, ".arrow") if not k.startswith("shared/")]
    key = data.draw(st.sampled_from(keys), label="key")
    rows, meta = index_parts(key, baseline.objects[key])
    new_rows, new_meta = data.draw(lying_index(rows, meta), label="index")
    if new_rows == rows and new_meta == meta:
        return
    run_and_check(baseline, key, reindex(baseline.objects[key], new_rows, new_meta))


# ---------------------------------------------------------------------------------------------- regressions


class HasObjects(Protocol):
    """A baseline: the pristine log's objects by key."""

    objects: dict[str, bytes]


def key_of(base: HasObjects, fragment: str, n: int = 0) -> str:
    """The ``n``-th key (in sorted order) of the baseline's objects that contains ``fragment``."""
    return [k for k in sorted(base.objects) if fragment in k][n]


def test_regression_damaged_decision_names_its_object(baseline: Baseline) -> None:
    """A decision that is not JSON was reported as ``Decision: not valid JSON``, naming no object."""
    key = key_of(baseline, "_coordinator/transactions/")
    answers = run_and_check(baseline, key, b"")
    assert key in str(answers.errors["decisions"])


def test_regression_decision_under_another_key_is_corrupt(baseline: Baseline) -> None:
    """The aborted decision copied over the committed one hid the committed records as good data."""
    committed, aborted = (
        key_of(baseline, "_coordinator/transactions/", 0),
        key_of(baseline, "_coordinator/transactions/", 1),
    )
    answers = run_and_check(baseline, committed, baseline.objects[aborted])
    assert "'txn'" in str(answers.errors["committed"])


def test_regression_decision_batch_range_not_a_pair(baseline: Baseline) -> None:
    """``[[14]]`` as a batch range leaked a ValueError from unpacking it in ``Decision.includes``."""
    key = key_of(baseline, "_coordinator/transactions/", 0)
    doc = json.loads(baseline.objects[key])
    doc["batches"]["t"]["0"] = [[14]]
    answers = run_and_check(baseline, key, json.dumps(doc).encode())
    assert "batches" in str(answers.errors["committed"])


def test_regression_decision_state_misspelt(baseline: Baseline) -> None:
    """A damaged ``state`` ("comMitted") read as an abort: committed records vanished without an error."""
    key = key_of(baseline, "_coordinator/transactions/", 0)
    doc = json.loads(baseline.objects[key])
    doc["state"] = "comMitted"
    answers = run_and_check(baseline, key, json.dumps(doc).encode())
    assert "'state'" in str(answers.errors["committed"])


@pytest.mark.parametrize(
    "mutation",
    [
        b"",
        b"[1]",
        b'{"generation": 1, "seq": 0, "state": []}',
        b'{"generation": 1, "seq": 0, "state": {"t": {"1": true}}}',
    ],
)
def test_regression_damaged_commit_entry(baseline: Baseline, mutation: bytes) -> None:
    """Entries were read with ``json.loads``: JSONDecodeError and AttributeError leaked, ``true`` read as 1."""
    key = key_of(baseline, "groups/g/commits/00000000000000000001/")
    answers = run_and_check(baseline, key, mutation)
    assert key in str(answers.errors["group"])


def test_regression_commit_entry_of_another_generation(baseline: Baseline) -> None:
    """An entry of generation 0 copied into generation 1's log gave generation 0's offsets as committed."""
    key = key_of(baseline, "groups/g/commits/00000000000000000001/")
    answers = run_and_check(baseline, key, baseline.objects[key_of(baseline, "groups/g/commits/00000000000000000000/")])
    assert "'generation'" in str(answers.errors["group"])


@pytest.mark.parametrize("field_value", [("partitions", []), ("partitions", {"t": "2"}), ("generation", 0)])
def test_regression_damaged_generation(baseline: Baseline, field_value: tuple[str, Any]) -> None:
    """A generation with ``partitions: []`` leaked AttributeError; one with another number was taken as this one."""
    key = key_of(baseline, "groups/g/generations/")
    doc = json.loads(baseline.objects[key])
    doc[field_value[0]] = field_value[1]
    answers = run_and_check(baseline, key, json.dumps(doc).encode())
    assert key in str(answers.errors["group"])


def test_regression_topic_config_of_the_wrong_type(baseline: Baseline) -> None:
    """``"segment.bytes": null`` in topic metadata was read as a config value (PROTOCOL.md 3.1, 4)."""
    key = key_of(baseline, "topics/t/meta/", 1)
    doc = json.loads(baseline.objects[key])
    doc["config"]["segment.bytes"] = None
    answers = run_and_check(baseline, key, json.dumps(doc).encode())
    assert "segment.bytes" in str(answers.errors["metadata"])


def test_regression_topic_metadata_of_another_version(baseline: Baseline) -> None:
    """Version 0's bytes at version 1's key were taken as the current metadata (older config) without a word."""
    key = key_of(baseline, "topics/t/meta/", 1)
    answers = run_and_check(baseline, key, baseline.objects[key_of(baseline, "topics/t/meta/", 0)])
    assert key in str(answers.errors["metadata"])


def _lie(base: Baseline, fragment: str, change: Callable[[list[dict[str, Any]], dict[str, Any]], None]) -> Answers:
    key = [k for k in sorted(base.objects) if fragment in k and k.startswith(f"topics/{TOPIC}/")][0]
    rows, meta = index_parts(key, base.objects[key])
    change(rows, meta)
    return run_and_check(base, key, reindex(base.objects[key], rows, meta))


def test_regression_index_row_claiming_a_wider_range(baseline: Baseline) -> None:
    """A row of the committed transaction's batch claiming 10..18 (not 18..18) hid it from read_committed as aborted."""

    def widen(rows: list[dict[str, Any]], _meta: dict[str, Any]) -> None:
        rows[0]["base_offset"] -= 8

    answers = _lie(baseline, "/1/log/00000000000000000018.arrow", widen)
    assert "10..18" in str(answers.errors["committed"])


def test_regression_index_rows_out_of_order(baseline: Baseline) -> None:
    """Swapped rows of a merged object returned its batches out of offset order as good data."""

    def swap(rows: list[dict[str, Any]], _meta: dict[str, Any]) -> None:
        rows[0], rows[1] = rows[1], rows[0]

    answers = _lie(baseline, "/0/log/00000000000000000000-", swap)
    assert "out of order" in str(answers.errors["uncommitted"])


def test_crossed_index_rows_are_corrupt(baseline: Baseline) -> None:
    """Rows pointing at each other's bytes (positions, lengths and CRCs swapped) are corruption, not records."""

    def cross(rows: list[dict[str, Any]], _meta: dict[str, Any]) -> None:
        a, b = rows
        for column in ("position", "length", "crc32c"):
            a[column], b[column] = b[column], a[column]

    answers = _lie(baseline, "/0/log/00000000000000000000-", cross)
    assert "uncommitted" in answers.errors


def test_regression_topic_metadata_without_config(baseline: Baseline) -> None:
    """Metadata without its optional ``config`` read as ``{}``, not the defaults: KeyError 'compression.type' leaked."""
    key = key_of(baseline, "topics/t/meta/", 1)
    doc = json.loads(baseline.objects[key])
    del doc["config"]
    # Another configuration (the defaults) is a value change no reader can detect; nothing but a PlogError may escape.
    answers = run_and_check(baseline, key, json.dumps(doc).encode(), lenient=True)
    assert answers.values["metadata"][3]["compression.type"] == "lz4"  # the default, as the table of section 4 says


def test_regression_last_appended_object_claiming_a_later_end(baseline: Baseline) -> None:
    """The tail object's index claiming next_offset 18 for records up to 16 moved the log end offset to 18."""

    def extend(_rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
        meta["next_offset"] += 1

    answers = _lie(baseline, "/0/log/00000000000000000016.arrow", extend)
    assert "[16, 18)" in str(answers.errors["ends"])


def test_regression_damaged_heartbeat_names_its_object(baseline: Baseline) -> None:
    """A heartbeat that is not JSON was reported as ``Heartbeat: not valid JSON``, naming no object.

    Then it made the whole description fail; now a damaged heartbeat is its member's missing one
    (PROTOCOL.md 11.4): the description succeeds and its warning names the object.
    """
    key = key_of(baseline, "groups/g/members/")
    answers = run_and_check(baseline, key, b"z" + baseline.objects[key][1:])
    code, _, err = answers.values["cli-describe"]
    assert code == 0 and key in err.replace("\n", "")
    assert answers.values["cli-groups"][0] == 0
