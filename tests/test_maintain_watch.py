"""``plog maintain --watch SECONDS`` as a real subprocess: passes until SIGINT or SIGTERM, then exit code 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from segment_format.records import now_ms, payload_batch
from segment_format.root import LogRoot
from segment_format.segment import BatchMeta

PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)


def _fill(url: str, appends: int) -> LogRoot:
    root = LogRoot(url)
    # Interval 1 h: the appends below do not maintain anything; only the watcher does.
    root.catalog.create("w", 1, {"segment.bytes": 16384, "file.delete.delay.ms": 0, "storage.layout": "partitioned"})
    for _ in range(appends):
        values = [os.urandom(200) for _ in range(4)]
        batch = payload_batch([now_ms()] * 4, [None] * 4, values)
        root.partition("w", 0).append([(batch, BatchMeta())], durable=False)
    return root


def _objects(root: LogRoot) -> int:
    return len([i for i in root.store.list(root.partition("w", 0).prefix + "log/") if i.key.endswith(".arrow")])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.timeout(120)
def test_watch_maintains_until_interrupted(tmp_path: Path, sig: signal.Signals) -> None:
    url = str(tmp_path / "root")
    root = _fill(url, 20)
    assert _objects(root) == 20
    env = {**os.environ, "PYTHONPATH": PROJECT_ROOT, "PYTHONUNBUFFERED": "1", "PLOG_URL": url}
    out_path = tmp_path / "out.txt"
    with open(out_path, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pyspark_logsource.cli", "maintain", "w", "--watch", "0.3"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and out_path.read_text().count("maintained topic 'w'") < 2:
            assert proc.poll() is None, out_path.read_text()
            time.sleep(0.1)
        text = out_path.read_text()
        assert text.count("maintained topic 'w'") >= 2, text  # one line per pass, several passes
        assert _objects(root) < 10, text  # merged, and the merged-away objects deleted
        proc.send_signal(sig)
        assert proc.wait(30) == 0, out_path.read_text()
        assert "Traceback" not in out_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    root.close()
