"""Whole segment objects read along with their index, kept until the read of their batches takes them.

A reader that needs an object's index usually reads its batches next. When
the object is small, the index read fetches the whole object (one request,
:func:`~segment_format.segment.read_segment`) and leaves the bytes here, so
that the batch read that follows finds them instead of asking storage again
(PROTOCOL.md 9). The bytes are unverified: every batch is checked against its
CRC32C when it is decoded, exactly as if it had just been read.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

#: Default bound of the bytes kept, over all objects.
DEFAULT_CAPACITY_BYTES = 32 * 1024 * 1024


class ObjectBytesCache:
    """A thread-safe, byte-bounded LRU of whole objects, each handed out once (:meth:`take`).

    The bound keeps memory small: bytes nobody takes (the index was wanted
    for something else) are evicted oldest first, and an object larger than
    the bound is never kept. Losing bytes only costs a request: the reader
    then reads the range it needs from storage.
    """

    def __init__(self, capacity_bytes: int = DEFAULT_CAPACITY_BYTES) -> None:
        self.capacity_bytes = capacity_bytes
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, key: str, data: bytes) -> None:
        """Keep ``data``, the whole object ``key``, evicting the oldest objects over the bound."""
        if len(data) > self.capacity_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= len(old)
            self._items[key] = data
            self._bytes += len(data)
            while self._bytes > self.capacity_bytes:
                _key, evicted = self._items.popitem(last=False)
                self._bytes -= len(evicted)

    def peek(self, key: str) -> bytes | None:
        """``key``'s bytes if kept, left in place for the read that takes them."""
        with self._lock:
            return self._items.get(key)

    def take(self, key: str) -> bytes | None:
        """The object's bytes if kept, removing them (the reader that takes them keeps them while it needs them)."""
        with self._lock:
            data = self._items.pop(key, None)
            if data is not None:
                self._bytes -= len(data)
            return data

    def forget(self, key: str) -> None:
        """Drop a key (after its object was deleted)."""
        self.take(key)

    @property
    def nbytes(self) -> int:
        """Bytes kept now (never more than ``capacity_bytes``)."""
        with self._lock:
            return self._bytes

    def __contains__(self, key: object) -> bool:
        """Whether ``key``'s bytes are kept."""
        with self._lock:
            return key in self._items
