"""A store view that counts requests, so tests can price a call (issue 11: every request is billed)."""

from __future__ import annotations

import threading
from collections import Counter

from segment_format.stores.base import ForwardingStore, ObjectInfo, Store


class CountingStore(ForwardingStore):
    """Forwards every operation to ``inner`` and counts it by (operation, first key segment).

    ``get`` and ``get_range`` count as ``get``, ``put_if_absent`` as ``put``; ``replace``,
    ``list``, ``exists`` and ``delete`` under their own names.
    """

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.calls: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    @property
    def counts(self) -> dict[str, int]:
        """Requests by operation, whatever the key."""
        out: Counter[str] = Counter()
        with self._lock:
            for (op, _top), n in self.calls.items():
                out[op] += n
        return dict(out)

    def total(self) -> int:
        """Requests so far."""
        with self._lock:
            return sum(self.calls.values())

    def _count(self, op: str, key: str) -> None:
        with self._lock:
            self.calls[(op, key.split("/", 1)[0])] += 1

    def get(self, key: str) -> bytes:  # noqa: D102
        self._count("get", key)
        return self.inner.get(key)

    def get_range(self, key: str, start: int, end: int) -> bytes:  # noqa: D102
        self._count("get", key)
        return self.inner.get_range(key, start, end)

    def list(self, prefix: str) -> list[ObjectInfo]:  # noqa: D102
        self._count("list", prefix)
        return self.inner.list(prefix)

    def exists(self, key: str) -> bool:  # noqa: D102
        self._count("exists", key)
        return self.inner.exists(key)

    def put_if_absent(self, key: str, data: bytes, *, durable: bool = True) -> bool:  # noqa: D102
        self._count("put", key)
        return self.inner.put_if_absent(key, data, durable=durable)

    def replace(self, key: str, data: bytes) -> None:  # noqa: D102
        self._count("replace", key)
        self.inner.replace(key, data)

    def delete(self, key: str) -> None:  # noqa: D102
        self._count("delete", key)
        self.inner.delete(key)
