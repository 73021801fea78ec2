"""Quotas (PROTOCOL.md 11.10): Kafka's client quotas kept in the root, resolved by Kafka's precedence.

::

    _coordinator/quotas/<entity>/<version:020d>.json

    <entity> := users/<name>/clients/<name> | users/<name> | clients/<name>
    <name>   := "default"                      Kafka's <default>
              | "n-" + hex(UTF-8 bytes)        any other user or client id

A quota document holds the entity's settings (``producer_byte_rate``, ``consumer_byte_rate``,
``store_request_rate``); the newest version of an entity is its configuration, and a version
without settings removes it. :func:`alter_quota` creates the next version (conditional create,
a lost race retries); :class:`QuotaReader` lists the prefix every ``refresh_s`` and reads only the
versions it has not read; :func:`resolve` applies Kafka's order; :class:`QuotaManager` keeps one
:class:`~coordinator.throttle.Throttle` per quota entity and kind, shared by the clients of a process.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from segment_format.documents import JsonDocument
from segment_format.errors import CorruptRecordError, InvalidConfigError, ObjectNotFoundError, PlogError
from segment_format.numbered import create_next, numbered_key, numbers_in, parse_number
from segment_format.stores.base import Store

from .keys import QUOTAS
from .throttle import Throttle, TimeAverage

__all__ = [
    "ANONYMOUS",
    "DEFAULT",
    "ClientQuota",
    "QUOTAS",
    "QUOTA_KEYS",
    "Entity",
    "QuotaDocument",
    "QuotaManager",
    "QuotaReader",
    "QuotaStep",
    "alter_quota",
    "connection_quota",
    "principal_user",
    "entity_key",
    "precedence",
    "resolve",
]

log = logging.getLogger(__name__)

#: Kafka's ``<default>`` entity name.
DEFAULT = "<default>"
#: The settings a quota document may hold (Kafka's names, and the store's request rate for Kafka's
#: ``request_percentage``).
QUOTA_KEYS = ("producer_byte_rate", "consumer_byte_rate", "store_request_rate")
#: Longest user or client id, in UTF-8 bytes: two hex-encoded names stay well inside a key's 1024 bytes.
MAX_NAME_BYTES = 200
#: Versions of an entity kept behind its newest (older ones are deleted by the next alter).
KEEP_VERSIONS = 1
#: How often a process lists the quotas, by default.
DEFAULT_REFRESH_S = 5.0


@dataclass(frozen=True)
class Entity:
    """A quota entity: ``user`` and/or ``client_id``, each a name, ``DEFAULT`` or None (not part of it)."""

    user: str | None = None
    client_id: str | None = None

    def __post_init__(self) -> None:
        if self.user is None and self.client_id is None:
            raise InvalidConfigError("a quota entity names a user, a client id or both")
        for what, name in (("user", self.user), ("client id", self.client_id)):
            if name is not None and (not isinstance(name, str) or len(name.encode()) > MAX_NAME_BYTES):
                raise InvalidConfigError(f"quota {what} {name!r} must be a str of at most {MAX_NAME_BYTES} bytes")

    def path(self) -> str:
        """Kafka's ZooKeeper path of the entity (``/config/users/alice/clients/<default>``), for people."""
        parts = []
        if self.user is not None:
            parts.append(f"users/{self.user}")
        if self.client_id is not None:
            parts.append(f"clients/{self.client_id}")
        return "/config/" + "/".join(parts)


def _encode_name(name: str) -> str:
    return "default" if name == DEFAULT else "n-" + name.encode().hex()


def _decode_name(text: str) -> str | None:
    if text == "default":
        return DEFAULT
    if text.startswith("n-"):
        try:
            return bytes.fromhex(text[2:]).decode()
        except (ValueError, UnicodeDecodeError):
            return None
    return None


def entity_key(entity: Entity) -> str:
    """The prefix of an entity's versions: ``_coordinator/quotas/users/<name>/clients/<name>/``."""
    parts = []
    if entity.user is not None:
        parts.append(f"users/{_encode_name(entity.user)}")
    if entity.client_id is not None:
        parts.append(f"clients/{_encode_name(entity.client_id)}")
    return QUOTAS + "/".join(parts) + "/"


def parse_entity_key(key: str) -> tuple[Entity, int] | None:
    """The entity and version of a quota document's key; None for any other key."""
    if not key.startswith(QUOTAS):
        return None
    segments = key[len(QUOTAS) :].split("/")
    version = parse_number(segments[-1])
    if version is None:
        return None
    names = segments[:-1]
    found: dict[str, str] = {}
    for kind, name in zip(names[::2], names[1::2], strict=False):
        decoded = _decode_name(name)
        if kind not in ("users", "clients") or decoded is None or kind in found:
            return None
        found[kind] = decoded
    if len(names) not in (2, 4) or (len(names) == 4 and names[0] != "users"):
        return None
    try:
        return Entity(found.get("users"), found.get("clients")), version
    except InvalidConfigError:
        return None


