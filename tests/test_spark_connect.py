"""plog through Spark Connect: what shared and serverless clusters offer, tested against a local Connect server.

Shared and serverless clusters reach Spark only through a Spark Connect client: plans go to the server
as protobuf, the data source's Python code runs in the *server's* Python workers, and errors come back
as text. The tests start one Connect server per test session, as a process of its own
(``spark-submit --class ...SparkConnectServer``, the class ``sbin/start-connect-server.sh`` runs, in the
foreground), bound to 127.0.0.1 on a free port; its Python workers find plog on ``PYTHONPATH`` (the
project root) and run this interpreter. A separate process, because this pytest process already hosts
the classic SparkSession of ``tests/fixtures_spark.py``, and a JVM holds one SparkContext: an in-process
Connect server (``builder.remote("local[2]")``) would need a SparkContext of its own.

The client is ``pyspark.sql.connect.session.SparkSession`` itself: ``pyspark.sql.SparkSession.builder
.remote(...)`` refuses to make a Connect session while a classic one is active in the process
(``SESSION_ALREADY_EXIST``). Since the process is not in Connect mode (``is_remote()`` is false, for the
classic tests' sake), ``pyspark.sql.functions`` would build classic columns: these tests use SQL text
(``selectExpr``, ``where``) instead.

Covered: a batch read, an exactly-once plog -> plog stream stopped and restarted from its checkpoint,
``groupIdForLag``, a typed topic read and written, a credential-like option refused with plog's message,
and ``plog demo`` running its Spark part through Connect (``SPARK_REMOTE``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyspark_logsource import Consumer, TopicPartition
from segment_format.root import LogRoot
from tests.fixtures_spark import SPARK_TEST_CONF, java_available, spark_test_env, wait_for

pyspark = pytest.importorskip("pyspark")

from tests.test_spark_sink import (  # noqa: E402
    committed,
    make_root,
    produce_keyed,
    run_available_now,
    stable_and_end,
    values,
)
from tests.test_spark_typed import append, read_df, stored_values, typed_root  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.connect]

#: The server's class (what ``sbin/start-connect-server.sh`` submits).
CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
#: How long the server may take to listen: a JVM start on a busy two-core machine.
SERVER_START_TIMEOUT_S = 180


def _free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the server binds it a moment later; another taker is unlikely)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _die_with_parent() -> None:
    """In the server's process, before exec: on Linux, SIGTERM it when pytest dies (even by SIGKILL).

    The fixture's teardown stops the server at the end of a session; this covers a session that never
    gets there, so no JVM outlives it holding a port and a gigabyte.
    """
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group (spark-submit, its JVM, the JVM's Python workers); SIGKILL if it lingers."""
    for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 30)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _why_no_connect() -> str | None:
    """Why this machine cannot run a Spark Connect server and client, or None."""
    if not java_available():
        return "Java is not installed: the Spark Connect server needs a JVM"
    missing = [m for m in ("grpc", "grpc_status", "google.rpc", "zstandard") if importlib.util.find_spec(m) is None]
    if missing:
        return f"the Spark Connect client needs {', '.join(missing)}: pip install 'pyspark[connect]'"
    from pyspark.find_spark_home import _find_spark_home

    home = Path(_find_spark_home())
    if not list((home / "jars").glob("spark-connect_*.jar")):
        return f"this pyspark ships no Spark Connect server (no jars/spark-connect_*.jar under {home})"
    return None


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A local Spark Connect server for the whole test session; yields its ``sc://127.0.0.1:<port>`` URL.

    Torn down at the end of the session. Skips (with the reason, and the tail of the server's log when
    it started but never listened) only when the machine cannot run one.
    """
    reason = _why_no_connect()
    if reason is not None:
        pytest.skip(reason)
    from pyspark.find_spark_home import _find_spark_home

    home = _find_spark_home()
    port = _free_port()
    conf = {
        **SPARK_TEST_CONF,
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.ui.showConsoleProgress": "false",
    }
    cmd = [os.path.join(home, "bin", "spark-submit"), "--master", "local[2]", "--name", "plog-connect-tests"]
    for key, value in conf.items():
        cmd += ["--conf", f"{key}={value}"]
    cmd += ["--class", CONNECT_SERVER_CLASS]
    env = {**os.environ, **spark_test_env(), "SPARK_HOME": home}
    for var in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE"):  # the server is classic Spark
        env.pop(var, None)
    log = tmp_path_factory.mktemp("connect-server") / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # only a prctl call: safe between fork and exec
        )
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while not _listening(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                what = "exited" if proc.poll() is not None else f"did not listen within {SERVER_START_TIMEOUT_S} s"
                pytest.skip(f"this machine cannot start a Spark Connect server (it {what}):\n{log.read_text()[-3000:]}")
            time.sleep(0.3)
        yield f"sc://127.0.0.1:{port}"
    finally:
        _stop_server(proc)


@pytest.fixture(scope="session")
def connect_spark(connect_server: str) -> Iterator[Any]:
    """A Spark Connect client session on :func:`connect_server`, shared by the module's tests."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    session = ConnectSession.builder.remote(connect_server).getOrCreate()
    try:
        yield session
    finally:
        for query in session.streams.active:
            query.stop()
        session.stop()


