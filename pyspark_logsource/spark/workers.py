"""State kept per Python worker: one ``LogRoot`` and transaction resolver per root, shared by source and sink tasks.

Spark reuses Python workers between tasks, so what is cached here (segment indexes, listings, transaction
decisions) serves later batches of the same worker, whether they read (``source``) or write (``sink``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

from coordinator.transactions import TransactionCoordinator
from segment_format.root import LogRoot

_ROOTS: dict[tuple[str, str], tuple[LogRoot, TransactionCoordinator]] = {}
_ROOTS_LOCK = threading.Lock()


def executor_root(url: str, storage_options: Mapping[str, Any]) -> tuple[LogRoot, TransactionCoordinator]:
    """One ``LogRoot`` (and transaction resolver) per root and options per Python worker, for every task."""
    key = (url, json.dumps(storage_options, sort_keys=True, default=str))
    with _ROOTS_LOCK:
        entry = _ROOTS.get(key)
        if entry is None:
            root = LogRoot(url, dict(storage_options))
            entry = _ROOTS[key] = (root, TransactionCoordinator(root.store))
        return entry