def _rates(value: Any) -> dict[str, float]:
    """A document's ``quotas``: an object of non-negative numbers; keys this version does not know are ignored."""
    if not isinstance(value, dict):
        raise TypeError("expected an object")
    out = {}
    for key, rate in value.items():
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate < float("inf"):
            raise ValueError(f"{key} must be a number >= 0")
        if key in QUOTA_KEYS:
            out[key] = float(rate)
    return out


@dataclass(frozen=True)
class QuotaDocument(JsonDocument):
    """One version of an entity's quotas. ``quotas`` maps the keys of ``QUOTA_KEYS`` to per-second rates."""

    version: int
    quotas: dict[str, float] = field(default_factory=dict, metadata={"decode": _rates})
    #: The writer's wall-clock time (ms), for people.
    written_ms: int = 0


def check_quotas(changes: Mapping[str, Any]) -> dict[str, float]:
    """``changes`` as rates: known keys, non-negative finite numbers (``InvalidConfigError`` names the bad one)."""
    out: dict[str, float] = {}
    for key, value in changes.items():
        if key not in QUOTA_KEYS:
            raise InvalidConfigError(f"unknown quota {key!r}: use one of {', '.join(QUOTA_KEYS)}")
        try:
            rate = float(value)
        except (TypeError, ValueError):
            raise InvalidConfigError(f"quota {key}={value!r} is not a number") from None
        if not rate >= 0 or rate == float("inf"):
            raise InvalidConfigError(f"quota {key}={value!r} must be a finite number >= 0")
        out[key] = rate
    return out


def read_entity(store: Store, entity: Entity) -> dict[str, float]:
    """An entity's quotas now (empty when it has none): a LIST and a GET."""
    prefix = entity_key(entity)
    found = numbers_in([info.key for info in store.list(prefix)], prefix)
    if not found:
        return {}
    key = numbered_key(prefix, found[-1])
    return QuotaDocument.from_json(store.get(key), what=key, keyed={"version": found[-1]}).quotas


def alter_quota(
    store: Store, entity: Entity, add: Mapping[str, Any] | None = None, delete: Iterable[str] = ()
) -> dict[str, float]:
    """Set the quotas in ``add`` and remove those in ``delete`` for ``entity``; return its quotas after.

    Creates the entity's next version with put-if-absent from the newest one (a concurrent alter
    makes this one retry on top of it: no change is lost), then deletes the versions older than
    the one before it.
    """
    changes = check_quotas(add or {})
    removed = list(delete)
    for key in removed:
        if key not in QUOTA_KEYS:
            raise InvalidConfigError(f"unknown quota {key!r}: use one of {', '.join(QUOTA_KEYS)}")
    prefix = entity_key(entity)
    result: dict[str, float] = {}

    def make_body(n: int) -> bytes:
        nonlocal result
        current: dict[str, float] = {}
        if n > 0:
            try:
                current = QuotaDocument.from_json(store.get(numbered_key(prefix, n - 1)), what=prefix).quotas
            except ObjectNotFoundError:
                current = {}
        result = {k: v for k, v in {**current, **changes}.items() if k not in removed}
        return QuotaDocument(n, result, int(time.time() * 1000)).to_json()

    n, _ = create_next(store, prefix, make_body)
    old = [
        numbered_key(prefix, m)
        for m in numbers_in([i.key for i in store.list(prefix)], prefix)
        if m < n - KEEP_VERSIONS
    ]
    if old:
        store.delete_many(old)
    return result


def precedence(user: str, client_id: str) -> list[Entity]:
    """Kafka's order of the entities whose quota applies to ``(user, client_id)``, most specific first."""
    return [
        Entity(user, client_id),
        Entity(user, DEFAULT),
        Entity(user, None),
        Entity(DEFAULT, client_id),
        Entity(DEFAULT, DEFAULT),
        Entity(DEFAULT, None),
        Entity(None, client_id),
        Entity(None, DEFAULT),
    ]


def resolve(
    configs: Mapping[Entity, Mapping[str, float]], user: str, client_id: str, key: str
) -> tuple[Entity, float] | None:
    """The first entity in Kafka's order that sets ``key`` for ``(user, client_id)``, and its value; None if none.

    Each quota type resolves on its own, as Kafka's: an entity that sets only ``producer_byte_rate``
    leaves ``consumer_byte_rate`` to the entities after it.
    """
    for entity in precedence(user, client_id):
        quotas = configs.get(entity)
        if quotas is not None and key in quotas:
            return entity, quotas[key]
    return None


