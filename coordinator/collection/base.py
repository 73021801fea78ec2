"""The root collector's parts: the context a pass hands each collector, its report, the collector interface.

A pass (:func:`coordinator.collection.collect`) runs a list of :class:`NamespaceCollector` in turn, each
deleting only what its rule in PROTOCOL.md allows (section 3.2),
and stops between steps once its budget is spent. Collectors are stateless between passes: every pass
decides from its own listings, so any number of passes may run at once, with each other and with every
writer.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

from segment_format.stores.base import ForwardingStore, ObjectInfo, Store


class CountingView(ForwardingStore):
    """The store as one collector sees it: every request it makes is counted (the report's ``requests``)."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.requests = 0

    def get(self, key: str) -> bytes:
        """``inner.get``, counted."""
        self.requests += 1
        return self.inner.get(key)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """``inner.get_range``, counted."""
        self.requests += 1
        return self.inner.get_range(key, start, end)

    def put_if_absent(self, key: str, data: bytes, *, durable: bool = True) -> bool:
        """``inner.put_if_absent``, counted."""
        self.requests += 1
        return self.inner.put_if_absent(key, data, durable=durable)

    def replace(self, key: str, data: bytes) -> None:
        """``inner.replace``, counted."""
        self.requests += 1
        self.inner.replace(key, data)

    def list(self, prefix: str) -> list[ObjectInfo]:
        """``inner.list``, counted once (a page per 1,000 objects on object stores)."""
        self.requests += 1
        return self.inner.list(prefix)

    def list_after(self, prefix: str, start_after: str) -> Sequence[ObjectInfo]:
        """``inner.list_after``, counted once."""
        self.requests += 1
        return self.inner.list_after(prefix, start_after)

    def delete(self, key: str) -> None:
        """``inner.delete``, counted."""
        self.requests += 1
        self.inner.delete(key)

    def delete_many(self, keys: Sequence[str]) -> None:
        """``inner.delete_many``, counted once (object stores batch it)."""
        self.requests += 1
        self.inner.delete_many(keys)

    def exists(self, key: str) -> bool:
        """``inner.exists``, counted."""
        self.requests += 1
        return self.inner.exists(key)

    def delete_prefix(self, prefix: str) -> int:
        """A listing and a delete per object, counted as :meth:`list` and :meth:`delete` are."""
        infos = self.list(prefix)
        for info in infos:
            self.delete(info.key)
        return len(infos)


@dataclass
class CollectionContext:
    """What a pass hands each collector: the store, the time, the budget and the pass's number.

    ``now_ms`` is the pass's wall clock (every age is measured against it, so tests can pass a time
    far in the future); ``deadline`` is a :func:`time.monotonic` reading after which a collector stops
    between steps (None: no budget); ``epoch`` is the number of the ``collector`` lease epoch the pass
    took (None for a pass run regardless of the schedule, ``plog maintain``), by which collectors that
    need not run every pass pick their passes.
    """

    store: CountingView
    now_ms: int
    deadline: float | None = None
    epoch: int | None = None
    #: The store as the caller opened it (backend extras such as a local store's temporary-file cleanup).
    raw_store: Store | None = None

    def spent(self) -> bool:
        """Whether the budget is spent: a collector checks it between steps and returns when it is."""
        return self.deadline is not None and time.monotonic() >= self.deadline

    @property
    def requests(self) -> int:
        """Requests made through :attr:`store` so far."""
        return self.store.requests


class NamespaceCollector(ABC):
    """Collects one namespace under a root by its rule in PROTOCOL.md.

    ``namespace`` names it in reports (``groups``, ``leases``, ``topics``, ...). ``every`` says how
    often a scheduled pass runs it: on passes whose lease epoch is a multiple of it (1: every pass); a
    pass run regardless of the schedule runs every collector.
    """

    namespace: str = ""
    every: int = 1

    @abstractmethod
    def collect(self, context: CollectionContext) -> int:
        """Delete what the rule allows, stopping between steps once ``context.spent()``; return how many
        objects were deleted. Must be safe to run concurrently with itself and with every writer."""


@dataclass
class CollectionReport:
    """What one pass did: objects deleted and requests made, per namespace; whether it finished."""

    deleted: dict[str, int] = field(default_factory=dict)
    requests: dict[str, int] = field(default_factory=dict)
    #: ``"done"`` (every collector ran), ``"budget"`` (stopped once the budget was spent) or ``"not-due"``.
    outcome: str = "done"
    seconds: float = 0.0
    #: Collectors that failed, with the error (a failure of one does not stop the others).
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def total_deleted(self) -> int:
        """Objects deleted by every collector together."""
        return sum(self.deleted.values())
