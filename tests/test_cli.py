"""The ``plog`` command line: run in-process through ``main([...])`` and as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from pyspark_logsource import Producer
from pyspark_logsource.cli.common import CliError, parse_timestamp, storage_options
from pyspark_logsource.cli.demo import generate_clicks, parse_clicks, verify_clicks
from pyspark_logsource.views.terminal import format_ms
from tests.fixtures_cli import Run

BASE_MS = 1_700_000_000_000  # 2023-11-14T22:13:20Z


def _subprocess(args: list[str], cwd: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in ("PLOG_URL", "COLUMNS")}
    return subprocess.run(
        [sys.executable, "-m", "pyspark_logsource.cli", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        timeout=60,
        env=env,
        check=False,
    )


def _values(out: str) -> list[str]:
    return out.splitlines()


# --------------------------------------------------------------------------- topics


def test_topics_create_list_describe_delete_round_trip(run: Run) -> None:
    code, out, _ = run(
        "topics",
        "create",
        "orders",
        "--partitions",
        "3",
        "--config",
        "retention.ms=3600000",
        "--config",
        "compression.type=zstd",
    )
    assert code == 0 and "created topic 'orders' with 3 partitions" in out
    assert run("topics", "create", "audit")[0] == 0

    code, out, _ = run("topics", "list")
    assert code == 0 and _values(out) == ["audit", "orders"]

    code, out, _ = run("topics", "describe", "orders")
    assert code == 0
    assert "topic orders" in out and "3 partitions" in out
    for header in ("partition", "start", "end", "bytes", "segments"):
        assert header in out
    assert "retention.ms" in out and "3600000" in out and "zstd" in out and "set" in out

    code, out, _ = run("topics", "create", "orders")
    assert code == 2  # already exists

    code, out, _ = run("topics", "delete", "orders")
    assert code == 0 and "deleted topic 'orders'" in out
    code, out, _ = run("topics", "list")
    assert _values(out) == ["audit"]
    code, _, err = run("topics", "describe", "orders")
    assert code == 2 and "error: unknown topic 'orders'" in err


def test_topics_list_empty_root_says_so(run: Run) -> None:
    code, out, err = run("topics", "list")
    assert code == 0 and out == "" and "no topics" in err


# --------------------------------------------------------------------------- produce / consume


def test_produce_plain_lines_then_consume_prints_exactly_them(run: Run) -> None:
    run("topics", "create", "lines")
    text = "alpha\nbeta with [brackets] and ümlauts\n\n  spaced  \r\nlast-without-newline"
    code, out, _ = run("produce", "lines", stdin=text.encode())
    assert code == 0 and "produced 5 records to 'lines'" in out and "offsets 0..4" in out

    code, out, err = run("consume", "lines", "--from-beginning", "--timeout-ms", "100")
    assert code == 0
    assert out == "alpha\nbeta with [brackets] and ümlauts\n\n  spaced  \nlast-without-newline\n"
    assert "consumed 5 records" in err


def test_produce_json_with_keys_then_consume_json(run: Run) -> None:
    run("topics", "create", "clicks", "--partitions", "3")
    lines = [json.dumps({"user": f"u{i % 4}", "n": i}) for i in range(40)]
    lines.insert(5, "")  # blank lines are skipped in --json mode
    lines.append(json.dumps({"n": 99}))  # no key field: refused by default, a null key and a warning if asked
    code, out, err = run("produce", "clicks", "--json", "--key-field", "user", stdin="\n".join(lines).encode())
    assert code == 2 and "produced 40 records" in out
    assert "line 42: no field 'user' for the key (--key-field)" in err and "--missing-key warn" in err
    code, out, err = run(
        "produce", "clicks", "--json", "--key-field", "user", "--missing-key", "warn", stdin=lines[-1].encode()
    )
    assert code == 0 and "produced 1 record" in out
    assert "warning: 1 line(s) had no field 'user' and were sent with a null key (line 1)" in " ".join(err.split())

    code, out, _ = run("consume", "clicks", "--from-beginning", "--format", "json", "--timeout-ms", "100")
    assert code == 0
    records = [json.loads(line) for line in _values(out)]
    assert len(records) == 41
    assert {r["topic"] for r in records} == {"clicks"}
    assert sorted(r["value"] for r in records) == sorted(line for line in lines if line)
    by_key: dict[str | None, list[dict]] = {}
    for record in records:
        assert set(record) == {"topic", "partition", "offset", "timestamp", "key", "value", "headers"}
        assert record["headers"] == [] and isinstance(record["timestamp"], int)
        value = json.loads(record["value"])
        assert record["key"] == value.get("user")
        by_key.setdefault(record["key"], []).append(record)
    for key, recs in by_key.items():
        if key is None:
            continue
        assert len({r["partition"] for r in recs}) == 1, key  # a key sticks to one partition
        ns = [json.loads(r["value"])["n"] for r in sorted(recs, key=lambda r: r["offset"])]
        assert ns == sorted(ns), key  # ... in order


def test_produce_to_one_partition_and_json_key_types(run: Run) -> None:
    run("topics", "create", "p", "--partitions", "2")
    stdin = b'{"k": 7, "v": 1}\n{"k": {"a": 1}, "v": 2}\n{"k": "s", "v": 3}\n'
    code, out, err = run("produce", "p", "--json", "--key-field", "k", "--partition", "1", "--progress", stdin=stdin)
    assert code == 0 and "partition 1: offsets 0..2" in out
    assert "producing to p" in err and "3 records" in err  # the progress bar's final state
    code, out, _ = run(
        "consume", "p", "--partition", "1", "--from-beginning", "--format", "json", "--timeout-ms", "100"
    )
    assert [json.loads(line)["key"] for line in _values(out)] == ["7", '{"a":1}', "s"]
    code, out, _ = run("consume", "p", "--partition", "0", "--from-beginning", "--timeout-ms", "50")
    assert code == 0 and out == ""


@pytest.fixture
def timed_topic(url: str, run: Run) -> list[int]:
    """Topic ``timed`` (1 partition): values v0..v9 with timestamps BASE_MS + i seconds."""
    run("topics", "create", "timed")
    stamps = [BASE_MS + i * 1000 for i in range(10)]
    with Producer(url) as producer:
        for i, ts in enumerate(stamps):
            producer.send("timed", value=f"v{i}", timestamp_ms=ts)
    return stamps


def test_consume_from_offset(run: Run, timed_topic: list[int]) -> None:
    code, out, _ = run("consume", "timed", "--offset", "4", "--max-records", "3")
    assert code == 0 and _values(out) == ["v4", "v5", "v6"]
    code, out, _ = run("consume", "timed", "--partition", "0", "--offset", "8", "--timeout-ms", "50")
    assert code == 0 and _values(out) == ["v8", "v9"]
    code, out, err = run("consume", "timed", "--offset", "11", "--timeout-ms", "50")
    assert code == 2 and "offset 11 is out of range" in err and "0..10" in err


def test_consume_from_timestamp_iso_and_ms(run: Run, timed_topic: list[int]) -> None:
    iso = format_ms(timed_topic[7])
    assert iso == "2023-11-14T22:13:27.000Z"
    for ts in (iso, str(timed_topic[7]), "2023-11-14T22:13:26.500", "2023-11-14T23:13:26.5+01:00"):
        code, out, _ = run("consume", "timed", "--from-timestamp", ts, "--timeout-ms", "50")
        assert code == 0 and _values(out) == ["v7", "v8", "v9"], ts
    code, out, _ = run("consume", "timed", "--from-timestamp", "2100-01-01T00:00:00Z", "--timeout-ms", "50")
    assert code == 0 and out == ""
    code, _, err = run("consume", "timed", "--from-timestamp", "yesterday-ish")
    assert code == 2 and "'yesterday-ish'" in err


def test_consume_defaults_to_the_end_and_max_records(run: Run, timed_topic: list[int]) -> None:
    code, out, err = run("consume", "timed", "--timeout-ms", "50")
    assert code == 0 and out == "" and "--from-beginning" in err
    code, out, err = run("consume", "timed", "--from-beginning", "--max-records", "2", "--progress")
    assert code == 0 and _values(out) == ["v0", "v1"] and "consumed 2 records" in err


def test_parse_timestamp_and_storage_options() -> None:
    assert parse_timestamp("1700000000123") == 1_700_000_000_123
    assert parse_timestamp("2023-11-14T22:13:20Z") == BASE_MS
    assert parse_timestamp("2023-11-14T22:13:20.250") == BASE_MS + 250
    assert parse_timestamp("2023-11-14T23:13:20+01:00") == BASE_MS
    for bad in ("", "soon", "1969-12-31T00:00:00Z"):
        with pytest.raises(CliError):
            parse_timestamp(bad)
    assert format_ms(-1) == "-" and format_ms(BASE_MS + 5) == "2023-11-14T22:13:20.005Z"
    assert storage_options([("anon", "true"), ("endpoint_url", "http://h:9000"), ("n", "3")]) == {
        "anon": True,
        "endpoint_url": "http://h:9000",
        "n": 3,
    }


def test_memory_url_and_storage_option_flag(run: Run) -> None:
    args = ("--url", "memory://cli-test", "--storage-option", "anon=true")
    assert run("topics", "create", "m", *args, with_url=False)[0] == 0
    code, out, _ = run("topics", "list", *args, with_url=False)
    assert code == 0 and "m" in _values(out)
    code, _, err = run("topics", "list", "--storage-option", "novalue", with_url=False)
    assert code == 2 and "KEY=VALUE" in err


# --------------------------------------------------------------------------- inspect / maintain


def test_inspect_segments_index_and_batch(run: Run, url: str) -> None:
    run("topics", "create", "ins", "--config", "storage.layout=partitioned")  # an object per append, named by offset
    run("produce", "ins", stdin=b"".join(b"first-%d\n" % i for i in range(5)))
    run("produce", "ins", stdin=b"".join(b"second-%d [x]\n" % i for i in range(7)))

    code, out, _ = run("inspect", "ins")
    assert code == 0
    assert "00000000000000000000.arrow" in out and "00000000000000000005.arrow" in out
    assert "ins-0" in out and "end 12" in out
    for header in (
        "object",
        "base",
        "end",
        "records",
        "batches",
        "bytes",
        "min timestamp",
        "max timestamp",
        "compression",
        "gen",
        "lz4",
    ):
        assert header in out, header

    code, out, _ = run("inspect", "ins", "--partition", "0", "--index")
    assert code == 0 and "index of 00000000000000000005.arrow" in out
    assert "crc32c" in out and "position" in out and "last offset" in out

    code, out, _ = run("inspect", "ins", "--batch", "7", "--width", "12")
    assert code == 0
    assert "batch 0 of 1 in 00000000000000000005.arrow" in out
    assert "record count" in out and "crc32c" in out
    assert "second-2 [x]" in out and "second-6 [x]" in out and "first-" not in out

    code, _, err = run("inspect", "ins", "--batch", "12")
    assert code == 2 and "offset 12 is out of range for ins-0" in err
    code, _, err = run("inspect", "ins", "--partition", "3")
    assert code == 2 and "partition 3" in err


def test_inspect_a_shared_topic_shows_each_shared_object_once(run: Run, url: str) -> None:
    """A shared topic's flushes each write one object holding every partition (PROTOCOL.md 7.3): ``plog inspect``
    lists each once, with its commits and partitions, and each partition's commit part as one line; once moved,
    a partition's segment shows in its own table."""
    from segment_format.stores import open_store

    config = ("--config", "shared.move.ms=0", "--config", "auto.maintenance.enable=false")
    run("topics", "create", "sh", "--partitions", "4", *config)
    for n in range(3):
        lines = b"".join(b'{"k": "k%d", "n": %d}\n' % (i, n) for i in range(16))
        assert run("produce", "sh", "--json", "--key-field", "k", stdin=lines)[0] == 0
    objects = [info.key.rsplit("/", 1)[-1] for info in open_store(url).list("shared/")]
    assert len(objects) == 3
    code, out, _ = run("inspect", "sh")
    assert code == 0 and "sh: commit part  (3 shared objects)" in out
    assert all(out.count(name) == 1 for name in objects)  # once each, not once per partition
    assert out.count("partition's commit part:") == 4 and "(no segment)" in out
    run("maintain", "sh")
    code, out, _ = run("inspect", "sh", "--partition", "0")
    assert code == 0 and ".g1.c" in out and "(1 segments)" in out


