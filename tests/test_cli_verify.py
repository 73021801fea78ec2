"""``plog verify``: the verifier as a command; exit 0 clean, 1 problems found, 2 bad usage; nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from pyspark_logsource import LogStore, Producer
from segment_format.inspect.listings import index_entries
from segment_format.root import LogRoot
from segment_format.segment import TAIL
from tests.fixtures_cli import Run

WORKTREE = Path(__file__).resolve().parent.parent
PER_ROUND = 40  # records per partition per produce round: a few batches each (batch_size below is in bytes)
ROUNDS = 3  # one appended object per partition per round


@pytest.fixture(autouse=True)
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wide console, so every object key is printed whole on one line of the table."""
    monkeypatch.setenv("COLUMNS", "250")


def make_root(url: str) -> None:
    """Topics ``a`` (2 partitions) and ``b`` (1): three objects per partition, several batches per object
    (partitioned topics: a shared topic's objects and commits are verified in ``test_shared_topics``)."""
    with LogStore(url) as store:
        store.create_topic("a", 2, config={"storage.layout": "partitioned"})
        store.create_topic("b", 1, config={"storage.layout": "partitioned"})
    with Producer(url, batch_size=512) as producer:
        for r in range(ROUNDS):
            for topic, partitions in (("a", 2), ("b", 1)):
                rows = [(p, f"{topic} round {r} record {i}") for p in range(partitions) for i in range(PER_ROUND)]
                producer.send_batch(
                    topic,
                    pd.DataFrame({"partition": [p for p, _ in rows], "value": [v for _, v in rows]}),
                )


@pytest.fixture
def root(url: str) -> Path:
    make_root(url)
    return Path(url)


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every file (with its bytes) and directory (None) under ``root``."""
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


def chain(root: Path, topic: str, partition: int) -> list[tuple[str, int]]:
    """(key, base offset) of each object of a partition's chain, oldest first."""
    view = LogRoot(str(root)).partition(topic, partition).view()
    return [(ref.key, ref.base_offset) for ref in view.segments]


def flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))


def verify_json(run: Run, root: Path, *topics: str) -> tuple[int, dict, str]:
    """``plog verify --json``, asserting it wrote nothing to the root and printed one JSON document."""
    before = snapshot(root)
    code, out, err = run("verify", *topics, "--json")
    assert snapshot(root) == before
    return code, json.loads(out), err


def verify_table(run: Run, root: Path, *topics: str) -> tuple[int, str, str]:
    before = snapshot(root)
    code, out, err = run("verify", *topics)
    assert snapshot(root) == before
    return code, out, err


def only_problem(doc: dict) -> dict:
    assert not doc["clean"] and len(doc["problems"]) == 1, doc
    problem: dict = doc["problems"][0]
    assert list(problem) == ["topic", "partition", "object", "offset", "problem", "detail", "on_chain"]
    return problem


def table_row(out: str, key: str) -> str:
    """The line of the table naming ``key``."""
    rows = [line for line in out.splitlines() if key in line]
    assert len(rows) == 1, out
    return rows[0]


def cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("│").split("│")]


# --------------------------------------------------------------------------- clean


def test_a_clean_root_exits_0_with_a_summary(run: Run, root: Path) -> None:
    objects = 3 * ROUNDS
    batches = sum(
        len(index_entries(str(root), topic, p, i)) for topic, p in (("a", 0), ("a", 1), ("b", 0)) for i in range(ROUNDS)
    )
    assert batches > objects  # several batches per object: damage can be placed in a later one
    code, out, err = verify_table(run, root)
    assert code == 0, err
    assert out.strip().splitlines() == [
        f"verified 2 topic(s), 3 partition(s), {objects} object(s), {batches} batch(es), "
        f"{objects * PER_ROUND:,} record(s), {out.split('record(s), ')[1].split(':')[0]}: no problems"
    ]

    code, doc, _ = verify_json(run, root)
    assert code == 0
    assert doc["clean"] is True and doc["problems"] == []
    sizes = sum(p.stat().st_size for p in root.rglob("*.arrow"))
    assert doc["checked"] == {
        "topics": ["a", "b"],
        "partitions": 3,
        "objects": objects,
        "batches": batches,
        "records": objects * PER_ROUND,
        "bytes": sizes,
    }


