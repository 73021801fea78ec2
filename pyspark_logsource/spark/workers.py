"""State kept per Python worker: one ``LogRoot`` and transaction resolver per root, shared by source and sink tasks.

Spark reuses Python workers between tasks, so what is cached here (segment indexes, listings, transaction
decisions) serves later batches of the same worker, whether they read (``source``) or write (``sink``).
"""

from __future__ import annotations

import gc
import json
import os
import threading
from collections.abc import Mapping
from typing import Any

from coordinator.quotas import ClientQuota
from coordinator.transactions import TransactionCoordinator
from segment_format.root import LogRoot

#: How long a worker trusts topic metadata. Tasks check what matters against the driver's plan (a
#: source task compares the topic id), and each read costs a LIST and a GET per topic on object
#: stores; partitions added are seen by the sink's routing within this (Kafka's producers: 5 min).
EXECUTOR_METADATA_MAX_AGE_S = 60.0

_ROOTS: dict[tuple[str, str], tuple[LogRoot, TransactionCoordinator]] = {}
_ROOTS_LOCK = threading.Lock()
_QUOTAS: dict[tuple[str, str, str, str], ClientQuota] = {}
_FROZEN_IN: int | None = None


def freeze_long_lived_objects() -> None:
    """Exempt every object alive now from the garbage collector's scans, once per process.

    PySpark's daemon runs a full ``gc.collect()`` after every task of a reused Python worker. With
    plog, pyarrow and pyspark imported, each collection scanned about 80,000 objects that live as
    long as the worker (modules, classes, functions, this worker's roots and caches): about 14 ms
    per task on a 2-core VM, 0.9 s of CPU for the 64 tasks of a 64-partition micro-batch, more than
    reading their records. ``gc.freeze()`` (made for this) moves them to a generation no collection
    scans; objects created later, the tasks' own, are collected as before.
    """
    global _FROZEN_IN
    if os.getpid() != _FROZEN_IN:  # a forked child freezes its own
        # No collection first: it would cost a worker that is not reused (one task per process) as much as
        # it saves; whatever cyclic garbage exists now (little, once) stays.
        gc.freeze()
        _FROZEN_IN = os.getpid()


def executor_root(url: str, storage_options: Mapping[str, Any]) -> tuple[LogRoot, TransactionCoordinator]:
    """One ``LogRoot`` (and transaction resolver) per root and options per Python worker, for every task."""
    key = (url, json.dumps(storage_options, sort_keys=True, default=str))
    with _ROOTS_LOCK:
        entry = _ROOTS.get(key)
        if entry is None:
            root = LogRoot(url, dict(storage_options), metadata_max_age_s=EXECUTOR_METADATA_MAX_AGE_S)
            entry = _ROOTS[key] = (root, TransactionCoordinator(root.store, root.protocol).for_reader(root))
            freeze_long_lived_objects()
        return entry


def executor_quota(root: LogRoot, byte_key: str, user: str, client_id: str) -> ClientQuota:
    """The worker's ``ClientQuota`` of ``(user, client_id)`` for ``byte_key`` on ``root`` (PROTOCOL.md 11.10).

    One per worker process, like the root: its ``QuotaManager`` (one per root per process) lists
    ``_coordinator/quotas/`` at most once per refresh interval (5 s) however many tasks the worker
    runs, and the tasks of one entity share its throttle, so a worker enforces the entity's share
    across the tasks it runs one after another or at once. A task that records nothing lists nothing.
    """
    key = (root.store.url, byte_key, user, client_id)
    with _ROOTS_LOCK:
        quota = _QUOTAS.get(key)
        if quota is None:
            quota = _QUOTAS[key] = ClientQuota(root.store, byte_key, user, client_id)
        return quota
