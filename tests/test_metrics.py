"""Metrics: Kafka's client metric names move when they should, store requests are counted exactly,
the OpenMetrics endpoints parse, ``plog top --once`` shows a root's topics and groups, and a streaming
query's progress says how far it is behind the latest offsets."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from pyspark_logsource.client.admin import LogStore
from pyspark_logsource.client.consumer import Consumer
from pyspark_logsource.client.metrics import SampledStat
from pyspark_logsource.client.openmetrics import serve_metrics
from pyspark_logsource.client.producer import Producer
from pyspark_logsource.client.types import TopicPartition
from pyspark_logsource.spark.progress import offsets_behind_latest
from segment_format.errors import InvalidConfigError, ObjectNotFoundError, StorageError
from segment_format.stores import MemoryStore
from segment_format.stores.counting import REQUEST_PRICES_USD, CountingStore, estimated_cost_usd

#: Every name docs/metrics.md lists, per client (``Producer.metrics()`` / ``Consumer.metrics()``).
STORE_NAMES = (
    "plog-store-get-total",
    "plog-store-put-total",
    "plog-store-list-total",
    "plog-store-head-total",
    "plog-store-delete-total",
    "plog-store-requests-total",
    "plog-store-errors-total",
    "plog-store-retries-total",
    "plog-store-cost-usd-total",
)
PRODUCER_NAMES = (
    "record-send-rate",
    "record-send-total",
    "outgoing-byte-rate",
    "outgoing-byte-total",
    "request-rate",
    "request-total",
    "request-latency-avg",
    "request-latency-max",
    "record-error-rate",
    "record-error-total",
    "batch-size-avg",
    "batch-size-max",
    "records-per-request-avg",
    "produce-throttle-time-avg",
    "produce-throttle-time-max",
    "buffer-total-bytes",
    "buffer-available-bytes",
    "plog-queued-bytes",
    "plog-open-buffers",
    "plog-buffers-in-flight",
    *STORE_NAMES,
)
CONSUMER_NAMES = (
    "records-consumed-rate",
    "records-consumed-total",
    "bytes-consumed-rate",
    "bytes-consumed-total",
    "fetch-rate",
    "fetch-total",
    "fetch-latency-avg",
    "fetch-latency-max",
    "fetch-size-avg",
    "fetch-size-max",
    "records-per-request-avg",
    "records-lag-max",
    "records-lag",
    "fetch-throttle-time-avg",
    "fetch-throttle-time-max",
    *STORE_NAMES,
)


def test_every_metric_is_kafkas_or_plogs_own_and_says_what_it_is() -> None:
    """Kafka's names for Kafka's metrics, a ``plog-`` prefix for plog's own (no underscores), and a HELP line
    that is a sentence, not the name again; rates and averages say they read low for the first 30 s."""
    from pyspark_logsource.client.metric_help import METRIC_HELP, metric_help

    for name in {*PRODUCER_NAMES, *CONSUMER_NAMES}:
        assert re.fullmatch(r"[a-z]+(-[a-z]+)*", name), name
        assert name in METRIC_HELP and metric_help(name) != name.replace("-", " "), name
        if name.endswith(("-rate", "-avg", "-max")) and name != "records-lag-max":
            assert "first 30 s" in metric_help(name), name
    assert metric_help("request-total", "gateway") == "Kafka requests answered"


def test_the_metrics_page_lists_exactly_these_names() -> None:
    page = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    section = page.split("# Metrics", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip(): line.split("|")[2] for line in section.splitlines() if line.startswith("| ")}
    listed = {kind: set(re.findall(r"`([a-z-]+)`", rows[kind])) for kind in ("producer", "consumer", "both")}
    assert listed["producer"] | listed["both"] == set(PRODUCER_NAMES)
    assert listed["consumer"] | listed["both"] == set(CONSUMER_NAMES)


def _root(tmp_path: Path, partitions: int = 2, name: str = "orders") -> str:
    url = str(tmp_path / "root")
    with LogStore(url) as store:
        store.create_topic(name, partitions)
    return url


def _produce(url: str, n: int, topic: str = "orders") -> dict[str, Any]:
    with Producer(url, linger_ms=5) as producer:
        for i in range(n):
            producer.send(topic, b"v" * 50, key=b"k%d" % i)
        producer.flush()
        return producer.metrics()


def _scrape(port: int) -> dict[str, Any]:
    """The endpoint's families by name (parsed by prometheus_client's own parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


# ---------------------------------------------------------------------------- sampled windows


