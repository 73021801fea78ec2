"""Every object name the coordinator layer uses: ``_coordinator/`` (PROTOCOL.md 11) and ``groups/`` (PROTOCOL.md 11.4).

::

    _coordinator/producer-ids/<id:020d>.json
    _coordinator/transactional-ids/<sha256(tid)>/producer-id.json
    _coordinator/transactional-ids/<sha256(tid)>/epochs/<epoch:020d>.json
    _coordinator/transactions/<producer_id:020d>/<txn:020d>.json            decision
    _coordinator/transactions/<producer_id:020d>/<txn:020d>.materialized    offsets copied to the groups
    _coordinator/leases/<name>/<epoch:020d>.json                            lease epoch
    _coordinator/leases/<name>/<epoch:020d>/<seq:020d>.json                 renewals and release
    _coordinator/leases/maintainer=<topic>/<epoch:020d>.json                one per maintenance pass
    _coordinator/quotas/...                                                 quotas (coordinator/quotas.py)
    groups/<group>/members/<member_id>/<seq:020d>.json                      heartbeats
    groups/<group>/generations/<generation:020d>.json
    groups/<group>/rebalances/<generation:020d>.json
    groups/<group>/commits/<generation:020d>/<seq:020d>.json
    groups/<group>/offsets/<seq:020d>.json                                  Spark lag offsets

The 20-digit numbering itself lives in :mod:`segment_format.numbered`.
"""

from __future__ import annotations

import hashlib
import re

from segment_format.errors import InvalidConfigError
from segment_format.layout import TOPIC_NAME, format_number
from segment_format.numbered import numbered_key

ROOT = "_coordinator/"
PRODUCER_IDS = ROOT + "producer-ids/"
TRANSACTIONS = ROOT + "transactions/"
TRANSACTIONAL_IDS = ROOT + "transactional-ids/"
LEASES = ROOT + "leases/"
QUOTAS = ROOT + "quotas/"
GROUPS = "groups/"

_LEASE_NAME = re.compile(r"^[a-zA-Z0-9._=-]{1,200}$")


def transactional_id_prefix(transactional_id: str) -> str:
    """Prefix of a transactional id's objects; hashed so that any string (a checkpoint path) is a safe key."""
    if not isinstance(transactional_id, str) or not transactional_id:
        raise InvalidConfigError(f"transactional_id must be a non-empty str, got {transactional_id!r}")
    return TRANSACTIONAL_IDS + hashlib.sha256(transactional_id.encode()).hexdigest() + "/"


def transactions_prefix(producer_id: int) -> str:
    """Prefix of the decision objects of one producer id."""
    return f"{TRANSACTIONS}{format_number(producer_id)}/"


def lease_prefix(name: str) -> str:
    """Prefix of a lease's epoch objects; ``name`` like ``partition=clicks-0``."""
    if not isinstance(name, str) or not _LEASE_NAME.match(name):
        raise InvalidConfigError(f"invalid lease name {name!r}: use 1 to 200 characters of [a-zA-Z0-9._=-]")
    return LEASES + name + "/"


def maintainer_lease_name(topic: str) -> str:
    """Name of the lease electing a topic's maintainer (PROTOCOL.md 10.1): ``maintainer=<topic>``.

    Topic names may be 249 characters, lease names 200: a longer topic is named by its hash.
    """
    name = f"maintainer={topic}"
    if len(name) > 200:
        name = "maintainer=sha256-" + hashlib.sha256(topic.encode()).hexdigest()
    return name


def materialized_key(producer_id: int, txn: int) -> str:
    """Marker saying a committed transaction's offsets were copied into the groups' commit logs."""
    return f"{transactions_prefix(producer_id)}{format_number(txn)}.materialized"


def lease_epoch_prefix(name: str, epoch: int) -> str:
    """Prefix of the renewals of one lease epoch."""
    return f"{lease_prefix(name)}{format_number(epoch)}/"


# ------------------------------------------------------------------------------------------- groups


def validate_group_id(group: object) -> str:
    """``group`` if it is a legal group id (Kafka's topic-name characters, so it is a safe key segment)."""
    if not isinstance(group, str) or group in (".", "..") or not TOPIC_NAME.match(group):
        raise InvalidConfigError(
            f"invalid group_id {group!r}: use 1 to 249 characters of [a-zA-Z0-9._-], not '.' or '..'"
        )
    return group


def group_prefix(group: str) -> str:
    """Prefix of everything belonging to ``group``."""
    return f"{GROUPS}{validate_group_id(group)}/"


def members_prefix(group: str) -> str:
    """Prefix of the heartbeat objects of all members."""
    return group_prefix(group) + "members/"


def heartbeat_key(group: str, member_id: str, seq: int) -> str:
    """Key of heartbeat ``seq`` of ``member_id``."""
    return numbered_key(f"{members_prefix(group)}{member_id}/", seq)


def generations_prefix(group: str) -> str:
    """Prefix of the generation objects."""
    return group_prefix(group) + "generations/"


def generation_key(group: str, generation: int) -> str:
    """Key of generation ``generation``."""
    return numbered_key(generations_prefix(group), generation)


def rebalances_prefix(group: str) -> str:
    """Prefix of the rebalance markers."""
    return group_prefix(group) + "rebalances/"


def rebalance_key(group: str, generation: int) -> str:
    """Key of the marker saying generation ``generation`` is being replaced."""
    return numbered_key(rebalances_prefix(group), generation)


def assignments_prefix(group: str) -> str:
    """Prefix of the assignments of client-assigned generations (PROTOCOL.md 11.4)."""
    return group_prefix(group) + "assignments/"


def assignment_key(group: str, generation: int) -> str:
    """Key of the assignment the leader of client-assigned generation ``generation`` computed."""
    return numbered_key(assignments_prefix(group), generation)


def commits_prefix(group: str, generation: int) -> str:
    """Prefix of the commit log of generation ``generation``."""
    return f"{group_prefix(group)}commits/{format_number(generation)}/"


def commit_key(group: str, generation: int, seq: int) -> str:
    """Key of entry ``seq`` of generation ``generation``'s commit log."""
    return numbered_key(commits_prefix(group, generation), seq)


def lag_offsets_prefix(group: str) -> str:
    """Where the Spark source records a query's progress for lag tools (``groupIdForLag``): flat, unfenced."""
    return group_prefix(group) + "offsets/"
