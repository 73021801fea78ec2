"""What an operator meets: ``plog serve``'s lifecycle, a mistyped root refused, the live tools describing themselves.

Through the real command: ``plog serve`` as a process (bind failures, SIGTERM and SIGINT with a Kafka client's
produce in flight), every other command through the CLI's entry point, and the root looked at afterwards.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pyspark_logsource import Consumer, LogStore, TopicPartition
from tests.fixtures_cli import Run
from tests.gateway_fixtures import REPO, free_port, wait_listening

GATEWAYS = Path("_coordinator", "gateways")


def _serve(url: str, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    command = [sys.executable, "-m", "pyspark_logsource.cli", "serve", "--url", url, *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _root_with_topic(tmp_path: Path) -> str:
    url = str(tmp_path / "root")
    with LogStore(url) as store:
        store.create_topic("orders", 1)
    return url


# --------------------------------------------------------------------------- plog serve: settings and binding


def test_serve_refuses_what_it_cannot_serve_before_it_prints_or_registers(tmp_path: Path) -> None:
    url = _root_with_topic(tmp_path)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        cases = [
            (["--listen", f"127.0.0.1:{taken.getsockname()[1]}"], "Address already in use"),
            (["--listen", "10.255.1.1:0", "--allow-unauthenticated-remote"], "Cannot assign requested address"),
            (["--listen", "0.0.0.0:0"], "refusing to listen on '0.0.0.0' without authentication"),
            (["--listen", "127.0.0.1:99999"], "port 99999 of '127.0.0.1:99999' is out of range"),
            (["--listen", "127.0.0.1:0", "--metrics-port", "70000"], "--metrics-port 70000 is out of range"),
        ]
        for args, reason in cases:
            proc = _serve(url, *args)
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 2, (args, err)
            assert reason in err and "Traceback" not in err and "serving" not in err, (args, err)
            assert out == ""
            if "cannot listen" in err:
                assert len(err.strip().splitlines()) == 1 and err.startswith("error: cannot listen on "), err
    finally:
        taken.close()
    assert not Path(url, GATEWAYS).exists()  # no registration was ever written


def test_serve_refuses_a_location_without_a_root_unless_asked_to_create_one(tmp_path: Path) -> None:
    typo = tmp_path / "typo"
    proc = _serve(str(typo), "--listen", "127.0.0.1:0")
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and f"no plog root at {typo}" in err and "plog topics create" in err
    assert not typo.exists()

    port = free_port()
    proc = _serve(str(typo), "--listen", f"127.0.0.1:{port}", "--create")
    try:
        wait_listening(port, proc=proc)  # type: ignore[arg-type]
        assert Path(typo, "_protocol").is_dir()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_serve_answers_a_produce_in_flight_then_deregisters_and_exits_0(tmp_path: Path, signum: int) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    url = _root_with_topic(tmp_path)
    port = free_port()
    # A flush at most every 3 s: the second record waits for its flush when the signal comes.
    proc = _serve(url, "--listen", f"127.0.0.1:{port}", "--flush-interval-ms", "3000")
    try:
        wait_listening(port, proc=proc)  # type: ignore[arg-type]
        producer = confluent_kafka.Producer({"bootstrap.servers": f"127.0.0.1:{port}", "acks": "all"})
        outcomes: dict[bytes, object] = {}

        def report(error: object, message: object) -> None:
            outcomes[message.value()] = error  # type: ignore[attr-defined]

        producer.produce("orders", b"first", on_delivery=report)
        producer.flush(30)
        assert outcomes == {b"first": None}
        producer.produce("orders", b"in flight", on_delivery=report)
        producer.poll(0.5)  # sent, and waiting for the next flush
        assert b"in flight" not in outcomes
        started = time.monotonic()
        proc.send_signal(signum)
        producer.flush(30)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert time.monotonic() - started < 15
    assert outcomes[b"in flight"] is None, outcomes  # acknowledged before the gateway went away
    assert "stopped, deregistered" in err and out == ""
    registrations = sorted(Path(url, GATEWAYS).rglob("*.json"))
    assert registrations and '"leaving":true' in registrations[-1].read_text()
    with Consumer(url, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("orders", 0)])
        assert consumer.read_to_end().column("value").to_pylist() == [b"first", b"in flight"]


# --------------------------------------------------------------------------- a mistyped root


@pytest.mark.parametrize(
    "command",
    [
        ["topics", "list"],
        ["topics", "describe", "orders"],
        ["groups", "list"],
        ["groups", "describe", "g1"],
        ["quotas", "describe"],
        ["top", "--once"],
        ["consume", "orders", "--timeout-ms", "100"],
        ["produce", "orders"],
        ["inspect", "orders"],
        ["maintain"],
        ["protocol"],
        ["verify"],
    ],
)
def test_every_command_refuses_a_location_without_a_root_and_creates_nothing(
    run: Run, tmp_path: Path, command: list[str]
) -> None:
    typo = tmp_path / "typo"
    code, out, err = run(*command, "--url", str(typo), with_url=False, stdin=b"x\n")
    assert code == 2 and out == "", err
    assert f"error: no plog root at {typo}" in err and "plog topics create" in err
    assert not typo.exists()
    typo.mkdir()  # a directory that holds no root is no root either
    code, _, err = run(*command, "--url", str(typo), with_url=False, stdin=b"x\n")
    assert code == 2 and "holds no protocol object and no topic" in err
    assert list(typo.iterdir()) == []


def test_topics_create_makes_a_root_where_there_was_none(run: Run, tmp_path: Path) -> None:
    where = ["--url", str(tmp_path / "new")]
    code, out, _ = run("topics", "create", "orders", *where, with_url=False)
    assert code == 0 and "created topic 'orders'" in out
    code, out, _ = run("topics", "list", *where, with_url=False)
    assert code == 0 and "orders" in out


def test_groups_describe_of_an_unknown_group_says_it_does_not_exist(run: Run) -> None:
    run("topics", "create", "orders")
    code, out, err = run("groups", "describe", "nosuch")
    assert code == 2 and out == "" and "consumer group 'nosuch' does not exist" in err