class QuotaReader:
    """Every entity's quotas in a root, listed at most every ``refresh_s`` (a LIST, plus a GET per new version)."""

    def __init__(self, store: Store, refresh_s: float = DEFAULT_REFRESH_S) -> None:
        self.store = store
        self.refresh_s = refresh_s
        self._configs: dict[Entity, dict[str, float]] = {}
        self._versions: dict[Entity, int] = {}
        self._read_at: float | None = None
        self._lock = threading.Lock()

    def configs(self, store: Store | None = None) -> dict[Entity, dict[str, float]]:
        """The quotas by entity, refreshed if ``refresh_s`` passed since the last listing (through ``store``,
        a live store of the root, when given: the one this reader was made with may have been closed)."""
        with self._lock:
            now = time.monotonic()
            if self._read_at is None or now - self._read_at >= self.refresh_s:
                self._read_at = now
                # A failed listing keeps the quotas last read; the next interval tries again.
                with contextlib.suppress(PlogError):
                    self._refresh(store or self.store)
            return self._configs

    def _refresh(self, store: Store) -> None:
        newest: dict[Entity, int] = {}
        for info in store.list(QUOTAS):
            parsed = parse_entity_key(info.key)
            if parsed is not None and parsed[1] >= newest.get(parsed[0], -1):
                newest[parsed[0]] = parsed[1]
        configs = {e: q for e, q in self._configs.items() if e in newest}
        for entity, version in newest.items():
            if self._versions.get(entity) == version:
                continue
            try:
                body = store.get(numbered_key(entity_key(entity), version))
            except ObjectNotFoundError:
                continue  # replaced since the listing: the next one finds the newer version
            key = numbered_key(entity_key(entity), version)
            try:
                quotas = QuotaDocument.from_json(body, what=key, keyed={"version": version}).quotas
            except CorruptRecordError as exc:
                # One bad document costs its entity, not every quota: the others still apply.
                log.warning("ignoring quota document %s: %s", key, exc)
                continue
            self._versions[entity] = version
            if quotas:
                configs[entity] = quotas
            else:
                configs.pop(entity, None)
        self._versions = {e: v for e, v in self._versions.items() if e in newest}
        self._configs = configs


class QuotaManager:
    """The quotas of one root in one process: a reader and a ``Throttle`` per (kind, quota entity).

    Clients of the same quota entity share its throttle, as Kafka's clients of one entity share a
    broker's quota. Use :meth:`for_store` to get the process's one manager per root.
    """

    _instances: dict[str, QuotaManager] = {}
    _instances_lock = threading.Lock()

    def __init__(self, store: Store, refresh_s: float = DEFAULT_REFRESH_S) -> None:
        self.reader = QuotaReader(store, refresh_s)
        self._throttles: dict[tuple[str, Entity], Throttle] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_store(cls, store: Store, refresh_s: float = DEFAULT_REFRESH_S) -> QuotaManager:
        """The process's manager for the root of ``store``: one LIST per refresh per root, not per client,
        and one throttle per quota entity for all the process's clients. It refreshes as often as the most
        eager of its clients asks."""
        with cls._instances_lock:
            found = cls._instances.get(store.url)
            if found is None:
                found = cls._instances[store.url] = QuotaManager(store, refresh_s)
            found.reader.refresh_s = min(found.reader.refresh_s, refresh_s)
            return found

    def quota(self, kind: str, user: str, client_id: str, store: Store | None = None) -> tuple[Entity, float] | None:
        """The quota of ``kind`` (a key of ``QUOTA_KEYS``) that applies to ``(user, client_id)`` now."""
        return resolve(self.reader.configs(store), user, client_id, kind)

    def throttle(self, kind: str, user: str, client_id: str, store: Store | None = None) -> Throttle | None:
        """The throttle of the entity whose quota of ``kind`` applies to ``(user, client_id)`` now, at that
        quota (a change read since applies from now); None when no entity sets one.

        ``store``: the caller's store of the root, used if the quotas are due to be listed again."""
        found = self.quota(kind, user, client_id, store)
        if found is None:
            return None
        entity, rate = found
        with self._lock:
            throttle = self._throttles.get((kind, entity))
            if throttle is None:
                throttle = self._throttles[(kind, entity)] = Throttle(rate)
        throttle.quota = rate
        return throttle


#: Kafka's principal name of an unauthenticated client, the user of a client that names none.
ANONYMOUS = "ANONYMOUS"
#: Longest a waiting step sleeps before it looks at its quota again: a quota raised or removed meanwhile
#: frees it within this (and the quotas' refresh interval).
RECHECK_S = 0.25


