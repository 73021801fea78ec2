"""Counting a store's requests by kind, and what they would cost on an object store.

:class:`CountingStore` forwards every operation to the store it wraps and counts it as the request
kind an object store bills it as (GET, PUT, LIST, HEAD, DELETE). It counts *operations*: a retry that
``FsspecStore`` makes after a transient failure is counted apart, in ``retries`` (read from the wrapped
store), since the kind of the retried request is the operation's. An operation that fails with anything
but an answer (a missing object is an answer, not an error) counts in ``errors``.

The prices in :data:`REQUEST_PRICES_USD` are the only place plog keeps them: they are S3 Standard's list
prices for request classes (PUT, COPY, POST, LIST: $0.005 per 1,000; GET and the others: $0.0004 per
1,000; DELETE: free). ``estimated_cost_usd`` is requests times price, nothing for storage or transfer.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import pyarrow as pa

from segment_format.errors import ObjectNotFoundError
from segment_format.stores.base import BytesLike, ForwardingStore, ObjectInfo, Store

__all__ = ["REQUEST_KINDS", "REQUEST_PRICES_USD", "CountingStore", "estimated_cost_usd"]

#: The request kinds counted, in the order reports show them.
REQUEST_KINDS = ("GET", "PUT", "LIST", "HEAD", "DELETE")

#: USD per request, by kind: S3 Standard's request prices (per 1,000: PUT/LIST $0.005, GET/HEAD $0.0004).
REQUEST_PRICES_USD: dict[str, float] = {
    "GET": 0.0004 / 1000,
    "PUT": 0.005 / 1000,
    "LIST": 0.005 / 1000,
    "HEAD": 0.0004 / 1000,
    "DELETE": 0.0,
}


def estimated_cost_usd(counts: dict[str, int]) -> float:
    """What ``counts`` (requests by kind) cost at :data:`REQUEST_PRICES_USD`."""
    return sum(REQUEST_PRICES_USD.get(kind, 0.0) * n for kind, n in counts.items())


class CountingStore(ForwardingStore):
    """``inner`` with its operations counted by request kind (see the module docstring); thread-safe."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(REQUEST_KINDS, 0)
        self._errors = 0

    # ------------------------------------------------------------------ the counts

    def counts(self) -> dict[str, int]:
        """Requests made so far, by kind (a copy)."""
        with self._lock:
            return dict(self._counts)

    @property
    def requests(self) -> int:
        """Requests made so far, every kind."""
        with self._lock:
            return sum(self._counts.values())

    @property
    def errors(self) -> int:
        """Operations that failed (not counting answers such as a missing object)."""
        return self._errors

    @property
    def retries(self) -> int:
        """Tries repeated after transient failures, as the wrapped store counts them (0 if it does not retry)."""
        return int(getattr(self.inner, "retries", 0))

    def _count(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self._counts[kind] += n

    def _failed(self, exc: BaseException) -> None:
        if not isinstance(exc, (ObjectNotFoundError, FileNotFoundError)):
            with self._lock:
                self._errors += 1

    def __getattr__(self, name: str) -> Any:
        # Backend extras (``cleanup_temp_files`` of a local store, ...) are the wrapped store's.
        if name == "inner":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    # ------------------------------------------------------------------ the operations, counted

    def get(self, key: str) -> bytes:
        """``inner.get``: one GET."""
        self._count("GET")
        try:
            return self.inner.get(key)
        except Exception as exc:
            self._failed(exc)
            raise

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """``inner.get_range``: one GET."""
        self._count("GET")
        try:
            return self.inner.get_range(key, start, end)
        except Exception as exc:
            self._failed(exc)
            raise

    def get_range_buffer(self, key: str, start: int, end: int) -> pa.Buffer:
        """``inner.get_range_buffer``: one GET."""
        self._count("GET")
        try:
            return self.inner.get_range_buffer(key, start, end)
        except Exception as exc:
            self._failed(exc)
            raise

    def get_suffix(self, key: str, length: int) -> tuple[bytes, int]:
        """``inner.get_suffix``: one GET (a suffix range answers with the size)."""
        self._count("GET")
        try:
            return self.inner.get_suffix(key, length)
        except Exception as exc:
            self._failed(exc)
            raise

    def put_if_absent(self, key: str, data: bytes, *, durable: bool = True) -> bool:
        """``inner.put_if_absent``: one PUT."""
        self._count("PUT")
        try:
            return self.inner.put_if_absent(key, data, durable=durable)
        except Exception as exc:
            self._failed(exc)
            raise

    def put_if_absent_parts(self, key: str, parts: Iterable[BytesLike], *, durable: bool = True) -> bool:
        """``inner.put_if_absent_parts``: one PUT."""
        self._count("PUT")
        try:
            return self.inner.put_if_absent_parts(key, parts, durable=durable)
        except Exception as exc:
            self._failed(exc)
            raise

    def replace(self, key: str, data: bytes) -> None:
        """``inner.replace``: one PUT."""
        self._count("PUT")
        try:
            self.inner.replace(key, data)
        except Exception as exc:
            self._failed(exc)
            raise

    def list(self, prefix: str) -> list[ObjectInfo]:
        """``inner.list``: one LIST (S3 pages by 1,000 keys; a longer listing costs more than counted)."""
        self._count("LIST")
        try:
            return self.inner.list(prefix)
        except Exception as exc:
            self._failed(exc)
            raise

    def list_after(self, prefix: str, start_after: str) -> Sequence[ObjectInfo]:
        """``inner.list_after``: one LIST."""
        self._count("LIST")
        try:
            return self.inner.list_after(prefix, start_after)
        except Exception as exc:
            self._failed(exc)
            raise

    def delete(self, key: str) -> None:
        """``inner.delete``: one DELETE."""
        self._count("DELETE")
        try:
            self.inner.delete(key)
        except Exception as exc:
            self._failed(exc)
            raise

    def delete_many(self, keys: Sequence[str]) -> None:
        """``inner.delete_many``: one DELETE per key (S3 sends up to 1,000 in one request; deletes are free)."""
        self._count("DELETE", len(keys))
        try:
            self.inner.delete_many(keys)
        except Exception as exc:
            self._failed(exc)
            raise

    def exists(self, key: str) -> bool:
        """``inner.exists``: one HEAD."""
        self._count("HEAD")
        try:
            return self.inner.exists(key)
        except Exception as exc:
            self._failed(exc)
            raise

    def size(self, key: str) -> int:
        """``inner.size``: one HEAD."""
        self._count("HEAD")
        try:
            return self.inner.size(key)
        except Exception as exc:
            self._failed(exc)
            raise

    def delete_prefix(self, prefix: str) -> int:
        """A LIST, then a DELETE per object (through this store, so that both are counted)."""
        return Store.delete_prefix(self, prefix)

    def close(self) -> None:
        """``inner.close``."""
        self.inner.close()

    def deadline(self, at_monotonic: float) -> AbstractContextManager[None]:
        """``inner.deadline``."""
        return self.inner.deadline(at_monotonic)
