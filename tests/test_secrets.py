"""Credentials stay out of sight (issue 12, *Secrets*).

A canary key and secret are given as plog's storage options (``storage_options`` in Python,
``--storage-option`` on the command line, ``storage.*`` options in Spark) against moto's S3 server,
which accepts any credentials, so the canary really is what signs the requests. Everything a person
or a log can see is then collected and searched for it: ``repr()`` of the client objects and their
stores, the messages of plog's errors (bad options, unknown topics, a storage deadline passed), the
CLI's output and error output, and, from a Spark driver run with event logging on, the batch and
streaming plans, ``explain``, the streaming query's progress and its string form, a failed read's
message and the event log itself.

Every backend's credential options are tried too (s3fs ``key``/``secret``/``token``, gcsfs ``token``, adlfs
``account_key``/``connection_string``/``sas_token``/``client_secret``/``credential``, a ``password``), each
with a canary of its own, against a local root, which ignores storage options, so that no backend package
is needed: Spark still sees every option. Under a name Spark would print plog refuses them, naming the
option and its safe spelling (``storage.secret.<name>``); under the safe spelling no plan, ``explain``,
progress, error or event log shows them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pyspark_logsource import Consumer, LogStore, Producer, TopicPartition
from pyspark_logsource.cli.app import main as plog_main
from pyspark_logsource.cli.common import storage_option_args
from pyspark_logsource.spark.credentials import SECRET_PREFIX, spark_redacts, spark_storage_options
from pyspark_logsource.spark.options import parse_options, split_options
from segment_format.errors import InvalidConfigError, PlogError
from segment_format.root import LogRoot
from segment_format.stores.credentials import scrub
from tests.fixtures_spark import java_available, start_driver, wait_for, write_driver_script

CANARY_KEY = "CANARY-KEY-7f3a91c2"
CANARY_SECRET = "CANARY-SECRET-7f3a91c2"


def _canary_options(storage: dict[str, Any]) -> dict[str, Any]:
    return {**storage, "key": CANARY_KEY, "secret": CANARY_SECRET}


#: Every backend's credential options (fsspec names), each with a canary value of its own.
BACKEND_CREDENTIALS: dict[str, str] = {
    name: f"CANARY-{name.upper()}-7f3a91c2"
    for name in (
        "key",  # s3fs
        "secret",  # s3fs
        "token",  # s3fs (session token), gcsfs
        "account_key",  # adlfs
        "connection_string",  # adlfs
        "sas_token",  # adlfs
        "client_secret",  # adlfs (service principal)
        "credential",  # adlfs
        "password",  # sftp, ftp, smb, s3fs (a proxy's)
    )
}
#: A structured option that hides a credential inside its JSON value (botocore's client arguments).
NESTED_CANARY = "CANARY-NESTED-7f3a91c2"
NESTED_OPTION = {"client_kwargs": {"region_name": "us-east-1", "aws_secret_access_key": NESTED_CANARY}}
ALL_CANARIES = (CANARY_KEY, CANARY_SECRET, NESTED_CANARY, *BACKEND_CREDENTIALS.values())
#: The credential options whose plain ``storage.<name>`` Spark would print, and plog therefore refuses.
REFUSED = sorted([name for name in BACKEND_CREDENTIALS if not spark_redacts("storage." + name)] + list(NESTED_OPTION))


def _assert_no_canary(where: str, text: str) -> None:
    for canary in ALL_CANARIES:
        assert canary not in text, (
            f"a credential appears in {where}: ...{text[max(0, text.find(canary) - 200) :][:260]}"
        )


@pytest.mark.s3
def test_client_objects_and_errors_never_show_credentials(s3_url: tuple[str, dict[str, Any]]) -> None:
    url, storage = s3_url
    options = _canary_options(storage)
    seen: dict[str, str] = {}
    with LogStore(url, options) as admin:
        admin.create_topic("secret-t", 2)
        seen["LogStore"] = repr(admin)
        with Producer(url, options) as producer:
            producer.send("secret-t", b"v", partition=0).get(30)
            seen["Producer"] = repr(producer)
            with pytest.raises(PlogError) as unknown:
                producer.send("no-such-topic", b"v").get(30)
            seen["unknown topic"] = str(unknown.value)
        with Consumer(url, options, auto_offset_reset="earliest") as consumer:
            consumer.assign([TopicPartition("secret-t", 0)])
            assert sum(len(r) for r in consumer.poll(timeout_ms=10_000).values()) == 1  # the canary signs real reads
            seen["Consumer"] = repr(consumer)
            with pytest.raises(PlogError) as out_of_range:
                consumer.seek(TopicPartition("secret-t", 9), 0)
            seen["bad partition"] = str(out_of_range.value)
    root = LogRoot(url, options)
    try:
        seen["LogRoot"] = repr(root)
        seen["store"] = repr(root.store)
        seen["partition log"] = repr(root.partition("secret-t", 0))
    finally:
        root.close()
    with pytest.raises(PlogError) as bad_option:
        LogStore(url, {**options, "plog_deadline_ms": "soon"})
    seen["bad option"] = str(bad_option.value)
    # Nothing listens on port 9 of 127.0.0.1: every try fails until the deadline passes.
    unreachable = {**options, "endpoint_url": "http://127.0.0.1:9", "plog_deadline_ms": 300}
    with pytest.raises(PlogError) as deadline, LogStore(url, unreachable) as store:
        store.create_topic("never", 1)
    seen["storage deadline"] = str(deadline.value) + repr(deadline.value.__cause__)
    for where, text in seen.items():
        _assert_no_canary(where, text)


@pytest.mark.s3
def test_cli_output_never_shows_credentials(s3_url: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    url, storage = s3_url
    options = _canary_options(storage)
    flags = ["--url", url, *storage_option_args(options)]

    def plog(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pyspark_logsource.cli", *args, *flags],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env={**os.environ, "COLUMNS": "200"},
        )

    created = plog("topics", "create", "cli-secret", "--partitions", "1")
    assert created.returncode == 0, created.stderr
    runs = {
        "topics list": plog("topics", "list"),
        "topics describe (unknown topic)": plog("topics", "describe", "no-such-topic"),
        "consume (unknown topic)": plog("consume", "no-such-topic"),
    }
    assert runs["topics list"].returncode == 0 and "cli-secret" in runs["topics list"].stdout
    assert runs["topics describe (unknown topic)"].returncode != 0
    for where, done in runs.items():
        _assert_no_canary(f"plog {where}", done.stdout + done.stderr)


SPARK_SECRETS_DRIVER = """
import io, contextlib
from pyspark_logsource import LogStore, Producer
url, storage, out, local = ARGS
storage = json.loads(storage)
with LogStore(url, storage) as admin:
    admin.create_topic("A", 2)
    admin.create_topic("B", 2)
