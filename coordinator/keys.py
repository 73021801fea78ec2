"""Object names under ``_coordinator/`` (PROTOCOL.md 11)."""

from __future__ import annotations

import hashlib
import re

from segment_format.errors import InvalidConfigError

ROOT = "_coordinator/"
PRODUCER_IDS = ROOT + "producer-ids/"
TRANSACTIONS = ROOT + "transactions/"
TRANSACTIONAL_IDS = ROOT + "transactional-ids/"
LEASES = ROOT + "leases/"

_NUMBERED = re.compile(r"^(\d{20})\.json$")
_LEASE_NAME = re.compile(r"^[a-zA-Z0-9._=-]{1,200}$")


def number_of(name: str) -> int | None:
    """The number of a ``<n:020d>.json`` name, None for other names."""
    m = _NUMBERED.match(name.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def numbered(prefix: str, n: int) -> str:
    """``<prefix><n:020d>.json``."""
    return f"{prefix}{n:020d}.json"


def transactional_id_prefix(transactional_id: str) -> str:
    """Prefix of a transactional id's objects; hashed so that any string (a checkpoint path) is a safe key."""
    if not isinstance(transactional_id, str) or not transactional_id:
        raise InvalidConfigError(f"transactional_id must be a non-empty str, got {transactional_id!r}")
    return TRANSACTIONAL_IDS + hashlib.sha256(transactional_id.encode()).hexdigest() + "/"


def transactions_prefix(producer_id: int) -> str:
    """Prefix of the decision objects of one producer id."""
    return f"{TRANSACTIONS}{producer_id:020d}/"


def lease_prefix(name: str) -> str:
    """Prefix of a lease's epoch objects; ``name`` like ``partition=clicks-0``."""
    if not isinstance(name, str) or not _LEASE_NAME.match(name):
        raise InvalidConfigError(f"invalid lease name {name!r}: use 1 to 200 characters of [a-zA-Z0-9._=-]")
    return LEASES + name + "/"
