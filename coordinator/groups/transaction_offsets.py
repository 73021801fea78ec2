"""A committed transaction's consumer offsets, copied into each group's commit log once (PROTOCOL.md 11.2, 11.4)."""

from __future__ import annotations

from typing import Any

from segment_format.errors import CommitFailedError
from segment_format.stores.base import Store

from ..keys import materialized_key
from .client import COMMIT_ATTEMPTS, GroupClient
from .documents import GenerationSealed


def materialize_offsets(store: Store, decision: Any) -> None:
    """Write a committed transaction's consumer offsets into each group's commit log, once.

    The decision object is the atomic record (PROTOCOL.md 11.2); this copies
    its offsets where ``committed()`` reads them, and leaves a marker so that a
    later call (``init_transactions`` after a crash) does not apply them again.
    """
    marker = materialized_key(decision.producer_id, decision.txn)
    if store.exists(marker):
        return
    member = f"txn:{decision.producer_id}:{decision.txn}"
    for group, topics in decision.offsets.items():
        offsets = {(topic, int(p)): int(o) for topic, parts in topics.items() for p, o in parts.items()}
        client = GroupClient(store, group)
        for _ in range(COMMIT_ATTEMPTS):
            try:
                client.append_commit(client.latest_generation(), member, offsets)
                break
            except GenerationSealed:
                continue  # a rebalance sealed it: the next generation takes the commit
        else:
            raise CommitFailedError(f"group {group}: could not record the offsets of transaction {decision.txn}")
    store.put_if_absent(marker, b"{}")