@pytest.fixture(autouse=True)
def _stop_connect_queries(request: pytest.FixtureRequest) -> Iterator[None]:
    """Stop the streaming queries a test left running on the server, so the next test starts clean."""
    yield
    if "connect_spark" in request.fixturenames:
        for query in request.getfixturevalue("connect_spark").streams.active:
            query.stop()


# ---------------------------------------------------------------------------- the tests


def test_the_session_is_a_connect_session(connect_spark: Any) -> None:
    # Guards the rest: a classic session here would make every other test prove nothing about Connect.
    assert type(connect_spark).__module__ == "pyspark.sql.connect.session"
    assert not hasattr(connect_spark, "_jsparkSession")


def test_batch_read(connect_spark: Any, tmp_path: Path) -> None:
    root = make_root(tmp_path, {"clicks": 2})
    produce_keyed(root, "clicks", 400)  # k<i % 20> by Kafka's partitioner: both partitions get some
    ends = [end for _, end in stable_and_end(root, "clicks")]
    assert all(ends)
    df = (
        connect_spark.read.format("plog")
        .option("subscribe", "clicks")
        .option("startingOffsets", "earliest")
        .option("endingOffsets", json.dumps({"clicks": {"0": 10, "1": -1}}))
        .load(root)
    )
    assert df.columns[:4] == ["key", "value", "topic", "partition"]
    assert df.count() == 10 + ends[1]
    got = df.where("partition = 0").orderBy("offset").selectExpr("offset", "cast(value as string) as v").collect()
    assert [r.offset for r in got] == list(range(10))
    stored = [row for row in committed(root, "clicks").to_pylist() if row["partition"] == 0][:10]
    assert [r.v for r in got] == [row["value"].decode() for row in stored]


def test_exactly_once_stream_restarted_from_its_checkpoint(connect_spark: Any, tmp_path: Path) -> None:
    root = make_root(tmp_path, {"in": 3, "even": 2, "odd": 1})
    produce_keyed(root, "in", 600)
    checkpoint = str(tmp_path / "ck")

    def start() -> Any:
        return (
            connect_spark.readStream.format("plog")
            .option("subscribe", "in")
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "250")
            .option("groupIdForLag", "lag-connect")
            .load(root)
            .selectExpr(
                "key",
                "upper(cast(value as string)) as value",
                "case when cast(split(cast(value as string), ':')[1] as int) % 2 = 0 "
                "then 'even' else 'odd' end as topic",
            )
            .writeStream.format("plog")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start(root)
        )

    query = run_available_now(start())
    assert len([p for p in query.recentProgress if p.numInputRows]) >= 3  # several micro-batches
    # New input while the query is stopped: the restarted query takes only that from its checkpoint.
    produce_keyed(root, "in", 300, start=600)
    query = run_available_now(start())
    assert sum(p.numInputRows for p in query.recentProgress) == 300
    got = sorted(values(committed(root, "even")) + values(committed(root, "odd")))
    assert got == sorted(f"IN:{i}".encode() for i in range(900))  # every record, once
    assert all(stable == end for stable, end in stable_and_end(root, "even") + stable_and_end(root, "odd"))
    _assert_lag_group_at_end(root, "in", "lag-connect")


