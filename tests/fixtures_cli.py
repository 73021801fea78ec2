"""CLI fixtures: a fresh root per test, and ``plog`` run in-process against it."""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from pyspark_logsource.cli.app import main
from pyspark_logsource.cli.common import create_root

#: ``run(*args, stdin=None, with_url=True) -> (exit code, stdout, stderr)``.
Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A fresh, empty plog root in a temporary directory (its protocol object and nothing else)."""
    location = str(tmp_path / "root")
    create_root(location, {})
    return location


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, url: str) -> Run:
    """Run ``plog ARGS --url <tmp root>`` in-process with ``stdin=`` bytes; returns (code, out, err)."""
    monkeypatch.delenv("PLOG_URL", raising=False)

    def _run(*args: str, stdin: bytes | None = None, with_url: bool = True) -> tuple[int, str, str]:
        capsys.readouterr()
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
        code = main([*args, *(["--url", url] if with_url else [])])
        out, err = capsys.readouterr()
        return code, out, err

    return _run