def test_sampled_stat_follows_kafkas_windows() -> None:
    now = [1000.0]
    stat = SampledStat(window_s=30.0, samples=2, clock=lambda: now[0])
    for value in (10.0, 20.0, 30.0):
        stat.record(value)
    now[0] += 10
    # Kafka's Rate.windowSize: the (samples - 1) whole windows not yet elapsed are added, 60 / (10 + 30) s.
    assert stat.rate() == pytest.approx(60 / 40)
    assert stat.count_rate() == pytest.approx(3 / 40)
    assert stat.avg() == pytest.approx(20.0) and stat.max() == 30.0
    now[0] += 25  # 35 s after the first: a second sample starts
    stat.record(5.0)
    assert stat.rate() == pytest.approx(65 / 35)
    now[0] += 30  # 65 s: the first sample (started at 0 s) is older than 2 windows, gone
    assert stat.rate() == pytest.approx(5 / 30) and stat.max() == 5.0
    now[0] += 60  # all samples obsolete: rates fall to 0, totals stay
    assert stat.rate() == 0.0 and stat.avg() == 0.0 and stat.max() == 0.0
    assert stat.total == 65.0 and stat.count == 4


# ---------------------------------------------------------------------------- the store's requests


def test_store_requests_are_counted_by_kind_and_priced() -> None:
    store = CountingStore(MemoryStore(f"count-{uuid.uuid4().hex}"))
    for i in range(3):
        assert store.put_if_absent(f"a/{i}", b"x" * 10)
    store.replace("a/notice", b"n")
    assert store.get("a/0") == b"x" * 10
    assert store.get_range("a/1", 2, 5) == b"xxx"
    with pytest.raises(ObjectNotFoundError):  # an answer, not an error
        store.get("a/missing")
    assert len(store.list("a/")) == 4
    assert store.exists("a/2") and store.size("a/2") == 10
    store.delete("a/0")
    store.delete_many(["a/1", "a/2"])
    assert store.delete_prefix("a/") == 1  # a LIST, then one DELETE
    assert store.counts() == {"GET": 3, "PUT": 4, "LIST": 2, "HEAD": 2, "DELETE": 4}
    assert store.requests == 15 and store.errors == 0 and store.retries == 0
    expected = 3 * 0.0004 / 1000 + 2 * 0.0004 / 1000 + (4 + 2) * 0.005 / 1000
    assert estimated_cost_usd(store.counts()) == pytest.approx(expected)
    assert REQUEST_PRICES_USD["DELETE"] == 0.0