with Producer(url, storage) as producer:
    for i in range(20):
        producer.send("A", key=b"k%d" % i, value=b"v%d" % i)
from pyspark_logsource.spark.credentials import spark_storage_options
from tests.test_secrets import spark_surfaces
options = spark_storage_options(storage)  # credentials as storage.secret.<name>, which Spark redacts
seen = spark_surfaces(spark, local, out + ".local")
batch = spark.read.format("plog").options(**options).option("subscribe", "A").load(url)
assert batch.count() == 20
seen["batch plan"] = batch._jdf.queryExecution().toString()
stream = (spark.readStream.format("plog").options(**options).option("subscribe", "A")
          .option("startingOffsets", "earliest").load(url))
query = (stream.select("key", "value").writeStream.format("plog").options(**options).option("topic", "B")
         .option("checkpointLocation", out + ".checkpoint").trigger(availableNow=True).start(url))
query.awaitTermination(180)
seen["progress"] = json.dumps(query.recentProgress, default=str)
seen["query"] = str(query)
text = io.StringIO()
with contextlib.redirect_stdout(text):
    query.explain(True)
seen["explain"] = text.getvalue()
try:
    spark.read.format("plog").options(**options).option("subscribe", "no-such-topic").load(url).count()
    seen["failed read"] = "no error"
except Exception as exc:
    seen["failed read"] = str(exc)
seen["B"] = str(spark.read.format("plog").options(**options).option("subscribe", "B").load(url).count())
spark.stop()
with open(out, "w") as f:
    json.dump(seen, f)
