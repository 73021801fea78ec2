"""The root's protocol object: which readers and writers may use a root (PROTOCOL.md 12).

::

    <root>/_protocol/<n:020d>.json
        {"min_reader_version": 1, "min_writer_version": 1,
         "reader_features": [], "writer_features": [], "created_ms": 1795363000000}

Protocol objects are numbered objects (:mod:`segment_format.numbered`): created
with put-if-absent, never changed, never deleted; the highest number is the
root's protocol. A root without any (written before the object existed) means
reader version 1, writer version 1 and no features (:data:`LEGACY`).

* A reader refuses a root whose ``min_reader_version`` is above
  :data:`READER_VERSION` or which lists a reader feature missing from
  :data:`FEATURES`; a writer does the same with the writer fields, and with the
  reader fields too, since every writer also reads.
* An upgrade creates the next number holding the larger versions and the union
  of the features: a root's requirements never go down.
* Writers of this code create object 0 when they create a topic in a root that
  has none, so that every root written from now on says what it needs.

Cost: :class:`RootProtocol` reads the object once per opened root (one listing,
plus one GET when the object exists) and caches it; on object stores every
request is billed, so nothing here runs per operation. :class:`WriterCheckedStore`
is the view of a store through which a root's data is written: its creates and
deletes check the cached protocol (a comparison, no request) before they go out.

Adding a feature is one entry in :data:`FEATURES` and one row in PROTOCOL.md's
feature table; nothing else here changes.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from . import numbered
from .documents import JsonDocument
from .errors import CorruptRecordError, InvalidConfigError, ObjectNotFoundError, UnsupportedProtocolError
from .layout import PROTOCOL_PREFIX
from .records import now_ms
from .stores.base import BytesLike, ForwardingStore, Store

#: The highest ``min_reader_version`` this code can read (PROTOCOL.md 12.1).
READER_VERSION = 1
#: The highest ``min_writer_version`` this code can write.
WRITER_VERSION = 1


@dataclass(frozen=True)
class Feature:
    """One named feature of the protocol (Delta Lake's table features).

    ``reader``: readers must implement it too (a reader-writer feature, listed
    in both ``reader_features`` and ``writer_features``); otherwise only writers
    must (listed in ``writer_features`` alone). ``section`` is where
    PROTOCOL.md specifies it.
    """

    name: str
    reader: bool
    section: str
    #: Features this one relies on: enabling it enables them too, in the same protocol object.
    implies: tuple[str, ...] = ()


#: Every feature this code implements, by name (one row each in PROTOCOL.md 12.2).
FEATURES: dict[str, Feature] = {
    # Merges resolve decided transactions (their objects are compaction's: .c<id> names, offset gaps), so that
    # transaction decisions, transactional-id epochs and producer ids can be collected.
    "boundedHistory": Feature("boundedHistory", reader=True, section="11.2", implies=("compaction",)),
    # Writers replace their topic's change notice before acknowledging; readers may then wait on it.
    "changeNotices": Feature("changeNotices", reader=False, section="9.1"),
    # Topics may be compacted: offset gaps, compacted objects (.c<id> names, possibly empty), null keys refused.
    "compaction": Feature("compaction", reader=True, section="11.6"),
    # Writers replace the root change notice after the topic notices of every write; readers waiting on
    # several topics may then read that one object instead of every topic's notice.
    "rootNotice": Feature("rootNotice", reader=False, section="9.1"),
    # Topics may be typed: value schemas in topic metadata, fields stored as columns, format version 2.
    "typedTopics": Feature("typedTopics", reader=True, section="11.8"),
    # Topics may be shared: flushes write shared objects (format version 3) and commits (7.3), moved into
    # per-partition segments by maintenance; merges then resolve transactions (boundedHistory).
    "sharedObjects": Feature("sharedObjects", reader=True, section="7.3", implies=("boundedHistory",)),
}

#: How often a process that keeps a root open reads its protocol again (PROTOCOL.md 12.3, *Re-checking*):
#: one GET of the next object's key. A feature whose enabling needs every running process to know it
#: (compaction, 11.6) is used only ``2 * PROTOCOL_RECHECK_S`` (and at least D) after it was enabled.
PROTOCOL_RECHECK_S = 300.0


@dataclass(frozen=True)
class ProtocolVersion(JsonDocument):
    """One protocol object: the least a reader and a writer must implement to use the root."""

    min_reader_version: int
    min_writer_version: int
    reader_features: tuple[str, ...] = ()
    writer_features: tuple[str, ...] = ()
    created_ms: int = 0

    def requirements(self) -> tuple[int, int, frozenset[str], frozenset[str]]:
        """What the object requires, without its timestamp (two objects that require the same are equal here)."""
        return (
            self.min_reader_version,
            self.min_writer_version,
            frozenset(self.reader_features),
            frozenset(self.writer_features) | frozenset(self.reader_features),
        )

    def covers(self, other: ProtocolVersion) -> bool:
        """Whether everything ``other`` requires is required here already."""
        r1, w1, rf1, wf1 = self.requirements()
        r2, w2, rf2, wf2 = other.requirements()
        return r1 >= r2 and w1 >= w2 and rf1 >= rf2 and wf1 >= wf2

    def merged(self, other: ProtocolVersion) -> ProtocolVersion:
        """The larger versions and the union of the features of both (an upgrade never lowers anything)."""
        readers = sorted(set(self.reader_features) | set(other.reader_features))
        writers = sorted(set(self.writer_features) | set(other.writer_features) | set(readers))
        return ProtocolVersion(
            max(self.min_reader_version, other.min_reader_version),
            max(self.min_writer_version, other.min_writer_version),
            tuple(readers),
            tuple(writers),
            self.created_ms,
        )


#: What a root without a protocol object means: everything written before the object existed.
LEGACY = ProtocolVersion(1, 1)
#: What writers of this code put in a new root's object 0: the features every writer of this code
#: honours from its first write (an older root gets them only by an explicit upgrade, PROTOCOL.md 9.1).
INITIAL = ProtocolVersion(
    1,
    1,
    ("boundedHistory", "compaction", "sharedObjects"),
    ("boundedHistory", "changeNotices", "compaction", "rootNotice", "sharedObjects"),
)
#: The reader-writer feature under which merges resolve transactions (PROTOCOL.md 10, *Resolving transactions*).
BOUNDED_HISTORY = "boundedHistory"


def with_implied(doc: ProtocolVersion) -> ProtocolVersion:
    """``doc`` with every feature its features imply (:attr:`Feature.implies`), each where its kind lists it."""
    readers, writers = set(doc.reader_features), set(doc.writer_features) | set(doc.reader_features)
    pending = list(writers)
    while pending:
        known = FEATURES.get(pending.pop())
        for name in () if known is None else known.implies:
            if name not in writers:
                writers.add(name)
                readers.update(_reader_part(name))
                pending.append(name)
    if (readers, writers) == (set(doc.reader_features), set(doc.writer_features)):
        return doc
    return replace(doc, reader_features=tuple(sorted(readers)), writer_features=tuple(sorted(writers)))


def _reader_part(feature: str) -> tuple[str, ...]:
    """``(feature,)`` if readers must implement it too, else ``()``."""
    return (feature,) if FEATURES[feature].reader else ()


def _iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).isoformat(timespec="seconds")


def protocol_key(n: int) -> str:
    """Key of protocol object ``n``."""
    return numbered.numbered_key(PROTOCOL_PREFIX, n)


def _parse(data: bytes, key: str) -> ProtocolVersion:
    doc = ProtocolVersion.from_json(data, what=key)
    if doc.min_reader_version < 1 or doc.min_writer_version < 1:
        raise CorruptRecordError(f"{key}: protocol versions start at 1", key=key)
    return doc


def read_protocol(store: Store) -> tuple[int, ProtocolVersion] | None:
    """The newest protocol object and its number (one listing and one GET), None for a root without one."""
    newest = numbered.latest(store, PROTOCOL_PREFIX)
    if newest is None:
        return None
    key = protocol_key(newest)
    try:
        return newest, _parse(store.get(key), key)
    except ObjectNotFoundError:  # never deleted by the protocol: someone removed it by hand
        raise CorruptRecordError("protocol object listed but gone", key=key) from None


def _describe(where: str, number: int | None) -> str:
    return f"plog root {where!r}" + (f" ({protocol_key(number)})" if number is not None else "")


def check_reader(protocol: ProtocolVersion, where: str = "", number: int | None = None) -> None:
    """Raise :class:`UnsupportedProtocolError` unless this code may read a root with ``protocol``."""
    _check(protocol, "reader", where, number)


def check_writer(protocol: ProtocolVersion, where: str = "", number: int | None = None) -> None:
    """Raise :class:`UnsupportedProtocolError` unless this code may write a root with ``protocol``.

    A writer reads too, so the reader requirements count as well.
    """
    _check(protocol, "writer", where, number)


def _check(protocol: ProtocolVersion, role: str, where: str, number: int | None) -> None:
    # (the requirement's name, what the root requires, what this code implements); a writer meets both.
    required = [("min_reader_version", protocol.min_reader_version, READER_VERSION)]
    features = set(protocol.reader_features)
    if role == "writer":
        required.append(("min_writer_version", protocol.min_writer_version, WRITER_VERSION))
        features |= set(protocol.writer_features)
    versions = {name: needed for name, needed, known in required if needed > known}
    unknown = tuple(sorted(f for f in features if f not in FEATURES))
    if not versions and not unknown:
        return
    parts = [
        f"it requires {name} {needed} (this {role} implements {known})"
        for name, needed, known in required
        if needed > known
    ]
    if unknown:
        parts.append(f"it lists features this {role} does not implement: {', '.join(unknown)}")
    action = "read" if role == "reader" else "written"
    raise UnsupportedProtocolError(
        f"{_describe(where, number)} cannot be {action} by this version of plog: "
        + "; ".join(parts)
        + "; upgrade plog to use this root",
        role=role,
        versions=versions,
        features=unknown,
    )


class _Covered(Exception):
    """Raised inside :func:`upgrade_protocol`'s body builder: the newest object already requires enough."""

    def __init__(self, number: int, doc: ProtocolVersion) -> None:
        super().__init__(number)
        self.number = number
        self.doc = doc


def upgrade_protocol(store: Store, wanted: ProtocolVersion = INITIAL, where: str = "") -> tuple[int, ProtocolVersion]:
    """Make the root require at least ``wanted``; returns the protocol object that stands, with its number.

    If the newest object already covers ``wanted`` nothing is written. Otherwise
    the next number is created with the merge of both (never a downgrade);
    a lost race reads the winner and merges again. Refuses to upgrade a root
    this code may not write, and to require what this code does not implement. A feature is enabled with
    the features it implies (``boundedHistory`` with ``compaction``: PROTOCOL.md 10, *Resolving transactions*).
    """
    check_writer(wanted, where)
    wanted = with_implied(wanted)

    def make_body(n: int) -> bytes | None:
        current = None
        if n > 0:
            key = protocol_key(n - 1)
            try:
                current = _parse(store.get(key), key)
            except ObjectNotFoundError:
                return None  # never deleted by the protocol; list again
            check_writer(current, where, n - 1)
            if current.covers(wanted):
                raise _Covered(n - 1, current)
        new = wanted if current is None else current.merged(wanted)
        return replace(new, created_ms=now_ms()).to_json()

    try:
        number, body = numbered.create_next(store, PROTOCOL_PREFIX, make_body)
    except _Covered as covered:
        return covered.number, covered.doc
    return number, _parse(body, protocol_key(number))


class RootProtocol:
    """The protocol object of one root, read once when first needed and then cached.

    Readers call :meth:`require_reader` and writers :meth:`require_writer`; after
    the first call both are comparisons in memory. A process therefore learns of
    an upgrade made after it opened the root only when it opens the root again
    (PROTOCOL.md 12.3 says why that is enough).
    """

    def __init__(self, store: Store, where: str | None = None) -> None:
        self.store = store
        self.where = where if where is not None else getattr(store, "url", "")
        self._lock = threading.Lock()
        self._loaded = False
        self._number: int | None = None
        self._doc = LEGACY
        self._writer_checked = False
        #: When the protocol was last read (monotonic s).
        self._checked = float("-inf")
        #: Features found settled by :meth:`is_settled`: a root's requirements never go down, so they stay so.
        self._settled: set[str] = set()
        #: The first protocol object listing a feature, with its ``created_ms``: protocol objects never change.
        self._first_listed: dict[str, tuple[int, int]] = {}

    def _load(self) -> None:
        with self._lock:
            if not self._loaded:
                found = read_protocol(self.store)
                if found is not None:
                    self._number, self._doc = found
                self._loaded = True
                self._checked = time.monotonic()

    def _recheck(self) -> None:
        """Read the next protocol object's key (one GET); if it exists, load the newest and check it again."""
        with self._lock:
            if time.monotonic() - self._checked < PROTOCOL_RECHECK_S:
                return  # another thread just did
            self._checked = time.monotonic()
            following = 0 if self._number is None else self._number + 1
            try:
                self.store.get(protocol_key(following))
            except ObjectNotFoundError:
                return
            found = read_protocol(self.store)
            if found is not None:
                self._number, self._doc = found
                self._writer_checked = False  # the next write checks the newer requirements first

    @property
    def version(self) -> ProtocolVersion:
        """The root's protocol (:data:`LEGACY` for a root without a protocol object), read again every
        :data:`PROTOCOL_RECHECK_S` while the root is in use (PROTOCOL.md 12.3, *Re-checking*)."""
        if not self._loaded:
            self._load()
        elif time.monotonic() - self._checked >= PROTOCOL_RECHECK_S:
            self._recheck()
        return self._doc

    @property
    def number(self) -> int | None:
        """Number of the protocol object in use, None for a root without one."""
        if not self._loaded:
            self._load()
        return self._number

    def require_reader(self) -> ProtocolVersion:
        """The protocol, if this code may read the root; else :class:`UnsupportedProtocolError`."""
        doc = self.version
        check_reader(doc, self.where, self._number)
        return doc

    def require_writer(self) -> ProtocolVersion:
        """The protocol, if this code may write the root; else :class:`UnsupportedProtocolError`."""
        doc = self.version  # re-read every PROTOCOL_RECHECK_S, which clears the check below when it changed
        if self._writer_checked:
            return doc
        check_writer(doc, self.where, self._number)
        self._writer_checked = True
        return doc

    def ensure_written(self) -> ProtocolVersion:
        """Create protocol object 0 if the root has none (writers do this when they create a topic)."""
        self.require_writer()
        if self._number is None:
            self.upgrade(INITIAL)
        return self._doc

    def settle_feature(self, feature: str | Sequence[str], wait_ms: int) -> None:
        """Make sure the root lists ``feature`` (one or several) and has for long enough that every
        process using it knows.

        A root without a protocol object gets object 0 listing it: before that object no topic existed,
        so no process has acted on the root under an older protocol. Otherwise the feature must have
        been listed for ``max(wait_ms, 2 * PROTOCOL_RECHECK_S)`` (PROTOCOL.md 11.6, *Enabling*): it is
        enabled now if it is not, and ``InvalidConfigError`` says from when it may be used.
        """
        features = (feature,) if isinstance(feature, str) else tuple(feature)
        self.require_writer()
        wanted = ProtocolVersion(1, 1, tuple(f for name in features for f in _reader_part(name)), features)
        if self.number is None:
            self.upgrade(INITIAL.merged(wanted))
        elif any(name not in self.version.writer_features for name in features):
            self.upgrade(wanted)
        for name in features:
            enabled_number, enabled_ms = self._first_listing(name)
            if enabled_number == 0:
                continue
            ready_ms = enabled_ms + max(wait_ms, int(2 * PROTOCOL_RECHECK_S * 1000))
            if now_ms() < ready_ms:
                raise InvalidConfigError(
                    f"feature {name!r} was enabled in {_describe(self.where, enabled_number)} at "
                    f"{_iso(enabled_ms)}; it may be used from {_iso(ready_ms)}, once every process that opened "
                    f"the root before has read its protocol again (PROTOCOL.md 11.6, *Enabling*); retry then"
                )

    def is_settled(self, feature: str, wait_ms: int) -> bool:
        """Whether the root lists ``feature`` and may use it: protocol object 0 lists it, or it has been
        listed for ``max(wait_ms, 2 * PROTOCOL_RECHECK_S)`` (PROTOCOL.md 11.6, *Enabling*; 10, *Resolving
        transactions*). Unlike :meth:`settle_feature` it enables nothing and never raises for the wait.

        Cost: nothing once settled; before, the GETs of the older protocol objects, once.
        """
        if feature in self._settled:
            return True
        if feature not in self.version.writer_features:
            return False
        found = self._first_listed.get(feature)
        if found is None:
            found = self._first_listed[feature] = self._first_listing(feature)
        number, enabled_ms = found
        if number != 0 and now_ms() < enabled_ms + max(wait_ms, int(2 * PROTOCOL_RECHECK_S * 1000)):
            return False
        self._settled.add(feature)
        return True

    def _first_listing(self, feature: str) -> tuple[int, int]:
        """The number and ``created_ms`` of the first protocol object listing ``feature``."""
        first = (self._number or 0, self._doc.created_ms)
        for n in range((self._number or 0) - 1, -1, -1):
            key = protocol_key(n)
            doc = _parse(self.store.get(key), key)
            if feature not in doc.writer_features:
                break
            first = (n, doc.created_ms)
        return first

    def upgrade(self, wanted: ProtocolVersion) -> ProtocolVersion:
        """Make the root require at least ``wanted`` (see :func:`upgrade_protocol`) and cache the result."""
        number, doc = upgrade_protocol(self.store, wanted, self.where)
        with self._lock:
            self._number, self._doc, self._loaded, self._writer_checked = number, doc, True, False
        return self.require_writer()


class WriterCheckedStore(ForwardingStore):
    """A view of ``inner`` whose creates and deletes first check that this code may write the root.

    The partition logs of a root write through it, so that a root requiring a
    writer version or feature this code lacks is refused to producers and
    maintenance, while readers of the same root, which never write there, go on.
    The check is the cached comparison of :meth:`RootProtocol.require_writer`.
    """

    def __init__(self, inner: Store, protocol: RootProtocol) -> None:
        super().__init__(inner)
        self.protocol = protocol

    def put_if_absent(self, key: str, data: bytes, *, durable: bool = True) -> bool:
        """Create through the inner store, once this code is known to be allowed to write the root."""
        self.protocol.require_writer()
        return self.inner.put_if_absent(key, data, durable=durable)

    def put_if_absent_parts(self, key: str, parts: Iterable[BytesLike], *, durable: bool = True) -> bool:
        """Create from parts through the inner store, once this code is known to be allowed to write the root."""
        self.protocol.require_writer()
        return self.inner.put_if_absent_parts(key, parts, durable=durable)

    def replace(self, key: str, data: bytes) -> None:
        """Replace through the inner store, once this code is known to be allowed to write the root."""
        self.protocol.require_writer()
        self.inner.replace(key, data)

    def delete(self, key: str) -> None:
        """Delete through the inner store, once this code is known to be allowed to write the root."""
        self.protocol.require_writer()
        self.inner.delete(key)

    def delete_many(self, keys: Sequence[str]) -> None:
        """Delete through the inner store, once this code is known to be allowed to write the root."""
        self.protocol.require_writer()
        self.inner.delete_many(keys)

    def delete_prefix(self, prefix: str) -> int:
        """Delete through the inner store, once this code is known to be allowed to write the root."""
        self.protocol.require_writer()
        return self.inner.delete_prefix(prefix)