def test_inspect_batch_needs_partition_on_multi_partition_topics(run: Run) -> None:
    run("topics", "create", "multi", "--partitions", "2")
    code, _, err = run("inspect", "multi", "--batch", "0")
    assert code == 2 and "--batch needs --partition" in err


def test_maintain(run: Run) -> None:
    run("topics", "create", "m1")
    run("produce", "m1", stdin=b"a\nb\n")
    code, out, _ = run("maintain", "m1")
    assert code == 0 and "merged: 0" in out and "garbage deleted: 0" in out
    code, out, _ = run("maintain")
    assert code == 0 and "all topics" in out
    code, _, err = run("maintain", "nope")
    assert code == 2 and "unknown topic 'nope'" in err


# --------------------------------------------------------------------------- bad input


def test_bad_input_exits_2_naming_the_culprit(run: Run) -> None:
    code, _, err = run("topics", "create", "bad name!")
    assert code == 2 and err.startswith("error: ") and "'bad name!'" in err and "Traceback" not in err
    code, _, err = run("topics", "create", "ok", "--config", "retention.mss=5")
    assert code == 2 and "retention.mss" in err
    code, _, err = run("topics", "create", "ok", "--partitions", "0")
    assert code == 2 and "partitions" in err
    unknown = (("consume", "ghost"), ("produce", "ghost"), ("inspect", "ghost"), ("topics", "delete", "ghost"))
    for args in unknown:
        code, _, err = run(*args, stdin=b"x\n")
        assert code == 2 and "unknown topic 'ghost'" in err, args
    run("topics", "create", "two", "--partitions", "2")
    code, _, err = run("consume", "two", "--offset", "0")
    assert code == 2 and "--offset needs --partition" in err
    code, _, err = run("produce", "two", "--key-field", "k", stdin=b"x\n")
    assert code == 2 and "--key-field needs --json" in err
    code, _, err = run("produce", "two", "--partition", "5", stdin=b"x\n")
    assert code == 2 and "partition 5" in err
    assert run("--help", with_url=False)[0] == 0
    assert run("consume", with_url=False)[0] == 2  # argparse: missing TOPIC