print("DONE", flush=True)
"""


@pytest.mark.spark
@pytest.mark.s3
@pytest.mark.timeout(300)
def test_spark_plans_progress_errors_and_event_logs_never_show_credentials(
    s3_url: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    if not java_available():
        pytest.skip("Java is not installed: Spark tests need a JVM")
    url, storage = s3_url
    events, out, log = tmp_path / "events", tmp_path / "seen.json", tmp_path / "driver.log"
    events.mkdir()
    script = write_driver_script(tmp_path / "driver.py", SPARK_SECRETS_DRIVER)
    conf = {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": str(events),
        "spark.eventLog.compress": "false",  # plain JSON lines, to search
        "spark.eventLog.rolling.enabled": "false",
    }
    local = str(tmp_path / "local-root")
    proc = start_driver(script, [url, json.dumps(_canary_options(storage)), str(out), local], log, conf)
    try:
        wait_for(lambda: proc.poll() is not None, 240, "the driver to finish", log=log, poll_s=0.5)
        assert proc.returncode == 0 and out.exists(), log.read_text()[-6000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    seen: dict[str, str] = json.loads(out.read_text())
    assert seen["B"] == "20" and "no-such-topic" in seen["failed read"], seen
    _check_surfaces(seen)
    logs = [p for p in events.rglob("*") if p.is_file()]
    assert logs and sum(p.stat().st_size for p in logs) > 10_000, "no event log was written"
    for p in logs:
        seen[f"event log {p.name}"] = p.read_text(errors="replace")
    seen["driver output"] = log.read_text(errors="replace")
    for where, text in seen.items():
        _assert_no_canary(where, text)


# ---------------------------------------------------------------------------- every backend's credentials


def _safe_options() -> dict[str, str]:
    """Every backend's credentials (and the nested one) as Spark options, in the spelling plog accepts."""
    options = spark_storage_options({**BACKEND_CREDENTIALS, **NESTED_OPTION})
    for name in REFUSED:
        assert SECRET_PREFIX + name in options and "storage." + name not in options
    return options


def _local_root(root: str) -> None:
    with LogStore(root) as admin:
        for topic in ("in", "out"):
            if topic not in admin.list_topics():
                admin.create_topic(topic, 2)
    with Producer(root) as producer:
        for i in range(10):
            producer.send("in", key=b"k%d" % i, value=b"v%d" % i, partition=i % 2)


def spark_surfaces(spark: Any, root: str, work: str) -> dict[str, str]:
    """Everything Spark shows of reads and writes given every backend's credentials the safe way.

    ``root`` is a local root (created here), which ignores storage options: Spark still holds and
    prints them. Used in this process with the suite's SparkSession, and by a driver with an event log.
    """
    import contextlib
    import io

    def explain(target: Any) -> str:
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            target.explain(True)
        return text.getvalue()

    def failure(run: Any) -> str:
        try:
            run()
        except Exception as exc:  # Spark's own wrapper of the source's error
            return f"{type(exc).__name__}: {exc}"
        raise AssertionError("expected a failure")

    _local_root(root)
    options = _safe_options()
    seen: dict[str, str] = {}
    stream = (
        spark.readStream.format("plog")
        .options(**options)
        .option("subscribe", "in")
        .option("startingOffsets", "earliest")
        .load(root)
    )
    # The plan before start() holds the source's options (StreamingRelationV2 [...]).
    seen["stream explain before start"] = explain(stream)
    seen["stream plan before start"] = stream._jdf.queryExecution().toString()
    assert "storage.secret.key" in seen["stream plan before start"], "Spark no longer prints the options"
    batch = spark.read.format("plog").options(**options).option("subscribe", "in").load(root)
    assert batch.count() == 10
    seen["batch explain"] = explain(batch)
    seen["batch plan"] = batch._jdf.queryExecution().toString()
    query = (
        stream.select("key", "value")
        .writeStream.format("plog")
        .options(**options)
        .option("topic", "out")
        .option("checkpointLocation", work + "-checkpoint")
        .trigger(availableNow=True)
        .start(root)
    )
    assert query.awaitTermination(180) and query.exception() is None, query.exception()
    seen["query explain"] = explain(query)
    seen["query"] = str(query)
    seen["last progress"] = json.dumps(query.lastProgress, default=str)
    seen["recent progress"] = json.dumps(query.recentProgress, default=str)
    batch.select("key", "value").write.format("plog").options(**options).option("topic", "out").mode("append").save(
        root
    )
    with Consumer(root, auto_offset_reset="earliest") as consumer:
        consumer.subscribe(["out"])
        got = 0
        for _ in range(20):
            got += sum(len(r) for r in consumer.poll(timeout_ms=500).values())
            if got >= 20:
                break
    assert got == 20, "the sinks did not write what they read"
    seen["bad option"] = failure(
        lambda: (
            spark.read.format("plog")
            .options(**options)
            .option("subscribe", "in")
            .option("minPartitions", "many")
            .load(root)
        )
    )
    assert "minPartitions" in seen["bad option"], seen["bad option"]
    seen["refused option"] = failure(
        lambda: (
            spark.read.format("plog")
            .options(**options)
            .option("storage.account_key", BACKEND_CREDENTIALS["account_key"] + "-again")
            .option("subscribe", "in")
            .load(root)
        )
    )
    assert "storage.account_key" in seen["refused option"], seen["refused option"]
    failed = (
        spark.readStream.format("plog")
        .options(**options)
        .option("subscribe", "no-such-topic")
        .load(root)
        .writeStream.format("plog")
        .options(**options)
        .option("topic", "out")
        .option("checkpointLocation", work + "-failed-checkpoint")
        .trigger(availableNow=True)
        .start(root)
    )
    # awaitTermination raises the query's error; its message may hold the query's logical plan.
    seen["failed query"] = failure(lambda: failed.awaitTermination(180))
    seen["failed query exception"] = str(failed.exception())
    assert "no-such-topic" in seen["failed query"], seen["failed query"]
    return seen


