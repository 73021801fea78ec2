"""The storage interface: the only thing plog asks of a filesystem.

plog runs on a plain directory and on object stores (S3, GCS, Azure) where an
object, once written, can never be appended to or changed in place. So the
protocol (PROTOCOL.md 2) assumes only these operations, and the
only *atomic* one among them is :meth:`Store.put_if_absent`. One kind of object,
the change notice (PROTOCOL.md 9.1), is overwritten with :meth:`Store.replace`.

Keys are ``/``-separated paths relative to the store's root, never starting
with ``/`` and never containing ``.`` or ``..`` segments. Callers build them
from validated topic names, so a key can never escape the root.

Every backend implements this class, and ``tests/test_storage_conformance.py``
runs one suite against all of them.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

#: A part of an object being created: bytes, or any object with the buffer protocol (an Arrow buffer);
#: Python 3.11 has no type for the buffer protocol (``collections.abc.Buffer`` came in 3.12).
BytesLike = Any


@dataclass(frozen=True)
class ObjectInfo:
    """One entry of a listing: the key and its size in bytes."""

    key: str
    size: int


class Store(ABC):
    """A flat namespace of immutable objects addressed by key.

    Guarantees every implementation gives (the conformance suite checks each):

    * An object is created whole or not at all: no reader ever sees a prefix
      of an object, whatever happens to the writer.
    * ``put_if_absent`` is atomic: of any number of concurrent calls for one
      key, exactly one returns ``True`` and the object then holds exactly that
      caller's bytes. (A backend that retries and cannot mark its creates
      settles a refusal after a lost answer by comparing the stored bytes with
      its own, PROTOCOL.md 2: callers that send identical bytes may then both
      be told ``True``. S3 marks them and is exact.)
    * Read-after-write and list-after-write: once ``put_if_absent`` has
      returned, every later ``get``, ``exists`` and ``list`` (from any process)
      sees the object.
    * Objects are never modified; they are only created and deleted, except
      by ``replace``, which the protocol uses for change notices alone.
    """

    #: The URL this store was opened with, for messages.
    url: str
    #: Whether each request is billed (an object store), so that writers gather more into each: a producer's
    #: default flush interval is longer there than on a local disk, where a request costs a millisecond.
    billed_per_request: bool = False

    @abstractmethod
    def get(self, key: str) -> bytes:
        """Return the whole object.

        Raises :class:`~segment_format.errors.ObjectNotFoundError` if it does not exist.
        """

    @abstractmethod
    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Return bytes ``[start, end)`` of the object, ``0 <= start <= end``.

        ``end`` past the object's size is clipped, so the result may be shorter
        than asked. Raises ``ObjectNotFoundError`` if the object does not exist.
        """

    def get_range_buffer(self, key: str, start: int, end: int) -> pa.Buffer:
        """:meth:`get_range`'s bytes as an Arrow buffer, with the same guarantees; callers must not write to it.

        For the large reads whose bytes Arrow decodes (a consumer's batches, a whole object read with its
        index). A backend may read straight into Arrow's memory pool, which keeps and reuses large blocks:
        every ``bytes`` of several MiB is a fresh allocation from the C heap, whose pages the kernel
        zeroes and maps one fault at a time, and on local disk that costs about four times the read itself.
        This default wraps :meth:`get_range` (no copy), so a subclass that overrides ``get_range`` alone
        (to count, refuse or damage reads) is asked for these reads too.
        """
        return pa.py_buffer(self.get_range(key, start, end))

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes, *, durable: bool = True) -> bool:
        """Create the object with ``data`` if no object with that key exists.

        Returns ``True`` if this call created it, ``False`` if the key was
        taken (by anyone, at any earlier moment); in that case nothing is
        changed. ``durable=True`` means the object survives a machine crash
        once this returns (fsync on local disk; object stores are always
        durable on acknowledgement); ``durable=False`` lets a local backend
        skip the fsync, and never weakens atomicity.
        """

    def put_if_absent_parts(self, key: str, parts: Iterable[BytesLike], *, durable: bool = True) -> bool:
        """:meth:`put_if_absent` of the parts joined, with the same guarantees.

        ``parts`` may be produced while they are written (an append's batches are compressed while the
        first ones are written): a backend that can write a part before the next exists does so; this
        default joins them first. An exception raised by ``parts`` propagates unchanged, and nothing is
        created. The object appears whole or not at all, as with :meth:`put_if_absent`.
        """
        return self.put_if_absent(key, b"".join(parts), durable=durable)

    @abstractmethod
    def replace(self, key: str, data: bytes) -> None:
        """Make the object at ``key`` hold ``data``, creating it or overwriting it (last writer wins).

        A reader sees the old bytes whole or the new bytes whole, never a mix;
        once this returns, every later ``get`` from any process sees these
        bytes or those of a later ``replace``. Not durable against a machine
        crash on local disk (no fsync): the protocol overwrites only hints.
        """

    @abstractmethod
    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix``, sorted by key.

        ``prefix`` is ``""`` or ends with ``/``; the listing is recursive.
        Objects being written but not yet created (temporary files) are never
        listed. An absent prefix gives an empty list.
        """

    def list_after(self, prefix: str, start_after: str) -> Sequence[ObjectInfo]:
        """``list(prefix)`` restricted to keys that sort after ``start_after``.

        Object stores skip the keys before ``start_after`` on the server (S3's
        ``StartAfter``), so a listing can pass over a large part of a prefix
        without paying for its pages; this default filters a full listing.
        """
        return [info for info in self.list(prefix) if info.key > start_after]

    @abstractmethod
    def delete(self, key: str) -> None:
        """Delete the object. Deleting an absent key is not an error."""

    def delete_many(self, keys: Sequence[str]) -> None:
        """Delete every key in ``keys`` (absent ones are not an error); object stores use one batch request."""
        for key in keys:
            self.delete(key)

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether an object with this key exists now."""

    def size(self, key: str) -> int:
        """The object's size in bytes; ``ObjectNotFoundError`` if absent."""
        return len(self.get(key))

    def get_suffix(self, key: str, length: int) -> tuple[bytes, int]:
        """The last ``length`` bytes of the object (all of it if it is shorter), and its size.

        For reading an object whose size is not known yet (a segment's tail).
        This default asks for the size, then the range: two requests. An
        object store that can answer a suffix range with the object's size
        (S3: ``Range: bytes=-N``, whose ``Content-Range`` gives the size)
        overrides it with one request, so that a probe costs one request
        whether or not the object exists. Raises ``ObjectNotFoundError`` if
        the object does not exist.
        """
        if length < 0:
            raise ValueError(f"suffix length {length} is negative")
        size = self.size(key)
        start = max(0, size - length)
        return self.get_range(key, start, size), size

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under ``prefix``; returns how many were deleted."""
        infos = self.list(prefix)
        for info in infos:
            self.delete(info.key)
        return len(infos)

    def close(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing
        """Release connections or handles; the store must not be used afterwards."""

    def deadline(self, at_monotonic: float) -> AbstractContextManager[None]:
        """Inside the block, operations this thread starts make no try after ``at_monotonic``.

        ``at_monotonic`` is a :func:`time.monotonic` reading. For requests that are only valid until
        then: an append's create is issued on knowledge of the log end at most W old (PROTOCOL.md 8,
        2, assumption A4), so a retry past that must not be sent. A create (:meth:`put_if_absent`) makes no try at
        all once ``at_monotonic`` has passed, the first included, and fails with ``StorageError``
        (nothing was sent); other operations still run their first try. The operation's own deadline
        (if sooner) still holds; past either it fails as usual. A backend that does not retry has
        nothing to bound.
        """
        return contextlib.nullcontext()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


class ForwardingStore(Store):
    """A store that forwards every operation to ``inner``: the base of views that add a check to some.

    Each method gives exactly the guarantee of ``inner``'s; a subclass
    overrides only the operations it guards (a writer-version check before
    creates and deletes, a test that refuses writes).
    """

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.url = inner.url
        self.billed_per_request = inner.billed_per_request

    def get(self, key: str) -> bytes:
        """``inner.get``."""
        return self.inner.get(key)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """``inner.get_range``."""
        return self.inner.get_range(key, start, end)

    def get_range_buffer(self, key: str, start: int, end: int) -> pa.Buffer:
        """``inner.get_range_buffer``, unless a subclass overrides :meth:`get_range`: then through it, so
        that a view counting or guarding range reads sees these too."""
        if type(self).get_range is not ForwardingStore.get_range:
            return super().get_range_buffer(key, start, end)
        return self.inner.get_range_buffer(key, start, end)

    def put_if_absent(self, key: str, data: bytes, *, durable: bool = True) -> bool:
        """``inner.put_if_absent``."""
        return self.inner.put_if_absent(key, data, durable=durable)

    def put_if_absent_parts(self, key: str, parts: Iterable[BytesLike], *, durable: bool = True) -> bool:
        """``inner.put_if_absent_parts``, unless a subclass guards :meth:`put_if_absent`: then the parts
        are joined and go through that guard (a view that checks creates checks these too)."""
        if type(self).put_if_absent is not ForwardingStore.put_if_absent:
            return super().put_if_absent_parts(key, parts, durable=durable)
        return self.inner.put_if_absent_parts(key, parts, durable=durable)

    def replace(self, key: str, data: bytes) -> None:
        """``inner.replace``."""
        self.inner.replace(key, data)

    def list(self, prefix: str) -> list[ObjectInfo]:
        """``inner.list``."""
        return self.inner.list(prefix)

    def list_after(self, prefix: str, start_after: str) -> Sequence[ObjectInfo]:
        """``inner.list_after``."""
        return self.inner.list_after(prefix, start_after)

    def delete(self, key: str) -> None:
        """``inner.delete``."""
        self.inner.delete(key)

    def delete_many(self, keys: Sequence[str]) -> None:
        """``inner.delete_many``."""
        self.inner.delete_many(keys)

    def exists(self, key: str) -> bool:
        """``inner.exists``."""
        return self.inner.exists(key)

    def size(self, key: str) -> int:
        """``inner.size``."""
        return self.inner.size(key)

    def get_suffix(self, key: str, length: int) -> tuple[bytes, int]:
        """``inner.get_suffix``."""
        return self.inner.get_suffix(key, length)

    def delete_prefix(self, prefix: str) -> int:
        """``inner.delete_prefix``."""
        return self.inner.delete_prefix(prefix)

    def deadline(self, at_monotonic: float) -> AbstractContextManager[None]:
        """``inner.deadline``."""
        return self.inner.deadline(at_monotonic)