def test_malformed_json_line_keeps_earlier_records_and_sends_nothing_after(run: Run) -> None:
    run("topics", "create", "j")
    run("produce", "j", "--json", stdin=b'{"n": 0}\n')
    stdin = b'{"n": 1}\n{"n": 2}\n{"n": 3,,}\n{"n": 4}\n'
    code, out, err = run("produce", "j", "--json", stdin=stdin)
    assert code == 2
    assert "error: line 3: invalid JSON" in err and '{"n": 3,,}' in err
    assert "the 2 records before it were sent" in err and "Traceback" not in err
    assert "produced 2 records" in out
    code, _, err = run("produce", "j", "--json", stdin=b"[1, 2]\n")
    assert code == 2 and "line 1: expected a JSON object, got list" in err
    code, out, _ = run("consume", "j", "--from-beginning", "--timeout-ms", "50")
    assert _values(out) == ['{"n": 0}', '{"n": 1}', '{"n": 2}']


# --------------------------------------------------------------------------- demo


def test_demo_twice_in_a_row_in_the_same_directory(tmp_path: Path, run: Run) -> None:
    # First run: a real subprocess, in a fresh empty directory, on the embedded default ./plog-data.
    # --no-spark: the demo's Spark part is tested in tests/test_spark_sink.py.
    first = _subprocess(["demo", "--records", "1500", "--no-spark"], cwd=tmp_path)
    out = first.stdout.decode()
    assert first.returncode == 0, first.stderr.decode() + out
    assert "1,500 records produced and read back exactly once" in out
    assert "created topic 'clicks' with 3 partitions" in out
    for section in (
        "throughput",
        "Producer.send",
        "Producer.send_batch",
        "Consumer.poll_arrow",
        "events per action",
        "top 5 pages",
        "verification",
        "purchase",
    ):
        assert section in out, section
    assert "✗" not in out

    # Second run: in-process, same root; appends and verifies only its own records.
    code, out, _ = run("demo", "--records", "1200", "--no-spark", "--url", str(tmp_path / "plog-data"), with_url=False)
    assert code == 0, out
    assert "already exists (3 partitions, 1,500 records): reusing it" in out
    assert "1,200 records produced and read back exactly once" in out
    code, out, _ = run("topics", "describe", "clicks", "--url", str(tmp_path / "plog-data"), with_url=False)
    assert "2,700" in out


