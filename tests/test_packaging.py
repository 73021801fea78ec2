"""The installed package is found by Spark's own data-source lookup, from any directory, also when editable.

Spark registers Python data sources by scanning ``pkgutil.iter_modules()`` for ``pyspark_*`` packages with a
``DefaultSource`` (pyspark/sql/worker/lookup_data_sources.py). ``iter_modules`` sees ``sys.path`` entries only,
not import hooks, so an install that works through an import hook (setuptools' default editable mode for a flat
layout) imports fine but is invisible to Spark: ``DATA_SOURCE_NOT_FOUND`` everywhere but the repository root.

These tests run against the environment as installed (CI's ``pip install -e ".[dev]"``): each check runs in a
subprocess whose working directory is a temporary directory and whose ``PYTHONPATH`` does not hold the
repository. When this checkout is not installed in the running interpreter (only put on ``PYTHONPATH``, or
another checkout installed), there is nothing to check and they skip.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures_spark import SPARK_TEST_CONF, java_available

ROOT = Path(__file__).resolve().parents[1]

#: Spark's lookup (lookup_data_sources.py), plus where a plain import finds the package.
LOOKUP = """
import importlib, importlib.util, json, pkgutil
found = {}
for info in pkgutil.iter_modules():
    if info.name.startswith("pyspark_"):
        module = importlib.import_module(info.name)
        if hasattr(module, "DefaultSource"):
            found[info.name] = {"file": module.__file__, "name": module.DefaultSource.name()}
spec = importlib.util.find_spec("pyspark_logsource")
print(json.dumps({"found": found, "origin": spec.origin if spec else None}))
"""

#: A tiny topic, then one batch read through ``format("plog")`` (so the JVM's own lookup is exercised).
READ = """
import json, sys
from pyspark.sql import SparkSession
from pyspark_logsource import LogStore, Producer
url, conf = sys.argv[1], json.loads(sys.argv[2])
LogStore(url).create_topic("t", partitions=2)
with Producer(url) as producer:
    for i in range(10):
        producer.send("t", key=str(i).encode(), value=b"v%d" % i)
builder = SparkSession.builder.master("local[1]")
for key, value in conf.items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()
rows = spark.read.format("plog").option("subscribe", "t").load(url).collect()
print(json.dumps(sorted(bytes(r.value).decode() for r in rows)))
spark.stop()
"""


def _outside_env() -> dict[str, str]:
    """This environment without the repository on ``PYTHONPATH`` (so only the install can find the package)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != ROOT]
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
    env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    return env


def _run_outside(script: str, cwd: Path, *args: str, timeout: float = 60) -> Any:
    """Run ``script`` with this interpreter in ``cwd``, outside the repository; return its last stdout line."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=cwd,
        env=_outside_env(),
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    err = done.stderr.decode()
    assert done.returncode == 0, err if len(err) < 6000 else f"{err[:3000]}\n...\n{err[-3000:]}"
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


def _require_this_checkout_installed(origin: str | None) -> None:
    if origin is None:
        pytest.skip("pyspark_logsource is not installed in this interpreter (only on PYTHONPATH)")
    if not Path(origin).resolve().is_relative_to(ROOT):
        pytest.skip(f"the installed pyspark_logsource is another copy ({origin}), not this checkout ({ROOT})")


def test_spark_lookup_finds_the_installed_package_from_another_directory(tmp_path: Path) -> None:
    result = _run_outside(LOOKUP, tmp_path)
    _require_this_checkout_installed(result["origin"])
    assert "pyspark_logsource" in result["found"], (
        f"pkgutil.iter_modules() does not see pyspark_logsource, which imports from {result['origin']}: "
        "an import-hook (editable) install that Spark's data-source lookup cannot find"
    )
    assert result["found"]["pyspark_logsource"]["name"] == "plog"
    assert Path(result["found"]["pyspark_logsource"]["file"]).resolve().is_relative_to(ROOT)


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_spark_reads_format_plog_from_another_directory(tmp_path: Path) -> None:
    if not java_available():
        pytest.skip("Java is not installed: Spark tests need a JVM")
    _require_this_checkout_installed(_run_outside(LOOKUP, tmp_path)["origin"])
    work = tmp_path / "elsewhere"
    work.mkdir()
    values = _run_outside(READ, work, str(tmp_path / "data"), json.dumps(SPARK_TEST_CONF), timeout=240)
    assert values == sorted(f"v{i}" for i in range(10))


def test_every_error_is_exported_from_the_package() -> None:
    """Every ``PlogError`` a user can meet is importable from ``pyspark_logsource``, one place for all."""
    import inspect as pyinspect

    import pyspark_logsource
    from segment_format import errors

    defined = {
        name for name, value in vars(errors).items() if pyinspect.isclass(value) and issubclass(value, errors.PlogError)
    }
    assert defined <= set(pyspark_logsource.__all__), sorted(defined - set(pyspark_logsource.__all__))
    for name in (*defined, "UnsupportedSparkError"):
        assert issubclass(getattr(pyspark_logsource, name), errors.PlogError), name


def test_the_wheel_carries_py_typed_for_every_package(tmp_path: Path) -> None:
    """PEP 561: each of the three packages ships ``py.typed``, so users' type checkers read its annotations."""
    import zipfile

    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)]
    built = subprocess.run(pip, capture_output=True, text=True, timeout=300, check=False)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in ("segment_format", "coordinator", "pyspark_logsource"):
        assert f"{package}/py.typed" in names, package
