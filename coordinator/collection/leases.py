"""Leases (PROTOCOL.md 11.7, *Collection*): every lease keeps its newest two epochs.

A candidate reads only a lease's newest epoch (and that epoch's renewals), so older epochs are dead
weight in the listing every candidate makes. The maintainer lease's holder deletes them after a full
pass (10.1); a holder whose passes are all cut short by their budget, and any other lease, relies on
this collector. Maintainer leases of deleted topics go with the topics' leftovers
(:mod:`coordinator.collection.topics`), which has the topic names at hand.
"""

from __future__ import annotations

from collections import defaultdict

from segment_format.numbered import parse_number

from ..keys import LEASES
from .base import CollectionContext, NamespaceCollector

#: Epochs a lease keeps: the newest, which candidates read, and the one before, so that a candidate whose
#: listing raced the newest creation still finds a consistent pair (and numbering never restarts).
EPOCHS_KEPT = 2


def _epoch_of(rest: str) -> int | None:
    """The epoch an object of a lease belongs to, from its key below ``<name>/``: its own or its renewal's."""
    head, _, tail = rest.partition("/")
    return parse_number(head + ".json") if tail else parse_number(head)


class LeasesCollector(NamespaceCollector):
    """``_coordinator/leases/<name>/``: epochs below the newest two, with their renewals."""

    namespace = "leases"

    def collect(self, context: CollectionContext) -> int:
        """One listing of every lease; each lease with more than two epochs is one step."""
        by_lease: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for info in context.store.list(LEASES):
            name, _, rest = info.key[len(LEASES) :].partition("/")
            epoch = _epoch_of(rest)
            if epoch is not None:
                by_lease[name].append((epoch, info.key))
        deleted = 0
        for objects in by_lease.values():
            epochs = sorted({epoch for epoch, key in objects if "/" not in key[len(LEASES) :].partition("/")[2]})
            if len(epochs) <= EPOCHS_KEPT:
                continue
            if context.spent():
                break
            floor = epochs[-EPOCHS_KEPT]
            doomed = [key for epoch, key in objects if epoch < floor]
            context.store.delete_many(doomed)
            deleted += len(doomed)
        return deleted