def _check_surfaces(seen: dict[str, str]) -> None:
    for where, text in seen.items():
        _assert_no_canary(where, text)


def test_the_refused_names_are_those_spark_would_print() -> None:
    # Pinned, so that a change of the rule (or of its regex) is seen here first.
    assert REFUSED == ["account_key", "client_kwargs", "connection_string", "credential", "key"]
    for name in BACKEND_CREDENTIALS:
        assert spark_redacts(SECRET_PREFIX + name)


@pytest.mark.parametrize("name", REFUSED)
def test_a_credential_spark_would_print_is_refused_naming_the_safe_spelling(name: str) -> None:
    value = json.dumps(NESTED_OPTION[name]) if name in NESTED_OPTION else BACKEND_CREDENTIALS[name]
    given = {"path": "/tmp/plog-never-opened", "subscribe": "t", f"storage.{name}": value}
    for streaming in (True, False, None):
        with pytest.raises(InvalidConfigError) as refused:
            parse_options(given, streaming=streaming)
        message = str(refused.value)
        assert f"'storage.{name}'" in message and f"'storage.secret.{name}'" in message, message
        _assert_no_canary("the refusal", message)
    # The safe spelling gives fsspec the same option, decoded as before.
    safe = {k: v for k, v in given.items() if k != f"storage.{name}"} | {f"storage.secret.{name}": value}
    opts = parse_options(safe, streaming=True)
    assert opts.storage_options[name] == (NESTED_OPTION.get(name) or value)


def test_a_credential_spark_redacts_is_accepted_under_its_plain_name() -> None:
    for name, value in BACKEND_CREDENTIALS.items():
        if name not in REFUSED:
            assert split_options({f"storage.{name}": value})[1] == {name: value}


def test_the_same_option_twice_and_a_password_in_the_url_are_refused() -> None:
    with pytest.raises(InvalidConfigError, match="storage.key.*storage.secret.key"):
        split_options({"storage.secret.key": CANARY_KEY, "storage.key": CANARY_SECRET})
    with pytest.raises(InvalidConfigError, match="'path': the URL holds a password") as url:
        split_options({"path": f"s3://user:{CANARY_SECRET}@bucket/plog"})
    _assert_no_canary("the URL's refusal", str(url.value))


def test_a_backend_error_quoting_a_credential_hides_it() -> None:
    options = {
        "connection_string": f"AccountKey={CANARY_KEY};",
        "client_kwargs": {"aws_secret_access_key": NESTED_CANARY},
    }
    text = f"ValueError: malformed connection string 'AccountKey={CANARY_KEY};' with {NESTED_CANARY}"
    assert scrub(text, options) == "ValueError: malformed connection string '***' with ***"


