"""The in-memory backend: process-wide dictionaries under one lock (tests and notebooks)."""

from __future__ import annotations

import threading

from segment_format.errors import InvalidConfigError, ObjectNotFoundError
from segment_format.stores.base import ObjectInfo, Store
from segment_format.stores.keys import check_key, check_prefix, check_range

_MEMORY_LOCK = threading.Lock()
_MEMORY_STORES: dict[str, dict[str, bytes]] = {}


class MemoryStore(Store):
    """A process-wide in-memory store: every ``MemoryStore`` with the same name shares its objects.

    Useful for tests and notebooks; nothing survives the process, and other
    processes do not see it.
    """

    def __init__(self, name: str) -> None:
        """Open (creating if new) the in-memory namespace called ``name``."""
        if not name:
            raise InvalidConfigError("memory store needs a name: memory://<name>")
        self.name = name
        self.url = f"memory://{name}"
        with _MEMORY_LOCK:
            self._objects = _MEMORY_STORES.setdefault(name, {})

    def get(self, key: str) -> bytes:
        """Return the whole object; ``ObjectNotFoundError`` if absent."""
        check_key(key)
        with _MEMORY_LOCK:
            try:
                return self._objects[key]
            except KeyError:
                raise ObjectNotFoundError(key) from None

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Return bytes ``[start, end)``, clipped to the object's size."""
        check_range(key, start, end)
        return self.get(key)[start:end]

    def put_if_absent(self, key: str, data: bytes, *, durable: bool = True) -> bool:
        """Create the object unless the key exists (``durable`` is meaningless here)."""
        check_key(key)
        payload = bytes(data)
        with _MEMORY_LOCK:
            if key in self._objects:
                return False
            self._objects[key] = payload
            return True

    def replace(self, key: str, data: bytes) -> None:
        """Make the object hold ``data``, created or overwritten."""
        check_key(key)
        payload = bytes(data)
        with _MEMORY_LOCK:
            self._objects[key] = payload

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object under ``prefix``, sorted by key."""
        check_prefix(prefix)
        with _MEMORY_LOCK:
            items = [(k, len(v)) for k, v in self._objects.items() if k.startswith(prefix)]
        return [ObjectInfo(k, n) for k, n in sorted(items)]

    def delete(self, key: str) -> None:
        """Delete the object; an absent key is not an error."""
        check_key(key)
        with _MEMORY_LOCK:
            self._objects.pop(key, None)

    def exists(self, key: str) -> bool:
        """Whether the object exists now."""
        check_key(key)
        with _MEMORY_LOCK:
            return key in self._objects

    def size(self, key: str) -> int:
        """The object's size; ``ObjectNotFoundError`` if absent."""
        return len(self.get(key))

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under ``prefix`` in one locked step; returns how many."""
        check_prefix(prefix)
        with _MEMORY_LOCK:
            doomed = [k for k in self._objects if k.startswith(prefix)]
            for k in doomed:
                del self._objects[k]
        return len(doomed)
