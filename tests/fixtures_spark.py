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

import os
import shutil
import sys
from collections.abc import Iterator
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


#: Spark settings of the test session, also used by child driver processes.
SPARK_TEST_CONF: dict[str, str] = {
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
