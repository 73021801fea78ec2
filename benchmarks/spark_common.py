"""What the Spark benchmarks share: the test data, the local[2] session, CPU accounting and the machine line.

Imported by ``bench_spark_source.py`` and ``bench_spark_sink.py`` (run as scripts from any directory: the
script's own directory is on ``sys.path``). Importing it puts the project root on ``sys.path`` too, so the
benchmarks run against the checkout, installed or not.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

PROJECT = Path(__file__).resolve().parent.parent
if str(PROJECT) not in sys.path:
    sys.path.insert(0, str(PROJECT))


def make_values(n: int, size: int, rng: np.random.Generator) -> pa.Array:
    """``n`` semi-compressible ``size``-byte values (slices of random words), built without Python objects."""
    words = np.array(
        b"event user click view order cart pay ship return login logout search page item "
        b"price paris tokyo lima oslo cairo delhi quebec madrid error warning info debug".split()
    )
    text = b" ".join(rng.choice(words, 200_000)) + b" "
    buf = np.frombuffer(text, np.uint8)
    starts = rng.integers(0, len(buf) - size, n)
    data = np.empty((n, size), np.uint8)
    for lo in range(0, n, 50_000):
        hi = min(n, lo + 50_000)
        data[lo:hi] = buf[starts[lo:hi, None] + np.arange(size)]
    offsets = np.arange(0, (n + 1) * size, size, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data.tobytes())])


def local_spark(app_name: str, master: str = "local[2]", conf: dict[str, str] | None = None) -> Any:
    """A quiet SparkSession (default local[2], 4 GB driver) whose Python workers run this interpreter and this
    checkout; executor processes (``local-cluster``) inherit the environment that says so."""
    os.environ.update(
        {
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")])),
        }
    )
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "4g")
        .config(map=conf or {})
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds used by ``pid`` and its descendants (live ones, and reaped ones via cutime), from /proc.

    The driver, the JVM and the Python workers all descend from this process, so the delta over a run is
    the work the run cost, whatever else the machine was doing meanwhile. NaN where /proc is not available.
    """
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    try:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                raw = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = raw[raw.rindex(")") + 2 :].split()
            stats[int(entry)] = fields
            children.setdefault(int(fields[1]), []).append(int(entry))
    except OSError:
        return float("nan")
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        f = stats.get(p)
        if f:
            total += sum(int(x) for x in f[11:15])  # utime, stime, cutime, cstime
        todo.extend(children.get(p, []))
    return total / tick


def machine() -> str:
    """One line naming the machine and the versions that matter: CPU, cores, RAM, OS, Python, Spark, Arrow, Java."""
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal")).split()[1])
        mem = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, StopIteration):
        pass
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[:1]
    import pyspark

    return (
        f"{platform.node()}: {cpu}, {os.cpu_count()} CPUs{mem}; {platform.system()} {platform.release()}; "
        f"Python {platform.python_version()}, pyspark {pyspark.__version__}, pyarrow {pa.__version__}, "
        f"{java[0] if java else 'java ?'}"
    )