@pytest.mark.parametrize("url", ["abfs://container/plog", "gs://bucket/plog", "s3://bucket/plog"])
def test_cli_errors_never_show_any_backends_credentials(
    url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PLOG_URL", raising=False)
    # Nothing listens on port 9: the S3 command fails at once, as the others do for a missing backend package.
    flags = ["--url", url, "--storage-option", "endpoint_url=http://127.0.0.1:9"]
    flags += ["--storage-option", "plog_deadline_ms=300"]
    flags += storage_option_args({**BACKEND_CREDENTIALS, **NESTED_OPTION})
    for args in (["topics", "list"], ["topics", "describe", "t"], ["consume", "t"]):
        code = plog_main([*args, *flags])
        out, err = capsys.readouterr()
        assert code != 0, (args, out, err)
        _assert_no_canary(f"plog {' '.join(args)} on {url}", out + err)
    # A mistyped pair (no '=') is not echoed either.
    assert plog_main(["topics", "list", "--url", url, "--storage-option", f"account_key:{CANARY_KEY}"]) != 0
    _assert_no_canary("a mistyped --storage-option", "".join(capsys.readouterr()))


def test_client_objects_on_any_backend_never_show_credentials(tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    options: dict[str, Any] = {**BACKEND_CREDENTIALS, **NESTED_OPTION}
    with LogStore(root, options) as admin:
        admin.create_topic("t", 1)
        with Producer(root, options) as producer, Consumer(root, options) as consumer:
            texts = [repr(admin), str(admin), repr(producer), str(producer), repr(consumer), str(consumer)]
            texts += [repr(admin.root), repr(admin.root.store)]
    for text in texts:
        _assert_no_canary("a client object", text)


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_spark_refuses_every_credential_it_would_print(spark: Any, tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    _local_root(root)
    for name in REFUSED:
        value = json.dumps(NESTED_OPTION[name]) if name in NESTED_OPTION else BACKEND_CREDENTIALS[name]
        option = f"storage.{name}"
        reads = {
            "readStream": lambda o=option, v=value: (
                spark.readStream.format("plog").option(o, v).option("subscribe", "in").load(root)
            ),
            "read": lambda o=option, v=value: (
                spark.read.format("plog").option(o, v).option("subscribe", "in").load(root)
            ),
        }
        for how, read in reads.items():
            with pytest.raises(Exception) as refused:  # Spark wraps the source's error in its own
                read()
            message = str(refused.value)
            assert "InvalidConfigError" in message and f"'{option}'" in message, (how, message)
            assert f"'storage.secret.{name}'" in message, (how, message)
            _assert_no_canary(f"{how}'s refusal of {option}", message)
        source = spark.read.format("plog").option("subscribe", "in").load(root).select("key", "value")
        with pytest.raises(Exception) as refused:
            source.write.format("plog").option(option, value).option("topic", "out").mode("append").save(root)
        message = str(refused.value)
        assert f"'storage.secret.{name}'" in message, message
        _assert_no_canary(f"write's refusal of {option}", message)
        stream = spark.readStream.format("plog").option("subscribe", "in").load(root).select("key", "value")
        text = ""
        try:
            query = (
                stream.writeStream.format("plog")
                .option(option, value)
                .option("topic", "out")
                .option("checkpointLocation", str(tmp_path / f"ck-{name}"))
                .trigger(availableNow=True)
                .start(root)
            )
            try:
                query.awaitTermination(120)
            finally:
                text = str(query.exception()) + explain_text(query)
        except Exception as exc:  # start() or awaitTermination() raising the query's error
            text += str(exc)
        assert f"'storage.secret.{name}'" in text, text
        _assert_no_canary(f"writeStream's refusal of {option}", text)


def explain_text(target: Any) -> str:
    """What ``target.explain(True)`` prints."""
    import contextlib
    import io

    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        target.explain(True)
    return text.getvalue()


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_spark_never_shows_any_backends_credentials(spark: Any, tmp_path: Path) -> None:
    _check_surfaces(spark_surfaces(spark, str(tmp_path / "root"), str(tmp_path / "work")))
