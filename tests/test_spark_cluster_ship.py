"""plog shipped to executors that do not have it: ``plog ship``'s zip, on ``local-cluster[2,1,1024]``.

On YARN or Kubernetes the executors run a Python of their own, not the driver's environment. Here
each side has a virtual environment made for the test from this Python's base interpreter, both with
plog's third-party dependencies (pyarrow, numpy, pandas, fsspec, lz4, google-crc32c, rich): the
driver's has plog (this checkout, as if installed), the executors' has not. No ``PYTHONPATH`` anywhere:
Spark hands the driver's to the executor tasks of data sources it finds itself, which would reach
this checkout on a one-machine cluster. The driver (a child process: the test process already holds a
classic session) starts ``local-cluster[2,1,1024]`` with ``shipping_conf``'s settings, as a user does.

A task on each executor shows that the executors' Python, in the worker's own environment without the
zip, does not find plog, and that the task imports it from the zip and from nowhere else. A plog ->
plog pipeline (availableNow, exactly-once) then runs, more records arrive in A while it is stopped,
and it runs again from its checkpoint. The Python processes the executor JVMs started are the
executors' Python, and topic B ends up holding every record of A once.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from pyspark_logsource import Consumer, LogStore, Producer, TopicPartition
from pyspark_logsource.spark.shipping import PACKAGES, build_pyfiles_zip, shipping_conf
from tests.fixtures_cli import Run
from tests.fixtures_spark import PROJECT_ROOT, SPARK_TEST_CONF, java_available

pytestmark = [pytest.mark.spark, pytest.mark.slow]

#: plog's third-party dependencies, as imported (pyproject's ``dependencies`` but pyspark, which Spark ships).
DEPENDENCIES = ("pyarrow", "numpy", "pandas", "fsspec", "lz4", "google_crc32c", "rich")

#: Runs in the executors' Python, as a task and directly: where plog and its dependencies import from.
PROBE = """
def probe(_=None):
    import importlib, os, subprocess, sys
    # The executors' Python in this worker's environment and working directory, without the shipped zip
    # (on sys.path per task, and named by PYTHONPATH): it must not find plog on its own.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(e for e in env.get("PYTHONPATH", "").split(os.pathsep)
                                        if not os.path.basename(e).startswith("pyspark_logsource-"))
    alone = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u; print([u.find_spec(n) is not None for n in %r])"
         % (PACKAGES,)], capture_output=True, text=True, env=env, check=True).stdout.strip()
    found = {}
    for name in PACKAGES + DEPENDENCIES:
        try:
            found[name] = importlib.import_module(name).__file__
        except ImportError as exc:
            found[name] = "ImportError: " + str(exc)
    # Directories (not the zip) on sys.path from which a plog package could be imported, seen from here.
    reachable = [e for e in sys.path if any(os.path.isdir(os.path.join(e or ".", n)) for n in PACKAGES)]
    yield {"python": sys.executable, "cwd": os.getcwd(), "alone": alone, "reachable": reachable,
           "PYTHONPATH": os.environ.get("PYTHONPATH", ""), "found": found}
"""

#: The driver: probes both executors, ships plog, runs the pipeline, produces more to A, runs it again.
DRIVER = """
import json, os, sys, time
T0 = time.time()
from pyspark.sql import SparkSession
from pyspark_logsource import Producer

conf, root, checkpoint = json.loads(sys.argv[1]), *sys.argv[2:]
PACKAGES, DEPENDENCIES = {packages!r}, {dependencies!r}
{probe}
builder = SparkSession.builder.appName("plog-ship-test")
for key, value in conf.items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
out = {{"started": round(time.time() - T0, 1)}}


def probe_executors():
    # Both executors are registered before the first job (minRegisteredResourcesRatio), each with one
    # core: the two tasks run one on each.
    return spark.sparkContext.parallelize(range(2), 2).mapPartitions(probe).collect()


