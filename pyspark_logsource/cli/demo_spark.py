"""``plog demo``, its Spark part: a streaming query that keeps running counts per user, exactly once.

``readStream.format("plog")`` over the demo's click stream, grouped by user,
``writeStream.format("plog")`` into ``clicks-per-user`` in complete mode with
``Trigger.AvailableNow`` and a checkpoint beside the data, so a later run goes
on from where the last one stopped. Then the counts are read back
``read_committed`` and checked. Spark starts on a quiet local[2] session whose
JVM warnings are dropped (Spark's errors are kept); with ``SPARK_REMOTE`` set, the
query runs on that Spark Connect server instead.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
from rich.table import Table
from rich.text import Text

from pyspark_logsource.cli.common import CliError, Env
from pyspark_logsource.client.admin import LogStore
from pyspark_logsource.client.consumer import Consumer
from pyspark_logsource.client.types import TopicPartition
from pyspark_logsource.spark.credentials import spark_storage_options
from pyspark_logsource.views.terminal import cell_number, cell_text, checks_table, format_ms
from segment_format.errors import TopicAlreadyExistsError

DEMO_SPARK_TOPIC = "clicks-per-user"
DEMO_SPARK_PARTITIONS = 3
_DEMO_COUNTS_SCHEMA = pa.schema(
    [
        pa.field("user", pa.string()),
        pa.field("events", pa.int64()),
        pa.field("views", pa.int64()),
        pa.field("clicks", pa.int64()),
        pa.field("purchases", pa.int64()),
        pa.field("last_ts", pa.int64()),
    ]
)


def _spark_remote() -> str | None:
    """The Spark Connect server to run the demo's query on (``SPARK_REMOTE``, as pyspark's own shells take it)."""
    return os.environ.get("SPARK_REMOTE") or None


def _spark_unavailable() -> str | None:
    """Why the demo's Spark part cannot run here (no pyspark, no Java), or None.

    Through a Spark Connect server (``SPARK_REMOTE=sc://...``) the JVM is the server's: no Java needed here.
    """
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed"
    remote = _spark_remote()
    if remote is not None and remote.startswith("sc://"):
        return None
    home = os.environ.get("JAVA_HOME")
    if not (home and os.access(os.path.join(home, "bin", "java"), os.X_OK)) and shutil.which("java") is None:
        return "Java is not installed (Spark needs a JVM)"
    return None


def _spark_url(url: str) -> str:
    """``url`` as Spark's Python workers must be handed it: a local path made absolute, any other URL as it is.

    The workers resolve a relative path in *their* working directory, which is not this one when the
    query runs on a Spark Connect server (nor, in general, on a cluster's executors).
    """
    local = url[len("file://") :] if url.startswith("file://") else url
    return os.path.abspath(local) if "://" not in local else url


def _demo_checkpoint(url: str) -> str:
    """The streaming query's checkpoint: under the data directory when it is local, else in ~/.cache/plog."""
    local = _spark_url(url)
    if "://" not in local:
        return os.path.join(local, "_spark", "checkpoints", DEMO_SPARK_TOPIC)
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return str(Path.home() / ".cache" / "plog" / "demo-checkpoints" / f"{digest}-{DEMO_SPARK_TOPIC}")


def _demo_spark_session() -> tuple[Any, bool]:
    """A quiet local[2] SparkSession whose Python workers run this interpreter and find ``format("plog")``.

    Returns it and whether it was made here (and is to be stopped); an active session is used as it is,
    and with ``SPARK_REMOTE`` set it is a Spark Connect session on that server.
    """
    package_parent = str(Path(__file__).resolve().parents[2])  # finds an editable install, too
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    paths = [package_parent, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    # pyspark's warning that it does not yet fully support pandas 3 is about APIs this demo does not use.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    active = SparkSession.getActiveSession()
    if active is not None:  # plog demo called from a program with its own session: use it, leave it running
        return active, False
    remote = _spark_remote()
    if remote is not None:
        # Spark Connect: the query runs on the server (whose Python workers must import plog, and which must
        # reach the plog URL and the checkpoint path); this process only sends plans. Classic set-up below
        # (a local JVM, sparkContext) would fail here: pyspark refuses a classic session beside SPARK_REMOTE.
        return SparkSession.builder.remote(remote).getOrCreate(), True
    conf = SparkConf().setAll(
        [
            ("spark.master", "local[2]"),
            ("spark.app.name", "plog-demo"),
            ("spark.ui.enabled", "false"),
            ("spark.ui.showConsoleProgress", "false"),
            ("spark.sql.shuffle.partitions", "2"),
            ("spark.sql.session.timeZone", "UTC"),
            ("spark.driver.host", "127.0.0.1"),
            ("spark.driver.bindAddress", "127.0.0.1"),
            ("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={DEMO_LOG4J2.as_uri()}"),
        ]
    )
    _start_quiet_jvm(conf)
    spark = SparkSession.builder.config(conf=conf).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark, True


#: Spark's errors only (the demo's log4j2 set-up); see the file.
DEMO_LOG4J2 = Path(__file__).with_name("log4j2-demo.properties")


def _start_quiet_jvm(conf: Any) -> None:
    """Start Spark's JVM with its stderr piped through :func:`_forward_jvm_stderr`, which drops JVM warnings.

    The JVM prints warnings of its own (``WARNING: Using incubator modules``) before log4j is set up, so no
    logging configuration can silence them; everything else on its stderr (Spark's errors, Python workers'
    tracebacks) is passed on. ``popen_kwargs`` is pyspark's hook for capturing the JVM's output.
    """
    import subprocess
    import threading

    from pyspark import SparkContext
    from pyspark.java_gateway import launch_gateway

    gateway = launch_gateway(conf, popen_kwargs={"stderr": subprocess.PIPE})
    if gateway.proc is not None and gateway.proc.stderr is not None:  # None: a gateway that was already running
        threading.Thread(target=_forward_jvm_stderr, args=(gateway.proc.stderr,), daemon=True).start()
    SparkContext(conf=conf, gateway=gateway)


def _forward_jvm_stderr(stream: IO[bytes]) -> None:
    """Copy the JVM's stderr to ours, without the JVM's own ``WARNING: ...`` lines (log4j lines look different)."""
    for line in iter(stream.readline, b""):
        if not line.startswith(b"WARNING: "):
            sys.stderr.buffer.write(line)
            sys.stderr.buffer.flush()


def _read_all(env: Env, topic: str) -> pa.Table:
    """Every committed record of ``topic`` (read_committed), ordered by partition and offset."""
    with Consumer(env.url, env.options, isolation_level="read_committed", auto_offset_reset="earliest") as c:
        c.assign([TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic))])
        return c.read_to_end()


def run_spark_demo(env: Env, source: str) -> bool:
    """Aggregate topic ``source`` into running counts per user in ``clicks-per-user``, exactly once; summarise.

    A Spark Structured Streaming query (``readStream.format("plog")`` -> group by user ->
    ``writeStream.format("plog")``, ``Trigger.AvailableNow``) with its checkpoint next to the data: a
    later run goes on from there and processes only new events. Python data source sinks take the
    append and complete output modes; in complete mode every micro-batch writes the counts of every user
    seen so far, so the newest record of a user (its key) holds its running count, as in a compacted
    Kafka topic. Returns False if a check fails.
    """
    out = env.out
    reason = _spark_unavailable()
    if reason is not None:
        env.note(f"skipping the Spark part of the demo: {reason} (or pass --no-spark)")
        return True
    checkpoint = _demo_checkpoint(env.url)
    with LogStore(env.url, env.options) as store:
        try:
            store.create_topic(DEMO_SPARK_TOPIC, DEMO_SPARK_PARTITIONS)
            shutil.rmtree(checkpoint, ignore_errors=True)  # a new output topic: the counts start over
        except TopicAlreadyExistsError:
            pass
        before = sum(p["end_offset"] for p in store.describe_topic(DEMO_SPARK_TOPIC)["partitions"])
    options = spark_storage_options(env.options)  # credentials as storage.secret.<name>: Spark redacts those
    out.print(
        Text.assemble(
            ("Spark", "bold"),
            " — streaming query ",
            (source, "cyan"),
            " → running counts per user → ",
            (DEMO_SPARK_TOPIC, "cyan"),
            " (exactly-once, Trigger.AvailableNow)",
        )
    )
    started = time.perf_counter()
    remote = _spark_remote()
    # Only the address: a Connect URL's parameters (sc://host/;token=...) may hold a credential.
    where = f"Spark Connect at {remote.split(';', 1)[0].rstrip('/')}" if remote else "Spark (local[2])"
    with env.err.status(f"starting {where} and running the streaming query ...", spinner="dots"):
        spark, own_session = _demo_spark_session()
        try:
            from pyspark.sql import functions as F  # noqa: N812 - Spark's convention

            event = F.from_json(F.col("value").cast("string"), "user string, page string, action string, ts long")
            clicks = (
                spark.readStream.format("plog")
                .options(**options)
                .option("subscribe", source)
                .option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", "25000")
                .load(_spark_url(env.url))
            )
            counts = (
                clicks.select(event.alias("e"))
                .where(F.col("e.user").isNotNull())
                .groupBy("e.user")
                .agg(
                    F.count(F.lit(1)).alias("events"),
                    *[
                        F.sum(F.when(F.col("e.action") == a, 1).otherwise(0)).alias(f"{a}s")
                        for a in ("view", "click", "purchase")
                    ],
                    F.max("e.ts").alias("last_ts"),
                )
            )
            query = (
                counts.select(
                    F.col("user").alias("key"),
                    F.to_json(F.struct("user", "events", "views", "clicks", "purchases", "last_ts")).alias("value"),
                )
                .writeStream.format("plog")
                .options(**options)
                .option("topic", DEMO_SPARK_TOPIC)
                .option("checkpointLocation", checkpoint)
                .outputMode("complete")
                .trigger(availableNow=True)
                .start(_spark_url(env.url))
            )
            query.awaitTermination()
            # The property, not p["numInputRows"]: a progress that came through Spark Connect is built from
            # JSON without the top-level count (the key holds None); the property sums the sources' counts then.
            batches = [p for p in query.recentProgress if p.numInputRows]
        except Exception as exc:  # noqa: BLE001 - Spark's errors (py4j, StreamingQueryException) as one line
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CliError(f"the Spark streaming query failed: {first}") from None
        finally:
            if own_session:
                spark.stop()
    seconds = time.perf_counter() - started

    # Read back with read_committed: the newest count of each user is its last record (a user is one partition).
    events_in = sum(p.numInputRows for p in batches)
    clicks_all = _read_all(env, source).column("value")
    total = int(pc.sum(pc.fill_null(pc.match_substring(clicks_all, '"user":'), False).cast(pa.int64())).as_py() or 0)
    updates = _read_all(env, DEMO_SPARK_TOPIC)
    parsed = (
        pa_json.read_json(
            pa.BufferReader(b"\n".join(updates.column("value").to_pylist())),
            parse_options=pa_json.ParseOptions(explicit_schema=_DEMO_COUNTS_SCHEMA),
        )
        if updates.num_rows
        else _DEMO_COUNTS_SCHEMA.empty_table()
    )
    users = parsed.column("user").to_pylist()
    events = parsed.column("events").to_pylist()
    latest: dict[str, int] = {}
    growing = True
    for position, (user, n) in enumerate(zip(users, events, strict=True)):
        if user in latest and n < events[latest[user]]:
            growing = False
        latest[user] = position
    counted = sum(events[i] for i in latest.values())
    written = updates.num_rows - before

    summary = Table(
        title=f"running counts per user in {DEMO_SPARK_TOPIC!r} (top 5, read back read_committed)", title_justify="left"
    )
    for column in ("user", "events", "views", "clicks", "purchases", "last event"):
        summary.add_column(column, justify="left" if column == "user" else "right")
    rows = parsed.take(pa.array(sorted(latest.values(), key=lambda i: (-events[i], users[i]))[:5], pa.int64()))
    for row in rows.to_pylist():
        summary.add_row(
            cell_text(row["user"]),
            cell_number(row["events"]),
            cell_number(row["views"]),
            cell_number(row["clicks"]),
            cell_number(row["purchases"]),
            cell_text(format_ms(row["last_ts"])),
        )
    out.print(summary)
    checks = [
        (
            "every event counted once",
            counted == total,
            f"the users' counts add up to {counted:,}; {source!r} holds {total:,} events",
        ),
        ("counts never go back", growing, "along the topic, each user's count only grows or stays"),
    ]
    out.print(checks_table("Spark verification", checks))
    ok = all(passed for _, passed, _ in checks)
    out.print(
        cell_text(
            f"{'✓' if ok else '✗'} Spark: {len(batches)} micro-batch(es), {events_in:,} new event(s) in, "
            f"{written:,} count record(s) out to {DEMO_SPARK_TOPIC!r} for {len(latest):,} users, "
            f"in {seconds:.1f} s (checkpoint {checkpoint})",
            "bold green" if ok else "bold red",
        ),
        soft_wrap=True,
    )
    return ok
