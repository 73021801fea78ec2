"""Quotas in the Spark source and sink (PROTOCOL.md 11.10): each worker process enforces its own share.

The timing tests assert a lower bound only: a query under a quota of ``q`` bytes per second that moves
``n`` bytes takes at least ``n / q`` less the one-second burst a young rate allows (and some slack); without
enforcement the same query takes about a second, so they fail. No upper bound: a loaded machine is slower.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")

from coordinator.keys import QUOTAS  # noqa: E402
from coordinator.quotas import ANONYMOUS, Entity, QuotaManager, alter_quota  # noqa: E402
from pyspark_logsource import LogStore, Producer  # noqa: E402
from pyspark_logsource.spark import workers  # noqa: E402
from pyspark_logsource.spark.option_schema import SINK_OPTIONS, SPARK_CLIENT_ID  # noqa: E402
from pyspark_logsource.spark.options import parse_options  # noqa: E402
from pyspark_logsource.spark.partition_reader import PlogInputPartition, read_partition  # noqa: E402
from pyspark_logsource.spark.sink import PlogBatchWriter  # noqa: E402
from pyspark_logsource.spark.workers import executor_root  # noqa: E402
from segment_format.errors import InvalidConfigError  # noqa: E402
from segment_format.shared.object import read_shared_meta  # noqa: E402
from segment_format.stores import open_store  # noqa: E402

from .quota_bound import Poller, Progress, assert_near_quota, assert_within_quota  # noqa: E402

RATE = 1024 * 1024
#: How long the flat-out tests run a task.
RUN_S = 10.0
VALUE = b"v" * 16_000
#: What a young rate lets through before its first delay (one window of the quota), plus scheduling slack.
BURST_AND_SLACK_S = 1.5


def _fill(url: str, topic: str, nbytes: int, partitions: int = 1) -> int:
    """Write ``nbytes`` of values to ``topic`` (one producer, no quota); return the number of records."""
    LogStore(url).create_topic(topic, partitions=partitions)
    count = nbytes // len(VALUE)
    with Producer(url) as producer:
        producer.send_batch(topic, pa.table({"value": [VALUE] * count}))
    return count


def test_the_quota_options_default_to_a_spark_client_and_refuse_long_names() -> None:
    opts = parse_options({"url": "/r", "subscribe": "t"}, streaming=False)
    assert (opts.client_id, opts.quota_user) == (SPARK_CLIENT_ID, ANONYMOUS)
    opts = parse_options({"url": "/r", "subscribe": "t", "clientid": "etl", "quotauser": "alice"}, streaming=False)
    assert (opts.client_id, opts.quota_user) == ("etl", "alice")
    assert SINK_OPTIONS.validate({"clientid": "etl"})["clientId"] == "etl"
    with pytest.raises(InvalidConfigError, match="clientId"):
        parse_options({"url": "/r", "subscribe": "t", "clientid": "c" * 201}, streaming=False)


def test_a_worker_lists_the_quotas_once_per_interval_whatever_its_tasks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tasks run one after another in a reused worker share its quota manager: one LIST per 5 s, not per task."""
    url = str(tmp_path / "root")
    _fill(url, "t", 20 * len(VALUE), partitions=2)
    root, _ = executor_root(url, {})
    meta = root.topic("t")
    listed: list[str] = []
    real_list = root.store.list

    def counting_list(prefix: str, *args: Any, **kwargs: Any) -> Any:
        listed.append(prefix)
        return real_list(prefix, *args, **kwargs)

    monkeypatch.setattr(root.store, "list", counting_list)
    # A fresh worker: the producer above made this process's manager list the quotas already.
    monkeypatch.setattr(QuotaManager, "_instances", {})
    monkeypatch.setattr(workers, "_QUOTAS", {})
    rows = 0
    for _ in range(3):  # three micro-batches of two tasks each
        for p in range(2):
            end = root.partition("t", p, meta).view().end_offset
            part = PlogInputPartition(url, {}, "t", meta.topic_id, p, 0, end)
            rows += sum(b.num_rows for b in read_partition(part))
    assert rows == 3 * 20
    assert sum(1 for prefix in listed if prefix.startswith(QUOTAS)) == 1, listed


