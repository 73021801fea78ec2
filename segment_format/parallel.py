"""Process-wide thread pools for work that releases the GIL: compressing and decompressing batches,
and independent storage requests.

Arrow's IPC writer and reader release the GIL while they compress, decompress and
copy, so the batches of one append (``encoding.py``) or of one read
(``segment.decode_range``) are handled on a few threads at once. The pool is
created on first use, and again in a forked child, which cannot use its parent's
threads.

Independent storage requests (the reads of many topics' metadata, listings and notices
a reader starting on a wide root makes) wait on the network, not the CPU: they go to a
second, larger pool (:func:`io_map`), so that they neither queue behind codec work nor
hold the codec pool's few threads while they wait.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

__all__ = ["IO_THREADS", "POOL_THREADS", "io_map", "ordered_imap", "ordered_map", "submit"]

#: Threads of the pool: enough for the cores of a small machine, few enough to stay out of Spark's way.
POOL_THREADS = min(4, os.cpu_count() or 1)

#: Threads of the request pool: requests in flight at once for one process's independent reads
#: (an object store answers in tens of milliseconds; these threads mostly wait).
IO_THREADS = 16

_T = TypeVar("_T")
_R = TypeVar("_R")


class _ProcessPool:
    """A thread pool made on first use, and again in a forked child, which cannot use its parent's threads."""

    def __init__(self, threads: int, prefix: str) -> None:
        self.threads, self.prefix = threads, prefix
        self._lock = threading.Lock()
        self._owner: tuple[int, ThreadPoolExecutor] | None = None

    def get(self) -> ThreadPoolExecutor:
        """This process's pool."""
        owner = self._owner
        if owner is None or owner[0] != os.getpid():
            with self._lock:
                owner = self._owner
                if owner is None or owner[0] != os.getpid():
                    owner = self._owner = (
                        os.getpid(),
                        ThreadPoolExecutor(self.threads, thread_name_prefix=self.prefix),
                    )
        return owner[1]


_CODEC = _ProcessPool(POOL_THREADS, "plog-codec")
_IO = _ProcessPool(IO_THREADS, "plog-io")


def ordered_map(fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
    """``[fn(x) for x in items]``, on the pool when there are several items; results in order, and the
    first failure in order is raised, as a plain loop would (later items may have run meanwhile, so
    ``fn`` must have no effect beyond its result)."""
    return list(ordered_imap(fn, items))


def ordered_imap(fn: Callable[[_T], _R], items: Sequence[_T]) -> Iterator[_R]:
    """:func:`ordered_map` as an iterator: every item starts on the pool at once, and each result is
    yielded as soon as it and those before it are done, so that the caller can write the first results
    while the pool still works on the later ones. The first failure in order is raised when reached;
    items not yet started when the caller stops iterating are cancelled."""
    if len(items) < 2 or POOL_THREADS < 2:
        return (fn(x) for x in items)
    return _CODEC.get().map(fn, items)


def submit(fn: Callable[[_T], _R], item: _T) -> Future[_R]:
    """``fn(item)`` started on the pool; its future (for work whose result is wanted later, if at all)."""
    return _CODEC.get().submit(fn, item)


def io_map(fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
    """:func:`ordered_map` for storage requests: ``[fn(x) for x in items]`` on the request pool, up to
    :data:`IO_THREADS` at once; results in order, the first failure in order raised. ``fn`` must be
    safe to run in parallel and have no effect the caller relies on beyond its result. Called from a
    thread of the request pool itself it runs in that thread, in order: a nested call could otherwise
    wait on threads that all wait on it."""
    if len(items) < 2 or threading.current_thread().name.startswith("plog-io"):
        return [fn(x) for x in items]
    return list(_IO.get().map(fn, items))
