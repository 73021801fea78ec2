"""The consumer's part in its group (PROTOCOL.md 11.4): membership, rebalances, offset commits.

``ConsumerGroup`` joins the group when the consumer subscribes (a ``GroupMember`` of
``coordinator/groups.py``, whose background thread heartbeats), runs the group's rebalance
steps from ``poll`` (``step``: auto-commit when due, then ``GroupMember.on_poll``, which calls
back ``_RebalanceHooks`` to revoke and assign partitions in the consumer's ``Fetcher`` and to
call the subscriber's listener), commits offsets (``commit``, ``commit_async``, fenced by
generation; without a subscription as a standalone commit) and leaves the group. A consumer
without a ``group_id`` has one too: it refuses offset calls.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from coordinator.groups import Generation, GroupClient, GroupMember, make_member_id
from pyspark_logsource.client.fetcher import Fetcher
from pyspark_logsource.client.types import TopicPartition, check_tp
from segment_format.errors import CommitFailedError, InvalidConfigError, UnknownTopicOrPartitionError
from segment_format.parallel import io_map
from segment_format.root import LogRoot

__all__ = ["ConsumerGroup"]

log = logging.getLogger(__name__)


def _commit_offset(tp: TopicPartition, value: object) -> int:
    """An offset to commit: an int, or anything with an ``offset`` (kafka-python's OffsetAndMetadata)."""
    offset = getattr(value, "offset", value)
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise InvalidConfigError(f"commit offset {value!r} for {tp} must be a non-negative int")
    return offset


class ConsumerGroup:
    """One consumer's membership of ``group_id`` (None: no group) over its ``fetcher``'s assignment and positions."""

    def __init__(self, root: LogRoot, group_id: str | None, config: dict[str, Any], fetcher: Fetcher) -> None:
        self.root = root
        self.group_id = group_id
        self.config = config
        self.fetcher = fetcher
        #: The live membership, from the first ``join`` until ``leave``.
        self.member: GroupMember | None = None
        #: The subscriber's rebalance listener (``on_partitions_revoked``/``on_partitions_assigned``), if any.
        self.listener: Any = None
        self._group_client: GroupClient | None = None
        self._hooks = _RebalanceHooks(self)
        self._standalone_id = make_member_id(config["client_id"])
        self._last_auto_commit = time.monotonic()
        self._executor: ThreadPoolExecutor | None = None
        # What this member's commits left in the group's log: (generation, offsets). Only the owner of a
        # partition commits it in a generation (PROTOCOL.md 11.4), so while the generation and the
        # positions stay the same, an auto-commit would write (and pay for) the same offsets again.
        self._commit_lock = threading.Lock()
        self._committed_in: tuple[int, dict[tuple[str, int], int]] | None = None

    # ------------------------------------------------------------------ membership

    def join(self, topics: set[str]) -> None:
        """Join the group (once), subscribed to ``topics``; a no-op without a ``group_id`` or when joined."""
        if self.group_id is None or self.member is not None:
            return
        self.member = GroupMember(
            self.root.store,
            self.group_id,
            client_id=self.config["client_id"],
            strategies=self.config["partition_assignment_strategy"],
            session_timeout_ms=self.config["session_timeout_ms"],
            heartbeat_interval_ms=self.config["heartbeat_interval_ms"],
            max_poll_interval_ms=self.config["max_poll_interval_ms"],
            partitions_for=self._partition_counts,
            metadata_max_age_ms=self.config["metadata_max_age_ms"],
        )
        self.member.start(topics)

    def set_topics(self, topics: set[str]) -> None:
        """Tell the group what this member now subscribes to (the group assigns the partitions)."""
        if self.member is not None:
            self.member.set_topics(topics)

    def _partition_counts(self, topics: Iterable[str], fresh: bool) -> dict[str, int]:
        """Partition counts from the root's topic cache (shared with the fetcher), read now if ``fresh``.

        The member's periodic check takes the cached metadata, which the fetcher keeps at most
        ``METADATA_MAX_AGE_S`` old, so the two do not each read the same metadata on their own
        schedules; before deciding that the counts changed, and when completing a rebalance, the
        member asks for a fresh read.
        """
        max_age_s = self.config["metadata_max_age_ms"] / 1000  # never staler than the user asked

        def count(name: str) -> int | None:
            try:
                return self.root.topic(name, refresh=fresh, max_age_s=max_age_s).partitions
            except UnknownTopicOrPartitionError:
                return None

        # Cached metadata stays current while the root notice is unchanged (the consumer follows it,
        # PROTOCOL.md 9.1): an idle check costs at most one GET; reads that are needed overlap.
        names = sorted(set(topics))
        return {name: n for name, n in zip(names, io_map(count, names), strict=True) if n is not None}

    def client(self) -> GroupClient:
        """The group's offsets client; ``InvalidConfigError`` without a ``group_id``."""
        if self.group_id is None:
            raise InvalidConfigError("offsets can only be committed or read with a group_id")
        if self.member is not None:
            return self.member.client
        if self._group_client is None:
            self._group_client = GroupClient(self.root.store, self.group_id)
        return self._group_client

    def step(self) -> None:
        """Run from ``poll``: auto-commit when due, then the group's rebalance steps (callbacks run here)."""
        if self.group_id is None:
            return
        if (
            self.config["enable_auto_commit"]
            and (time.monotonic() - self._last_auto_commit) * 1000 >= self.config["auto_commit_interval_ms"]
        ):
            self.auto_commit()
        if self.member is not None:
            self.member.on_poll(self._hooks)

    # ------------------------------------------------------------------ offsets

    def auto_commit(self) -> None:
        """Commit the positions now, unless they are what this member already committed in its generation.

        Kafka's consumers commit every interval whatever moved; here each commit
        is a billed PUT (and a LIST and a GET), so an idle member commits nothing.
        A failure (the group rebalanced) is logged, not raised.
        """
        self._last_auto_commit = time.monotonic()
        try:
            self.client()
            positions = self._positions_to_commit()
            if not self._already_committed(positions):
                self._commit_now(positions)
        except CommitFailedError as exc:
            log.warning("auto-commit of group %s failed: %s", self.group_id, exc)

    def _already_committed(self, offsets: Mapping[tuple[str, int], int]) -> bool:
        """Whether this member's commits in its adopted generation already hold exactly ``offsets``."""
        return self._already_committed_by(self.member, offsets)

    def _already_committed_by(self, member: GroupMember | None, offsets: Mapping[tuple[str, int], int]) -> bool:
        done = self._committed_in
        if member is None or member.adopted is None or done is None or done[0] != member.adopted.number:
            return False
        return all(done[1].get(tp) == offset for tp, offset in offsets.items())

    def _note_committed(self, generation: int, offsets: Mapping[tuple[str, int], int]) -> None:
        """Remember ``offsets`` as committed in ``generation`` (merged with earlier commits there)."""
        done = self._committed_in
        before = done[1] if done is not None and done[0] == generation else {}
        self._committed_in = (generation, {**before, **offsets})

    def _positions_to_commit(self) -> dict[tuple[str, int], int]:
        f = self.fetcher
        return {(tp.topic, tp.partition): f.positions[tp] for tp in f.assignment if tp in f.positions}

    def _offsets_to_commit(self, offsets: Mapping[TopicPartition, Any] | None) -> dict[tuple[str, int], int]:
        if offsets is None:
            return self._positions_to_commit()
        if not isinstance(offsets, Mapping):
            raise InvalidConfigError(f"commit offsets must be a dict of TopicPartition -> offset, got {offsets!r}")
        out = {}
        for tp, value in offsets.items():
            tp = check_tp(tp)
            out[(tp.topic, tp.partition)] = _commit_offset(tp, value)
        return out

    def _commit_now(self, offsets: dict[tuple[str, int], int]) -> None:
        if not offsets:
            return
        member = self.member
        if member is not None:
            # Serialized with the record of what was committed, so that record is never older than the log.
            with self._commit_lock:
                adopted = member.adopted
                member.commit(offsets)
                if adopted is not None and member.adopted is adopted:
                    self._note_committed(adopted.number, offsets)
        else:
            self.client().standalone_commit(offsets, self._standalone_id)

    def commit(self, offsets: Mapping[TopicPartition, Any] | None = None) -> None:
        """Commit ``offsets`` ({tp: next offset to read}); by default the assigned partitions' positions."""
        self.client()
        self._commit_now(self._offsets_to_commit(offsets))

    def commit_async(
        self,
        offsets: Mapping[TopicPartition, Any] | None = None,
        callback: Callable[[dict[TopicPartition, int], Exception | None], Any] | None = None,
    ) -> Future[None]:
        """Commit in the background; ``callback(offsets, exception_or_None)`` runs when it is done."""
        self.client()
        chosen = self._offsets_to_commit(offsets)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="plog-commit")

        def run() -> None:
            error: Exception | None = None
            try:
                self._commit_now(chosen)
            except Exception as exc:  # noqa: BLE001 - handed to the callback and the future
                error = exc
            if callback is not None:
                callback({TopicPartition(t, p): o for (t, p), o in chosen.items()}, error)
            if error is not None:
                raise error

        return self._executor.submit(run)

    def committed(self, partition: TopicPartition) -> int | None:
        """The group's committed offset of ``partition`` (the next offset to read), or None."""
        tp = check_tp(partition)
        return self.client().committed().get((tp.topic, tp.partition))

    # ------------------------------------------------------------------ leaving

    def leave(self, autocommit: bool) -> None:
        """Leave the group: commit the positions (with auto-commit on), revoke everything, stop the member."""
        member, self.member = self.member, None
        if member is None:
            return
        try:
            if autocommit and self.config["enable_auto_commit"] and member.adopted is not None:
                try:
                    positions = self._positions_to_commit()
                    if not self._already_committed_by(member, positions):
                        member.commit(positions)
                except CommitFailedError as exc:
                    log.warning("commit of group %s on leaving failed: %s", self.group_id, exc)
            revoked = sorted(self.fetcher.assignment)
            self.fetcher.note_assignment([])
            if revoked and self.listener is not None:
                self.listener.on_partitions_revoked(revoked)
        finally:
            member.close()

    def close(self) -> None:
        """Wait for ``commit_async`` calls still running (after ``leave``)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)


class _RebalanceHooks:
    """The consumer's side of a rebalance (``coordinator.groups.RebalanceHooks``), run from ``poll``."""

    def __init__(self, group: ConsumerGroup) -> None:
        self.group = group

    def commit_before_revoke(self) -> None:
        if self.group.config["enable_auto_commit"]:
            self.group.auto_commit()

    def revoke(self, partitions: list[tuple[str, int]]) -> None:
        g, f = self.group, self.group.fetcher
        gone = {TopicPartition(*tp) for tp in partitions}
        f.note_assignment([tp for tp in f.assignment if tp not in gone])
        if g.listener is not None:
            g.listener.on_partitions_revoked(sorted(gone))

    def assign(
        self,
        generation: Generation,
        assigned: list[tuple[str, int]],
        added: list[tuple[str, int]],
        retained: list[tuple[str, int]],
    ) -> None:
        g, f = self.group, self.group.fetcher
        tps = [TopicPartition(*tp) for tp in assigned]
        keep = {TopicPartition(*tp) for tp in retained}
        positions = {tp: f.positions[tp] for tp in tps if tp in keep and tp in f.positions}
        if len(positions) < len(tps):
            committed = g.client().committed(generation)
            for tp in tps:
                if tp not in positions and (tp.topic, tp.partition) in committed:
                    positions[tp] = committed[(tp.topic, tp.partition)]
            # Positions taken from the log are committed already: auto-commit need not write them again.
            g._note_committed(
                generation.number, {(tp.topic, tp.partition): positions[tp] for tp in positions if tp not in keep}
            )
        f.positions = positions  # the rest start at auto_offset_reset when first read
        f.note_assignment(tps)
        f.next_partition = 0
        if g.listener is not None:
            cooperative = g.member is not None and g.member.cooperative
            g.listener.on_partitions_assigned(
                sorted(TopicPartition(*tp) for tp in (added if cooperative else assigned))
            )