def _assert_lag_group_at_end(root: str, topic: str, group: str) -> None:
    """``groupIdForLag``: the group's committed offsets reach the end of every partition of ``topic``."""
    ends = {p: end for p, (_, end) in enumerate(stable_and_end(root, topic))}
    store = LogRoot(root).store
    wait_for(
        lambda: any(
            json.loads(store.get(i.key)) == {topic: {str(p): e for p, e in ends.items()}}
            for i in store.list(f"groups/{group}/offsets/")
        ),
        30,
        f"group {group!r}'s offsets",
    )
    with Consumer(root, group_id=group) as consumer:  # what lag tools read
        assert {p: consumer.committed(TopicPartition(topic, p)) for p in ends} == ends


def test_typed_topic_read_and_written(connect_spark: Any, tmp_path: Path) -> None:
    url = typed_root(
        tmp_path, {"ev": ("user string, n int NOT NULL, score double", 2), "out": ("user string, n bigint NOT NULL", 1)}
    )
    append(url, "ev", [{"user": f"u{i}", "n": i, "score": i / 2} for i in range(6)] + [None], partition=0)
    append(url, "ev", [{"user": "v", "n": 100, "score": None}], partition=1, first_key=7)

    df = read_df(connect_spark, url, subscribe="ev")
    value = df.schema["value"].dataType
    assert [(f.name, f.dataType.simpleString()) for f in value.fields] == [
        ("user", "string"),
        ("n", "int"),
        ("score", "double"),
    ]
    assert df.where("value.n = 3").selectExpr("value.user", "value.score").first() == ("u3", 1.5)
    flat = read_df(connect_spark, url, subscribe="ev", flattenValue="true")
    assert flat.columns[-3:] == ["user", "n", "score"]
    assert sorted(r.n for r in flat.where("n is not null").select("n").collect()) == [0, 1, 2, 3, 4, 5, 100]

    # Written through the sink: top-level fields (n widened int -> bigint, score dropped), and a struct value.
    flat.where("n < 3").selectExpr("key", "user", "n").write.mode("append").format("plog").option("topic", "out").save(
        url
    )
    connect_spark.createDataFrame([("k9", ("w", 9))], "key string, value struct<user: string, n: bigint>").write.mode(
        "append"
    ).format("plog").option("topic", "out").save(url)
    assert sorted(stored_values(url, "out"), key=lambda v: v["n"] if v else -1) == [
        {"user": "u0", "n": 0},
        {"user": "u1", "n": 1},
        {"user": "u2", "n": 2},
        {"user": "w", "n": 9},
    ]
    with pytest.raises(Exception, match="non-nullable field 'n' is missing"):  # the sink's check, as text
        connect_spark.createDataFrame([("x",)], "user string").write.mode("append").format("plog").option(
            "topic", "out"
        ).save(url)


def test_a_credential_option_is_refused_with_plogs_message(connect_spark: Any, tmp_path: Path) -> None:
    root = make_root(tmp_path, {"t": 1})
    secret = "plog-test-not-a-real-key-7f3a"
    with pytest.raises(Exception) as info:
        connect_spark.read.format("plog").option("subscribe", "t").option("storage.key", secret).load(root).count()
    text = str(info.value)
    assert "'storage.key'" in text and "'storage.secret.key'" in text, text
    assert secret not in text  # plog's message names the option, never its value


def test_plog_demo_runs_its_spark_part_through_connect(connect_server: str, tmp_path: Path) -> None:
    """``plog demo`` with ``SPARK_REMOTE`` set: the streaming query runs on the Connect server, no local JVM."""
    env = {k: v for k, v in os.environ.items() if k not in ("PLOG_URL", "COLUMNS", "SPARK_CONNECT_MODE_ENABLED")}
    env["SPARK_REMOTE"] = connect_server
    env["JAVA_HOME"] = str(tmp_path / "no-java")  # a JVM in the client would have to come from somewhere
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if not _has_java(p))
    done = subprocess.run(
        [sys.executable, "-m", "pyspark_logsource.cli", "demo", "--records", "600"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": spark_test_env()["PYTHONPATH"]},
        capture_output=True,
        timeout=300,
        check=False,
    )
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()[-5000:] + out
    assert "add up to 600; 'clicks' holds 600 events" in out and "600 new event(s) in" in out
    assert "✗" not in out and "skipping the Spark part" not in out + done.stderr.decode()
    assert (tmp_path / "plog-data" / "_spark" / "checkpoints" / "clicks-per-user" / "commits").is_dir()


def _has_java(directory: str) -> bool:
    return os.access(os.path.join(directory, "java"), os.X_OK)
