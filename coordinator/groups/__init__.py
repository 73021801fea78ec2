"""Consumer groups without a broker (PROTOCOL.md 11.4, argued in 13, I11).

A group is a handful of small JSON objects under ``groups/<group>/``; every
decision a Kafka group coordinator makes is made here by one put-if-absent:

``members/<member_id>/<seq:020d>.json``
    heartbeats. A member creates ``seq + 1`` every ``heartbeat_interval_ms`` and
    deletes ``seq``. The newest one carries its subscription, its assignment
    protocols, its timeouts, the generation it has adopted and the generation
    it is ready to join (its acknowledgement of a rebalance).
``rebalances/<generation:020d>.json``
    "generation g is being replaced": created (once, put-if-absent) by any member
    that sees the live members or their subscriptions differ from generation g.
    Members then prepare: with an eager protocol they commit and revoke every
    partition, with a cooperative one they keep fetching; either way they
    acknowledge by heartbeating ``joined = g + 1``.
``generations/<generation:020d>.json``
    the membership and assignment of a generation, and a snapshot of the
    committed offsets. Generation g + 1 is created by whichever member first
    sees every live member acknowledge (or the rebalance timeout pass): it
    *seals* generation g's commit log, runs the assignor, and creates the object
    with put-if-absent, so exactly one proposal wins.
``commits/<generation:020d>/<seq:020d>.json``
    the commit log of a generation. Entries are numbered contiguously, each
    created with put-if-absent from a listing, each holding the whole committed
    state of the group after it (so the newest entry is all a reader needs).
    The last entry of a replaced generation is its *seal*; after it no commit
    can be created in that generation (its number is taken), which is what
    fences a member that lost its partitions (``CommitFailedError``).

Liveness is judged by each member on its own monotonic clock: a member is dead
when its newest heartbeat has not changed for its ``session_timeout_ms``. Wall
clocks are compared only for a first impression of a heartbeat and by one-shot
observers (the CLI, standalone commits), within :data:`MAX_CLOCK_SKEW_MS`.
Safety (one owner per partition per generation, commits fenced by generation)
does not depend on any clock; see PROTOCOL.md 13, I11.

The code lives in :mod:`coordinator.groups.documents` (the JSON documents),
:mod:`coordinator.groups.client` (GroupClient, list_groups), :mod:`coordinator.groups.transaction_offsets`
(materialize_offsets),
:mod:`coordinator.groups.member`
(GroupMember, RebalanceHooks), :mod:`coordinator.groups.completion` (the next generation of a rebalance,
choose_protocol), :mod:`coordinator.groups.assignors` (the partition
assignors) and :mod:`coordinator.keys` (names); the names below are this package's public surface
(``from coordinator.groups import ...``).

May import: ``segment_format`` and ``coordinator.keys``; never ``coordinator.transactions``,
``coordinator.leases`` or ``coordinator.maintainer`` (checked by ``tests/test_layering.py``).
"""

from __future__ import annotations

from segment_format.records import now_ms

from ..keys import (
    GROUPS,
    commit_key,
    commits_prefix,
    generation_key,
    generations_prefix,
    group_prefix,
    heartbeat_key,
    lag_offsets_prefix,
    members_prefix,
    rebalance_key,
    rebalances_prefix,
    validate_group_id,
)
from .client import (
    GC_DELAY_MS,
    MAX_STALENESS_MS,
    GroupClient,
    list_groups,
)
from .completion import choose_protocol
from .documents import (
    MAX_CLOCK_SKEW_MS,
    Generation,
    GenerationSealed,
    GroupDescription,
    Heartbeat,
    MemberInfo,
    make_member_id,
    offsets_from_json,
    offsets_to_json,
)
from .member import GroupMember, RebalanceHooks
from .transaction_offsets import materialize_offsets

__all__ = [
    "GC_DELAY_MS",
    "GROUPS",
    "MAX_CLOCK_SKEW_MS",
    "MAX_STALENESS_MS",
    "Generation",
    "GenerationSealed",
    "GroupClient",
    "GroupDescription",
    "GroupMember",
    "Heartbeat",
    "MemberInfo",
    "RebalanceHooks",
    "choose_protocol",
    "commit_key",
    "commits_prefix",
    "generation_key",
    "generations_prefix",
    "group_prefix",
    "heartbeat_key",
    "lag_offsets_prefix",
    "list_groups",
    "make_member_id",
    "materialize_offsets",
    "members_prefix",
    "now_ms",
    "offsets_from_json",
    "offsets_to_json",
    "rebalance_key",
    "rebalances_prefix",
    "validate_group_id",
]