def test_store_errors_and_retries_are_counted() -> None:
    import fsspec

    from segment_format.stores import FsspecStore
    from segment_format.stores.retrying import RetryPolicy

    fs = fsspec.filesystem("memory", skip_instance_cache=True)
    base = f"retries-{uuid.uuid4().hex}"
    inner = FsspecStore(
        fs, base, f"memory://{base}", create_kwargs={"mode": "create"}, retry=RetryPolicy(30.0, 0.001, 0.002)
    )
    store = CountingStore(inner)
    assert store.put_if_absent("k", b"v")
    cat_file = fs.cat_file
    failures = [ConnectionResetError("reset"), ConnectionResetError("reset")]

    def flaky(path: str, *args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return cat_file(path, *args, **kwargs)

    fs.cat_file = flaky
    assert store.get("k") == b"v"  # two transient failures, retried
    assert store.counts()["GET"] == 1 and store.retries == 2 and store.errors == 0

    def refused(path: str, *args: Any, **kwargs: Any) -> Any:
        raise PermissionError("denied")

    fs.cat_file = refused
    with pytest.raises(StorageError, match="denied"):
        store.get("k")
    assert store.errors == 1 and store.counts()["GET"] == 2


# ---------------------------------------------------------------------------- producer and consumer


def test_producer_metrics_move_with_sends(tmp_path: Path) -> None:
    url = _root(tmp_path)
    metrics = _produce(url, 500)
    assert set(PRODUCER_NAMES) <= set(metrics)
    assert metrics["record-send-total"] == 500
    assert metrics["outgoing-byte-total"] > 500 * 50
    assert metrics["request-total"] >= 1  # a flush at least (one shared object for both partitions)
    for name in ("record-send-rate", "outgoing-byte-rate", "request-rate", "request-latency-avg", "batch-size-avg"):
        assert metrics[name] > 0, name
    assert metrics["request-latency-max"] >= metrics["request-latency-avg"]
    assert metrics["records-per-request-avg"] == pytest.approx(500 / metrics["request-total"])
    assert metrics["record-error-total"] == 0 and metrics["record-error-rate"] == 0
    assert metrics["plog-store-put-total"] >= metrics["request-total"]  # every request an object at least
    assert metrics["plog-store-requests-total"] == sum(
        metrics[f"plog-store-{k}-total"] for k in ("get", "put", "list", "head", "delete")
    )
    assert metrics["plog-store-cost-usd-total"] > 0


def test_record_errors_count_the_records_whose_send_failed(tmp_path: Path) -> None:
    url = _root(tmp_path, partitions=1)
    with Producer(url, linger_ms=60_000) as producer:
        producer.send("orders", b"first")
        producer.flush(30)  # the topic's objects are known now: only the appends below write
        inner = producer.root.store.inner

        def refuse(*args: Any, **kwargs: Any) -> bool:
            raise StorageError("the store refuses writes")

        inner.put_if_absent = refuse
        inner.put_if_absent_parts = refuse
        futures = [producer.send("orders", b"v%d" % i) for i in range(7)]
        producer.flush(30)
        for future in futures:
            with pytest.raises(StorageError, match="refuses writes"):
                future.get(timeout=30)
        metrics = producer.metrics()
        del inner.put_if_absent, inner.put_if_absent_parts
    assert metrics["record-error-total"] == 7 and metrics["record-error-rate"] > 0
    assert metrics["record-send-total"] == 1
    assert metrics["plog-store-errors-total"] >= 1


def test_consumer_metrics_move_and_lag_falls_to_zero(tmp_path: Path) -> None:
    url = _root(tmp_path)
    _produce(url, 400)
    with Consumer(url, group_id="billing", auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("orders", 0), TopicPartition("orders", 1)])
        first = consumer.poll(5_000, max_records=10)
        assert sum(len(v) for v in first.values()) == 10
        early = consumer.metrics()
        assert set(CONSUMER_NAMES) <= set(early)
        assert early["records-lag-max"] > 0
        assert set(early["records-lag"]) <= {"orders-0", "orders-1"}
        seen = 10
        deadline = time.monotonic() + 30
        while seen < 400 and time.monotonic() < deadline:
            seen += sum(len(v) for v in consumer.poll(1_000).values())
        consumer.poll(0)  # a round that finds both partitions at their ends
        metrics = consumer.metrics()
    assert seen == 400
    assert metrics["records-consumed-total"] == 400
    assert metrics["records-lag-max"] == 0 and metrics["records-lag"] == {"orders-0": 0, "orders-1": 0}
    for name in ("records-consumed-rate", "bytes-consumed-rate", "fetch-rate", "fetch-latency-avg", "fetch-size-avg"):
        assert metrics[name] > 0, name
    assert metrics["fetch-latency-max"] >= metrics["fetch-latency-avg"]
    assert metrics["bytes-consumed-total"] > 400 * 50
    assert metrics["plog-store-get-total"] > 0 and metrics["plog-store-put-total"] == 0  # no commit: nothing written


# ---------------------------------------------------------------------------- OpenMetrics


def test_client_endpoint_serves_parsable_openmetrics(tmp_path: Path) -> None:
    url = _root(tmp_path)
    with Producer(url) as producer:
        server = serve_metrics(producer, 0)
        try:
            for i in range(50):
                producer.send("orders", b"v", key=b"%d" % i)
            producer.flush()
            families = _scrape(server.port)
            with pytest.raises(InvalidConfigError, match=f"cannot serve metrics on 127.0.0.1:{server.port}"):
                serve_metrics(producer, server.port)  # the port is taken
        finally:
            server.close()
    sent = families["plog_producer_record_send"]
    assert sent.type == "counter" and sent.samples[0].name == "plog_producer_record_send_total"
    assert sent.samples[0].value == 50
    assert families["plog_producer_record_send_rate"].samples[0].value > 0
    assert families["plog_producer_store_put"].samples[0].value >= 2
    with Consumer(url, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("orders", 0), TopicPartition("orders", 1)])
        consumer.poll(5_000, max_records=1)
        server = serve_metrics(consumer, 0)
        try:
            families = _scrape(server.port)
        finally:
            server.close()
        lags = consumer.metrics()["records-lag"]
    samples = families["plog_consumer_records_lag"].samples
    assert {(s.labels["topic"], s.labels["partition"]): s.value for s in samples} == {
        tuple(name.rsplit("-", 1)): lag for name, lag in lags.items()
    }
    assert sum(lags.values()) > 0 and families["plog_consumer_records_lag_max"].samples[0].value == max(lags.values())


