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

#: How long a worker trusts topic metadata. Tasks check what matters against the driver's plan (a
#: source task compares the topic id), and each read costs a LIST and a GET per topic on object
#: stores; partitions added are seen by the sink's routing within this (Kafka's producers: 5 min).
EXECUTOR_METADATA_MAX_AGE_S = 60.0

_ROOTS: dict[tuple[str, str], tuple[LogRoot, TransactionCoordinator]] = {}
_ROOTS_LOCK = threading.Lock()


def executor_root(url: str, storage_options: Mapping[str, Any]) -> tuple[LogRoot, TransactionCoordinator]:
    """One ``LogRoot`` (and transaction resolver) per root and options per Python worker, for every task."""
    key = (url, json.dumps(storage_options, sort_keys=True, default=str))
    with _ROOTS_LOCK:
        entry = _ROOTS.get(key)
        if entry is None:
            root = LogRoot(url, dict(storage_options), metadata_max_age_s=EXECUTOR_METADATA_MAX_AGE_S)
            entry = _ROOTS[key] = (root, TransactionCoordinator(root.store))
        return entry
