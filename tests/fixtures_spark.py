"""Spark fixtures: one local SparkSession for the whole test session.

Starting a JVM costs seconds, so every Spark test shares one session
(``local[2]``, two shuffle partitions, no UI). Python workers run this
interpreter (``PYSPARK_PYTHON`` / ``PYSPARK_DRIVER_PYTHON``). The project
root is put on ``PYTHONPATH`` so that Spark's own lookup of installed
``pyspark_*`` data sources finds ``pyspark_logsource`` even when it is
installed in editable mode (setuptools' editable finder hides packages from
``pkgutil.iter_modules``, which that lookup uses). The tests never call
``spark.dataSource.register``: ``format("plog")`` must resolve on its own.

Without Java the Spark tests are skipped, not failed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)


def java_available() -> bool:
    """Whether a ``java`` executable can be found (``JAVA_HOME`` or ``PATH``)."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return True
    return shutil.which("java") is not None


def spark_test_env() -> dict[str, str]:
    """Environment variables a Spark driver (this process or a child) needs for these tests."""
    paths = [PROJECT_ROOT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }


#: The JVM options of every Spark JVM the tests start: the C1 compiler only and the serial collector. A test's
#: JVM lives seconds to minutes, and C2's compilations and the parallel collector's threads cost it more CPU
#: than they save (a session that runs one query: 12 CPU-s instead of 21); on two cores the suite is CPU-bound.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

#: Spark settings of the test session, also used by child driver processes.
SPARK_TEST_CONF: dict[str, str] = {
    "spark.driver.extraJavaOptions": TEST_JVM_OPTIONS,
    "spark.executor.extraJavaOptions": TEST_JVM_OPTIONS,
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.python.filterPushdown.enabled": "true",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
    "spark.sql.session.timeZone": "UTC",
}


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The session's SparkSession (``local[2]``); skips the test when Java or pyspark is missing."""
    if not java_available():
        pytest.skip("Java is not installed: Spark tests need a JVM")
    pytest.importorskip("pyspark", reason="pyspark is not installed")
    from pyspark.sql import SparkSession

    with pytest.MonkeyPatch.context() as mp:
        for name, value in spark_test_env().items():
            mp.setenv(name, value)
        builder = SparkSession.builder.master("local[2]").appName("plog-tests")
        for key, value in SPARK_TEST_CONF.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
        try:
            yield session
        finally:
            for query in session.streams.active:
                query.stop()
            session.stop()


@pytest.fixture(autouse=True)
def _no_leftover_queries(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a Spark test, stop the streaming queries it left running, so the next test starts clean."""
    yield
    if "spark" in request.fixturenames:
        session = request.getfixturevalue("spark")
        for query in session.streams.active:
            query.stop()


# ---------------------------------------------------------------------------- driver processes to SIGKILL

#: The start of every child driver script: ``spark``, built from the JSON conf in ``sys.argv[1]``; the
#: script's own arguments follow in ``ARGS`` (``sys.argv[2:]``).
_DRIVER_PREAMBLE = """
import json, sys, time
from pyspark.sql import SparkSession

builder = SparkSession.builder.master("local[2]").appName("plog-kill-test")
for key, value in json.loads(sys.argv[1]).items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
ARGS = sys.argv[2:]
"""


def write_driver_script(path: Path, body: str) -> Path:
    """Write a child Spark driver: the shared preamble (``spark``, ``ARGS``) followed by ``body``."""
    path.write_text(_DRIVER_PREAMBLE + textwrap.dedent(body))
    return path


def start_driver(script: Path, args: list[str], log: Path, conf: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``script`` (from ``write_driver_script``) as a driver in a process group of its own.

    Its output is appended to ``log``. Its JVM is tuned to start fast rather than run fast
    (``TEST_JVM_OPTIONS``): it lives for seconds, until the test kills it.
    """
    settings = {**SPARK_TEST_CONF, "spark.ui.showConsoleProgress": "false", **(conf or {})}
    out = open(log, "ab")  # noqa: SIM115 - the child owns it
    try:
        return subprocess.Popen(
            [sys.executable, str(script), json.dumps(settings), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **spark_test_env()},
            start_new_session=True,
        )
    finally:
        out.close()


def kill_driver(proc: subprocess.Popen) -> None:
    """SIGKILL the driver's whole process group: the Python driver, its JVM and the JVM's Python workers."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def wait_for(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    *,
    proc: subprocess.Popen | None = None,
    log: Path | None = None,
    poll_s: float = 0.3,
) -> None:
    """Poll ``predicate`` until it is true; fail after ``timeout`` seconds, or at once if driver ``proc`` exits.

    The failure names ``what`` was awaited and ends with the tail of the driver's ``log``, if given.
    """

    def tail() -> str:
        return f":\n{log.read_text()[-6000:]}" if log is not None else ""

    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the driver exited while waiting for {what}{tail()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}{tail()}")
        time.sleep(poll_s)
