"""Credentials stay out of sight (issue 12, *Secrets*).

A canary key and secret are given as plog's storage options (``storage_options`` in Python,
``--storage-option`` on the command line, ``storage.*`` options in Spark) against moto's S3 server,
which accepts any credentials, so the canary really is what signs the requests. Everything a person
or a log can see is then collected and searched for it: ``repr()`` of the client objects and their
stores, the messages of plog's errors (bad options, unknown topics, a storage deadline passed), the
CLI's output and error output, and, from a Spark driver run with event logging on, the batch and
streaming plans, ``explain``, the streaming query's progress and its string form, a failed read's
message and the event log itself.
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
from segment_format.errors import PlogError
from segment_format.root import LogRoot
from tests.fixtures_spark import java_available, start_driver, wait_for, write_driver_script

CANARY_KEY = "CANARY-KEY-7f3a91c2"
CANARY_SECRET = "CANARY-SECRET-7f3a91c2"


def _canary_options(storage: dict[str, Any]) -> dict[str, Any]:
    return {**storage, "key": CANARY_KEY, "secret": CANARY_SECRET}


def _assert_no_canary(where: str, text: str) -> None:
    for canary in (CANARY_KEY, CANARY_SECRET):
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
    flags = ["--url", url]
    for name, value in options.items():
        flags += ["--storage-option", f"{name}={value if isinstance(value, str) else json.dumps(value)}"]

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
url, storage, out = ARGS
storage = json.loads(storage)
with LogStore(url, storage) as admin:
    admin.create_topic("A", 2)
    admin.create_topic("B", 2)
with Producer(url, storage) as producer:
    for i in range(20):
        producer.send("A", key=b"k%d" % i, value=b"v%d" % i)
options = {"storage." + k: v if isinstance(v, str) else json.dumps(v) for k, v in storage.items()}
seen = {}
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
    proc = start_driver(script, [url, json.dumps(_canary_options(storage)), str(out)], log, conf)
    try:
        wait_for(lambda: proc.poll() is not None, 240, "the driver to finish", log=log, poll_s=0.5)
        assert proc.returncode == 0 and out.exists(), log.read_text()[-6000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    seen: dict[str, str] = json.loads(out.read_text())
    assert seen["B"] == "20" and "no-such-topic" in seen["failed read"], seen
    logs = [p for p in events.rglob("*") if p.is_file()]
    assert logs and sum(p.stat().st_size for p in logs) > 10_000, "no event log was written"
    for p in logs:
        seen[f"event log {p.name}"] = p.read_text(errors="replace")
    seen["driver output"] = log.read_text(errors="replace")
    for where, text in seen.items():
        _assert_no_canary(where, text)
