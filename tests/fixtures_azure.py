"""Azure Blob fixtures: one Azurite per test session on 127.0.0.1, and a fresh container per test.

Azurite is Microsoft's emulator, an npm package. It is installed on first use
into ``.cache/azurite`` under the repository (gitignored) with ``npm install``,
so a fresh machine with node and npm needs nothing else; without them the
Azure tests are skipped, saying so. It runs in memory (``--inMemoryPersistence``),
loopback only, with ``--skipApiVersionCheck`` (the newest azure-storage-blob
speaks a newer API version than Azurite knows) and the well-known development
account, whose key is public by design.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures_gcs import free_port, serving_on_loopback

#: Azurite's development account (documented by Microsoft; not a secret).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
#: The npm package installed when none is found (major version 3: the Blob API of the SDKs in use).
AZURITE_PACKAGE = "azurite@3"
#: Where the fixture installs Azurite: ``.cache/azurite`` at the repository root.
AZURITE_CACHE = Path(__file__).resolve().parent.parent / ".cache" / "azurite"
#: Written into the cache last, once ``npm install`` has finished.
AZURITE_INSTALLED = ".installed"


def azurite_blob_binary() -> str:
    """The ``azurite-blob`` executable: on ``PATH``, in the cache, or installed into the cache now.

    The cache counts only once an install finished (a marker written last): an install killed halfway leaves
    a ``node_modules`` that starts and dies, so it is installed again, into a fresh directory that replaces
    the cache by a rename. ``pytest.skip`` when node or npm is missing; a failed install is an error.
    """
    found = shutil.which("azurite-blob")
    if found:
        return found
    binary = Path("node_modules") / ".bin" / "azurite-blob"
    if (AZURITE_CACHE / AZURITE_INSTALLED).exists():
        return str(AZURITE_CACHE / binary)
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Azurite needs node and npm (not found on PATH); the Azure tests are skipped")
    AZURITE_CACHE.parent.mkdir(parents=True, exist_ok=True)
    # One install at a time (the suite's workers start together): the second finds the first's copy.
    with open(AZURITE_CACHE.with_name("azurite.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (AZURITE_CACHE / AZURITE_INSTALLED).exists():
            return str(AZURITE_CACHE / binary)
        return _install_azurite(binary)


def _install_azurite(binary: Path) -> str:
    """``npm install`` Azurite into a fresh directory, then rename it to the cache (see ``azurite_blob_binary``)."""
    fresh = AZURITE_CACHE.with_name(f"azurite.installing-{os.getpid()}")
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir(parents=True)
    npm = ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", "--prefix", str(fresh), AZURITE_PACKAGE]
    done = subprocess.run(npm, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0 or not (fresh / binary).exists():
        raise RuntimeError(f"npm install {AZURITE_PACKAGE} into {fresh} failed: {done.stderr[-2000:]}")
    (fresh / AZURITE_INSTALLED).write_text(AZURITE_PACKAGE)
    shutil.rmtree(AZURITE_CACHE, ignore_errors=True)
    try:
        fresh.rename(AZURITE_CACHE)
    except OSError:  # another session installed it meanwhile: use its copy
        shutil.rmtree(fresh, ignore_errors=True)
    return str(AZURITE_CACHE / binary)


def connection_string(endpoint: str) -> str:
    """The connection string of the development account at ``endpoint`` (``http://127.0.0.1:port``)."""
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint={endpoint}/{AZURITE_ACCOUNT};"
    )


def azure_storage_options(endpoint: str) -> dict[str, Any]:
    """The adlfs options that reach Azurite with the development account."""
    return {"connection_string": connection_string(endpoint)}


def start_azurite(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start Azurite's Blob service on a free loopback port, in memory; wait until it accepts connections."""
    binary = azurite_blob_binary()
    port = free_port()
    log = open(workdir / "azurite.log", "wb")  # noqa: SIM115 - the process owns it until it ends
    args = [binary, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence"]
    args += ["--skipApiVersionCheck", "--disableTelemetry", "--silent"]
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    log.close()
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"Azurite exited with {proc.returncode}: {(workdir / 'azurite.log').read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("Azurite did not listen within 60 s")
        time.sleep(0.1)


@pytest.fixture(scope="session")
def azure_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Start Azurite on 127.0.0.1 (free port) for the session; yield its Blob endpoint URL."""
    pytest.importorskip("adlfs", reason="adlfs is not installed (pip install '.[azure]')")
    proc, url = start_azurite(tmp_path_factory.mktemp("azurite"))
    with serving_on_loopback(proc, url):
        yield url


@pytest.fixture
def azure_url(azure_endpoint: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Create a fresh container on Azurite; yield ``("abfs://<container>/plog", storage_options)``.

    The container is removed afterwards.
    """
    from adlfs import AzureBlobFileSystem

    options = azure_storage_options(azure_endpoint)
    fs = AzureBlobFileSystem(**options, skip_instance_cache=True)
    container = f"plog-test-{uuid.uuid4().hex[:16]}"
    fs.mkdir(container)
    try:
        yield f"abfs://{container}/plog", options
    finally:
        fs.rm(container, recursive=True)
