"""Leases: leadership with epochs, on storage alone (PROTOCOL.md 11.7).

::

    _coordinator/leases/<name>/<epoch:020d>.json              {"holder", "epoch", "expires_ms", "created_ms"}
    _coordinator/leases/<name>/<epoch:020d>/<seq:020d>.json   renewals: {"expires_ms"} or {"released": true}

Epoch ``e`` is taken by creating its object with put-if-absent, so there is
never more than one holder of an epoch. A candidate may create ``e+1`` only
once epoch ``e`` is released or expired: its newest expiry plus the clock-skew
bound ``max_clock_skew_ms`` has passed on the candidate's clock. A holder
treats its lease as lost as soon as its own clock passes the expiry, so with
skew below the bound, the old holder stops before the new one starts.

Its job: electing the one maintainer per topic of the self-maintaining log
(PROTOCOL.md 10.1, :mod:`coordinator.maintainer`): lease name
``maintainer=<topic>`` (:func:`coordinator.keys.maintainer_lease_name`), whose
expiry is the topic's ``auto.maintenance.interval.ms``. That lease is never
renewed or released after a full pass: an epoch's expiry *is* the time the
next pass is due, and old epochs are pruned (:meth:`Lease.prune`) so the
listing a candidate reads stays a few objects long. Epoch objects are immutable,
so a candidate caches the ones it has read and a repeated :meth:`Lease.state`
costs one LIST while the newest epoch is unchanged. Epochs and renewals are
numbered objects (:mod:`segment_format.numbered`); a lost race for an epoch is
not retried, since losing it means another candidate holds the lease.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import ClassVar

from segment_format import numbered
from segment_format.documents import JsonDocument
from segment_format.errors import FencedError, InvalidConfigError, ObjectNotFoundError
from segment_format.numbered import parse_number
from segment_format.records import now_ms
from segment_format.stores.base import Store

from .keys import lease_epoch_prefix, lease_prefix

#: The assumed bound on clock differences between machines (ε of PROTOCOL.md 2, assumption A4).
DEFAULT_MAX_CLOCK_SKEW_MS = 1000


@dataclass(frozen=True)
class LeaseEpoch(JsonDocument):
    """``<epoch>.json``: who took the epoch and until when (without renewals)."""

    json_separators: ClassVar[tuple[str, str]] = (", ", ": ")  # the spacing stored objects have always had

    holder: str
    epoch: int
    expires_ms: int
    created_ms: int = 0


@dataclass(frozen=True)
class LeaseRenewal(JsonDocument):
    """``<epoch>/<seq>.json``: a later expiry for the epoch, or its release."""

    json_separators: ClassVar[tuple[str, str]] = (", ", ": ")

    expires_ms: int = 0
    released: bool = False


@dataclass(frozen=True)
class LeaseState:
    """What the objects say about a lease now."""

    epoch: int
    holder: str | None
    expires_ms: int
    released: bool

    def free_at(self, now: int, skew_ms: int) -> bool:
        """Whether a candidate may take the next epoch at ``now``."""
        return self.holder is None or self.released or now > self.expires_ms + skew_ms


class Lease:
    """One named lease as seen by one candidate (``holder_id``)."""

    def __init__(
        self,
        store: Store,
        name: str,
        holder_id: str | None = None,
        lease_ms: int = 10_000,
        max_clock_skew_ms: int = DEFAULT_MAX_CLOCK_SKEW_MS,
    ) -> None:
        if not isinstance(lease_ms, int) or lease_ms <= 0:
            raise InvalidConfigError(f"lease_ms={lease_ms!r} must be a positive int")
        self.store = store
        self.name = name
        self.prefix = lease_prefix(name)
        self.holder_id = holder_id or uuid.uuid4().hex
        self.lease_ms = lease_ms
        self.skew_ms = max_clock_skew_ms
        self.epoch: int | None = None
        self._expires_ms = 0
        self._renewals = 0
        # Epoch objects are created once and never change: a read one need not be read again.
        self._heads: dict[str, LeaseEpoch] = {}
        self._listed: list[str] = []
        #: What the last :meth:`try_acquire` read (None before the first).
        self.last_state: LeaseState | None = None

    def state(self) -> LeaseState:
        """Read the current epoch, holder and expiry."""
        infos = self.store.list(self.prefix)
        self._listed = [i.key for i in infos]
        epochs = [
            (n, i.key)
            for i in infos
            if "/" not in i.key[len(self.prefix) :]
            for n in [parse_number(i.key)]
            if n is not None
        ]
        if not epochs:
            return LeaseState(-1, None, 0, False)
        epoch, key = max(epochs)
        head = self._heads.get(key)
        if head is None:
            try:
                # Keyed: another epoch's bytes here would hand this epoch to that epoch's holder (PROTOCOL.md 3.1).
                head = LeaseEpoch.from_json(self.store.get(key), what=key, keyed={"epoch": epoch})
            except ObjectNotFoundError:
                return LeaseState(epoch, None, 0, True)
            self._heads = {key: head}  # only the newest epoch is ever asked for again
        expires, released = head.expires_ms, False
        renewal_prefix = lease_epoch_prefix(self.name, epoch)
        renewals = sorted(i.key for i in infos if i.key.startswith(renewal_prefix))
        if renewals:
            try:
                last = LeaseRenewal.from_json(self.store.get(renewals[-1]), what=renewals[-1])
                expires = max(expires, last.expires_ms)
                released = last.released
            except ObjectNotFoundError:
                pass
        return LeaseState(epoch, head.holder, expires, released)

    def try_acquire(self) -> bool:
        """Take the next epoch if the lease is free; True if this candidate now holds it."""
        now = now_ms()
        state = self.last_state = self.state()
        if state.holder == self.holder_id and not state.released and now < state.expires_ms:
            self.epoch, self._expires_ms = state.epoch, state.expires_ms
            return True
        if not state.free_at(now, self.skew_ms):
            return False
        epoch = state.epoch + 1
        expires = now + self.lease_ms
        body = LeaseEpoch(self.holder_id, epoch, expires, now).to_json()
        if not numbered.create(self.store, self.prefix, epoch, body):
            return False  # another candidate took this epoch first
        self.epoch, self._expires_ms, self._renewals = epoch, expires, 0
        return True

    @property
    def expires_ms(self) -> int:
        """The expiry of the epoch this candidate holds (0 if none), by its own clock."""
        return self._expires_ms if self.epoch is not None else 0

    def held(self) -> bool:
        """Whether this candidate may still act as holder: it holds an epoch and its clock is before expiry."""
        return self.epoch is not None and now_ms() < self._expires_ms

    def check(self) -> int:
        """The held epoch, or ``FencedError`` if the lease is lost or another holder has a newer epoch."""
        if not self.held():
            raise FencedError(f"lease {self.name!r} is not held by {self.holder_id} (expired or never acquired)")
        assert self.epoch is not None
        return self.epoch

    def renew(self) -> None:
        """Extend the expiry; ``FencedError`` if the lease was lost meanwhile (never renews a lost lease)."""
        epoch = self.check()
        self._renewals += 1
        expires = now_ms() + self.lease_ms
        renewed = LeaseRenewal(expires).to_json()
        if not numbered.create(self.store, lease_epoch_prefix(self.name, epoch), self._renewals, renewed):
            raise FencedError(f"lease {self.name!r}: renewal {self._renewals} of epoch {epoch} already exists")
        if self.state().epoch != epoch:
            self.epoch = None
            raise FencedError(f"lease {self.name!r}: a newer epoch exists; {self.holder_id} was fenced")
        self._expires_ms = expires

    def release(self) -> None:
        """Give the lease up so that a candidate can take it at once."""
        if self.epoch is None:
            return
        self._renewals += 1
        released = LeaseRenewal(0, released=True).to_json()
        numbered.create(self.store, lease_epoch_prefix(self.name, self.epoch), self._renewals, released)
        self.epoch = None
        self._expires_ms = 0

    def prune(self) -> int:
        """Delete the epochs (and their renewals) below the newest two seen by the last :meth:`state`.

        For leases taken again and again (one epoch per maintenance pass), so their listing stays short.
        Only older epochs go: a candidate only ever reads the newest, and the one before it is kept so
        that a candidate whose listing raced the newest creation still finds a consistent pair.
        """
        epochs = sorted(
            {n for key in self._listed for n in [parse_number(key)] if n is not None and self._is_epoch(key)}
        )
        if len(epochs) <= 2:
            return 0
        doomed = set(epochs[:-2])
        deleted = 0
        for key in self._listed:
            rest = key[len(self.prefix) :]
            number = parse_number(rest.split("/", 1)[0] + ".json") if "/" in rest else parse_number(key)
            if number in doomed:
                self.store.delete(key)
                deleted += 1
        return deleted

    def _is_epoch(self, key: str) -> bool:
        return "/" not in key[len(self.prefix) :]
