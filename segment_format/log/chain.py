"""A partition's chain: which segment objects hold which offsets (PROTOCOL.md 7).

One partition is the objects under its prefix (PROTOCOL.md 7)::

    <partition>/
      log/00000000000000000000-00000000000000004000.g1.arrow   rewritten: merged from appended objects
      log/00000000000000000000.arrow                           appended, superseded (deleted after a delay)
      log/00000000000000004000.arrow                           appended: offsets 4000..4099
      log/00000000000000004100.arrow                           appended: the tail, 4100..end-1
      start/00000000000000000000.json                          log start offset markers

The chain is resolved from one listing: rewritten objects from the log start
up to the *frontier* (the highest end of any rewritten object), then the
appended objects at or after the frontier, each ending where the next begins.

This module holds the resolution as pure functions of a listing
(:func:`parse_listing`, :func:`resolve_chain`), which the reader and the
verifier both use, and :class:`LogChain`, one process's current knowledge of
one partition's chain: the last resolved :class:`LogView`, followed cheaply as
objects are appended.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import CorruptRecordError, ObjectNotFoundError
from ..layout import appended_name, parse_segment_name, parse_start_marker, rewrite_id_of
from ..segment import SegmentIndex
from ..shared.commit import ROW_FIELDS, CommitEntry
from ..shared.sequence import CommitChainGapError, CommitElement, TopicSequence
from ..stores.base import ObjectInfo, Store
from ..typed.layout import TypedLayout
from .index_cache import IndexCache


class ChainGapError(CorruptRecordError):
    """A listing whose objects do not join up: corruption, unless a new listing joins up."""


@dataclass(frozen=True)
class SegmentRef:
    """One segment object of the resolved chain."""

    key: str
    base_offset: int
    #: Exclusive end; None only for the last appended object until its index is read.
    end_offset: int | None
    generation: int
    size: int


#: Where a commit entry's row holds its batch's producer id.
PRODUCER_ID_FIELD = ROW_FIELDS.index("producer_id")


@dataclass(frozen=True)
class _UnbuiltRun:
    """A run on a view whose index is built from its commit entry when first asked for: a view of a partition
    with many runs not moved yet costs a reference per run, not an index per run that nobody reads (a reader
    reads those past its position; a gateway recovering a producer, those its entries name)."""

    key: str
    element: CommitElement
    entry: CommitEntry
    layout_of: Callable[[int], TypedLayout | None]

    def holds_producer(self, producer_id: int) -> bool:
        """Whether a row of the run is a batch of ``producer_id``, from its commit entry alone."""
        return any(row[PRODUCER_ID_FIELD] == producer_id for row in self.entry.rows)

    def build(self) -> SegmentIndex:
        version = self.entry.value_schema_version
        layout = None if version is None else self.layout_of(version)
        return self.entry.index(self.key, self.element.commit, layout)


@dataclass
class LogView:
    """A resolved snapshot of a partition: its chain, start and end offsets."""

    segments: list[SegmentRef]
    start_offset: int
    end_offset: int
    #: Objects listed but not on the chain, with the key of whatever superseded them.
    superseded: list[tuple[ObjectInfo, str]]
    start_marker: str | None
    running_max_timestamp: int = -1
    #: Start markers below the largest (``start_marker``), which garbage collection deletes.
    stale_markers: tuple[str, ...] = ()
    #: A shared partition's chain end ``C_p`` (PROTOCOL.md 7.3 step 1): where its segments end and its commit
    #: part takes over. None for a partitioned topic's view.
    chain_end: int | None = None

    def segment_for(self, offset: int) -> int:
        """Index in ``segments`` of the segment holding ``offset`` (offset must be in range)."""
        bases = [s.base_offset for s in self.segments]
        return bisect.bisect_right(bases, offset) - 1


@dataclass
class PartitionListing:
    """A partition's listing sorted into the objects chain resolution reads (PROTOCOL.md 7.1, 7.2)."""

    #: ``(base, info)`` of each appended object, in listing order.
    appended: list[tuple[int, ObjectInfo]]
    #: ``(base, end, generation, info)`` of each rewritten object, in listing order.
    rewritten: list[tuple[int, int, int, ObjectInfo]]
    #: ``(offset, key)`` of each start marker, in listing order.
    markers: list[tuple[int, str]]