# --------------------------------------------------------------------------- damage


def test_a_flipped_byte_in_a_batch_is_named_with_its_object_and_offset(run: Run, root: Path) -> None:
    key, _ = chain(root, "a", 1)[1]
    index = index_entries(str(root), "a", 1, 1)
    flip(root / key, int(index.loc[1, "position"]) + 10)  # inside the second batch of the object
    batch_offset = int(index.loc[1, "base_offset"])
    assert batch_offset > PER_ROUND  # the second object's second batch, not where the object starts

    code, doc, _ = verify_json(run, root)
    assert code == 1
    problem = only_problem(doc)
    assert problem["problem"] == "batch checksum" and "CRC32C" in problem["detail"]
    assert (problem["topic"], problem["partition"], problem["object"], problem["offset"]) == ("a", 1, key, batch_offset)
    assert problem["on_chain"] is True

    code, out, _ = verify_table(run, root)
    assert code == 1
    assert cells(table_row(out, key))[:5] == ["a", "1", str(batch_offset), "batch checksum", key]
    assert out.strip().splitlines()[-1].endswith(": 1 problem(s)")


def test_a_truncated_object_is_named_at_its_base_offset(run: Run, root: Path) -> None:
    key, base = chain(root, "b", 0)[2]
    assert base == 2 * PER_ROUND
    data = (root / key).read_bytes()
    (root / key).write_bytes(data[: len(data) // 2])

    code, doc, _ = verify_json(run, root)
    assert code == 1
    problem = only_problem(doc)
    assert (problem["topic"], problem["partition"], problem["object"], problem["offset"]) == ("b", 0, key, base)
    assert problem["problem"] == "truncated"

    code, out, _ = verify_table(run, root)
    assert code == 1 and cells(table_row(out, key))[:5] == ["b", "0", str(base), "truncated", key]


def test_a_damaged_index_is_named_at_its_objects_base_offset(run: Run, root: Path) -> None:
    key, base = chain(root, "a", 0)[1]
    assert base == PER_ROUND
    size = (root / key).stat().st_size
    flip(root / key, size - TAIL.size - 40)  # inside the index, before the tail

    code, doc, _ = verify_json(run, root)
    assert code == 1
    problem = only_problem(doc)
    assert (problem["object"], problem["offset"], problem["problem"]) == (key, base, "index checksum")

    code, out, _ = verify_table(run, root)
    assert code == 1 and cells(table_row(out, key))[:5] == ["a", "0", str(base), "index checksum", key]


def test_only_the_named_topics_are_checked(run: Run, root: Path) -> None:
    key, _ = chain(root, "b", 0)[0]
    flip(root / key, 200)

    code, doc, _ = verify_json(run, root, "a")
    assert code == 0 and doc["clean"] and doc["checked"]["topics"] == ["a"]
    assert doc["checked"]["partitions"] == 2 and doc["checked"]["objects"] == 2 * ROUNDS

    code, out, _ = verify_table(run, root, "a")
    assert code == 0 and "no problems" in out

    for topics in (("b",), ("a", "b"), ()):
        code, doc, _ = verify_json(run, root, *topics)
        assert code == 1 and only_problem(doc)["object"] == key


# --------------------------------------------------------------------------- errors


def test_an_unknown_topic_is_an_error_naming_it(run: Run, root: Path) -> None:
    before = snapshot(root)
    code, out, err = run("verify", "a", "nope")
    assert code == 2 and out == ""
    assert "error: unknown topic 'nope'" in err

    code, out, err = run("verify", "nope", "zilch", "--json")
    assert code == 2 and out == ""  # nothing on stdout for a script to mistake for a report
    assert "error: unknown topics 'nope', 'zilch'" in err
    assert snapshot(root) == before


def test_a_missing_root_is_an_error_and_is_not_created(run: Run, tmp_path: Path) -> None:
    missing = tmp_path / "not-a-root"
    code, out, err = run("verify", "--url", str(missing), with_url=False)
    assert code == 2 and out == ""
    assert "error: no plog root at" in err and str(missing) in err
    assert not missing.exists()


def test_an_empty_root_is_clean_and_says_so(run: Run, url: str) -> None:
    code, out, err = run("verify")
    assert code == 0 and "0 object(s)" in out and "no topics" in err


def test_progress_goes_to_stderr_and_json_stays_alone_on_stdout(run: Run, root: Path) -> None:
    code, out, err = run("verify", "--json", "--progress")
    assert code == 0 and json.loads(out)["clean"] is True
    assert "verifying" in err and f"{3 * ROUNDS} objects" in err


def test_help_documents_the_exit_codes(run: Run) -> None:
    code, out, _ = run("verify", "--help", with_url=False)
    assert code == 0
    text = " ".join(out.split())
    assert "0 when everything is sound, 1 when problems were found" in text and "2 on bad usage" in text


# --------------------------------------------------------------------------- a real process


def test_verify_as_a_real_command(root: Path, tmp_path: Path) -> None:
    """``python -m pyspark_logsource.cli verify``: exit codes and stdout of the real process."""
    env = {k: v for k, v in os.environ.items() if k not in ("PLOG_URL", "COLUMNS")}
    env["PYTHONPATH"] = os.pathsep.join([str(WORKTREE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)

    def plog(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pyspark_logsource.cli", "verify", "--url", str(root), *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=False,
        )

    clean = plog()
    assert clean.returncode == 0, clean.stderr
    assert clean.stdout.strip().endswith("no problems")

    key, base = chain(root, "a", 1)[2]
    size = (root / key).stat().st_size
    flip(root / key, size - TAIL.size - 40)
    before = snapshot(root)
    damaged = plog("--json")
    assert snapshot(root) == before
    assert damaged.returncode == 1, damaged.stderr
    problem = only_problem(json.loads(damaged.stdout))
    assert (problem["object"], problem["offset"], problem["problem"]) == (key, base, "index checksum")

    unknown = plog("nope")
    assert unknown.returncode == 2 and unknown.stdout == "" and "unknown topic 'nope'" in unknown.stderr


def test_counts_are_what_readers_see_and_superseded_objects_are_counted_apart(run: Run, url: str) -> None:
    """A merge leaves the objects it replaced listed until they are deleted (PROTOCOL.md 10): the counts are the
    chains' (what a reader reads), and the superseded objects are counted apart, checked all the same."""
    import pyarrow as pa

    from pyspark_logsource import Consumer, LogStore, Producer, TopicPartition
    from segment_format.root import LogRoot

    with LogStore(url) as store:
        store.create_topic("p", 1, {"storage.layout": "partitioned", "auto.maintenance.enable": False})
        store.create_topic("s", 2, {"auto.maintenance.enable": False})
    with Producer(url) as producer:
        for i in range(20):
            producer.send_batch("p", pa.table({"value": [b"p%d" % i] * 10}))
            producer.send_batch(
                "s", pa.table({"value": [b"s%d" % i] * 10, "partition": pa.array([0, 1] * 5, pa.int32())})
            )
    with LogRoot(url) as root:
        root.maintain("p")
        root.maintain("s")
    seen = 0
    with Consumer(url, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("p", 0), TopicPartition("s", 0), TopicPartition("s", 1)])
        seen = consumer.read_to_end().num_rows
    code, out, _ = run("verify", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["clean"]
    assert seen == 400 and doc["checked"]["records"] == seen
    assert doc["superseded"]["objects"] > 0 and doc["superseded"]["records"] > 0
    code, out, _ = run("verify")
    assert code == 0 and "400 record(s)" in out and "superseded object(s) awaiting deletion" in " ".join(out.split())
