"""A process-wide thread pool for work that releases the GIL: compressing and decompressing batches.

Arrow's IPC writer and reader release the GIL while they compress, decompress and
copy, so the batches of one append (``encoding.py``) or of one read
(``segment.decode_range``) are handled on a few threads at once. The pool is
created on first use, and again in a forked child, which cannot use its parent's
threads.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

__all__ = ["POOL_THREADS", "ordered_imap", "ordered_map", "submit"]

#: Threads of the pool: enough for the cores of a small machine, few enough to stay out of Spark's way.
POOL_THREADS = min(4, os.cpu_count() or 1)

_T = TypeVar("_T")
_R = TypeVar("_R")
_lock = threading.Lock()
_owner: tuple[int, ThreadPoolExecutor] | None = None


def _pool() -> ThreadPoolExecutor:
    global _owner
    owner = _owner
    if owner is None or owner[0] != os.getpid():  # a forked child cannot use its parent's threads
        with _lock:
            owner = _owner
            if owner is None or owner[0] != os.getpid():
                owner = _owner = (os.getpid(), ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="plog-codec"))
    return owner[1]


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
    return _pool().map(fn, items)


def submit(fn: Callable[[_T], _R], item: _T) -> Future[_R]:
    """``fn(item)`` started on the pool; its future (for work whose result is wanted later, if at all)."""
    return _pool().submit(fn, item)