def parse_listing(
    prefix: str,
    infos: Sequence[ObjectInfo],
    *,
    on_unparsed: Callable[[ObjectInfo, str, str], None] | None = None,
    on_marker: Callable[[int, str], None] | None = None,
) -> PartitionListing:
    """Sort the listing ``infos`` of the partition at ``prefix`` by what their names say they are.

    Names under ``log/`` or ``start/`` that are not segment object or marker
    names are skipped (a reader ignores them), after being passed to
    ``on_unparsed`` as ``(info, folder, name)``; each marker is passed to
    ``on_marker`` as ``(offset, key)``. Both are called in listing order, so
    that a caller reporting on them (the verifier) reports in that order.
    """
    listing = PartitionListing([], [], [])
    for info in infos:
        folder, _, name = info.key[len(prefix) :].partition("/")
        if folder == "log":
            parsed = parse_segment_name(name)
            if parsed is None:
                if on_unparsed is not None:
                    on_unparsed(info, folder, name)
            elif parsed.end_offset is None:
                listing.appended.append((parsed.base_offset, info))
            else:
                listing.rewritten.append((parsed.base_offset, parsed.end_offset, parsed.generation, info))
        elif folder == "start":
            offset = parse_start_marker(name)
            if offset is None:
                if on_unparsed is not None:
                    on_unparsed(info, folder, name)
                continue
            listing.markers.append((offset, info.key))
            if on_marker is not None:
                on_marker(offset, info.key)
    return listing


def listed_chain_end(prefix: str, infos: Sequence[ObjectInfo]) -> int:
    """A shared topic's partition's chain end (PROTOCOL.md 7.3 step 1) from its listing alone, no index read:
    its segments are all rewritten objects (moves and merges), whose names give their ends; the largest start
    marker when it is above them. Raises :class:`ChainGapError` for a listing that does not join up."""
    resolved = resolve_chain(prefix, parse_listing(prefix, infos))
    ends = [ref.end_offset for ref in resolved.segments if ref.end_offset is not None]
    return max([*ends[-1:], resolved.marker_offset or 0])


@dataclass(frozen=True)
class ChainHole:
    """Offsets ``[lo, hi)`` that no object of a partition's chain holds (PROTOCOL.md 7.2 step 3)."""

    lo: int
    hi: int
    #: The chain object just past the hole; None for a hole between rewritten objects.
    key: str | None
    #: Why the offsets are missing, worded for a verify report.
    why: str
    #: The message a reader raises :class:`ChainGapError` with.
    message: str


@dataclass
class ResolvedChain:
    """The chain a listing resolves to (PROTOCOL.md 7.2), before any index is read."""

    #: The rewritten elements, then the appended ones; the last appended element's end is None (unknown).
    segments: list[SegmentRef]
    #: Index in ``segments`` of the first appended element (``len(segments)`` when there is none).
    appended_from: int
    #: Objects listed but not on the chain, with the key of the chain's last element ("" for an empty chain).
    superseded: list[tuple[ObjectInfo, str]]
    #: The largest start marker's offset and key, None when there is no marker.
    marker_offset: int | None
    marker_key: str | None
    #: Start markers below the largest: nothing reads them (PROTOCOL.md 10, *Garbage collection*).
    stale_markers: tuple[str, ...] = ()


