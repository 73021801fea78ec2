"""A partition assignor plog has never heard of, and a group member process that uses it.

Used by ``tests/test_gateway_client_assigned.py``: its kafka-python consumers name ``lopsided`` as their only
assignment strategy, so the gateway can only hand the assignment to the group's leader, a client (PROTOCOL.md
11.4, *Client-assigned generations*). ``lopsided`` gives partitions out as none of plog's assignors would: each
member but the one with the highest id gets one partition, that one gets all the rest.

Run as a real process (to be SIGKILLed)::

    python -m tests.client_assigned_members BOOTSTRAP GROUP TOPIC

It joins GROUP subscribed to TOPIC and prints one JSON line ``{"member": ..., "generation": ...,
"partitions": [...]}`` each time its generation or assignment changes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from kafka.coordinator.assignors.abstract import AbstractPartitionAssignor, ConsumerProtocolAssignment
from kafka.coordinator.assignors.abstract import ConsumerProtocolSubscription as Subscription
from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor

NAME = "lopsided"
#: Timeouts that keep a test to seconds (Kafka's minimum session timeout is 6 s).
FAST: dict[str, Any] = {
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 1000,
    "enable_auto_commit": False,
    "request_timeout_ms": 30_000,
    "metadata_max_age_ms": 1000,
}


def lopsided(member_ids: Sequence[str], partitions: Sequence[tuple[str, int]]) -> dict[str, list[tuple[str, int]]]:
    """The assignment: by id order, every member but the last gets one partition, the last all the rest."""
    ids = sorted(member_ids)
    tps = sorted(partitions)
    out: dict[str, list[tuple[str, int]]] = {m: [] for m in ids}
    for i, member in enumerate(ids[:-1]):
        out[member] = tps[i : i + 1]
    if ids:
        out[ids[-1]] = tps[len(ids) - 1 :]
    return out


class LopsidedAssignor(AbstractPartitionAssignor):
    """kafka-python's assignor interface (like its RoundRobinPartitionAssignor), computing :func:`lopsided`."""

    name = NAME
    version = 0
    #: the member ids of every assignment this process computed (it was the leader), in order
    computed: list[tuple[str, ...]] = []

    @classmethod
    def assign(cls, cluster: Any, members: Any) -> dict[str, ConsumerProtocolAssignment]:
        topics = sorted({t for m in members for t in m.metadata.topics})
        tps = [(t, p) for t in topics for p in sorted(cluster.partitions_for_topic(t) or ())]
        shares = lopsided([m.member_id for m in members], tps)
        cls.computed.append(tuple(sorted(shares)))
        out = {}
        for member, share in shares.items():
            by_topic: dict[str, list[int]] = {}
            for t, p in share:
                by_topic.setdefault(t, []).append(p)
            out[member] = ConsumerProtocolAssignment(cls.version, sorted(by_topic.items()), b"")
        return out

    @classmethod
    def metadata(cls, topics: Any) -> Subscription:
        return Subscription(cls.version, list(topics), b"")

    @classmethod
    def on_assignment(cls, assignment: Any, generation: int) -> None:
        pass


class OwnCooperativeAssignor(CooperativeStickyAssignor):
    """kafka-python's cooperative sticky assignor under a name plog does not know: the client runs KIP-429's
    incremental rebalances itself (members rejoin with the partitions they own; the leader withholds moves)."""

    name = "own-cooperative"


def member_id(consumer: Any) -> str | None:
    """The member id of a kafka-python consumer's stable generation (None while it rebalances)."""
    gen = consumer._coordinator.generation_if_stable()
    return None if gen is None else str(gen.member_id)


def main(bootstrap: str, group: str, topic: str) -> None:
    import kafka

    consumer = kafka.KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap.split(","),
        group_id=group,
        partition_assignment_strategy=[LopsidedAssignor],
        **FAST,
    )
    shown: tuple[Any, ...] = ()
    while True:  # polled back to back (see :class:`tests.test_gateway_client_assigned.Member` on why)
        consumer.poll(timeout_ms=100)
        gen = consumer._coordinator.generation_if_stable()
        if gen is None:
            continue
        now = (str(gen.member_id), int(gen.generation_id), sorted(tp.partition for tp in consumer.assignment()))
        if now != shown:
            shown = now
            print(json.dumps({"member": now[0], "generation": now[1], "partitions": now[2]}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
