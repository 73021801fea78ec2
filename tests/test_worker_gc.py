"""A Python worker's long-lived objects are out of the garbage collector's scans (``gc.freeze``).

PySpark's daemon runs a full ``gc.collect()`` after every task of a reused worker; scanning plog's,
pyarrow's and pyspark's module objects each time cost about 14 ms per task. Checked in a fresh
process, as a worker is one: freezing the test session itself would change nothing it tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pyspark_logsource import LogStore

_WORKER = """
import gc, json, sys
from pyspark_logsource.spark.workers import executor_root
before = gc.get_freeze_count()
executor_root(sys.argv[1], {})
executor_root(sys.argv[1], {})  # the same root again: nothing more is frozen
frozen = gc.get_freeze_count()

class Node:
    pass

collected = []
for _ in range(3):  # objects of later tasks, in cycles, are still collected
    a, b = Node(), Node()
    a.other, b.other = b, a
    del a, b
    collected.append(gc.collect())
print(json.dumps({"before": before, "frozen": frozen, "again": gc.get_freeze_count(),
                  "collected": collected, "tracked": len(gc.get_objects())}))
"""


def test_a_worker_freezes_what_it_imported_once_and_still_collects_later_cycles(tmp_path: Path) -> None:
    url = str(tmp_path / "root")
    LogStore(url).create_topic("t", 1)
    out = subprocess.run([sys.executable, "-c", _WORKER, url], capture_output=True, text=True, check=True, timeout=120)
    facts = json.loads(out.stdout.strip().splitlines()[-1])
    assert facts["before"] == 0
    assert facts["frozen"] > 20_000  # the modules' objects: plog, pyarrow, pyspark's worker side
    assert facts["again"] == facts["frozen"]
    assert all(n >= 2 for n in facts["collected"]), facts["collected"]  # each cycle's two objects
    assert facts["tracked"] < facts["frozen"] // 10  # what a task's collection still scans
