"""Shared fixtures, and the order the suite runs in. Fixture families live in their own modules, loaded here.

The suite runs on two pytest-xdist workers (``-n 2 --dist loadgroup``, the README's command), with CI's
PySpark compatibility lanes beside them: on two cores a third worker gained little and made Spark's
Python workers miss their 10 s connect-back under load. Tests marked
``slow`` (the crash and soak tests, minutes each) are handed out first, so that the workers end together
instead of one finishing a soak alone. A module whose session-wide server is costly (the Spark Connect
server) or whose tests share files outside ``tmp_path`` (the packaging tests build in the checkout) keeps
its tests on one worker (its ``xdist_group``).
"""

from __future__ import annotations

import os

import pytest

pytest_plugins = [
    "tests.fixtures_s3",
    "tests.fixtures_gcs",
    "tests.fixtures_azure",
    "tests.fixtures_spark",
    "tests.fault_proxy",
    "tests.fixtures_cli",
]

#: Modules whose tests run on one worker, by group name.
ONE_WORKER = {"test_spark_connect": "connect", "test_packaging": "packaging"}


def pytest_configure(config: pytest.Config) -> None:
    """Tests see the CLI as a pipe sees it: xdist's workers inherit a ``COLUMNS`` of the controlling terminal,
    which would narrow the CLI's tables in one run and not in another."""
    os.environ.pop("COLUMNS", None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Slow tests first (a stable sort: the rest keep their order), and one worker per grouped module."""
    for item in items:
        group = ONE_WORKER.get(item.module.__name__.rsplit(".", 1)[-1]) if item.module is not None else None
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
