"""Starting gateways for tests: in a thread (fast) or as a real process (to SIGKILL it)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A port nobody listens on now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, timeout_s: float = 30.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Wait until something accepts connections on 127.0.0.1:port."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"gateway process exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout_s}s")


@contextmanager
def gateway_process(url: str, *extra: str, port: int | None = None) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``plog serve`` as a real process on 127.0.0.1; killed (SIGKILL) at the end if still running.

    Its log goes to a temporary file (a pipe nobody reads would stall a chatty gateway once full); the
    file's end is printed to stderr when the body fails, so pytest shows it with the failure.
    """
    port = port or free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [
        sys.executable,
        "-m",
        "pyspark_logsource.cli",
        "serve",
        "--url",
        url,
        "--listen",
        f"127.0.0.1:{port}",
        *extra,
    ]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)
        try:
            wait_listening(port, proc=proc)
            yield proc, port
        except BaseException:
            log.seek(0)
            tail = log.read().decode(errors="replace")[-20_000:]
            print(f"--- log of the gateway on port {port} ---\n{tail}", file=sys.stderr)
            raise
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)


def consume_from_start(
    config: dict[str, Any], topic: str, partitions: int, expected: int, timeout_s: float = 30
) -> list[Any]:
    """Up to ``expected`` messages a librdkafka consumer reads from offset 0 of ``partitions`` partitions
    (assigned, no group), polling until it has them or ``timeout_s`` passes; any error fails the test."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"group.id": "reader", "enable.auto.commit": False, **config})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            got.append(message)
    finally:
        consumer.close()
    return got


def send_frames(port: int, frames: bytes) -> bytes:
    """Send raw bytes to a gateway on 127.0.0.1, close the sending side, and return all it answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(frames)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def one_record_batch(value: bytes, **producer: int) -> bytes:
    """A Kafka record batch (v2) of one record with ``value``, built by the gateway's codec."""
    import pyarrow as pa

    from pyspark_logsource.gateway.record_batch import encode_batch
    from segment_format.records import RECORD_SCHEMA

    row = {"offset": 0, "timestamp": 0, "key": None, "value": value, "headers": None}
    return encode_batch(pa.RecordBatch.from_pylist([row], schema=RECORD_SCHEMA), **producer)


def produce_frame(records: bytes, topic: str = "orders", partition: int = 0, correlation_id: int = 7) -> bytes:
    """A size-prefixed Produce v9 request (acks=-1) of ``records`` to one partition, built with kio."""
    import io
    import struct

    from kio.index import load_request_schema
    from kio.schema.request_header.v2.header import RequestHeader
    from kio.serial import entity_writer

    from pyspark_logsource.gateway.entities import make

    request = make(
        load_request_schema(0, 9),
        transactional_id=None,
        acks=-1,
        timeout=30_000,
        topic_data=[{"name": topic, "partition_data": [{"index": partition, "records": records}]}],
    )
    out = io.BytesIO()
    header = RequestHeader(request_api_key=0, request_api_version=9, correlation_id=correlation_id, client_id="t")
    entity_writer(RequestHeader)(out, header)
    entity_writer(type(request))(out, request)
    return struct.pack(">i", len(out.getvalue())) + out.getvalue()
