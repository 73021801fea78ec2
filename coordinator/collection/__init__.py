"""The root collector: every namespace under a root collected by its rule (PROTOCOL.md 3.2, *The root
collector*).

:func:`collect` runs the collectors of :data:`COLLECTORS` in turn, each a
:class:`~coordinator.collection.base.NamespaceCollector` deleting only what its rule allows, and stops
between steps once its budget is spent; it is safe to run concurrently with itself and with every writer.
:func:`~coordinator.collection.schedule.maybe_collect` runs it when the root's ``collector`` lease says a
pass is due (writers call it after their writes); ``plog maintain`` runs it unconditionally.

A further namespace is one more module here with one more entry in :data:`COLLECTORS`.
"""

from __future__ import annotations

from .base import CollectionContext, CollectionReport, CountingView, NamespaceCollector
from .groups import OFFSETS_RETENTION_MS, GroupsCollector
from .leases import LeasesCollector
from .passes import COLLECTORS, collect
from .schedule import DEFAULT_INTERVAL_MS, LEASE_NAME, maybe_collect
from .temp_files import TempFilesCollector
from .topics import TopicsCollector
from .transactions import TransactionCollection, TransactionHistoryCollector, TransactionsCollector

__all__ = [
    "COLLECTORS",
    "DEFAULT_INTERVAL_MS",
    "LEASE_NAME",
    "OFFSETS_RETENTION_MS",
    "CollectionContext",
    "CollectionReport",
    "CountingView",
    "GroupsCollector",
    "LeasesCollector",
    "NamespaceCollector",
    "TempFilesCollector",
    "TopicsCollector",
    "TransactionCollection",
    "TransactionHistoryCollector",
    "TransactionsCollector",
    "collect",
    "maybe_collect",
]
