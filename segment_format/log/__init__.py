"""The partition log: one module per concept behind the ``partition_log.PartitionLog`` facade.

What lives here: ``chain`` (resolving a partition's objects into one chain of segments), ``index_cache`` and
``object_bytes`` (indexes and small objects kept in memory), ``producer_state`` (idempotence and transactions
per producer), ``appender`` (appending, with tail hints and contention), ``reader`` (reading ranges,
transaction outcomes), ``maintenance`` (merging and retention), ``transaction_resolution`` (decided
transactions written into rewritten batches) and ``compaction`` (the pass; its plan in ``compaction_plan``, its
offset map in ``offset_map``).

May import: the format's core (``errors``, ``parallel``, ``config``, ``documents``, ``layout``, ``records``,
``numbered``, ``notice``, ``protocol``, ``topic``, ``encoding``), ``stores/``, ``typed/`` and ``segment/``;
never ``root`` or ``inspect/`` (checked by ``tests/test_layering.py``).
"""

from __future__ import annotations

from .appender import TAIL_HINT_SKEW_MS, AppendResult
from .chain import LogView, PartitionListing, SegmentRef, parse_listing, resolve_chain
from .compaction_plan import DecisionTimes
from .index_cache import IndexCache
from .maintenance import MERGE_FANOUT
from .partition_log import PartitionLog
from .producer_state import ProducerStateManager
from .reader import ABORTED, COMMITTED, DECODE_AHEAD_READS, READ_COMMITTED, READ_UNCOMMITTED, TransactionResolver

__all__ = [
    "ABORTED",
    "COMMITTED",
    "DECODE_AHEAD_READS",
    "MERGE_FANOUT",
    "READ_COMMITTED",
    "READ_UNCOMMITTED",
    "TAIL_HINT_SKEW_MS",
    "AppendResult",
    "DecisionTimes",
    "IndexCache",
    "LogView",
    "PartitionListing",
    "PartitionLog",
    "ProducerStateManager",
    "SegmentRef",
    "TransactionResolver",
    "parse_listing",
    "resolve_chain",
]