def test_produce_consume_as_subprocess_with_bad_json(tmp_path: Path) -> None:
    assert _subprocess(["topics", "create", "sp"], cwd=tmp_path).returncode == 0
    bad = _subprocess(
        ["produce", "sp", "--json", "--key-field", "id"],
        cwd=tmp_path,
        stdin=b'{"id": "a"}\n{"id": "b"}\nnot json\n{"id": "c"}\n',
    )
    err = bad.stderr.decode()
    assert bad.returncode == 2 and "error: line 3: invalid JSON" in err and "Traceback" not in err
    consumed = _subprocess(
        ["consume", "sp", "--from-beginning", "--format", "json", "--timeout-ms", "100"], cwd=tmp_path
    )
    assert consumed.returncode == 0
    keys = [json.loads(line)["key"] for line in consumed.stdout.decode().splitlines()]
    assert keys == ["a", "b"]
    assert (tmp_path / "plog-data" / "topics" / "sp").is_dir()


def test_demo_verification_detects_loss_duplicates_and_reordering() -> None:
    stream = generate_clicks("feedbeef", 300, BASE_MS)
    partitions = [int(u.split("-")[1]) % 3 for u in stream.users]
    next_offset = [0, 0, 0]
    offsets = []
    for p in partitions:
        offsets.append(next_offset[p])
        next_offset[p] += 1
    table = pa.table(
        {
            "topic": ["clicks"] * 300,
            "partition": pa.array(partitions, pa.int32()),
            "offset": pa.array(offsets, pa.int64()),
            "timestamp": pa.array(stream.timestamps, pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
            "key": pa.array([u.encode() for u in stream.users], pa.binary()),
            "value": pa.array(stream.values, pa.binary()),
        }
    )
    written: dict[int, set[int]] = {}
    for p, o in zip(partitions, offsets, strict=True):
        written.setdefault(p, set()).add(o)
    good = parse_clicks(table, "feedbeef")
    assert all(ok for _, ok, _ in verify_clicks(stream, good, written))
    assert parse_clicks(table, "otherrun").num_rows == 0

    def failed(got: pa.Table) -> set[str]:
        return {name for name, ok, _ in verify_clicks(stream, got, written) if not ok}

    assert "every record read back" in failed(good.slice(1))
    assert "no duplicates" in failed(pa.concat_tables([good, good.slice(0, 1)]))
    # Swap the sequence numbers of one user's first two events: per-user order broken.
    user = stream.users[0]
    rows = [i for i, u in enumerate(good.column("user").to_pylist()) if u == user][:2]
    assert len(rows) == 2
    seq = good.column("seq").to_pylist()
    seq[rows[0]], seq[rows[1]] = seq[rows[1]], seq[rows[0]]
    swapped = good.set_column(good.schema.get_field_index("seq"), "seq", pa.array(seq, pa.int64()))
    assert "per-user order kept" in failed(swapped)
