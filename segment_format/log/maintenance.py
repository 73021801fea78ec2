"""Maintenance of a partition: merging small appended objects, retention, deleting records, garbage collection.

Kafka's ``LogCleaner`` and retention do this work on a broker; here any
process may (PROTOCOL.md 10). Everything it writes is a new object:
merged segments are rewritten objects (generation 1) created beside the
appended objects they cover (and runs of small merged segments are merged
again into the next generation, so small appends never pile up while a 64 MiB
segment fills: PROTOCOL.md 10, *Tiers*), and a new log start is a start marker. The
objects left off the chain are deleted only ``file.delete.delay.ms`` after
they left it, so that a reader or writer holding an older view never finds
an object it needs gone. On a compacted topic a pass compacts instead of
merging when the partition is due (:mod:`segment_format.log.compaction`), and its
merges name their objects with a rewrite id and state what compaction reads
(PROTOCOL.md 11.6). In a root listing ``boundedHistory`` merges resolve the
transactional batches they copy (aborted ones dropped, committed ones written as
plain records) and name every object with a rewrite id, so that the log stops
needing transaction decisions (PROTOCOL.md 10, *Resolving transactions*).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..documents import JsonDocument
from ..errors import CorruptRecordError, ObjectNotFoundError, OffsetOutOfRangeError
from ..layout import new_rewrite_id, parse_segment_name, parse_start_marker, rewritten_name, start_marker_name
from ..records import now_ms
from ..segment import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    WHOLE_READ,
    EncodedBatch,
    SegmentIndex,
    assemble_segment,
    raw_messages,
)
from ..stores.base import ObjectInfo
from ..topic import is_compacted
from .chain import LogChain, LogView, SegmentRef
from .compaction import LogCompactor
from .compaction_plan import DecisionTimes, is_clean
from .move import RunMover, is_run, segments_only
from .move_reads import MoveCandidate, MoveReads
from .reader import TransactionResolver
from .transaction_resolution import resolve_transactions

#: Objects a merge group closes at, whatever their size (PROTOCOL.md 10, *Tiers*): with the default
#: 64 MiB ``segment.bytes`` a partition of small appends would otherwise keep tens of thousands of
#: objects until 64 MiB accumulate. Each generation keeps fewer than this many objects waiting.
MERGE_FANOUT = 16


def _timestamp_ceiling(view: LogView) -> float:
    """No record of ``view`` is later than this: its end's running maximum (6.1), or +inf when unknown.

    Merging closes a group when a record comes ``segment.ms`` after the group's first; while the
    ceiling is not that late no object's index needs reading to know it, only the group's first.
    """
    return view.running_max_timestamp if view.running_max_timestamp >= 0 else float("inf")


def _holds_transactional(idx: SegmentIndex) -> bool:
    """Whether the object holds a transactional batch (markers aside)."""
    return bool((((idx.attributes & ATTR_TRANSACTIONAL) != 0) & ((idx.attributes & ATTR_CONTROL) == 0)).any())


def _merged_transaction_timeout(indexes: list[SegmentIndex], transactional: list[bool]) -> int | None:
    """The timeout a merged object states for its transactions (PROTOCOL.md 11.2, *Timeouts*).

    The largest of its inputs', so that no transaction is aborted sooner than its own timeout
    allows; none when an input whose transactional batches the object still holds as such
    (``transactional``) states none (their timeout is unknown), or when no input states one.
    """
    timeouts = []
    for idx, holds in zip(indexes, transactional, strict=True):
        if idx.meta.transaction_timeout_ms is not None:
            timeouts.append(idx.meta.transaction_timeout_ms)
        elif holds:
            return None
    return max(timeouts, default=None)


@dataclass(frozen=True)
class _MergePass:
    """How one pass merges: when its listing was taken, and how it resolves and names objects."""

    listed_monotonic: float
    #: Decides the transactional batches merges copy (PROTOCOL.md 10, *Resolving transactions*); None: copy them.
    resolver: TransactionResolver | None = None
    #: Every object is named with a rewrite id and created within W of the listing (a compacted topic, 11.6;
    #: a root listing ``boundedHistory``, 10).
    named: bool = False
    #: Every object is created within W of the listing, named or not: the root lists ``boundedHistory``,
    #: settled or not, so decisions may be collected once it settles (PROTOCOL.md 10, *Resolving transactions*).
    within_w: bool = False


def _compaction_fields(group: list[SegmentRef], indexes: list[SegmentIndex]) -> dict[str, int]:
    """What a merge on a compacted topic states for compaction (PROTOCOL.md 11.6): the end of its inputs'
    clean prefix, and, when every input has one, the latest of their first compactions."""
    out = {}
    clean_end = None
    for ref, idx in zip(group, indexes, strict=True):
        if not is_clean(ref, idx):
            break
        clean_end = idx.meta.next_offset
    if clean_end is not None:
        out["clean_end"] = clean_end
    firsts = [idx.meta.first_compacted_ms for idx in indexes]
    if all(first is not None for first in firsts):
        out["first_compacted_ms"] = max(first for first in firsts if first is not None)
    return out


@dataclass(frozen=True)
class StartMarker(JsonDocument):
    """A start marker ``start/<offset>.json`` (PROTOCOL.md 7.1): the log start offset is at least ``offset``."""

    #: Markers have always been written with ``json.dumps``' default spacing; kept, so their bytes do not change.
    json_separators = (", ", ": ")

    offset: int
    created_ms: int

    @classmethod
    def read(cls, key: str, data: bytes) -> StartMarker:
        """Parse the marker stored at ``key``; ``CorruptRecordError`` naming the key and the field unless
        it is one (the offset in the name is authoritative: a body saying otherwise is corrupt)."""
        return cls.from_json(data, what=key, keyed={"offset": parse_start_marker(key.rsplit("/", 1)[-1])})


class LogCleaner:
    """Merges, retires and deletes the objects of one partition, within its topic's configuration."""

    def __init__(
        self,
        chain: LogChain,
        writer_id: str,
        name: str,
        compactor: LogCompactor | None = None,
        topic: str = "",
        partition: int = 0,
    ) -> None:
        #: The topic is typed (PROTOCOL.md 11.8): merge groups close where the value schema version changes.
        self.typed = False
        #: Whether merges resolve transactions and name every object with an id: the root lists
        #: ``boundedHistory`` and may use it (PROTOCOL.md 10, *Resolving transactions*). The root sets it.
        self.bounded_history: Callable[[], bool] = lambda: False
        #: Whether the root lists ``boundedHistory`` at all (settled or not): merges then act within W.
        self.history_listed: Callable[[], bool] = lambda: False
        self.topic = topic
        self.partition = partition
        self.chain = chain
        self.writer_id = writer_id
        self.name = name
        self.compactor = compactor
        #: (key, created_ms) of the last start marker read: markers are immutable (PROTOCOL.md 10).
        self._marker: tuple[str, int] | None = None

    def delete_records(self, before_offset: int) -> int:
        """Advance the log start offset to ``before_offset`` (Kafka's DeleteRecords); returns the new start."""
        view = self.chain.view()
        if not view.start_offset <= before_offset <= view.end_offset:
            raise OffsetOutOfRangeError(
                f"cannot move the start of {self.name} to {before_offset}: "
                f"valid offsets are {view.start_offset}..{view.end_offset}"
            )
        if before_offset > view.start_offset:
            self._write_start_marker(before_offset)
        return self.chain.view().start_offset

    def _write_start_marker(self, offset: int) -> None:
        body = StartMarker(offset=offset, created_ms=now_ms()).to_json()
        self.chain.store.put_if_absent(self.chain.prefix + "start/" + start_marker_name(offset), body)

    def merge_segments(self, resolver: TransactionResolver | None = None) -> int:
        """Merge sealed appended objects at the frontier into segments of up to ``segment.bytes``.

        A group closes when the next object would take it past ``segment.bytes``
        or more than ``segment.ms`` after its first record. Only closed groups
        of two or more objects are rewritten; batches are copied verbatim, except that in a root
        listing ``boundedHistory`` the transactional ones ``resolver`` finds decided are resolved.
        Returns how many merged segments were written.
        """
        return self._on_fresh_view(lambda view, listed: self._merge(view, listed, resolver))

    def compact(
        self,
        now: int | None = None,
        resolver: TransactionResolver | None = None,
        decided_ms: DecisionTimes | None = None,
        force: bool = False,
    ) -> int:
        """Compact the partition now if it is due (or ``force``: whatever is dirty); returns objects written."""
        compactor = self.compactor
        if compactor is None or not is_compacted(self.chain.config):
            return 0
        at = now_ms() if now is None else now
        return self._on_fresh_view(
            lambda view, listed: compactor.compact(view, listed, at, resolver, decided_ms, force)
        )

    def _on_fresh_view(self, step: Callable[[LogView, float], int]) -> int:
        """Run ``step`` on a fresh listing (with the time it was taken), and list again if it wrote anything.

        The time is read before the listing, so that a W bound measured from it is never looser than the
        listing's real age (another thread may list the chain meanwhile).
        """
        listed = time.monotonic()
        written = step(self._segments(self.chain.view()), listed)
        if written:
            self.chain.view()
        return written

    def maintain(
        self,
        now: int | None = None,
        listing: Sequence[ObjectInfo] | None = None,
        listed_monotonic: float = 0.0,
        resolver: TransactionResolver | None = None,
        decided_ms: DecisionTimes | None = None,
        move_reads: MoveReads | None = None,
    ) -> tuple[int, int]:
        """One maintenance pass: rewrite (compact when due, else merge), apply retention, collect garbage;
        returns (rewritten, deleted).

        With ``listing`` (a topic-wide listing's part, taken at ``listed_monotonic``: a
        self-maintenance pass) the three steps work on that one listing and list nothing
        after their own writes (PROTOCOL.md 10.1); the next pass sees them. Without it (an
        explicit ``plog maintain``) the partition is listed, and listed again after a step
        changed it, so that one command also collects what its own merge superseded when
        ``file.delete.delay.ms`` allows. ``resolver`` and ``decided_ms`` decide transactions for
        compaction (PROTOCOL.md 11.6; without them it stops at the first transactional batch) and, in a
        root listing ``boundedHistory``, ``resolver`` those merges resolve (PROTOCOL.md 10). A shared
        partition's moves take their bytes from ``move_reads`` when given (:mod:`.move_reads`).
        """
        if listing is not None:
            try:
                view = self.chain.view_from(listing, listed_monotonic)
                moved, view = self._move(view, listed_monotonic, now, resolver, move_reads)
                rewritten = moved + self._rewrite(view, listed_monotonic, now, resolver, decided_ms)
                # Each step reads the clock when it runs, as when called alone.
                self._retire(view, now_ms() if now is None else now)
                return rewritten, self._collect(view, now_ms() if now is None else now)
            except ObjectNotFoundError:
                pass  # the listing is older than another maintainer's merge and its deletions: list afresh
        view = self.chain.view()
        moved, view = self._move(view, self.chain.listed_monotonic, now, resolver, move_reads)
        if moved:
            view = self._segments(self.chain.view())
        rewritten = moved + self._rewrite(view, self.chain.listed_monotonic, now, resolver, decided_ms)
        if rewritten > moved:
            view = self._segments(self.chain.view())
        if self._retire(view, now_ms() if now is None else now) > view.start_offset:
            view = self._segments(self.chain.view())
        deleted = self._collect(view, now_ms() if now is None else now)
        if deleted:
            self.chain.view()
        return rewritten, deleted

    def _segments(self, view: LogView) -> LogView:
        """A shared partition's view without its commit part (merging, retention and collection work on
        segments, PROTOCOL.md 10.2); any other view as it is."""
        return view if view.chain_end is None else segments_only(view, view.chain_end)

    def move_candidate(
        self, listing: Sequence[ObjectInfo] | None, listed_monotonic: float, now: int | None
    ) -> MoveCandidate:
        """The runs a pass on ``listing`` (None: a fresh one) could move, with their indexes, and how far they
        have come towards a move: what a pass over many partitions plans and reads for them all at once
        (:mod:`.move_reads`). No runs for a partitioned topic."""
        try:
            view = self.chain.view() if listing is None else self.chain.view_from(listing, listed_monotonic)
        except ObjectNotFoundError:
            return MoveCandidate([], 0.0)
        if view.chain_end is None:
            return MoveCandidate([], 0.0)
        mover = RunMover(self.chain, self.writer_id, self.topic, self.partition)
        runs = [self.chain.index(ref) for ref in view.segments if is_run(ref)]
        return MoveCandidate(runs, mover.reach(view, now_ms() if now is None else now))

    def _move(
        self,
        view: LogView,
        listed_monotonic: float,
        now: int | None,
        resolver: TransactionResolver | None,
        reads: MoveReads | None = None,
    ) -> tuple[int, LogView]:
        """Move a shared partition's runs into a segment when due (PROTOCOL.md 10.2); returns how many
        objects were written and the view the other steps work on (its segments). A partition handed a
        round's ``reads`` was planned to move with others, at half the bounds (:func:`.move_reads.due_together`)."""
        if view.chain_end is None:
            return 0, view
        mover = RunMover(self.chain, self.writer_id, self.topic, self.partition, reads)
        runs = mover.due_runs(view, now_ms() if now is None else now, together=reads is not None)
        bounded = self.bounded_history()
        moved = mover.move(runs, listed_monotonic, resolver if bounded else None, view.chain_end) if runs else 0
        return moved, self._segments(view)

    def _rewrite(
        self,
        view: LogView,
        listed_monotonic: float,
        now: int | None,
        resolver: TransactionResolver | None,
        decided_ms: DecisionTimes | None,
    ) -> int:
        """Compact if the topic is compacted and the partition due (11.6); else merge."""
        if self.compactor is not None and is_compacted(self.chain.config):
            at = now_ms() if now is None else now
            compacted = self.compactor.compact(view, listed_monotonic, at, resolver, decided_ms)
            if compacted:
                return compacted  # the compacted objects are already segment-sized: nothing left to merge
        return self._merge(view, listed_monotonic, resolver)

    def _merge(self, view: LogView, listed_monotonic: float, resolver: TransactionResolver | None) -> int:
        bounded = self.bounded_history()
        named = bounded or is_compacted(self.chain.config)
        how = _MergePass(listed_monotonic, resolver if bounded else None, named, named or self.history_listed())
        return self._merge_appended(view, how) + self._merge_tiers(view, how)

    def _merge_appended(self, view: LogView, how: _MergePass) -> int:
        appended = [s for s in view.segments if s.generation == 0]
        sealed = appended[:-1]  # never touch the tail object
        limit_bytes = self.chain.config["segment.bytes"]
        limit_ms = self.chain.config["segment.ms"]
        ceiling = _timestamp_ceiling(view)
        # Indexes of objects the merge may take are read as the merge reads them (whole, when small), so
        # that the bytes stay cached for it: a group's first object would otherwise be read twice.
        written = 0
        group: list[SegmentRef] = []
        group_bytes = 0
        group_first_ts = 0
        group_version: tuple[int | None, str | None] = (None, None)
        for ref in sealed:
            closes = bool(group) and (group_bytes + ref.size > limit_bytes or len(group) >= MERGE_FANOUT)
            if group and not closes and ceiling - group_first_ts > limit_ms:  # else no record can be late enough
                closes = self.chain.index(ref, WHOLE_READ).meta.max_timestamp - group_first_ts > limit_ms
            if group and not closes and self.typed:  # an object holds one value schema version (11.8)
                closes = self._version(ref) != group_version
            if closes:
                # Written even when it holds one object (a copy): a merge must start at the frontier, so
                # a group left unwritten here would make the next one skip its offsets (PROTOCOL.md 10).
                done = self._write_merged(group, how, alone=True)
                if not done:
                    return written  # not sent (its listing is too old): nothing after it may be merged
                written += done
                group, group_bytes = [], 0
            if not group:
                group_first_ts = self.chain.index(ref, WHOLE_READ).meta.min_timestamp
                group_version = self._version(ref)
            group.append(ref)
            group_bytes += ref.size
        if group and (
            group_bytes >= limit_bytes
            or len(group) >= MERGE_FANOUT
            or (
                appended
                and len(sealed)
                and self.chain.index(appended[-1]).meta.min_timestamp - group_first_ts > limit_ms
            )
        ):
            written += self._write_merged(group, how)
        return written

    def _merge_tiers(self, view: LogView, how: _MergePass) -> int:
        """Merge runs of small rewritten elements of one generation into the next (PROTOCOL.md 10, *Tiers*)."""
        limit_bytes = self.chain.config["segment.bytes"]
        limit_ms = self.chain.config["segment.ms"]
        ceiling = _timestamp_ceiling(view)
        compacted = is_compacted(self.chain.config)
        written = 0
        group: list[SegmentRef] = []
        group_bytes = group_first_ts = 0
        for ref in view.segments:
            if ref.generation == 0:
                break  # the appended part: merged above
            if compacted and is_clean(ref, self.chain.index(ref)):
                # Compaction joins clean objects itself, without resetting their tombstones' clocks
                # (PROTOCOL.md 11.6); a merge cannot tell which hold tombstones.
                group, group_bytes = [], 0
                continue
            joins = (
                group
                and ref.generation == group[0].generation
                and ref.base_offset == group[-1].end_offset
                and 2 * ref.size < limit_bytes
                and (not self.typed or self._version(ref) == self._version(group[0]))
            )
            if joins:
                late = ceiling - group_first_ts > limit_ms and (
                    self.chain.index(ref, WHOLE_READ).meta.max_timestamp - group_first_ts > limit_ms
                )
                if group_bytes + ref.size > limit_bytes or late:
                    written += self._write_merged(group, how)  # full: it can grow no more
                    joins = False
            if not joins:
                group, group_bytes = [], 0
                if 2 * ref.size >= limit_bytes:
                    continue  # a full segment starts no run
                group_first_ts = self.chain.index(ref, WHOLE_READ).meta.min_timestamp
            group.append(ref)
            group_bytes += ref.size
            if len(group) >= MERGE_FANOUT:
                written += self._write_merged(group, how)
                group, group_bytes = [], 0
        return written

    def _version(self, ref: SegmentRef) -> tuple[int | None, str | None]:
        """A typed topic's object's value schema version and schema (its index, read whole as the merge
        reads it): objects merge only when both are equal, so a merge never restates a schema."""
        meta = self.chain.index(ref, WHOLE_READ).meta
        return meta.value_schema_version, meta.value_schema

    def _write_merged(self, group: list[SegmentRef], how: _MergePass, alone: bool = False) -> int:
        """Write ``group`` as one rewritten object; a lone object only with ``alone``. Returns 1 if written."""
        if len(group) < (1 if alone else 2):
            return 0
        batches: list[EncodedBatch] = []
        indexes = []
        transactional = []  # per input: whether the object still holds its transactional batches as such
        for ref in group:
            # One request per object whose index is not known yet: the index and the batches come whole.
            idx = self.chain.index(ref, WHOLE_READ)
            indexes.append(idx)
            raw = raw_messages(self.chain.store, idx, self.chain.cache.objects.take(ref.key))
            holds = bool((idx.transactions >= 0).any())
            if how.resolver is not None and _holds_transactional(idx):
                # Decided batches resolved, the rest copied (PROTOCOL.md 10, *Resolving transactions*).
                raw, holds = resolve_transactions(idx, raw, how.resolver, self.topic, self.partition)
            transactional.append(holds)
            batches.extend(raw)
        first, last = indexes[0], indexes[-1]
        if any(
            (idx.meta.value_schema_version, idx.meta.value_schema)
            != (first.meta.value_schema_version, first.meta.value_schema)
            for idx in indexes
        ):
            return 0  # never mix versions (11.8); the grouping above prevents it, this stops the pass if not
        generation = group[0].generation + 1
        created_ms = now_ms()
        fields = {
            "base_offset": group[0].base_offset,
            "next_offset": last.meta.next_offset,
            "running_max_timestamp": last.meta.running_max_timestamp,
            "compression": first.meta.compression,
            "created_ms": created_ms,
            "writer": self.writer_id,
            "generation": generation,
        }
        bounds = [idx.meta.append_bounds() for idx in indexes]
        fields["min_append_ms"] = min(low for low, _ in bounds)  # carried so that compaction can trust them (11.6)
        fields["max_append_ms"] = max(high for _, high in bounds)
        if not batches:  # only empty compacted objects (a topic switched from compact): keep their times
            fields["min_timestamp"] = min(idx.meta.min_timestamp for idx in indexes)
            fields["max_timestamp"] = max(idx.meta.max_timestamp for idx in indexes)
        timeout = _merged_transaction_timeout(indexes, transactional)
        if timeout is not None:
            fields["transaction_timeout_ms"] = timeout
        rewrite_id = None
        send_by = float("inf")
        if how.named or how.within_w:
            # Every rewrite of a compacted topic, or of a root listing boundedHistory, acts on a listing at most
            # W old and names its object with an id (PROTOCOL.md 10, *Resolving transactions*; 11.6; assumption A4).
            send_by = how.listed_monotonic + self.chain.config["writer.max.staleness.ms"] / 1000
            if time.monotonic() >= send_by:
                return 0
        if how.named:
            rewrite_id = new_rewrite_id(created_ms)
        if is_compacted(self.chain.config):
            fields.update(_compaction_fields(group, indexes))
        data, _ = assemble_segment(batches, fields, first.meta.layout)
        name = rewritten_name(group[0].base_offset, last.meta.next_offset, generation, rewrite_id)
        if send_by == float("inf"):
            self.chain.store.put_if_absent(self.chain.prefix + "log/" + name, data)
        else:
            with self.chain.store.deadline(send_by):
                self.chain.store.put_if_absent(self.chain.prefix + "log/" + name, data)
        return 1

    def apply_retention(self, now: int | None = None) -> int:
        """Move the log start past whole segments beyond ``retention.ms`` / ``retention.bytes``.

        The last segment is never retired. Returns the new log start offset.
        """
        view = self._segments(self.chain.view())
        new_start = self._retire(view, now_ms() if now is None else now)
        return self.chain.view().start_offset if new_start > view.start_offset else view.start_offset

    def _retire(self, view: LogView, now: int) -> int:
        """Write the start marker retention asks for on ``view``; returns the start it asked for."""
        if "delete" not in self.chain.config["cleanup.policy"]:
            return view.start_offset
        segments = view.segments[:-1]
        retention_ms = self.chain.config["retention.ms"]
        retention_bytes = self.chain.config["retention.bytes"]
        total = sum(s.size for s in view.segments)
        new_start = view.start_offset
        for ref in segments:
            idx = self.chain.index(ref)
            too_old = retention_ms >= 0 and idx.meta.max_timestamp < now - retention_ms
            too_big = retention_bytes >= 0 and total - ref.size >= retention_bytes
            if not (too_old or too_big):
                break
            total -= ref.size
            new_start = max(new_start, idx.meta.next_offset)
        if new_start > view.start_offset:  # within [start, end]: a start marker may be written (10)
            self._write_start_marker(new_start)
        return new_start

    def collect_garbage(self, now: int | None = None) -> int:
        """Delete objects off the chain once ``file.delete.delay.ms`` has passed since they left it.

        An object leaves the chain when a rewritten segment covering it, or a
        start marker past it, is created; that object's creation time starts the clock.
        """
        deleted = self._collect(self._segments(self.chain.view()), now_ms() if now is None else now)
        if deleted:
            self.chain.view()
        return deleted

    def _collect(self, view: LogView, now: int) -> int:
        delay = self.chain.config["file.delete.delay.ms"]
        deleted = 0
        marker_ms = self._marker_created_ms(view.start_marker)
        by_base = {s.base_offset: s for s in view.segments}
        for info, _ in view.superseded:
            parsed = parse_segment_name(info.key.rsplit("/", 1)[-1])
            if parsed is None:
                continue
            end = parsed.end_offset
            if end is None:
                try:
                    end = self.chain.cache.get(self.chain.store, info.key, info.size).meta.next_offset
                except (ObjectNotFoundError, CorruptRecordError):
                    end = parsed.base_offset + 1
            since = None
            if end <= view.start_offset and marker_ms is not None:
                since = marker_ms
            else:
                s = view.segment_for(parsed.base_offset)
                ref = view.segments[s] if s >= 0 else by_base.get(parsed.base_offset)
                if ref is not None and ref.generation > 0:
                    since = self.chain.index(ref).meta.created_ms
            if since is not None and now - since >= delay:
                self.chain.store.delete(info.key)
                self.chain.cache.forget(info.key)
                deleted += 1
        # Start markers below the largest: readers take the largest (PROTOCOL.md 10). Once the largest is D old
        # a listing that misses it is older than any reader acts on, so nothing falls back to them either.
        if view.stale_markers and marker_ms is not None and now - marker_ms >= delay:
            self.chain.store.delete_many(list(view.stale_markers))
            deleted += len(view.stale_markers)
        # Segments of the chain entirely below the start are garbage as well.
        for ref in view.segments[:-1]:
            below_start = ref.end_offset is not None and ref.end_offset <= view.start_offset
            if below_start and marker_ms is not None and now - marker_ms >= delay:
                self.chain.store.delete(ref.key)
                self.chain.cache.forget(ref.key)
                deleted += 1
        return deleted

    def marker_created_ms(self, key: str | None) -> int | None:
        """When the start marker ``key`` was written (None: no marker, or gone)."""
        return self._marker_created_ms(key)

    def _marker_created_ms(self, key: str | None) -> int | None:
        """When the start marker ``key`` was written; markers never change, so each is read once."""
        if key is None:
            return None
        if self._marker is None or self._marker[0] != key:
            try:
                self._marker = (key, StartMarker.read(key, self.chain.store.get(key)).created_ms)
            except ObjectNotFoundError:
                return None
        return self._marker[1]
