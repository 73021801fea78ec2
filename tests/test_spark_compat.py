"""The compatibility lane: ``format("plog")`` on whatever PySpark is installed (4.0 and later).

``.ci/compat`` runs this module (``-m compat``) in one venv per PySpark minor version; in the project's
own venv it runs on the newest. Every test goes through Spark's own lookup of ``format("plog")`` (no
``spark.dataSource.register``), so a connector that fails to import on some version fails here, not
with a silent ``DATA_SOURCE_NOT_FOUND`` in a user's notebook.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pyspark_logsource import Consumer, LogStore, Producer, TopicPartition
from segment_format.errors import InvalidConfigError

pytestmark = [pytest.mark.compat]

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed")

from pyspark_logsource.spark import compat  # noqa: E402

#: The installed PySpark as (major, minor).
INSTALLED = tuple(int(x) for x in re.findall(r"\d+", pyspark.__version__)[:2])


# ---------------------------------------------------------------------------- helpers


def make_root(tmp_path: Path, topics: dict[str, int]) -> str:
    root = str(tmp_path / "plog")
    with LogStore(root) as store:
        for name, partitions in topics.items():
            store.create_topic(name, partitions, config={"retention.ms": -1})
    return root


def produce(root: str, topic: str, n: int, start: int = 0) -> None:
    """``n`` records keyed ``k<i % 7>`` with values ``<topic>:<i>``."""
    idx = range(start, start + n)
    with Producer(root) as producer:
        producer.send_batch(
            topic,
            pa.table(
                {
                    "key": pa.array([f"k{i % 7}".encode() for i in idx], pa.binary()),
                    "value": pa.array([f"{topic}:{i}".encode() for i in idx], pa.binary()),
                }
            ),
        )


def committed_values(root: str, topic: str) -> list[bytes]:
    """Every value a read_committed consumer sees in ``topic`` (duplicates kept)."""
    with LogStore(root) as store:
        partitions = len(store.describe_topic(topic)["partitions"])
    with Consumer(root, isolation_level="read_committed", auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        return consumer.read_to_end().column("value").to_pylist()


def expected(topic: str, n: int, transform: Any = bytes) -> list[bytes]:
    return sorted(transform(f"{topic}:{i}".encode()) for i in range(n))


def finish(query: Any, timeout: float = 240) -> Any:
    """Wait for an AvailableNow query to end; its error, if any, fails the test."""
    assert query.awaitTermination(timeout), "the query did not finish"
    if query.exception() is not None:
        raise AssertionError(str(query.exception()))
    return query


def stream_plog_to_plog(spark: Any, root: str, ck: Path, available_now: bool = True) -> Any:
    writer = (
        spark.readStream.format("plog")
        .option("subscribe", "in")
        .option("startingOffsets", "earliest")
        .load(root)
        .selectExpr("key", "upper(cast(value as string)) as value")
        .writeStream.format("plog")
        .option("topic", "out")
        .option("checkpointLocation", str(ck))
    )
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime="200 milliseconds")
    return writer.start(root)


# ---------------------------------------------------------------------------- what compat detects


def test_detected_features_match_the_installed_pyspark() -> None:
    """compat's detection agrees with its documented table for the installed version, and with the API."""
    from pyspark.sql import datasource

    assert pyspark.__version__ == compat.SPARK_VERSION
    assert (INSTALLED >= (4, 0)) == compat.HAS_DATA_SOURCES
    assert compat.missing_essentials() == []
    assert (INSTALLED >= (4, 1)) == compat.HAS_STREAM_ARROW_WRITER
    assert (INSTALLED >= (4, 1)) == compat.HAS_FILTER_PUSHDOWN
    assert (INSTALLED >= (4, 2)) == compat.HAS_ADMISSION_CONTROL
    assert (INSTALLED >= (4, 2)) == compat.HAS_TRIGGER_AVAILABLE_NOW
    # The names compat hands out are PySpark's own wherever PySpark has them.
    for name in ("DataSource", "DataSourceReader", "DataSourceStreamReader", "DataSourceArrowWriter", "EqualTo"):
        if hasattr(datasource, name):
            assert getattr(compat, name) is getattr(datasource, name)
    # Without a class of its own, the stream writer is an Arrow writer: PySpark 4.0's write worker feeds
    # any DataSourceArrowWriter Arrow batches (test_exactly_once_sink_survives_a_restart_and_a_replay runs it).
    assert issubclass(compat.DataSourceStreamArrowWriter, datasource.DataSourceStreamWriter)
    assert issubclass(compat.DataSourceStreamArrowWriter, datasource.DataSourceArrowWriter) or (
        compat.HAS_STREAM_ARROW_WRITER
    )


def test_an_unsupported_pyspark_is_named_with_what_it_lacks() -> None:
    message = compat.unsupported_message("3.5.3", ["pyspark.sql.datasource.DataSource"])
    assert "pyspark 3.5.3" in message and "pyspark.sql.datasource.DataSource" in message
    assert f"pyspark>={compat.MINIMUM_SPARK}" in message
    compat.require_supported()  # the installed one is supported: no error
    assert issubclass(compat.UnsupportedSparkError, ImportError)


# ---------------------------------------------------------------------------- through Spark


