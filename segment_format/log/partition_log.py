"""The partition log: one partition's chain of immutable segment objects, behind one small facade.

:class:`PartitionLog` is what the rest of plog holds for a partition. It
composes one object per concept, each in its own module, and delegates to
them (Kafka splits its ``UnifiedLog`` the same way)::

    PartitionLog
      chain      LogChain              chain.py           which objects hold which offsets (PROTOCOL.md 7)
      producers  ProducerStateManager  producer_state.py  idempotent sequences, epochs, retried appends (11.1)
      appender   Appender              appender.py        claim offsets by put-if-absent (8), writer epochs (11.3)
      reader     LogReader             reader.py          isolated reads, last stable offset, time lookup (9, 11.2)
      cleaner    LogCleaner            maintenance.py     merging, retention, delete-records, garbage (10)

The chain is shared: what the appender appends and the cleaner merges, the
reader sees without listing again. Indexes come from an
:class:`~segment_format.log.index_cache.IndexCache` shared by every log of a root.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from ..errors import IncompatibleSchemaError, InvalidConfigError
from ..notice import write_notices
from ..segment import ATTR_LOG_APPEND_TIME, WHOLE_READ, SegmentIndex
from ..stores.base import ObjectInfo, Store
from ..typed.layout import Projection, entry_layout
from ..typed.value_schema import SchemaHistory
from .appender import Appender, AppendResult, Tail
from .chain import LogChain, LogView, SegmentRef
from .compaction import LogCompactor
from .compaction_plan import DecisionTimes
from .flush import append_shared
from .index_cache import IndexCache
from .maintenance import LogCleaner
from .move_reads import MoveCandidate, MoveReads
from .producer_state import Payloads, ProducerStateManager
from .reader import READ_UNCOMMITTED, LogReader, TransactionResolver

_WRITER_IDS: dict[int, str] = {}


def process_writer_id() -> str:
    """A random id of this process, drawn once (a forked child draws its own): the ``writer`` its objects and
    commits carry, by which a shared topic's writers tell each other apart (PROTOCOL.md 7.3, *Contention*)."""
    pid = os.getpid()
    found = _WRITER_IDS.get(pid)
    if found is None:
        found = _WRITER_IDS[pid] = uuid.uuid4().hex
    return found