class QuotaStep:
    """One step a client reserved against its quotas (bytes, store requests), waiting for its allowance.

    :meth:`wait_s` looks at the quotas again each time, so a step reserved under a low quota clears at a
    raised one, and at once when its quota is removed.
    """

    def __init__(self, quota: ClientQuota, amounts: dict[str, float]) -> None:
        self.quota = quota
        self.amounts = {kind: amount for kind, amount in amounts.items() if amount > 0}
        #: Per kind: the throttle the step is reserved on and the step's end in its ledger.
        self._places: dict[str, tuple[Throttle, float]] = {}
        self.waited_s = 0.0

    def wait_s(self) -> float:
        """Seconds until every quota allows this step (0: it may be taken now); may list the quotas."""
        longest = 0.0
        for kind, amount in self.amounts.items():
            throttle = self.quota.manager.throttle(kind, self.quota.user, self.quota.client_id, self.quota.store)
            if throttle is None:
                self._places.pop(kind, None)
                continue
            place = self._places.get(kind)
            if place is None or place[0] is not throttle:  # a new quota, or another entity's: take a place there
                place = self._places[kind] = (throttle, throttle.reserve(amount))
            longest = max(longest, throttle.wait_s(place[1]))
        return longest

    def wait(self, stop: threading.Event | None = None) -> float:
        """Sleep until the step may be taken (or ``stop`` is set); record and return the time waited."""
        start = time.monotonic()
        while (pause := self.wait_s()) > 0:
            pause = min(pause, RECHECK_S)
            if stop is None:
                time.sleep(pause)
            elif stop.wait(pause):
                break
        self.waited_s = time.monotonic() - start
        self.quota.record_wait(self.waited_s)
        return self.waited_s


class ClientQuota:
    """One client's side of its quotas: reserve each step, wait before taking it, average the waits.

    ``byte_key`` is ``producer_byte_rate`` or ``consumer_byte_rate``; each step also counts store requests
    against ``store_request_rate``, and waits for both (the client waits as a Kafka client whose response
    the broker delayed). ``throttle_time_avg_ms`` is Kafka's ``produce-throttle-time-avg`` /
    ``fetch-throttle-time-avg``.
    """

    def __init__(
        self, store: Store, byte_key: str, user: str, client_id: str, refresh_s: float = DEFAULT_REFRESH_S
    ) -> None:
        if byte_key not in ("producer_byte_rate", "consumer_byte_rate"):
            raise InvalidConfigError(
                f"a client's byte quota is producer_byte_rate or consumer_byte_rate, not {byte_key!r}"
            )
        self.store = store
        self.manager = QuotaManager.for_store(store, refresh_s)
        self.byte_key = byte_key
        self.user = user or ANONYMOUS
        self.client_id = client_id
        self.throttle_time = TimeAverage()

    def step_bytes(self) -> int | None:
        """The largest step the byte quota allows at once (its burst), None when unlimited: a client cuts
        what it moves into steps of at most this, so that the bound holds over any interval, not only
        from its start (PROTOCOL.md 11.10)."""
        throttle = self.manager.throttle(self.byte_key, self.user, self.client_id, self.store)
        if throttle is None or throttle.quota is None:
            return None
        return max(1, int(throttle.quota * throttle.burst_s))

    def reserve(self, nbytes: float, requests: float = 0) -> QuotaStep:
        """Reserve a step of ``nbytes`` and ``requests``; wait on the returned step before taking it."""
        step = QuotaStep(self, {self.byte_key: nbytes, "store_request_rate": requests})
        step.wait_s()  # takes the step's places in the ledgers now, in the order steps are asked for
        return step

    def acquire(self, nbytes: float, requests: float = 0, stop: threading.Event | None = None) -> float:
        """Reserve a step of ``nbytes`` and ``requests`` and sleep until the quotas allow it; return the
        seconds waited (``stop``: an event that ends the wait early)."""
        return self.reserve(nbytes, requests).wait(stop)

    def record_wait(self, seconds: float) -> None:
        """Count a wait (seconds) in the throttle-time average."""
        self.throttle_time.record(seconds * 1000)

    def throttle_time_avg_ms(self) -> float:
        """The average wait (ms) of the last 30 s, zeros included (Kafka's ``*-throttle-time-avg``)."""
        return self.throttle_time.value()

    def throttle_time_max_ms(self) -> float:
        """The longest wait (ms) of the last 30 s (Kafka's ``*-throttle-time-max``)."""
        return self.throttle_time.maximum()


def principal_user(principal: str | None) -> str:
    """The user of a Kafka principal (``User:alice`` is ``alice``); ANONYMOUS without one."""
    if not principal:
        return ANONYMOUS
    return principal.split(":", 1)[1] if principal.startswith("User:") else principal


def connection_quota(store: Store, byte_key: str, principal: str | None, client_id: str | None) -> ClientQuota:
    """A gateway connection's side of a byte quota: its principal's user and its requests' client id."""
    return ClientQuota(store, byte_key, principal_user(principal), client_id or "")