@pytest.mark.spark
def test_batch_read(spark: Any, tmp_path: Path) -> None:
    root = make_root(tmp_path, {"in": 3})
    produce(root, "in", 300)
    df = spark.read.format("plog").option("subscribe", "in").load(root)
    rows = df.select("value", "partition", "offset").collect()
    assert sorted(bytes(r.value) for r in rows) == expected("in", 300)
    # Filters are right with pushdown (4.1 and later) and without it (Spark filters every row). A new load():
    # a DataFrame reused after a pushed-down query keeps that query's plan on 4.1 to 4.3 (see source.py).
    fresh = spark.read.format("plog").option("subscribe", "in").load(root)
    picked = fresh.where("partition = 1 and offset >= 10").select("partition", "offset").collect()
    want = sorted((r.partition, r.offset) for r in rows if r.partition == 1 and r.offset >= 10)
    assert sorted((r.partition, r.offset) for r in picked) == want and len(want) > 50


@pytest.mark.spark
def test_streaming_read_resumes_from_its_checkpoint(spark: Any, tmp_path: Path) -> None:
    root = make_root(tmp_path, {"in": 2})
    produce(root, "in", 200)
    out, ck = tmp_path / "out", tmp_path / "ck"

    def run() -> Any:
        return finish(
            spark.readStream.format("plog")
            .option("subscribe", "in")
            .option("startingOffsets", "earliest")
            .load(root)
            .select("value")
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(ck))
            .trigger(availableNow=True)
            .start()
        )

    run()
    assert sorted(bytes(r.value) for r in spark.read.parquet(str(out)).collect()) == expected("in", 200)
    produce(root, "in", 50, start=200)
    run()
    assert sorted(bytes(r.value) for r in spark.read.parquet(str(out)).collect()) == expected("in", 250)


@pytest.mark.spark
def test_exactly_once_sink_survives_a_restart_and_a_replay(spark: Any, tmp_path: Path) -> None:
    root = make_root(tmp_path, {"in": 2, "out": 3})
    produce(root, "in", 300)
    ck = tmp_path / "ck"

    # A running query (processing-time trigger), stopped once it has written everything.
    query = stream_plog_to_plog(spark, root, ck, available_now=False)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert sorted(committed_values(root, "out")) == expected("in", 300, bytes.upper)

    # Restarted from its checkpoint: only the new records, once.
    produce(root, "in", 100, start=300)
    finish(stream_plog_to_plog(spark, root, ck))
    assert sorted(committed_values(root, "out")) == expected("in", 400, bytes.upper)

    # Spark lost the record of its last commit (the driver died right after the sink committed): it re-runs
    # that micro-batch from its offsets log; the sink finds the batch's decision and writes nothing again.
    last = max(int(p.name) for p in (ck / "commits").iterdir() if p.name.isdigit())
    (ck / "commits" / str(last)).unlink()
    (ck / "commits" / f".{last}.crc").unlink(missing_ok=True)
    rerun = finish(stream_plog_to_plog(spark, root, ck))
    assert [p["batchId"] for p in rerun.recentProgress if p["numInputRows"]] == [last]
    assert sorted(committed_values(root, "out")) == expected("in", 400, bytes.upper)

    # And the reader goes on from the replayed batch's end (PySpark before 4.2 learns it from the replay).
    produce(root, "in", 20, start=400)
    after = finish(stream_plog_to_plog(spark, root, ck))
    assert sum(p["numInputRows"] for p in after.recentProgress) == 20
    assert sorted(committed_values(root, "out")) == expected("in", 420, bytes.upper)


@pytest.mark.spark
def test_read_limits_work_where_spark_has_admission_control_and_are_refused_where_not(
    spark: Any, tmp_path: Path
) -> None:
    root = make_root(tmp_path, {"in": 2, "out": 2})
    produce(root, "in", 300)
    query = (
        spark.readStream.format("plog")
        .option("subscribe", "in")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "100")
        .load(root)
        .selectExpr("key", "value")
        .writeStream.format("plog")
        .option("topic", "out")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start(root)
    )
    if compat.HAS_ADMISSION_CONTROL:
        finish(query)
        assert len([p for p in query.recentProgress if p["numInputRows"]]) == 3
        assert sorted(committed_values(root, "out")) == expected("in", 300)
    else:
        # The query fails when it starts, with plog's error naming the option and the version.
        with pytest.raises(
            Exception, match=rf"option 'maxOffsetsPerTrigger': pyspark {re.escape(pyspark.__version__)}"
        ):
            query.awaitTermination(240)
        assert committed_values(root, "out") == []


def test_read_limit_options_are_checked_by_version() -> None:
    from pyspark_logsource.spark.options import parse_options

    opts = parse_options({"subscribe": "t", "path": "/tmp/x", "maxOffsetsPerTrigger": "5"}, streaming=True)
    if compat.HAS_ADMISSION_CONTROL:
        compat.check_stream_options(opts)
    else:
        with pytest.raises(InvalidConfigError, match="maxOffsetsPerTrigger"):
            compat.check_stream_options(opts)
    compat.check_stream_options(parse_options({"subscribe": "t", "path": "/tmp/x"}, streaming=True))