class PartitionLog:
    """Appends to and reads from one partition's chain of segment objects."""

    def __init__(
        self,
        store: Store,
        prefix: str,
        config: dict,
        *,
        index_cache: IndexCache | None = None,
        name: str = "",
        topic: str = "",
        partition: int = 0,
        topic_id: str = "",
    ) -> None:
        self.store = store
        self.topic = topic
        self.partition = partition
        #: The topic's id, for its change notice (PROTOCOL.md 9.1); "" for a log outside a root's layout.
        self.topic_id = topic_id
        self.prefix = prefix
        # One dict shared by the chain, the appender and the cleaner, so that a newer version of the
        # topic's metadata reaches all of them at once (adopt_config).
        self.config = dict(config)
        config = self.config
        #: Version of the topic metadata whose config this log holds (LogRoot keeps it current).
        self.meta_version = 0
        self.name = name or prefix
        self.cache = index_cache if index_cache is not None else IndexCache()  # an empty cache is falsy
        #: Random id of this writing process, stamped on the objects it writes (``writer`` in the segment JSON).
        writer_id = process_writer_id()
        self.chain = LogChain(store, prefix, config, self.cache, self.name)
        self.producers = ProducerStateManager(
            store, prefix, self.name, read_index=lambda key: self.cache.get(store, key, None)
        )
        self.appender = Appender(self.chain, self.producers, config, writer_id, self.name)
        self.reader = LogReader(self.chain, topic, partition, self.name)
        #: A typed topic's value schemas as of ``meta_version`` (PROTOCOL.md 11.8); None: untyped.
        self.value_schemas: SchemaHistory | None = None
        self.reader.known_schemas = lambda: self.value_schemas
        self.cleaner = LogCleaner(
            self.chain,
            writer_id,
            self.name,
            LogCompactor(self.chain, writer_id, self.name, topic, partition),
            topic,
            partition,
        )

    def adopt_config(
        self, config: dict[str, Any], meta_version: int, value_schemas: SchemaHistory | None = None
    ) -> None:
        """Take the config of topic metadata version ``meta_version`` if it is newer than the one held:
        a policy, D or W changed while this process kept the log (compaction switched on, for one), or a
        typed topic's value schema evolved."""
        if meta_version <= self.meta_version:
            return
        self.config.clear()
        self.config.update(config)
        self.meta_version = meta_version
        if value_schemas is not None:
            self.value_schemas = value_schemas
        self.appender.config_changed()

    @property
    def _tail(self) -> Tail | None:
        """The log end the appender last knew; tests set it to None to force a fresh resolution."""
        return self.appender.tail

    @_tail.setter
    def _tail(self, tail: Tail | None) -> None:
        self.appender.tail = tail

    # ------------------------------------------------------------------ resolution

    def index(self, ref: SegmentRef) -> SegmentIndex:
        """The verified index of a chain segment; checks it agrees with its name."""
        return self.chain.index(ref)

    def may_hold_producer(self, ref: SegmentRef, producer_id: int) -> bool:
        """False for a run of the cached view that holds no batch of ``producer_id`` (no index built)."""
        return self.chain.may_hold_producer(ref, producer_id)

    def timestamp_type(self, offset: int, default: int) -> int:
        """1 (LogAppendTime) or 0 (CreateTime) for the stored batch holding ``offset``, from its index in the
        cached view; ``default`` when the view holds no such batch."""
        view = self.chain.view(False)
        s = view.segment_for(offset)
        if s < 0:
            return default
        idx = self.index(view.segments[s])
        b = idx.batch_for_offset(offset)
        if b >= idx.batch_count:
            return default
        return 1 if int(idx.attributes[b]) & ATTR_LOG_APPEND_TIME else 0

    def view(self, refresh: bool = True) -> LogView:
        """Resolve the chain from a fresh listing (or return the cached one)."""
        return self.chain.view(refresh)

    def follow_tail(self) -> LogView:
        """Cheaply extend the cached view with objects appended since (see :meth:`LogChain.follow_tail`)."""
        return self.chain.follow_tail()

    # ------------------------------------------------------------------ appending

    def learn_tail(self, end_offset: int, running_max_timestamp: int, since_ms: int) -> None:
        """Take the end of this log from a tail hint of a decision (see :meth:`Appender.learn`)."""
        self.appender.learn(end_offset, running_max_timestamp, since_ms)

    def append(
        self,
        payloads: Payloads,
        *,
        durable: bool = True,
        compression: str | None = None,
        writer_epoch: int | None = None,
        extra: dict[str, Any] | None = None,
        transaction_timeout_ms: int | None = None,
        notify: bool = True,
        keep_bytes: int = 0,
    ) -> AppendResult:
        """Append batches (payload columns, no offsets) as one new segment object.

        The offsets are claimed by creating ``log/<end>.arrow`` with
        put-if-absent (PROTOCOL.md 8). Losing the race to another writer moves
        to the new end and retries with new offsets, after a random pause from
        the second loss in a row, for up to ``CONTENTION_TIMEOUT_S`` (then
        ``ConcurrentAppendError``; nothing was written). A store error leaves it unknown whether
        the object was created; the same key is then tried again and an object
        found there that is this attempt, or holds this producer's batch, counts
        as the append (11.1). Idempotent batches must continue their producer's
        sequence (``OutOfOrderSequenceError``), and with ``writer_epoch`` the
        append is refused (``FencedError``) after an object of a newer epoch (11.3).
        ``transaction_timeout_ms`` is stamped on transactional appends: how long
        their transaction may stay undecided before anyone may abort it (11.2).
        ``extra`` goes into the segment JSON's ``extra`` object, for extensions.
        With ``notify`` (the default) the topic's change notice is replaced once
        the object exists, before this returns (PROTOCOL.md 9.1; if it cannot be
        written the append raises, although its object exists); a writer that
        appends to several partitions before acknowledging passes False and
        calls :func:`~segment_format.notice.write_notice` once itself.
        An object this append created of at most ``keep_bytes`` bytes comes back in the result's
        ``data``, for the writer to hand to a maintainer (:meth:`IndexCache.offer
        <segment_format.log.index_cache.IndexCache.offer>`, PROTOCOL.md 10.1).
        """
        if self.chain.sequence is not None:
            result = self._append_shared(payloads, durable, compression, writer_epoch, transaction_timeout_ms)
        else:
            result = self.appender.append(
                payloads,
                durable=durable,
                compression=compression,
                writer_epoch=writer_epoch,
                extra=extra,
                transaction_timeout_ms=transaction_timeout_ms,
                keep_bytes=keep_bytes,
            )
        if notify and self.topic_id:
            committed = (self.topic,) if self.chain.sequence is not None else ()  # a commit is its notice (9.1)
            write_notices(self.store, {self.topic: (self.topic_id, [self.partition])}, committed)
        return result

    def _append_shared(
        self,
        payloads: Payloads,
        durable: bool,
        compression: str | None,
        writer_epoch: int | None,
        transaction_timeout_ms: int | None,
    ) -> AppendResult:
        """A shared topic's append (PROTOCOL.md 7.3): a flush of this one partition's run."""
        if writer_epoch is not None:
            raise InvalidConfigError(f"{self.name}: writer epochs are for partitioned topics (PROTOCOL.md 11.7)")
        earlier = self.appender.earlier_commit(payloads)
        if earlier is not None:
            return earlier
        (result,) = append_shared(
            [(self.appender, payloads, None)],
            durable=durable,
            compression=compression,
            timeout_ms=transaction_timeout_ms,
        )
        if isinstance(result, BaseException):
            raise result
        return result

    # ------------------------------------------------------------------ reading

    def read(
        self,
        offset: int,
        max_records: int | None = None,
        max_bytes: int | None = None,
        isolation: str = READ_UNCOMMITTED,
        resolver: TransactionResolver | None = None,
        projection: Projection | None = None,
        decode_ahead: bool = False,
        max_decoded_bytes: int | None = None,
    ) -> tuple[list[pa.RecordBatch], int]:
        """Record batches from ``offset`` on, and the offset to read next.

        Raises ``OffsetOutOfRangeError`` below the log start or beyond the log
        end. Returns no batches at the end. ``max_records`` is exact;
        ``max_bytes`` is a soft bound on stored bytes (at least one batch is returned).
        Control batches are never returned. With ``isolation=READ_COMMITTED``
        batches of aborted (or unlisted) transactions are skipped and the read
        stops at the first undecided one, the last stable offset (PROTOCOL.md 11.2).
        A typed topic's batches are read as ``projection`` (PROTOCOL.md 11.8), by default every
        field of the newest value schema this log knows. ``decode_ahead``: a caller about to read on
        from where this read ends (a consumer polling) lets the batches that follow, in bytes already
        read, decode meanwhile (:class:`~segment_format.log.reader.LogReader`); no request is added.
        ``max_decoded_bytes`` bounds the Arrow bytes returned (at least one record): a client under a
        byte quota reads no more than it may take at once, however well the stored batches compress.
        """
        reader = self.reader
        limits = (max_records, max_bytes, isolation, resolver)
        extra = (decode_ahead, max_decoded_bytes)
        if projection is not None or self.value_schemas is None:
            return reader.read(offset, *limits, projection, *extra)
        known = self.value_schemas
        default = self.default_projection()
        try:
            return reader.read(offset, *limits, default, *extra)
        except IncompatibleSchemaError:
            if self.value_schemas is known:
                raise
            # The read met a newer version and the metadata was read again: read as the newest now (11.8).
            newest = self.default_projection()
            return reader.read(offset, *limits, newest, *extra)

    def default_projection(self) -> Projection | None:
        """Every field of the newest value schema this log knows (None: an untyped topic)."""
        if self.value_schemas is None:
            return None
        return Projection(entry_layout(self.value_schemas.current))

    def last_stable_offset(
        self, resolver: TransactionResolver | None, whole: int = WHOLE_READ, follow: bool = True
    ) -> int:
        """The first offset of the earliest undecided transactional batch, or the log end (PROTOCOL.md 11.2);
        ``whole``, ``follow``: see :meth:`LogReader.last_stable_offset
        <segment_format.log.reader.LogReader.last_stable_offset>`."""
        return self.reader.last_stable_offset(resolver, whole, follow)

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        """The earliest offset whose timestamp is >= ``timestamp_ms``; None if there is none."""
        return self.reader.offset_for_timestamp(timestamp_ms)

    # ------------------------------------------------------------------ maintenance

    def delete_records(self, before_offset: int) -> int:
        """Advance the log start offset to ``before_offset`` (Kafka's DeleteRecords); returns the new start."""
        return self.cleaner.delete_records(before_offset)

    def merge_segments(self, resolver: TransactionResolver | None = None) -> int:
        """Merge sealed appended objects into segments of up to ``segment.bytes``; returns how many were written.

        ``resolver``: in a root listing ``boundedHistory``, the merges resolve the transactional batches it
        finds decided (PROTOCOL.md 10, *Resolving transactions*)."""
        return self.cleaner.merge_segments(resolver)

    def apply_retention(self, now: int | None = None) -> int:
        """Move the log start past whole segments beyond ``retention.ms`` / ``retention.bytes``; returns it."""
        return self.cleaner.apply_retention(now)

    def collect_garbage(self, now: int | None = None) -> int:
        """Delete objects off the chain once ``file.delete.delay.ms`` has passed; returns how many."""
        return self.cleaner.collect_garbage(now)

    def maintain(
        self,
        now: int | None = None,
        listing: Sequence[ObjectInfo] | None = None,
        listed_monotonic: float = 0.0,
        resolver: TransactionResolver | None = None,
        decided_ms: DecisionTimes | None = None,
        move_reads: MoveReads | None = None,
    ) -> tuple[int, int]:
        """Compact or merge, apply retention and collect garbage on one listing (``listing``, taken at
        ``listed_monotonic``, or a fresh one); returns (rewritten, deleted). ``resolver`` and
        ``decided_ms`` decide transactions for compaction (PROTOCOL.md 11.6), and ``resolver`` for merges in a
        root listing ``boundedHistory`` (PROTOCOL.md 10, *Resolving transactions*); a shared partition's moves
        take their bytes from ``move_reads`` (a pass's, :func:`~segment_format.log.move_reads.move_rounds`)."""
        return self.cleaner.maintain(now, listing, listed_monotonic, resolver, decided_ms, move_reads)

    def move_candidate(
        self, listing: Sequence[ObjectInfo] | None = None, listed_monotonic: float = 0.0, now: int | None = None
    ) -> MoveCandidate:
        """A shared partition's runs and how far they have come towards a move (none for a partitioned topic):
        what a pass plans its moves from (:func:`~segment_format.log.move_reads.due_together`)."""
        return self.cleaner.move_candidate(listing, listed_monotonic, now)

    def compact(
        self,
        now: int | None = None,
        resolver: TransactionResolver | None = None,
        decided_ms: DecisionTimes | None = None,
        force: bool = False,
    ) -> int:
        """Compact a compacted topic's partition if due (``force``: if anything is dirty); objects written."""
        return self.cleaner.compact(now, resolver, decided_ms, force)