def test_gateway_endpoint_counts_requests_bytes_connections_and_objects(tmp_path: Path) -> None:
    pytest.importorskip("kio")
    confluent_kafka = pytest.importorskip("confluent_kafka")
    from tests.gateway_fixtures import free_port, gateway_process

    url = _root(tmp_path, partitions=1)
    metrics_port = free_port()
    with gateway_process(url, "--metrics-port", str(metrics_port)) as (_proc, port):
        producer = confluent_kafka.Producer({"bootstrap.servers": f"127.0.0.1:{port}", "linger.ms": 0})
        for i in range(5):
            producer.produce("orders", value=b"v%d" % i)
        assert producer.flush(30) == 0
        families = _scrape(metrics_port)
    by_api = {s.labels["api"]: s.value for s in families["plog_gateway_requests_by_api"].samples}
    assert by_api.get("Produce", 0) >= 1 and by_api.get("Metadata", 0) >= 1
    value = {name: f.samples[0].value for name, f in families.items() if f.samples and not f.samples[0].labels}
    assert value["plog_gateway_request"] == sum(by_api.values())
    assert families["plog_gateway_request"].documentation == "Kafka requests answered"
    assert families["plog_gateway_store_put"].documentation == "PUT requests to the store (creates and replaces)"
    assert value["plog_gateway_incoming_byte"] > 0 and value["plog_gateway_outgoing_byte"] > 0
    assert value["plog_gateway_connection_creation"] >= 1
    assert value["plog_gateway_objects_written"] >= 1
    assert value["plog_gateway_store_put"] >= value["plog_gateway_objects_written"]
    with LogStore(url) as store:
        assert store.root.partition("orders", 0).view().end_offset == 5


