"""Many clients through two gateways, one SIGKILLed midway (issue: load and faults for ``plog serve``).

Client processes open many idempotent producer connections and many group-consumer connections to two real
``plog serve`` processes on one local root; midway the leader of the topic is SIGKILLed. Afterwards every
acknowledged record is in the log exactly once, each key's acknowledged records in the order they were sent
(a record the client gave up on, after Kafka's delivery timeout, may or may not be there, and such records
must be few), and the surviving gateway's peak memory is reported and bounded. ``PLOG_LONG=1``
(``benchmarks/soak``) runs the long form: 200 producer and 50 consumer connections for minutes.

The client processes stand for machines of their own, so they run at the idle CPU priority: 250 librdkafka
clients bring some 750 threads, and at normal priority on a two-core machine they took most of its CPU
(load average 36) and left the gateway under test a quarter of a core, whose answers then took seconds.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")

from coordinator.groups import GroupClient  # noqa: E402
from pyspark_logsource.client.admin import LogStore  # noqa: E402

from .gateway_fixtures import REPO, gateway_process  # noqa: E402
from .soak import soak  # noqa: E402

FAST = ("--heartbeat-ms", "500", "--registration-ms", "2000")
TOPIC = "load"
PARTITIONS = 8
GROUP = "load-group"
#: How long the group may take after the stream to commit everything (a rebalance after the kill, sessions of 6 s).
CATCH_UP_S = 120
#: Producer processes x producers each, consumer processes x consumers each, records per producer.
PRODUCER_PROCESSES = soak(2, 4)
PRODUCERS = soak(15, 50)
CONSUMER_PROCESSES = soak(2, 5)
CONSUMERS = soak(5, 10)
RECORDS = soak(60, 1500)
#: How long the producers' stream lasts.
STREAM_S = soak(8, 300)
#: At most this share of the records may time out in the clients (Kafka's delivery timeout) across the kill.
MAX_TIMED_OUT = 0.01
#: The surviving gateway's peak resident memory must stay under this.
PEAK_RSS_BOUND = 1024 * 2**20


def _idle_priority() -> None:
    """Run this (client) process only on CPU the gateways leave (Linux's SCHED_IDLE; a no-op elsewhere)."""
    if hasattr(os, "SCHED_IDLE"):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def _client(*args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(
        [sys.executable, "-m", "tests.gateway_load_client", *args],
        preexec_fn=_idle_priority,
        env=env,
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _group_caught_up(root: str, deadline_s: float) -> None:
    """Wait (at most ``deadline_s``) until the group has committed every partition's end: the consumers read all."""
    store = LogStore(root)
    ends = {(TOPIC, p): store.root.partition(TOPIC, p).view(refresh=True).end_offset for p in range(PARTITIONS)}
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        committed = GroupClient(store.root.store, GROUP).committed()
        if all(committed.get(tp, 0) >= end for tp, end in ends.items()):
            return
        time.sleep(0.5)


def _peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.slow
@pytest.mark.timeout(soak(300, 1800))
def test_many_clients_through_two_gateways_one_sigkilled(tmp_path: Path) -> None:
    root = str(tmp_path / "plog")
    with LogStore(root) as store:
        store.create_topic(TOPIC, PARTITIONS, config={"retention.ms": -1})
    with gateway_process(root, *FAST) as (first, first_port), gateway_process(root, *FAST) as (second, second_port):
        bootstrap = f"127.0.0.1:{first_port},127.0.0.1:{second_port}"
        probe = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "log_level": 0})
        deadline = time.monotonic() + 30
        metadata = probe.list_topics(TOPIC, timeout=30)
        while len(metadata.brokers) < 2 and time.monotonic() < deadline:  # both registered: the leader is final
            time.sleep(0.2)
            metadata = probe.list_topics(TOPIC, timeout=30)
        leader = metadata.brokers[metadata.topics[TOPIC].partitions[0].leader].port
        victim, survivor = (first, second) if leader == first_port else (second, first)
        clients: list[subprocess.Popen[str]] = []
        try:
            consumers = [
                # They read until the group has committed everything (_group_caught_up), at most this long.
                _client("consume", bootstrap, TOPIC, GROUP, str(CONSUMERS), str(STREAM_S + CATCH_UP_S))
                for _ in range(CONSUMER_PROCESSES)
            ]
            clients += consumers
            producers = [
                _client("produce", bootstrap, TOPIC, f"p{i}", str(PRODUCERS), str(RECORDS), str(STREAM_S))
                for i in range(PRODUCER_PROCESSES)
            ]
            clients += producers
            for proc in producers:
                assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
            time.sleep(STREAM_S / 2)  # midway through the producers' stream
            victim.send_signal(signal.SIGKILL)
            outputs = [proc.communicate("", timeout=600)[0] for proc in producers]
            assert [proc.returncode for proc in producers] == [0] * len(producers), outputs
            # The consumers stop once the group has committed everything (after the rebalance the kill causes).
            _group_caught_up(root, CATCH_UP_S)
            reads = [json.loads(proc.communicate("stop\n", timeout=600)[0])["read"] for proc in consumers]
        finally:
            for proc in clients:  # a failed run leaves no client behind, loading the machine
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        peak = _peak_rss(survivor.pid)
    acked: dict[str, list[str]] = {}
    timed_out: dict[str, list[str]] = {}
    for output in outputs:
        answer = json.loads(output)
        acked.update(answer["acked"])
        timed_out.update(answer["timed_out"])
    assert len(acked) == PRODUCER_PROCESSES * PRODUCERS
    sent = PRODUCER_PROCESSES * PRODUCERS * RECORDS
    given_up = sum(map(len, timed_out.values()))
    # A record the client gave up on (Kafka's delivery timeout, 120 s) may or may not be in the log, as with a
    # broker; across a gateway's death a few producers' records can wait that long in the client. Few, or the
    # gateways are not keeping up.
    assert given_up <= sent * MAX_TIMED_OUT, f"{given_up} of {sent} records timed out in the clients: {timed_out}"
    assert all(len(acked[k]) + len(timed_out.get(k, ())) == RECORDS for k in acked)
    table = LogStore(root).read_topic(TOPIC).read_all().select(["key", "value", "partition", "offset"])
    rows = table.sort_by([("partition", "ascending"), ("offset", "ascending")]).to_pylist()
    counts = collections.Counter(row["value"].decode() for row in rows)
    wanted = {value for values in acked.values() for value in values}
    maybe = {value for values in timed_out.values() for value in values}
    assert wanted <= set(counts), f"acknowledged but missing: {sorted(wanted - set(counts))[:10]}"
    assert set(counts) <= wanted | maybe, f"never sent: {sorted(set(counts) - wanted - maybe)[:10]}"
    # Idempotence holds for every producer whose client gave up on nothing. One that gave up bumped its epoch
    # and sent what it still held under new sequences (librdkafka's rule after a delivery timeout), so records
    # it had in flight then may be there twice, as with a Kafka broker.
    twice = sorted(v for v, c in counts.items() if c > 1 and v.rsplit("-", 1)[0] not in timed_out)
    assert not twice, f"written twice by a producer that never timed out: {twice[:10]}"
    by_key: dict[str, list[int]] = collections.defaultdict(list)
    for row in rows:
        value = row["value"].decode()
        if value in wanted and int(value.rsplit("-", 1)[1]) not in by_key[row["key"].decode()]:
            by_key[row["key"].decode()].append(int(value.rsplit("-", 1)[1]))
    # Each key's acknowledged records are in the log in the order they were sent (by first appearance).
    assert all(sequence == sorted(sequence) for sequence in by_key.values())
    assert sum(reads) >= len(wanted)  # the group read everything at least once (a rebalance may repeat some)
    print(f"surviving gateway's peak RSS: {peak / 2**20:.0f} MiB; {given_up} of {sent} timed out", file=sys.stderr)
    assert peak < PEAK_RSS_BOUND
