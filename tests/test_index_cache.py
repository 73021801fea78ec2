"""The index cache under concurrency: one cache hammered by several real threads stays consistent.

A root's :class:`IndexCache` is shared by a producer's sender thread and its
caller, a consumer's fetcher and its caller, Spark's task threads. Without
its lock, a ``forget`` landing between a hit's lookup and its move to the
front raises ``KeyError`` in the reader, and an insert's eviction can be seen
half done (more entries than the capacity).

Under the GIL such a switch lands inside the cache's few steps only now and
then (hours in production, not seconds in a test). The keys used here yield
the interpreter whenever they are hashed, that is inside every step of the
cache's ordered dict, so that the threads interleave there on every
operation, as free-threaded Python may at any point: without the lock the
hammering test fails on every run, with it it passes.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from pathlib import Path

from segment_format.log.index_cache import IndexCache
from segment_format.records import payload_batch, with_offsets
from segment_format.root import LogRoot
from segment_format.segment import BatchMeta, assemble_segment, encode_batch, ipc_options
from segment_format.stores import MemoryStore

KEYS = 4
CAPACITY = 3
THREADS = 8
OPERATIONS = 400


class YieldingKey(str):
    """An object key that lets other threads run each time it is hashed (see the module docstring)."""

    def __hash__(self) -> int:
        time.sleep(0)  # releases the GIL: another thread runs now, mid-operation
        return str.__hash__(self)


def store_with_segments() -> tuple[MemoryStore, dict[str, int]]:
    """A store holding ``KEYS`` small segment objects; returns it and each key's base offset."""
    store = MemoryStore(f"index-cache-{uuid.uuid4().hex}")
    options = ipc_options("none")
    bases: dict[str, int] = {}
    for n in range(KEYS):
        base = 100 * n
        batch = with_offsets(payload_batch([n], [None], [b"v%d" % n], [None]), base)
        fields = {"next_offset": base + 1, "running_max_timestamp": n, "compression": "none", "created_ms": 0}
        data, _ = assemble_segment([encode_batch(batch, BatchMeta(), options)], {**fields, "writer": "test"})
        key = YieldingKey(f"p/log/{base:020d}.arrow")
        store.put_if_absent(key, data)
        bases[key] = base
    return store, bases


def test_threads_hammering_get_and_forget_see_the_right_index_and_a_bounded_cache() -> None:
    store, bases = store_with_segments()
    keys = sorted(bases)
    cache = IndexCache(capacity=CAPACITY)
    errors: list[BaseException] = []
    wrong: list[str] = []
    oversize: list[int] = []
    start = threading.Barrier(THREADS)

    def hammer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            start.wait()
            for _ in range(OPERATIONS):
                key = rng.choice(keys)
                if rng.random() < 0.3:
                    cache.forget(key)
                    continue
                idx = cache.get(store, key, None)
                if idx.key != key or idx.meta.base_offset != bases[key]:
                    wrong.append(key)
                size = len(cache)
                if size > CAPACITY:
                    oversize.append(size)
        except BaseException as exc:  # noqa: BLE001 - any exception in a thread fails the test
            errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(seed,)) for seed in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert wrong == []
    assert oversize == []
    assert len(cache) <= CAPACITY
    # What stays cached is still each key's own index.
    for key in keys:
        if key in cache:
            assert cache.get(store, key, None).meta.base_offset == bases[key]


def test_lru_evicts_the_least_recently_used_and_forget_forces_a_new_read() -> None:
    store, bases = store_with_segments()
    keys = sorted(bases)
    cache = IndexCache(capacity=2)
    first = cache.get(store, keys[0], None)
    cache.get(store, keys[1], None)
    assert cache.get(store, keys[0], None) is first  # a hit, and keys[0] is now the most recent
    cache.get(store, keys[2], None)  # evicts keys[1], the least recently used
    assert keys[0] in cache and keys[2] in cache and keys[1] not in cache
    cache.forget(keys[0])
    assert keys[0] not in cache
    again = cache.get(store, keys[0], None)
    assert again is not first and again.meta.base_offset == bases[keys[0]]


def test_every_log_of_a_root_shares_the_roots_cache(tmp_path: Path) -> None:
    """One cache per root, so its bounds (indexes, bytes kept) hold per root; an empty cache is still the one
    to share (it has a length, so it is falsy: ``cache or IndexCache()`` gave each log a cache of its own)."""
    root = LogRoot(str(tmp_path / "root"))
    root.catalog.create("t", 3, {})
    assert len(root.index_cache) == 0
    assert all(root.partition("t", p).cache is root.index_cache for p in range(3))


def test_reading_indexes_imports_no_pandas(tmp_path: Path) -> None:
    """Every Spark query's source runner and every fresh Python worker reads indexes first; pyarrow's
    ``to_numpy`` would import pandas there (about 150 ms of CPU), which nothing of an index needs."""
    import subprocess
    import sys

    url = str(tmp_path / "root")
    root = LogRoot(url)
    root.catalog.create("t", 1, {})
    batch = payload_batch([1, 2], [None, None], [b"a", b"b"])
    root.partition("t", 0).append([(batch, BatchMeta())], durable=False)
    script = (
        "import sys\n"
        "from segment_format.root import LogRoot\n"
        f"view = LogRoot({url!r}).partition('t', 0).view()\n"
        "assert view.end_offset == 2, view\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