def test_maintain_watch_serves_its_passes(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    from tests.gateway_fixtures import REPO, free_port, wait_listening

    url = _root(tmp_path)
    port = free_port()
    cmd = [sys.executable, "-m", "pyspark_logsource.cli", "maintain", "--url", url, "--watch", "0.2"]
    proc = subprocess.Popen(
        [*cmd, "--metrics-port", str(port)],
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_listening(port, proc=proc)
        deadline = time.monotonic() + 20
        passes = 0.0
        while passes < 2 and time.monotonic() < deadline:
            families = _scrape(port)
            passes = families["plog_maintain_passes"].samples[0].value if "plog_maintain_passes" in families else 0
            time.sleep(0.1)
        assert passes >= 2
        assert families["plog_maintain_store_list"].samples[0].value > 0
        assert families["plog_maintain_passes"].documentation == "maintenance passes run"
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert f"metrics on http://127.0.0.1:{port}/metrics" in err  # the address it serves, printed at start


# ---------------------------------------------------------------------------- plog top


def test_plog_top_once_shows_topics_and_group_lag(tmp_path: Path) -> None:
    url = _root(tmp_path)
    with LogStore(url) as store:
        store.create_topic("payments", 1)
    _produce(url, 100)
    with Consumer(url, group_id="billing", auto_offset_reset="earliest", enable_auto_commit=False) as consumer:
        consumer.subscribe(["orders"])
        seen = 0
        deadline = time.monotonic() + 30
        while seen < 60 and time.monotonic() < deadline:
            seen += sum(len(v) for v in consumer.poll(1_000, max_records=60 - seen).values())
        consumer.commit()
        committed = {tp: consumer.committed(tp) for tp in consumer.assignment()}
        committed = {tp: offset for tp, offset in committed.items() if offset is not None}
    from tests.gateway_fixtures import REPO

    done = subprocess.run(
        [sys.executable, "-m", "pyspark_logsource.cli", "top", "--once", "--url", url],
        env=dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="160"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    rows = {
        line.split("│")[1].strip(): [c.strip() for c in line.split("│")[1:-1]]
        for line in done.stdout.splitlines()
        if line.count("│") >= 5
    }
    assert rows["orders"][:3] == ["orders", "2", "100"] and rows["payments"][:3] == ["payments", "1", "0"]
    with LogStore(url) as store:  # the group's lag counts the partitions it committed
        ends = {p: store.root.partition("orders", p).view().end_offset for p in range(2)}
    lag = sum(ends[tp.partition] - offset for tp, offset in committed.items())
    assert sum(committed.values()) == 60 and lag > 0
    # The group is empty now (its consumer closed); no consume rate in a single frame.
    assert rows["billing"] == ["billing", "Empty", "0", "orders", "60", "-", str(lag)]
    assert "stored bytes/s" in done.stdout and "not the payload" in " ".join(done.stdout.split())
    assert int(done.stdout.split("this refresh: ")[1].split(" store requests")[0]) > 0


def test_plog_top_refresh_costs_what_its_help_says(tmp_path: Path) -> None:
    """After the first frame: one request per idle shared topic (a probe of its next commit, for all its
    partitions), a LIST of topics, a LIST of groups/, and what describing each group costs."""
    from coordinator.groups import GroupClient
    from pyspark_logsource.cli.top import TopSampler

    url = _root(tmp_path)
    with LogStore(url) as store:
        store.create_topic("payments", 1)
    _produce(url, 20)
    with Consumer(url, group_id="billing", auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("orders", 0)])
        consumer.poll(5_000)
        consumer.commit()
    with LogStore(url) as store:
        counting = store.root.store
        assert isinstance(counting, CountingStore)
        sampler = TopSampler(store)
        sampler.sample()
        before = counting.requests
        GroupClient(counting, "billing").describe()
        group_cost = counting.requests - before
        frame = sampler.sample()
        _produce(url, 30)
        grown = sampler.sample()
    assert grown.topics[0].end == 50 and grown.topics[0].records_per_s and grown.topics[0].records_per_s > 0
    assert grown.topics[0].bytes_per_s and grown.topics[0].bytes_per_s > 0 and grown.topics[1].records_per_s == 0
    assert 1 <= group_cost <= 6
    assert frame.requests == 2 + 2 + group_cost  # "orders" (2 partitions) and "payments": a probe each
    assert frame.groups[0].lag == 0 and [t.records_per_s for t in frame.topics] == [0.0, 0.0]
    assert frame.groups[0].consumed_per_s == 0.0 and grown.groups[0].consumed_per_s == 0.0


@pytest.mark.parametrize("how", ["q", "ctrl-c"])
def test_plog_top_on_a_terminal_shows_its_keys_and_quits_on_q_or_ctrl_c(tmp_path: Path, how: str) -> None:
    import contextlib
    import pty
    import select
    import signal

    from tests.gateway_fixtures import REPO

    url = _root(tmp_path)
    pid, fd = pty.fork()
    if pid == 0:  # the child: plog top on the pseudo-terminal
        os.environ.update(PYTHONPATH=str(REPO), COLUMNS="160")
        os.execv(sys.executable, [sys.executable, "-m", "pyspark_logsource.cli", "top", "--url", url])
    seen = b""
    deadline = time.monotonic() + 60
    while b"q or Ctrl-C: quit" not in seen and time.monotonic() < deadline:
        if select.select([fd], [], [], 0.5)[0]:
            seen += os.read(fd, 65536)
    assert b"q or Ctrl-C: quit" in seen, seen[-2000:]
    if how == "q":
        os.write(fd, b"q")
    else:
        os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + 20
    status = None
    while status is None and time.monotonic() < deadline:
        done, code = os.waitpid(pid, os.WNOHANG)
        if done:
            status = code
        elif select.select([fd], [], [], 0.1)[0]:
            with contextlib.suppress(OSError):  # the child closed its end
                os.read(fd, 65536)
    if status is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    os.close(fd)
    assert status is not None and os.waitstatus_to_exitcode(status) == 0


# ---------------------------------------------------------------------------- Spark progress


def test_offsets_behind_latest_from_progress_fields() -> None:
    source = {
        "endOffset": json.dumps({"t": {"0": 60, "1": 70}, "@start": {"t": {"0": 0}}}),
        "latestOffset": json.dumps({"t": {"0": 250, "1": 70, "2": 5}}),
    }
    assert offsets_behind_latest(source) == {
        "minOffsetsBehindLatest": 0,
        "maxOffsetsBehindLatest": 190,
        "avgOffsetsBehindLatest": 95.0,
    }
    assert offsets_behind_latest({"endOffset": source["endOffset"], "latestOffset": None}) == {}


@pytest.mark.spark
def test_stream_progress_says_how_far_behind_latest(spark: Any, tmp_path: Path) -> None:
    from tests.test_spark_source import make_root, run_available_now

    root = make_root(tmp_path, {"lagging": 2}, per_partition=100)
    df = (
        spark.readStream.format("plog")
        .option("subscribe", "lagging")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "80")
        .load(root)
    )
    q, rows = run_available_now(spark, df, tmp_path / "sink", tmp_path / "ck")
    assert rows.num_rows == 200
    behind = [offsets_behind_latest(p["sources"][0]) for p in q.recentProgress if p["numInputRows"]]
    assert behind[0] == {"minOffsetsBehindLatest": 60, "maxOffsetsBehindLatest": 60, "avgOffsetsBehindLatest": 60.0}
    assert behind[-1]["maxOffsetsBehindLatest"] == 0
    # What PySpark allows: no source metrics of a Python data source (Kafka's source fills these).
    assert not q.recentProgress[-1]["sources"][0].get("metrics")
