"""A plog root: one store, its protocol object, its topic catalog, and the partition logs under it."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .errors import InvalidConfigError, ObjectNotFoundError, PlogError, UnknownTopicOrPartitionError
from .layout import incarnation_prefix, partition_prefix, validate_topic_name
from .log.chain import ChainGapError, LogView, listed_chain_end
from .log.commit_collection import collect_commits
from .log.commit_merge import merge_commits, own_small_tier
from .log.compaction_plan import DecisionTimes
from .log.index_cache import IndexCache
from .log.move_reads import due_together, move_rounds
from .log.object_bytes import ObjectBytesCache
from .log.offset_map import DEFAULT_DEDUPE_BUFFER_SIZE, MAP_ENTRY_BYTES
from .log.partition_log import PartitionLog, process_writer_id
from .log.reader import TransactionResolver
from .notice import ROOT_NOTICE, RootReads, read_notice, write_notices
from .parallel import io_map
from .protocol import BOUNDED_HISTORY, RootProtocol, WriterCheckedStore, read_protocol
from .records import now_ms as wall_now_ms
from .segment import SegmentIndex
from .shared.commit import COMMITS
from .shared.sequence import TopicSequence
from .stores import open_store
from .stores.base import ObjectInfo, Store
from .topic import TopicCatalog, TopicMetadata, is_shared
from .typed.layout import TypedLayout, entry_layout
from .typed.value_schema import SchemaHistory

#: How long cached topic metadata is trusted before it is read again (new partitions, config changes).
METADATA_MAX_AGE_S = 5.0
#: A local temporary file older than this belongs to a writer that died; a live write takes far less.
TEMP_FILE_MAX_AGE_S = 3600.0
#: The most bytes of its own small shared objects a root keeps for a writer's merge of its tier (PROTOCOL.md
#: 10.2): a tier is at most ``segment.bytes`` / 8 (8 MiB by default); bytes evicted only cost their reads.
OWN_OBJECTS_BYTES = 16 * 1024 * 1024


def holds_root(store: Store) -> bool:
    """Whether ``store`` holds a plog root: a protocol object (PROTOCOL.md 12.1), or, in a root made before
    them, a topic or a coordinator object. One LIST for a root with a protocol object; no object is created."""
    if read_protocol(store) is not None:
        return True
    return any(store.list(prefix) for prefix in ("topics/", "_coordinator/", "groups/"))


class LogRoot:
    """Everything under one URL: topics, their metadata and their partition logs.

    Partition logs and topic metadata are cached per root, so a producer or a
    consumer that touches a partition many times resolves it once.

    Opening a root reads its protocol object once (PROTOCOL.md 12: one listing,
    plus one GET when it exists) and refuses, with ``UnsupportedProtocolError``,
    a root this code cannot read. Writer requirements are checked, from the same
    cached object, by the first write: topic changes go through ``catalog`` and
    partition data through ``data_store``, a view of ``store`` that checks before
    every create or delete. Coordinator objects (groups, transactions) are written
    through ``store`` itself, so a reader of a root that only its writers cannot
    handle still joins groups and commits offsets.
    """

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        store: Store | None = None,
        metadata_max_age_s: float = METADATA_MAX_AGE_S,
    ) -> None:
        self.url = url
        #: How long topic metadata is cached (each read is a LIST and a GET on object stores).
        self.metadata_max_age_s = metadata_max_age_s
        self.store = store if store is not None else open_store(url, storage_options)
        self.protocol = RootProtocol(self.store, url)
        try:
            self.protocol.require_reader()
        except BaseException:
            if store is None:  # ours to release; a store passed in belongs to the caller
                self.store.close()
            raise
        self.data_store: Store = WriterCheckedStore(self.store, self.protocol)
        self.catalog = TopicCatalog(self.store, self.protocol)
        self.index_cache = IndexCache()
        #: This root's reads of the root notice, in a root whose protocol lists ``rootNotice`` (else None):
        #: shared by the reader's notice waiting and, once :meth:`follow_root_notice` was called, its metadata.
        self.root_reads: RootReads | None = (
            RootReads(self.store) if ROOT_NOTICE in self.protocol.version.writer_features else None
        )
        self._metadata_gated = False
        #: Cached metadata: (when it was known current, metadata, the root reads' basis it rests on).
        self._topics: dict[str, tuple[float, TopicMetadata, int | None]] = {}
        #: The catalog's topic names as last listed, in the same form.
        self._names: tuple[float, list[str], int | None] | None = None
        self._logs: dict[tuple[str, str, int], PartitionLog] = {}
        #: Shared topics' commit sequences, by (topic, topic id) (PROTOCOL.md 7.3).
        self._sequences: dict[tuple[str, str], TopicSequence] = {}
        #: Small shared objects this root's writers created, for the copy of a writer's own tier (10.2).
        self._own_objects = ObjectBytesCache(OWN_OBJECTS_BYTES)
        self._lock = threading.Lock()
        self._dedupe_buffer_size = DEFAULT_DEDUPE_BUFFER_SIZE

    @property
    def dedupe_buffer_size(self) -> int:
        """The offset map limit, in bytes, of every compaction this root's logs run: Kafka's
        ``log.cleaner.dedupe.buffer.size`` (PROTOCOL.md 11.6, *Bounded offset maps*), 128 MiB by default."""
        return self._dedupe_buffer_size

    @dedupe_buffer_size.setter
    def dedupe_buffer_size(self, size: int) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < MAP_ENTRY_BYTES:
            raise InvalidConfigError(
                f"log.cleaner.dedupe.buffer.size must be an integer of at least {MAP_ENTRY_BYTES} bytes, got {size!r}"
            )
        self._dedupe_buffer_size = size
        with self._lock:
            for log in self._logs.values():
                if log.cleaner.compactor is not None:
                    log.cleaner.compactor.dedupe_buffer_size = size

    def follow_root_notice(self) -> bool:
        """Take cached metadata and topic names as current while the root notice is unchanged
        (PROTOCOL.md 9.1, *Metadata under the root notice*): a reader of many topics then refreshes
        its metadata with one GET.

        For readers that keep metadata for long (consumers, the Spark source); a no-op, returning False,
        in a root whose protocol does not list ``rootNotice``. A writer gains nothing: its own writes
        change the root notice."""
        self._metadata_gated = self.root_reads is not None
        return self._metadata_gated

    def _basis(self) -> int | None:
        """The root reads' basis for metadata about to be read (None: not gated). A first read of the root
        notice is made now, so that it returns before the metadata read starts, as the rule requires."""
        reads = self.root_reads
        if not self._metadata_gated or reads is None:
            return None
        if not reads.read_once:
            reads.read()
        return reads.basis()

    def _still_current(self, basis: int | None, max_age_s: float) -> float | None:
        """When metadata resting on ``basis`` was last confirmed current by the root notice (None: read it again)."""
        reads = self.root_reads
        if not self._metadata_gated or reads is None:
            return None
        return reads.unchanged_since(basis, max_age_s)

    def _max_age(self, max_age_s: float | None) -> float:
        return self.metadata_max_age_s if max_age_s is None else min(max_age_s, self.metadata_max_age_s)

    def topic(self, name: str, refresh: bool = False, max_age_s: float | None = None) -> TopicMetadata:
        """Metadata of ``name`` (cached for ``max_age_s`` or the root's age, the shorter); raises if unknown.

        After :meth:`follow_root_notice`, cached metadata older than that stays current while the root
        notice is unchanged (one GET of it per age for all topics); ``refresh`` always reads it again."""
        if not isinstance(name, str):  # e.g. a list would fail the cache lookup with a TypeError
            validate_topic_name(name)
        cached = self._topics.get(name)
        limit = self._max_age(max_age_s)
        if cached is not None and not refresh:
            if time.monotonic() - cached[0] < limit:
                return cached[1]
            confirmed = self._still_current(cached[2], limit)
            if confirmed is not None:
                self._topics[name] = (confirmed, cached[1], cached[2])
                return cached[1]
        basis = self._basis()
        checked = time.monotonic()
        meta = self.catalog.get(name) if cached is None else self.catalog.current(cached[1])
        self._topics[name] = (checked, meta, basis)
        return meta

    def topic_names(self, max_age_s: float | None = None, refresh: bool = False) -> list[str]:
        """The catalog's topic names (cached as :meth:`topic` caches metadata; ``refresh`` lists them now), sorted.

        A listing of the catalog finds every topic's newest metadata version: topics whose metadata
        is not cached are read from it, in parallel, one GET each instead of a LIST and a GET."""
        limit = self._max_age(max_age_s)
        cached = self._names
        if cached is not None and not refresh:
            if time.monotonic() - cached[0] < limit:
                return list(cached[1])
            confirmed = self._still_current(cached[2], limit)
            if confirmed is not None:
                self._names = (confirmed, cached[1], cached[2])
                return list(cached[1])
        basis = self._basis()
        checked = time.monotonic()
        newest = self.catalog.newest_versions()
        names = sorted(newest)
        self._names = (checked, names, basis)
        unknown = [name for name in names if name not in self._topics]

        def read(name: str) -> TopicMetadata | None:
            try:
                return self.catalog.read_version(name, newest[name])
            except (ObjectNotFoundError, PlogError):
                return None  # collected or deleted since the listing: read on first use, as before

        for name, meta in zip(unknown, io_map(read, unknown), strict=True):
            if meta is not None and name not in self._topics:
                self._topics[name] = (checked, meta, basis)
        return list(names)

    def topics(
        self, names: Sequence[str], max_age_s: float | None = None, refresh: bool = False
    ) -> dict[str, TopicMetadata]:
        """Metadata of several topics ({name: metadata}; unknown ones left out), read in parallel
        (:meth:`topic` for each)."""

        def read(name: str) -> TopicMetadata | None:
            try:
                return self.topic(name, refresh=refresh, max_age_s=max_age_s)
            except UnknownTopicOrPartitionError:
                return None

        return {name: meta for name, meta in zip(names, io_map(read, list(names)), strict=True) if meta is not None}

    def forget_topic(self, name: str) -> None:
        """Drop cached metadata and logs of ``name`` (after it was deleted or changed)."""
        self._topics.pop(name, None)
        self._names = None
        with self._lock:
            for key in [k for k in self._logs if k[0] == name]:
                del self._logs[key]

    def partition(self, topic: str, partition: int, meta: TopicMetadata | None = None) -> PartitionLog:
        """The log of one partition; raises ``UnknownTopicOrPartitionError`` if it does not exist."""
        meta = meta or self.topic(topic)
        if not (isinstance(partition, int) and 0 <= partition < meta.partitions):
            meta = self.topic(topic, refresh=True)  # partitions may have been added
        meta.check_partition(partition)
        key = (topic, meta.topic_id, partition)
        log = self._logs.get(key)
        if log is None:
            with self._lock:
                log = self._logs.get(key)
                if log is None:
                    log = PartitionLog(
                        self.data_store,
                        partition_prefix(topic, meta.topic_id, partition),
                        meta.config,
                        index_cache=self.index_cache,
                        name=f"{topic}-{partition}",
                        topic=topic,
                        partition=partition,
                        topic_id=meta.topic_id,
                    )
                    log.meta_version = meta.version
                    log.cleaner.bounded_history = functools.partial(self._bounded_history, log)
                    log.cleaner.history_listed = self._history_listed
                    if log.cleaner.compactor is not None:
                        log.cleaner.compactor.dedupe_buffer_size = self._dedupe_buffer_size
                    if meta.schema_history is not None:
                        log.value_schemas = meta.schema_history
                        log.appender.schemas = self._schema_source(topic)
                        log.reader.refresh_schemas = lambda topic=topic, log=log: self._refresh_schemas(topic, log)
                        log.cleaner.typed = True
                    if is_shared(meta.config):
                        self._share(log, topic, meta)
                    self._logs[key] = log
        if log.meta_version < meta.version:
            # The topic's config or value schemas changed since the log was made.
            log.adopt_config(meta.config, meta.version, meta.schema_history)
        return log

    def sequence(self, topic: str, meta: TopicMetadata | None = None) -> TopicSequence:
        """The commit sequence of a shared topic's incarnation (PROTOCOL.md 7.3), one per root and incarnation,
        shared by the logs of its partitions (a commit one of them makes or follows, all of them know)."""
        meta = meta or self.topic(topic)
        with self._lock:
            return self._sequence_of(topic, meta)

    def _sequence_of(self, topic: str, meta: TopicMetadata) -> TopicSequence:
        """:meth:`sequence`, for a caller that holds ``_lock``."""
        key = (topic, meta.topic_id)
        found = self._sequences.get(key)
        if found is None:
            prefix = incarnation_prefix(topic, meta.topic_id)
            found = self._sequences[key] = TopicSequence(self.data_store, prefix, dict(meta.config), topic)
            found.own_objects = self._own_objects
        return found

    def _share(self, log: PartitionLog, topic: str, meta: TopicMetadata) -> None:
        """Make ``log`` a shared topic's: its chain reads runs after its segments, its appends commit (7.3)."""
        chain = log.chain
        chain.sequence = self._sequence_of(topic, meta)  # partition() holds the lock
        chain.partition = log.partition

        def layout_of(version: int) -> TypedLayout | None:
            schemas = log.value_schemas
            if schemas is not None and version > len(schemas.entries):
                # A run of a version written after this process read the metadata (11.8): read it again.
                self._refresh_schemas(topic, log)
                schemas = log.value_schemas
            return None if schemas is None else entry_layout(schemas.entry(version))

        chain.layout_of = layout_of

    def _bounded_history(self, log: PartitionLog) -> bool:
        """Whether ``log``'s merges resolve transactions: the root lists ``boundedHistory`` and has for the
        topic's D (PROTOCOL.md 10, *Resolving transactions*)."""
        return self.protocol.is_settled(BOUNDED_HISTORY, log.config["file.delete.delay.ms"])

    def _history_listed(self) -> bool:
        """Whether the root lists ``boundedHistory``, settled or not (merges then act within W)."""
        return BOUNDED_HISTORY in self.protocol.version.writer_features

    def _refresh_schemas(self, topic: str, log: PartitionLog) -> None:
        """Read ``topic``'s metadata again and give ``log`` its value schemas (an object of a newer version)."""
        meta = self.topic(topic, refresh=True)
        log.adopt_config(meta.config, meta.version, meta.schema_history)

    def _schema_source(self, topic: str) -> Callable[[float], SchemaHistory | None]:
        """What a typed topic's appender asks before writing: the value schemas current within W
        (PROTOCOL.md 11.8: two GETs, from :meth:`topic`'s cache when younger than W)."""

        def current(max_age_s: float) -> SchemaHistory | None:
            return self.topic(topic, max_age_s=max_age_s).schema_history

        return current

    def partition_listings(self, topic: str, meta: TopicMetadata | None = None) -> dict[int, list[ObjectInfo]]:
        """Every partition's listing from one listing of the topic's incarnation (PROTOCOL.md 7.2, 10.1).

        One LIST per 1,000 objects of the whole topic instead of at least one per
        partition; each partition's part is a listing of its own prefix with the same
        guarantee. Partitions with no object map to an empty list.
        """
        meta = meta or self.topic(topic)
        prefix = incarnation_prefix(topic, meta.topic_id)
        listings: dict[int, list[ObjectInfo]] = {p: [] for p in range(meta.partitions)}
        commits: list[ObjectInfo] = []
        listed_at = time.monotonic()
        for info in self.data_store.list(prefix):
            head, slash, _ = info.key[len(prefix) :].partition("/")
            # The notice and strays are not partitions; a partition is named by its number, unpadded (3).
            if slash and head.isdecimal() and head.isascii() and head == str(int(head)) and int(head) in listings:
                listings[int(head)].append(info)
            elif head + slash == COMMITS:
                commits.append(info)
        if is_shared(meta.config):
            # The same listing resolves the topic's commits (7.3): the partitions' views need no other.
            self.sequence(topic, meta).resolve(commits, listed_at)
        return listings

    def partition_views(self, topic: str, meta: TopicMetadata | None = None) -> list[LogView]:
        """Every partition's view, by partition number, from one listing of the topic (:meth:`partition_listings`),
        their indexes read in parallel; a partition whose part of the listing names an object collected since
        (merged meanwhile) is listed afresh."""
        meta = meta or self.topic(topic)
        listed = time.monotonic()
        listings = self.partition_listings(topic, meta)

        def view(p: int) -> LogView:
            chain = self.partition(topic, p, meta).chain
            try:
                return chain.view_from(listings[p], listed)
            except ObjectNotFoundError:
                return chain.view()

        return io_map(view, list(range(meta.partitions)))

    def resolve_unseen(self, topic: str, partitions: Iterable[int]) -> None:
        """Resolve the views of a shared ``topic``'s ``partitions`` that this process has none of yet from one
        listing of the topic (:meth:`partition_listings`, which also resolves its commits) when two or more need
        one: a reader starting on many partitions then lists once, not once per partition, and probes the
        topic's head once, not once per partition. A partition whose part names an object collected
        since is left to resolve itself."""
        meta = self.topic(topic)
        if not is_shared(meta.config):
            return  # a partitioned topic's own listings are its probes: one listing of all saves no request
        unseen = [p for p in partitions if self.partition(topic, p, meta).chain.cached_view is None]
        if len(unseen) < 2:
            return
        listed = time.monotonic()
        listings = self.partition_listings(topic, meta)
        for p in unseen:
            try:
                self.partition(topic, p, meta).chain.view_from(listings[p], listed)
            except ObjectNotFoundError:
                continue

    def notify(self, topic: str, partitions: Iterable[int] = (), meta: TopicMetadata | None = None) -> None:
        """Replace ``topic``'s change notice, then the root's (PROTOCOL.md 9.1): after appending, before acknowledging.

        For writers that append to several partitions with ``notify=False`` and
        acknowledge them together. Raises the store's error if a notice could
        not be written (after retries): the writer must then report its write
        as failed, not acknowledge it.
        """
        meta = meta or self.topic(topic)
        committed = (topic,) if is_shared(meta.config) else ()
        write_notices(self.data_store, {topic: (meta.topic_id, partitions)}, committed)

    def topic_change(self, topic: str, topic_id: str) -> bytes | None:
        """What a reader waiting on ``topic`` reads for its notice (PROTOCOL.md 9.1): a shared topic's head
        commit number, after a probe of the next (its commits are its notice, 7.3); any other topic's notice
        object. None when there is none: the caller then compares the topic's id with ``topic_id``.

        An incarnation's layout never changes (4), so the metadata the reader already holds for ``topic_id``
        answers which it is, without a request; only an incarnation not cached is read."""
        cached = self._topics.get(topic)
        meta = cached[1] if cached is not None and cached[1].topic_id == topic_id else None
        if meta is None:
            try:
                meta = self.topic(topic)
            except UnknownTopicOrPartitionError:
                meta = None
        if meta is None or meta.topic_id != topic_id or not is_shared(meta.config):
            return read_notice(self.data_store, topic, topic_id)
        sequence = self.sequence(topic, meta)
        sequence.follow_head()
        head = sequence.head
        # No commit yet is a notice too (9.1): its first commit, like any, replaces the root notice.
        return b"no commit" if head is None else b"commit %d" % head.sequence

    def notify_topics(self, written: Mapping[str, Iterable[int]]) -> None:
        """Announce one write to several topics ({topic: partitions}): their notices, then one root notice.

        For a transaction's decision, acknowledged once for all its topics (PROTOCOL.md 9.1). A topic
        deleted since is left out (nobody waits on it). Raises the first store error, after every
        notice was tried: the decider must then not report the decision as made.
        """
        ids: dict[str, tuple[str, Iterable[int]]] = {}
        committed = []
        for topic, partitions in written.items():
            try:
                meta = self.topic(topic)
            except UnknownTopicOrPartitionError:
                continue
            ids[topic] = (meta.topic_id, partitions)
            if is_shared(meta.config):
                committed.append(topic)
        write_notices(self.data_store, ids, committed)

    def maintain(
        self,
        topic: str | None = None,
        resolver: TransactionResolver | None = None,
        decided_ms: DecisionTimes | None = None,
        now: int | None = None,
    ) -> dict[str, int]:
        """Compact or merge, apply retention and collect garbage on every partition of ``topic`` (or all).

        ``resolver`` and ``decided_ms`` decide transactions for compaction (PROTOCOL.md 11.6), and ``resolver``
        for merges in a root listing ``boundedHistory`` (PROTOCOL.md 10, *Resolving transactions*). ``now``
        (wall-clock ms; default: the clock) is the time retention, moves and collection judge ages by.
        """
        self.protocol.require_writer()
        totals = {"merged": 0, "garbage_deleted": 0}
        for name in [topic] if topic else self.catalog.names():
            merged, deleted = self._maintain_topic(name, resolver, decided_ms, now)
            totals["merged"] += merged
            totals["garbage_deleted"] += deleted
        cleanup = getattr(self.store, "cleanup_temp_files", None)
        if cleanup is not None:  # local disk: temporary files of writers killed mid-write
            totals["temp_files_deleted"] = cleanup(TEMP_FILE_MAX_AGE_S)
        return totals

    def _maintain_topic(
        self, name: str, resolver: TransactionResolver | None, decided_ms: DecisionTimes | None, now: int | None
    ) -> tuple[int, int]:
        """:meth:`maintain` of one topic; (rewritten, deleted)."""
        meta = self.topic(name, refresh=True)
        logs = {p: self.partition(name, p, meta) for p in range(meta.partitions)}
        listings: dict[int, list[ObjectInfo]] = {}
        due: dict[int, Sequence[SegmentIndex]] = {}
        listed = time.monotonic()
        stale_s = meta.config["writer.max.staleness.ms"] / 4000
        if is_shared(meta.config):
            # One listing of the topic (and its commits) for every partition, as a self-maintenance pass
            # takes (10.1), and the moves reading each shared object once for all partitions due (10.2).
            listings = self.partition_listings(name, meta)
            due = due_together({p: log.move_candidate(listings[p], listed, now) for p, log in logs.items()})

        def relist() -> None:  # before a round of moves: a listing W old would stop the rest of the pass (10.2)
            nonlocal listed, listings
            if time.monotonic() - listed > stale_s:
                listed, listings = time.monotonic(), self.partition_listings(name, meta)

        merged = deleted = 0
        moved = []
        for p, reads in move_rounds(self.store, due, list(logs), relist):
            rewritten, gone = logs[p].maintain(
                now, listings.get(p), listed, resolver=resolver, decided_ms=decided_ms, move_reads=reads
            )
            merged += rewritten
            deleted += gone
            if rewritten and due.get(p):
                moved.append(p)
        if moved:  # the commits' pass below sees what was just moved: one more listing of the topic
            listed = time.monotonic()
            listings = self.partition_listings(name, meta)
            for p in moved:
                logs[p].chain.view_from(listings[p], listed)
        if is_shared(meta.config):
            rewritten, gone = self.maintain_commits(name, meta, logs, now)
            merged += rewritten
            deleted += gone
        return merged, deleted

    def merge_own_tier(self, topic: str) -> int:
        """After a write to ``topic``: when this process's commit completed a tier of small plain commits, merge
        them now (a range and one copied object) instead of at the next pass (PROTOCOL.md 10.2, *A writer merges
        its small tier*); returns the ranges written. No request unless such a tier is there."""
        meta = self.topic(topic)
        if not is_shared(meta.config) or not meta.config["auto.maintenance.enable"]:
            return 0
        sequence = self.sequence(topic, meta)
        tier_end = own_small_tier(sequence)
        if tier_end is None:
            return 0
        sequence.tier_tried = tier_end
        listed = time.monotonic()
        # The commits and each partition's chain end from one listing, so that the range leaves out what was
        # moved, as a pass's merge does; from the names alone (no view, no index read: this is a writer's path).
        listings = self.partition_listings(topic, meta)
        logs = {p: self.partition(topic, p, meta) for p in range(meta.partitions)}
        try:
            ends = {p: listed_chain_end(logs[p].chain.prefix, listings[p]) for p in logs}
        except ChainGapError:
            return 0  # a listing straddling a move: the next pass merges the tier
        return merge_commits(sequence, logs, listed, writer=process_writer_id(), chain_ends=ends)

    def collect_commits(
        self, topic: str, meta: TopicMetadata, logs: Mapping[int, PartitionLog], now: int | None = None
    ) -> int:
        """Delete a shared topic's commits whose runs ``logs`` (partitions just maintained) show moved into
        segments at least D before ``now`` (PROTOCOL.md 10.2); returns how many went."""
        sequence = self.sequence(topic, meta)
        sequence.resolve()  # the ranges and what they cover, as listed now
        return collect_commits(sequence, logs, wall_now_ms() if now is None else now)

    def maintain_commits(
        self, topic: str, meta: TopicMetadata, logs: Mapping[int, PartitionLog], now: int | None = None
    ) -> tuple[int, int]:
        """A shared topic's commits after a pass over ``logs`` (PROTOCOL.md 10.2): collect what the partitions'
        views allow, then merge into commit ranges, both from one listing of the commits; returns (ranges
        written, documents deleted)."""
        sequence = self.sequence(topic, meta)
        listed = time.monotonic()
        sequence.resolve()
        deleted = collect_commits(sequence, logs, wall_now_ms() if now is None else now)
        return merge_commits(sequence, logs, listed, writer="maintainer"), deleted

    def close(self) -> None:
        """Release the store."""
        self.store.close()

    def __enter__(self) -> LogRoot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