def resolve_chain(
    prefix: str, listing: PartitionListing, on_hole: Callable[[ChainHole], None] | None = None
) -> ResolvedChain:
    """Resolve a partition's chain from its parsed listing (PROTOCOL.md 7.2 steps 1-4).

    ``prefix`` is the partition's prefix, the key a :class:`ChainGapError` is
    raised with.

    Without ``on_hole`` the returned chain is guaranteed to have no hole:
    each element starts at or before the end of the one before it (rewritten
    objects may overlap; appended ones end where the next begins), and the
    first starts at or below the start marker. At the first hole it raises :class:`ChainGapError`
    instead, because a reader must never serve offsets from a chain with a
    hole: the listing may merely straddle a merge and its deletions, and a new
    listing may join up. With ``on_hole`` every hole is passed to it, in chain
    order, and resolution continues past it with the next object that exists,
    so that :func:`~segment_format.inspect.verify.verify` reports all of them in one
    pass. Both use this one walk so that the verifier checks exactly the chain
    readers read.
    """

    def hole(found: ChainHole) -> None:
        if on_hole is None:
            raise ChainGapError(found.message, key=prefix)
        on_hole(found)

    appended, rewritten, markers = listing.appended, listing.rewritten, listing.markers
    marker_offset, marker_key = max(markers) if markers else (None, None)
    chain: list[SegmentRef] = []
    frontier = max((r[1] for r in rewritten), default=None)
    if rewritten and frontier is not None and (marker_offset is None or marker_offset < frontier):
        position = marker_offset if marker_offset is not None else min(r[0] for r in rewritten)
        while position < frontier:
            covering = [r for r in rewritten if r[0] <= position < r[1]]
            if not covering:
                # Some rewritten object ends at the frontier and does not cover position, so it starts above it.
                following = min((r[0] for r in rewritten if r[0] > position), default=frontier)
                hole(
                    ChainHole(
                        position,
                        following,
                        None,
                        "no rewritten object covers them",
                        f"gap in the chain: no segment object covers offset {position}",
                    )
                )
                position = following
                continue
            # Largest end, then generation, then rewrite id (11.6; an object without one sorts first).
            base, end, gen, info = max(covering, key=lambda r: (r[1], r[2], rewrite_id_of(r[3].key) or ""))
            chain.append(SegmentRef(info.key, base, end, gen, info.size))
            position = end
    appended_from = len(chain)
    tail_from = frontier if frontier is not None else -1
    if marker_offset is not None:
        tail_from = max(tail_from, marker_offset)
    tail = [(b, i) for b, i in appended if frontier is None or b >= frontier]
    # Drop appended objects that end at or before the start (their successor begins at or before it).
    while len(tail) > 1 and tail[1][0] <= tail_from:
        tail.pop(0)
    # The walk stops only at the frontier, so the rewritten part ends there and the tail starts at or after it.
    rewritten_end = chain[-1].end_offset if chain else None
    if rewritten_end is not None and tail and tail[0][0] != rewritten_end:
        hole(
            ChainHole(
                rewritten_end,
                tail[0][0],
                tail[0][1].key,
                "between the rewritten objects and the appended ones",
                f"gap in the chain: rewritten segments end at {rewritten_end} "
                f"but the next appended object starts at {tail[0][0]}",
            )
        )
    for n, (base, info) in enumerate(tail):
        tail_end = tail[n + 1][0] if n + 1 < len(tail) else None
        chain.append(SegmentRef(info.key, base, tail_end, 0, info.size))
    chosen = {ref.key for ref in chain}
    last_key = chain[-1].key if chain else ""
    superseded = [(info, last_key) for _base, info in appended if info.key not in chosen]
    superseded += [(info, last_key) for *_range, info in rewritten if info.key not in chosen]
    if chain and marker_offset is not None and chain[0].base_offset > marker_offset:
        hole(
            ChainHole(
                marker_offset,
                chain[0].base_offset,
                chain[0].key,
                f"the start marker says the log starts at {marker_offset}",
                f"gap in the chain: the log starts at {marker_offset} but its first object at {chain[0].base_offset}",
            )
        )
    stale = tuple(key for _offset, key in markers if key != marker_key)
    return ResolvedChain(chain, appended_from, superseded, marker_offset, marker_key, stale)