__all__ = ["PartitionLog"]


def append_together(
    appends: Sequence[tuple[PartitionLog, Payloads]],
    *,
    durable: bool = True,
    compression: str | None = None,
    transaction_timeout_ms: int | None = None,
) -> list[AppendResult | BaseException]:
    """Append to several partitions of shared topics as one flush (PROTOCOL.md 7.3): one shared object for
    them all and one commit per topic, whatever the number of partitions. Returns, per append, its result or
    the error that failed it. An append retried after an ambiguous failure is first looked for among the
    commits it may have landed as (11.1), as :meth:`PartitionLog.append` does. Writes no change notice: a
    commit is its topic's notice, and the caller replaces the root notice once (9.1)."""
    out: list[AppendResult | BaseException | None] = [None] * len(appends)
    flush: list[int] = []
    for n, (plog, payloads) in enumerate(appends):
        if plog.chain.sequence is None:
            out[n] = InvalidConfigError(f"{plog.name}: not a shared topic's partition (PROTOCOL.md 7.3)")
            continue
        out[n] = plog.appender.earlier_commit(payloads)
        if out[n] is None:
            flush.append(n)
    if flush:
        results = append_shared(
            [(appends[n][0].appender, appends[n][1], None) for n in flush],
            durable=durable,
            compression=compression,
            timeout_ms=transaction_timeout_ms,
        )
        for n, result in zip(flush, results, strict=True):
            out[n] = result
    return [r if r is not None else RuntimeError("not appended") for r in out]