def executor_pythons():
    # The Python processes the executor JVMs started (the pipeline's tasks ran in them): their command
    # line and PYTHONPATH, read from /proc.
    def parent(pid):
        with open(f"/proc/{{pid}}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])

    def read(pid, name):
        with open(f"/proc/{{pid}}/{{name}}", "rb") as f:
            return f.read().decode(errors="replace").split("\\0")

    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = read(pid, "cmdline")
            if "pyspark.daemon" not in cmd:
                continue
            p = parent(int(pid))
            while p > 1 and "CoarseGrainedExecutorBackend" not in " ".join(read(p, "cmdline")) and p != os.getpid():
                p = parent(p)
            ours = p  # an executor of this driver's cluster, not of another test's running beside it
            while ours > 1 and ours != os.getpid():
                ours = parent(ours)
            if p > 1 and p != os.getpid() and ours == os.getpid():
                env = dict(e.split("=", 1) for e in read(pid, "environ") if "=" in e)
                found.append({{"python": cmd[0], "args": cmd[1:], "PYTHONPATH": env.get("PYTHONPATH", "")}})
        except OSError:  # gone meanwhile
            continue
    return found


out["probes"] = probe_executors()
out["probed"] = round(time.time() - T0, 1)


def run_query():
    source = (spark.readStream.format("plog").option("subscribe", "A").option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", "250").load(root))
    query = (source.selectExpr("key", "concat(upper(cast(value as string)), '|', cast(partition as string), "
                               "':', cast(offset as string)) as value")
             .writeStream.format("plog").option("topic", "B").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start(root))
    query.awaitTermination()
    return [(p["batchId"], p["numInputRows"]) for p in query.recentProgress]


out["first"] = run_query()
out["first_ran"] = round(time.time() - T0, 1)
with Producer(root) as producer:  # more records while the query is stopped
    for i in range(400, 700):
        producer.send("A", key=("k%d" % (i % 7)).encode(), value=("a-%d" % i).encode())
out["second"] = run_query()  # restarted from its checkpoint
out["second_ran"] = round(time.time() - T0, 1)
out["workers"] = executor_pythons()
spark.stop()
out["stopped"] = round(time.time() - T0, 1)
print("RESULT " + json.dumps(out), flush=True)
"""


def _site_dirs() -> list[str]:
    """The directories this Python imports plog's dependencies from (its site-packages: no plog there)."""
    import importlib.util

    dirs = []
    for name in DEPENDENCIES:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, f"{name} is not installed"
        top = Path(spec.origin).parent
        dirs.append(str(top.parent if spec.submodule_search_locations else top))
    return list(dict.fromkeys(dirs))


def _venv(path: Path, *paths: str) -> Path:
    """A virtual environment of this Python's base interpreter whose ``sys.path`` adds ``paths``; its python.

    Made with ``--without-pip`` (under a second); ``paths`` come in through a ``.pth`` file. The
    directories a ``.pth`` file names are added to ``sys.path`` without their own ``.pth`` files being
    read, so this environment's editable install of plog (a ``.pth`` naming a checkout) does not follow
    its site-packages. Nothing is downloaded.
    """
    base = Path(sys.base_prefix, "bin", f"python{sys.version_info.major}.{sys.version_info.minor}")
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    python = path / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
        env=_bare_env(),
    ).stdout.strip()
    Path(purelib, "plog-test-paths.pth").write_text("\n".join(paths) + "\n")
    return python


@pytest.fixture(scope="module")
def executors_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The executors' Python: plog's dependencies (this environment's site-packages), not plog."""
    return _venv(tmp_path_factory.mktemp("executors-venv"), *_site_dirs())


@pytest.fixture(scope="module")
def driver_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The driver's Python: plog's dependencies and plog, this checkout, as if installed (no ``PYTHONPATH``).

    Not ``PYTHONPATH``: Spark hands the driver's to the executor tasks of data sources it finds itself.
    """
    return _venv(tmp_path_factory.mktemp("driver-venv"), *_site_dirs(), PROJECT_ROOT)


def _bare_env() -> dict[str, str]:
    """This process's environment without anything that points a Python at plog or at this Python."""
    return {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV")
    }


def _probe_directly(python: Path) -> dict[str, Any]:
    script = f"import json\nPACKAGES, DEPENDENCIES = {PACKAGES!r}, {DEPENDENCIES!r}\n{PROBE}\n"
    script += "print(json.dumps(next(probe())))"
    done = subprocess.run(
        [str(python), "-c", script], capture_output=True, text=True, env=_bare_env(), cwd="/", timeout=120
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def _run_driver(
    script: Path, root: Path, checkpoint: Path, zip_path: Path, pythons: tuple[Path, Path], log: Path
) -> dict[str, Any]:
    """Run the driver (``pythons``: the driver's, the executors') to its end on ``local-cluster[2,1,1024]``."""
    driver, executors = pythons
    conf = {
        **SPARK_TEST_CONF,
        "spark.master": "local-cluster[2,1,1024]",
        "spark.ui.showConsoleProgress": "false",
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        **shipping_conf(zip_path, str(executors)),
    }
    env = {
        **_bare_env(),
        "PYSPARK_DRIVER_PYTHON": str(driver),
        "PYSPARK_PYTHON": str(executors),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    with open(log, "ab") as out:
        done = subprocess.run(
            [str(driver), str(script), json.dumps(conf), str(root), str(checkpoint)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=log.parent,
            timeout=400,
        )
    text = log.read_text(errors="replace")
    lines = [line for line in text.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"the driver failed:\n{text[-6000:]}"
    return dict(json.loads(lines[-1][len("RESULT ") :]))


def _assert_from_zip(probes: list[dict[str, Any]], python: Path, zip_path: Path) -> None:
    """Both executors' Python imported plog from the shipped zip, and only there could it find it."""
    assert len(probes) == 2
    assert len({p["cwd"] for p in probes}) == 2, "both tasks ran on one executor"
    for p in probes:
        assert p["python"] == str(python)
        assert p["alone"] == "[False, False, False]", "the executors' Python finds plog without the zip"
        for name in PACKAGES:
            assert p["found"][name].endswith(f"{zip_path.name}/{name}/__init__.py"), p["found"]
        for name in DEPENDENCIES:
            assert not p["found"][name].startswith("ImportError"), p["found"]
        # No directory on the workers' sys.path holds one of plog's packages, and the checkout is not there.
        assert p["reachable"] == [], f"plog reachable from {p['reachable']}"
        assert PROJECT_ROOT not in p["PYTHONPATH"].split(os.pathsep)


def _produce(root: Path, start: int, n: int) -> None:
    with Producer(str(root)) as producer:
        for i in range(start, start + n):
            producer.send("A", key=f"k{i % 7}".encode(), value=f"a-{i}".encode())


def _read_all(root: Path, topic: str) -> list[tuple[bytes, bytes, int, int]]:
    with LogStore(str(root)) as store:
        partitions = len(store.describe_topic(topic)["partitions"])
    with Consumer(str(root), isolation_level="read_committed", auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        t = consumer.read_to_end()
    return list(
        zip(
            t.column("key").to_pylist(),
            t.column("value").to_pylist(),
            t.column("partition").to_pylist(),
            t.column("offset").to_pylist(),
            strict=True,
        )
    )


def test_the_zip_holds_plog_and_is_the_same_for_the_same_code(tmp_path: Path) -> None:
    first = build_pyfiles_zip(tmp_path / "a")
    second = build_pyfiles_zip(tmp_path / "b")
    assert first.name == second.name and first.read_bytes() == second.read_bytes()
    assert first.name.startswith("pyspark_logsource-") and first.suffix == ".zip"
    names = zipfile.ZipFile(first).namelist()
    for package in PACKAGES:
        assert f"{package}/__init__.py" in names
    assert "pyspark_logsource/spark/source.py" in names
    assert not [n for n in names if "__pycache__" in n or not n.endswith((".py", "py.typed"))]
    # Imported from the zip alone (as an executor does) by a Python that has the dependencies.
    code = (
        f"import sys; sys.path.insert(0, {str(first)!r})\n"
        "import pyspark_logsource.spark.source, pyspark_logsource.spark.sink, coordinator.transactions\n"
        "print(pyspark_logsource.__file__)\n"
        # A plog imported from a zip cannot zip itself again: refused, naming the package and the zip.
        "from pyspark_logsource.spark.shipping import build_pyfiles_zip\n"
        "from segment_format.errors import PlogError\n"
        "try:\n"
        "    build_pyfiles_zip('again')\n"
        "except PlogError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_bare_env(), cwd=tmp_path, timeout=120
    )
    assert done.returncode == 0, done.stderr
    imported_from, refusal = done.stdout.strip().splitlines()
    assert imported_from == f"{first}/pyspark_logsource/__init__.py"
    assert refusal.startswith("cannot ship package 'pyspark_logsource': it is imported from") and str(first) in refusal
    assert not (tmp_path / "again").exists()


def test_plog_ship_prints_the_zip_it_wrote(run: Run, tmp_path: Path) -> None:
    code, out, err = run("ship", "--directory", str(tmp_path / "dist"), with_url=False)
    assert code == 0, err
    path = Path(out.strip())
    assert path == build_pyfiles_zip(tmp_path / "dist")  # the same code: the same zip, not written twice
    assert path.parent == tmp_path / "dist" and len(list(path.parent.iterdir())) == 1
    assert f"--conf spark.submit.pyFiles={path} --conf spark.executorEnv.PYTHONPATH={path.name}" in " ".join(
        err.split()
    )


@pytest.mark.timeout(600)
def test_executors_without_plog_run_the_pipeline_exactly_once(
    tmp_path: Path, executors_python: Path, driver_python: Path
) -> None:
    if not java_available():
        pytest.skip("Java is not installed: Spark tests need a JVM")
    started = time.monotonic()
    # The executors' Python cannot import plog on its own, and has its dependencies; the driver's has plog.
    alone = _probe_directly(executors_python)
    assert alone["python"] == str(executors_python)
    for name in PACKAGES:
        assert alone["found"][name].startswith("ImportError"), alone["found"]
    for name in DEPENDENCIES:
        assert not alone["found"][name].startswith("ImportError"), alone["found"]
    assert (
        _probe_directly(driver_python)["found"]["pyspark_logsource"] == f"{PROJECT_ROOT}/pyspark_logsource/__init__.py"
    )

    root, checkpoint, dist = tmp_path / "data", tmp_path / "checkpoint", tmp_path / "dist"
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.format(packages=PACKAGES, dependencies=DEPENDENCIES, probe=textwrap.dedent(PROBE)))
    with LogStore(str(root)) as store:
        store.create_topic("A", partitions=2)
        store.create_topic("B", partitions=2)
    _produce(root, 0, 400)

    zip_path = build_pyfiles_zip(dist)
    result = _run_driver(script, root, checkpoint, zip_path, (driver_python, executors_python), tmp_path / "driver.log")
    _assert_from_zip(result["probes"], executors_python, zip_path)
    # The pipeline's tasks ran in the executors' Python (not the driver's, which has plog), no checkout
    # on their PYTHONPATH: plog came from the zip.
    workers = result["workers"]
    assert workers and {w["python"] for w in workers} == {str(executors_python)}, workers
    assert not [w for w in workers if PROJECT_ROOT in w["PYTHONPATH"].split(os.pathsep)], workers
    assert sum(n for _, n in result["first"]) == 400
    assert sum(n for _, n in result["second"]) == 300  # the restarted query went on from its checkpoint

    a = _read_all(root, "A")
    expected = collections.Counter((k, v.upper() + f"|{p}:{o}".encode()) for k, v, p, o in a)
    got = collections.Counter((k, v) for k, v, _, _ in _read_all(root, "B"))
    assert len(a) == 700
    assert sum(n - 1 for n in got.values() if n > 1) == 0, "duplicates in B"
    assert got == expected
    timings = {k: v for k, v in result.items() if k in ("started", "probed", "first_ran", "second_ran", "stopped")}
    print(f"\nplog shipped to executors without it: {time.monotonic() - started:.1f} s; driver (s): {timings}")