class LogChain:
    """One partition's chain as this process knows it: the last resolved view, kept current cheaply.

    The appender, the reader and the cleaner of a partition share one
    ``LogChain``, so that what one of them learns (an object appended, a
    listing after a merge) the others use. Indexes come from the shared
    :class:`~segment_format.log.index_cache.IndexCache` and are checked against
    the place the chain gives them.
    """

    def __init__(self, store: Store, prefix: str, config: dict[str, Any], cache: IndexCache, name: str) -> None:
        self.store = store
        self.prefix = prefix
        self.config = config
        self.cache = cache
        self.name = name
        #: A shared topic's commit sequence (PROTOCOL.md 7.3), one for all its partitions' chains in a process;
        #: None for a partitioned topic. ``partition`` says which partition's entries are this chain's.
        self.sequence: TopicSequence | None = None
        self.partition = 0
        #: How a run of a typed topic's value schema version is read (set by the log; None: untyped).
        self.layout_of: Callable[[int], TypedLayout | None] = lambda version: None
        #: The topic's last head probe (its sequence's ``checked_monotonic``) as of this partition's last look.
        self._head_seen = float("-inf")
        #: The indexes of the runs on the current view, by their element keys (runs have no index object).
        self._runs: dict[str, SegmentIndex | _UnbuiltRun] = {}
        self._view: LogView | None = None
        #: When the cached view was last known current (monotonic s): its listing or its last tail probe.
        self._view_checked = float("-inf")
        #: When the chain was last listed (monotonic s), and the log start that listing gave: a view
        #: seeded from elsewhere (:meth:`seed`) has no start of its own, only its first element's base.
        self.listed_monotonic = float("-inf")
        self.listed_start = 0

    def may_hold_producer(self, ref: SegmentRef, producer_id: int) -> bool:
        """False when ``ref`` is a run of the current view none of whose batches is ``producer_id``'s, told from
        its commit entry without building its index; True otherwise (a segment's index says)."""
        run = self._runs.get(ref.key) if ref.generation < 0 else None
        return not isinstance(run, _UnbuiltRun) or run.holds_producer(producer_id)

    def index(self, ref: SegmentRef, whole: int = 0) -> SegmentIndex:
        """The verified index of a chain segment; checks it agrees with its name.

        ``whole`` > 0: the caller reads the segment's batches next, so an
        object of at most ``whole`` bytes is read whole with its index (see
        :meth:`IndexCache.get <segment_format.log.index_cache.IndexCache.get>`).
        A run of a shared topic (PROTOCOL.md 7.3) has its index in its commit, kept with the view.
        """
        if ref.generation < 0:
            run = self._runs.get(ref.key)
            if run is None:  # a view this process no longer holds: resolve again
                raise ObjectNotFoundError(ref.key)
            if isinstance(run, _UnbuiltRun):
                # Two threads may both build it: the same index from the same entry, whichever is kept.
                run = self._runs[ref.key] = run.build()
            return run
        idx = self.cache.get(self.store, ref.key, ref.size or None, whole)
        if idx.meta.base_offset != ref.base_offset or (
            ref.end_offset is not None and idx.meta.next_offset != ref.end_offset
        ):
            raise CorruptRecordError(
                f"segment covers [{idx.meta.base_offset}, {idx.meta.next_offset}) but its place in the chain "
                f"is [{ref.base_offset}, {ref.end_offset})",
                key=ref.key,
            )
        return idx

    def view(self, refresh: bool = True, whole: int = 0, relist_commits: bool = False) -> LogView:
        """Resolve the chain from a fresh listing (or return the cached one).

        ``whole`` is passed to :meth:`index` for the last object's index, the one resolution reads. A shared
        topic's commits are followed from their head (one GET); ``relist_commits`` lists them afresh instead
        (an object or a commit of the view was found missing: a merge or a collection passed it).
        """
        if self._view is not None and not refresh:
            return self._view
        return self._resolve_retrying(whole, None, 0.0, relist_commits)

    @property
    def cached_view(self) -> LogView | None:
        """The view this process resolved last, as it is (no request); None before the first."""
        return self._view

    def view_from(self, listing: Sequence[ObjectInfo], listed_monotonic: float) -> LogView:
        """Resolve the chain from ``listing``, a listing of this partition taken elsewhere at ``listed_monotonic``.

        A maintenance pass lists a whole topic once and resolves each partition
        from its part (PROTOCOL.md 10.1). If that listing does not resolve (it
        straddled a merge, or an object it names is gone), the chain is listed
        afresh, as :meth:`view` does.
        """
        return self._resolve_retrying(0, listing, listed_monotonic, False)

    def _resolve_retrying(
        self, whole: int, listing: Sequence[ObjectInfo] | None, listed_monotonic: float, relist_commits: bool
    ) -> LogView:
        last_gap: CorruptRecordError | None = None
        for _ in range(8):
            try:
                checked = time.monotonic() if listing is None else listed_monotonic
                if relist_commits and self.sequence is not None:
                    self.sequence.resolve()
                view = self._resolve(whole, listing, checked)
                self.listed_start = max(self.listed_start, view.start_offset)  # starts only move forward
                if checked >= self._view_checked:  # else what this process learned since is newer: keep it
                    self._view, self._view_checked, self.listed_monotonic = view, checked, checked
                return view
            except ObjectNotFoundError:
                listing, relist_commits = None, True
                continue  # an object vanished between listing and reading: list again
            except (ChainGapError, CommitChainGapError) as gap:
                listing, relist_commits = None, True
                last_gap = gap  # a listing can straddle a merge and its deletions: list again
                continue
        if last_gap is not None:
            raise last_gap
        raise CorruptRecordError("partition keeps changing under the reader; could not resolve it", key=self.prefix)

    def _resolve(self, whole: int, listing: Sequence[ObjectInfo] | None = None, listed: float = 0.0) -> LogView:
        infos = self.store.list(self.prefix) if listing is None else listing
        resolved = resolve_chain(self.prefix, parse_listing(self.prefix, infos))
        chain, marker_offset = resolved.segments, resolved.marker_offset
        if not chain:
            start = marker_offset or 0
            view = LogView([], start, start, resolved.superseded, resolved.marker_key, -1, resolved.stale_markers)
            return view if self.sequence is None else self._with_runs(view, resolve=True, listed=listed)
        last = chain[-1]
        last_index = self.index(last, whole)
        end_offset = last_index.meta.next_offset
        if last.end_offset is None:
            chain[-1] = SegmentRef(last.key, last.base_offset, end_offset, last.generation, last.size)
        start = chain[0].base_offset if marker_offset is None else max(marker_offset, chain[0].base_offset)
        view = LogView(
            chain,
            start,
            end_offset,
            resolved.superseded,
            resolved.marker_key,
            last_index.meta.running_max_timestamp,
            resolved.stale_markers,
        )
        return view if self.sequence is None else self._with_runs(view, resolve=True, listed=listed)

    # ------------------------------------------------------------------ shared topics (PROTOCOL.md 7.3)

    def _with_runs(self, view: LogView, resolve: bool, listed: float = 0.0) -> LogView:
        """``view`` (the partition's segments, listed at ``listed``) extended with its commit part: the runs
        after its chain end.

        ``resolve``: the commit chain is brought up to date first (its head followed, or listed when never
        resolved or not checked for D/2), unless it was checked after ``listed`` (a maintenance pass resolving
        many partitions from one topic listing probes the head once, not once per partition); else the
        sequence is taken as it is known."""
        sequence = self.sequence
        assert sequence is not None
        if resolve:
            sequence.follow_head(unless_checked_after=listed)
        self._head_seen = sequence.checked_monotonic
        # The segments' end, or the start when it is above it (a chain whose segments are all gone, 7.3 step 1).
        chain_end = max(view.end_offset, view.start_offset)
        view.end_offset = view.chain_end = chain_end
        try:
            runs = sequence.entries_for(self.partition, chain_end)
        except CommitChainGapError:
            if not resolve:
                raise
            # The commits known predate a move these segments show (a range dropped the moved runs, 10.2):
            # list the commits afresh; a gap that stays makes the caller list the partition again.
            sequence.resolve()
            runs = sequence.entries_for(self.partition, chain_end)
        _check_tiles(sequence, self.partition, chain_end, runs)
        self._runs = {}
        for element, entry in runs:
            view.segments.append(self._run_ref(element, entry))
        head = sequence.head
        if head is not None:
            view.end_offset = sequence.end_of(self.partition, chain_end)
            view.running_max_timestamp = max(view.running_max_timestamp, head.max_timestamp_of(self.partition))
        if runs and view.segments[0].generation < 0:
            view.start_offset = max(view.start_offset, view.segments[0].base_offset)
        return view

    def _run_ref(self, element: CommitElement, entry: CommitEntry) -> SegmentRef:
        """A run as a chain element: a key of its own (the element's and the partition's), offsets, its bytes."""
        key = f"{element.key}#{self.partition}@{entry.base_offset}"  # a range holds many entries of a partition
        self._runs[key] = _UnbuiltRun(key, element, entry, self.layout_of)
        return SegmentRef(key, entry.base_offset, entry.next_offset, -1, entry.stored_bytes)

    def follow_runs(self) -> LogView:
        """A shared partition's :meth:`follow_tail`: one probe of the topic's next commit (for all its
        partitions), then the view extended with this partition's new runs."""
        view = self._view
        now = time.monotonic()
        if view is None or now - self._view_checked >= self.config["file.delete.delay.ms"] / 2000:
            return self.view()
        self._view_checked = now
        sequence = self.sequence
        assert sequence is not None
        # One probe serves every partition of the topic a reader follows in one round (a consumer's fetch):
        # one made since the round began by another partition, since this one last looked. A partition checked
        # twice in a round, or by a reader without rounds, probes afresh. The probe reused is the topic's
        # latest, so it is never older than the last read of the topic's notice, which is itself a probe
        # (9.1), and parking stays sound.
        sequence.follow_head(unless_checked_after=max(self.cache.round_started, self._head_seen))
        self._head_seen = sequence.checked_monotonic
        return self.extend_with_runs()

    def extend_with_runs(self) -> LogView:
        """The cached view extended with the runs the sequence knows past its end (a commit this process
        made, or one it followed), without a request."""
        view = self._view
        assert self.sequence is not None and view is not None
        runs = self.sequence.entries_for(self.partition, view.end_offset)
        _check_tiles(self.sequence, self.partition, view.end_offset, runs)
        for element, entry in runs:
            view.segments.append(self._run_ref(element, entry))
        head = self.sequence.head
        if head is not None:
            view.end_offset = self.sequence.end_of(self.partition, view.end_offset)
            view.running_max_timestamp = max(view.running_max_timestamp, head.max_timestamp_of(self.partition))
        return view

    def follow_tail(self, whole: int = 0) -> LogView:
        """Cheaply extend the cached view with objects appended since (one existence check when idle).

        Each check reads the end of ``log/<end>.arrow`` with one request
        (:meth:`Store.get_suffix <segment_format.stores.base.Store.get_suffix>`):
        an absent object answers "not found", a present one its index, and,
        when it is at most ``whole`` bytes, its batches too, kept for the read
        that follows (:meth:`index`).

        The check for ``log/<end>.arrow`` can only be trusted while checks come
        less than ``file.delete.delay.ms`` apart: that object may have been
        appended, merged and deleted since the last one, and a reader that only
        looks for it would then wait at ``end`` forever. After a longer pause
        (half the delay, for margin) the chain is listed again instead.
        """
        if self.sequence is not None:
            return self.follow_runs()
        view = self._view
        now = time.monotonic()
        if view is None or now - self._view_checked >= self.config["file.delete.delay.ms"] / 2000:
            return self.view(whole=whole)
        self._view_checked = now
        while True:
            key = self.prefix + "log/" + appended_name(view.end_offset)
            try:
                idx = self.cache.get(self.store, key, None, whole)
            except ObjectNotFoundError:
                return view
            if idx.meta.base_offset != view.end_offset:
                raise CorruptRecordError("appended segment does not start where its name says", key=key)
            view.segments.append(SegmentRef(key, view.end_offset, idx.meta.next_offset, 0, idx.size))
            view.end_offset = idx.meta.next_offset
            view.running_max_timestamp = idx.meta.running_max_timestamp

    def seed(self, segments: Sequence[SegmentRef], runs: Mapping[str, SegmentIndex] | None = None) -> None:
        """Adopt consecutive chain elements another reader resolved (PROTOCOL.md 9, planned reads), with
        ``runs``, the indexes of those that are runs of a shared topic (from the resolver's commits).

        Kept instead: a cached view that already holds every offset they hold. The adopted view
        starts at its first element's base, which is not a log start (:attr:`listed_start` is), and
        counts as never checked by this process: a tail probe from it lists the chain first.
        """
        if not segments or segments[-1].end_offset is None:
            return
        base, end = segments[0].base_offset, segments[-1].end_offset
        view = self._view
        if view is not None and view.start_offset <= base and view.end_offset >= end:
            return
        self._view = LogView(list(segments), base, end, [], None)
        self._view_checked = float("-inf")
        self._runs = dict(runs or {})

    def appended(self, ref: SegmentRef, running_max_timestamp: int) -> None:
        """Add the object this process just appended to the cached view, if the view ends where it begins."""
        view = self._view
        if view is not None and ref.end_offset is not None and view.end_offset == ref.base_offset:
            view.segments.append(ref)
            view.end_offset = ref.end_offset
            view.running_max_timestamp = running_max_timestamp


def _check_tiles(
    sequence: TopicSequence, partition: int, chain_end: int, runs: Sequence[tuple[CommitElement, CommitEntry]]
) -> None:
    """A partition's runs after its chain end reach the head's end for it (PROTOCOL.md 7.3 step 3): else the
    segments and the commits were taken at moments a move fell between, and the caller lists again."""
    reached = runs[-1][1].next_offset if runs else chain_end
    expected = sequence.end_of(partition, chain_end)
    if reached != expected:
        raise CommitChainGapError(
            f"{sequence.name}-{partition}: its runs end at {reached}, the head commit says {expected}",
            key=sequence.prefix,
        )
