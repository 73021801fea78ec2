"""The index cache: parsed segment indexes kept in memory, shared by every partition log of a root.

Segment objects never change once created, so an index read once stays right
for as long as its key exists; the cache only has to bound its size and
forget keys whose objects were deleted (so that a key re-created later, which
the protocol never does but a test or an operator might, is read again).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from ..errors import CorruptRecordError
from ..segment import SegmentIndex, parse_index, read_segment
from ..stores.base import Store
from .object_bytes import ObjectBytesCache
from .shared_spans import SharedSpans


class IndexCache:
    """A thread-safe LRU of parsed segment indexes, keyed by object key.

    One cache is shared by all logs of a :class:`~segment_format.root.LogRoot`,
    and so by a producer's sender thread and its caller's thread, a consumer's
    fetcher and its caller, Spark's task threads. A lock guards the ordered
    dict, because its read-then-move and insert-then-evict steps are not
    atomic together: without it a ``forget`` between a hit's lookup and its
    ``move_to_end`` raises ``KeyError``, and racing evictions can overshoot or
    empty the cache. The lock is never held while an index is read from
    storage: two threads missing the same key may both read it (the results
    are equal, since objects never change), which is cheaper than serialising
    every reader behind one slow request.
    """

    def __init__(self, capacity: int = 4096, objects: ObjectBytesCache | None = None) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, SegmentIndex] = OrderedDict()
        self._lock = threading.Lock()
        #: Whole objects read with their index (``whole``), until a reader takes them for their batches.
        self.objects = objects if objects is not None else ObjectBytesCache()
        #: Spans of shared objects read once for the several partitions of a topic this process reads.
        self.spans = SharedSpans()
        #: When the current round of a reader over its partitions began (a consumer's fetch), monotonic: a
        #: probe of a shared topic's head made since then serves each partition that follows after it
        #: (PROTOCOL.md 9.1). Infinity, never, for readers without rounds.
        self.round_started = float("inf")

    def get(self, store: Store, key: str, size: int | None, whole: int = 0) -> SegmentIndex:
        """The index of ``key``, read once and then served from memory.

        ``whole`` > 0 says the caller is about to read the object's batches:
        on a miss an object of at most ``whole`` bytes is then read whole in
        the same request as its index (:func:`~segment_format.segment.read_segment`),
        and its bytes are left in :attr:`objects` for that read to take.
        """
        with self._lock:
            item = self._items.get(key)
            if item is not None:
                self._items.move_to_end(key)
                return item
        item = self._offered_index(store, key, size)
        data = None
        if item is None:
            item, data = read_segment(store, key, size, whole)
        if data is not None:
            self.objects.put(key, data)
        with self._lock:
            self._items[key] = item
            self._items.move_to_end(key)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
        return item

    def _offered_index(self, store: Store, key: str, size: int | None) -> SegmentIndex | None:
        """The index of an object whose bytes were offered, parsed and checked as if read; None if there are
        none, or if they are not the object (another size, a damaged index: dropped, so that the object is
        read from storage, which decides)."""
        offered = self.objects.peek(key)
        if offered is None:
            return None
        if size is None or size == len(offered):
            try:
                return parse_index(key, len(offered), offered, 0, store)
            except CorruptRecordError:
                pass
        self.objects.take(key)
        return None

    def offer(self, key: str, data: bytes) -> None:
        """Keep ``data``, the whole object ``key`` as the writer that created it wrote it, for the next
        :meth:`get` of ``key`` (its index, without a request) and the read that takes its bytes.

        A writer hands over the objects it just created so that maintenance merges them without reading
        them back (PROTOCOL.md 10.1). Objects never change and a key names one object for its life; the
        bytes are checked exactly as bytes read (index, then every batch's CRC when decoded or merged).
        """
        self.objects.put(key, data)

    def forget(self, key: str) -> None:
        """Drop a key (after its object was deleted)."""
        with self._lock:
            self._items.pop(key, None)
        self.objects.forget(key)

    def __len__(self) -> int:
        """How many indexes are cached (never more than ``capacity``)."""
        with self._lock:
            return len(self._items)

    def __contains__(self, key: object) -> bool:
        """Whether ``key``'s index is cached (a look, not a use: the LRU order is unchanged)."""
        with self._lock:
            return key in self._items