@pytest.mark.spark
@pytest.mark.timeout(120)
def test_a_spark_read_is_slowed_to_its_consumer_byte_rate(spark: Any, tmp_path: Path) -> None:
    url = str(tmp_path / "root")
    count = _fill(url, "t", 6 * RATE)
    alter_quota(open_store(url), Entity(None, "slow-reader"), {"consumer_byte_rate": RATE})

    def read(client_id: str) -> float:
        start = time.monotonic()
        df = spark.read.format("plog").option("subscribe", "t").option("clientId", client_id).load(url)
        assert df.selectExpr("sum(length(value)) AS n").collect()[0]["n"] == count * len(VALUE)
        return time.monotonic() - start

    read("free-reader")  # no quota for this client id; warms the workers up
    throttled = read("slow-reader")
    free = read("free-reader")
    expected = count * len(VALUE) / RATE
    print(f"spark read of {expected:.1f} MiB: {free:.1f} s free, {throttled:.1f} s at 1 MiB/s")
    assert throttled >= expected - BURST_AND_SLACK_S, (throttled, expected)


@pytest.mark.spark
@pytest.mark.timeout(120)
def test_a_spark_batch_write_is_slowed_to_its_producer_byte_rate(spark: Any, tmp_path: Path) -> None:
    url = str(tmp_path / "root")
    LogStore(url).create_topic("out", partitions=1)
    alter_quota(open_store(url), Entity("etl", None), {"producer_byte_rate": RATE})
    count = 4 * RATE // len(VALUE)
    df = spark.range(count, numPartitions=1).selectExpr(f"cast(repeat('v', {len(VALUE)}) AS binary) AS value")

    def write(user: str) -> float:
        start = time.monotonic()
        df.write.format("plog").option("topic", "out").option("quotaUser", user).mode("append").save(url)
        return time.monotonic() - start

    write(ANONYMOUS)  # no quota for this user; warms the workers up
    elapsed = write("etl")
    free = write(ANONYMOUS)
    expected = count * len(VALUE) / RATE
    print(f"spark write of {expected:.1f} MiB: {free:.1f} s free, {elapsed:.1f} s at 1 MiB/s")
    assert LogStore(url).describe_topic("out")["partitions"][0]["end_offset"] == 3 * count
    assert elapsed >= expected - BURST_AND_SLACK_S, (elapsed, expected)


# ------------------------------------------------------------------ a task flat out


def test_a_sink_task_flat_out_keeps_its_producer_byte_rate(tmp_path: Path) -> None:
    """The sink's task entry point (``DataWriter.write``, as an executor runs it) fed 11 MiB of rows as fast as
    it takes them: what it writes to the store keeps Kafka's bound from the task's start and over every
    interval."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    url = str(tmp_path / "root")
    LogStore(url).create_topic("out", partitions=4)
    alter_quota(open_store(url), Entity("etl", None), {"producer_byte_rate": RATE})
    value = os.urandom(1000)
    schema = StructType([StructField("value", BinaryType())])
    writer = PlogBatchWriter({"url": url, "topic": "out", "quotaUser": "etl"}, schema)
    start = time.monotonic()

    def rows() -> Iterator[pa.RecordBatch]:  # as fast as the task takes them: 11 MiB, 10 s at the quota
        for _ in range(11 * RATE // (256 * len(value))):
            yield pa.record_batch({"value": pa.array([value] * 256, pa.binary())})

    # The task writes shared objects at the quota's pace, and the driver's one commit makes them visible at
    # the end (PROTOCOL.md 11.2): what the task moved is the records in the objects it has created so far.
    store = open_store(url)
    counted: dict[str, int] = {}

    def written() -> int:
        for info in store.list("shared/"):
            if info.key not in counted:
                counted[info.key] = read_shared_meta(store, info.key).record_count
        return len(value) * sum(counted.values())

    with Poller(written) as seen:
        writer.commit([writer.write(rows())])
    assert_within_quota(seen, RATE, start)
    assert_near_quota(seen, RATE, start)
    ends = sum(p["end_offset"] for p in LogStore(url).describe_topic("out")["partitions"])
    assert ends * len(value) == written()  # all of it committed, at once


def test_a_source_task_flat_out_keeps_its_consumer_byte_rate(tmp_path: Path) -> None:
    """The source's task (``read_partition``, as an executor runs it) reading a 16 MB backlog as fast as Spark
    takes its batches: what it hands Spark keeps Kafka's bound from its start and over every interval."""
    url = str(tmp_path / "root")
    # Set before the filler runs: this process's reading of the quotas holds for the refresh interval (5 s).
    alter_quota(open_store(url), Entity(None, "slow-reader"), {"consumer_byte_rate": RATE})
    count = _fill(url, "t", 16 * RATE)
    meta = LogStore(url).root.topic("t")
    part = PlogInputPartition(url, {}, "t", meta.topic_id, 0, 0, count, client_id="slow-reader")
    progress = Progress()
    start = time.monotonic()
    for batch in read_partition(part):
        progress.add(batch.num_rows * len(VALUE))
        if time.monotonic() - start >= RUN_S:
            break
    assert_within_quota(progress, RATE, start)
    assert_near_quota(progress, RATE, start)
