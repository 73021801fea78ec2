"""Appending to a partition: claim the next offsets by creating ``log/<end>.arrow`` (PROTOCOL.md 8).

An append claims offsets ``[end, end+n)`` by creating the object named after
``end`` with put-if-absent; a writer that loses the race learns the new end by
following the objects the winners appended, and retries. The writer keeps the
end it last knew (its :class:`Tail`) for at most ``writer.max.staleness.ms``,
so that back-to-back appends need no listing (PROTOCOL.md 2, assumption A4). With a writer
epoch (a partition lease, PROTOCOL.md 11.7) the tail also carries the epoch of
the object at the end, and an append of an older epoch is fenced.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

from .. import numbered
from ..encoding import encode_batches
from ..errors import (
    ConcurrentAppendError,
    CorruptRecordError,
    FencedError,
    IncompatibleSchemaError,
    InvalidRecordError,
    ObjectNotFoundError,
    StorageError,
)
from ..layout import appended_name
from ..records import now_ms
from ..segment import ATTR_CONTROL, ATTR_LOG_APPEND_TIME, BatchMeta, SegmentIndex, SegmentParts, ipc_options
from ..shared.commit import Commit
from ..shared.object import SharedRun
from ..topic import is_compacted
from ..typed.layout import Projection, TypedLayout, entry_layout, read_value
from ..typed.value_schema import SchemaHistory
from .chain import LogChain, SegmentRef
from .producer_state import Payloads, ProducerStateManager, batch_identities

#: Given W in seconds, the topic's value schemas as of a moment less than W ago (None: untyped).
SchemaSource = Callable[[float], SchemaHistory | None]

#: How long an append keeps retrying lost races before it fails for contention (Kafka's ``delivery.timeout.ms``).
CONTENTION_TIMEOUT_S = 120.0
#: The cap of the randomized pause after a lost race (Kafka's ``retry.backoff.ms``).
CONTENTION_BACKOFF_MAX_S = 0.1
#: Store errors tolerated in one append before giving up (each may or may not have created the object).
MAX_AMBIGUOUS_FAILURES = 5


#: ε of PROTOCOL.md 2, assumption A4: the bound on the skew between the wall clocks of writers handing tail hints over.
TAIL_HINT_SKEW_MS = 1_000


@dataclass(frozen=True)
class AppendResult:
    """Where an append landed: offsets of each batch, the object created."""

    key: str
    base_offsets: list[int]
    next_offset: int
    log_append_time_ms: int
    #: The created object's ``running_max_timestamp`` (what a tail hint hands on, PROTOCOL.md 11.2).
    running_max_timestamp: int = -1
    #: The created object's bytes, when the append asked to keep objects of its size (``keep_bytes``), so that
    #: a maintainer can merge them without reading them back (PROTOCOL.md 10.1); else None.
    data: bytes | None = None


def refuse_null_keys(payloads: Payloads, name: str) -> None:
    """A compacted topic keeps records by key: one without a key is refused, as Kafka refuses it
    (PROTOCOL.md 11.6, *Keys*), before anything of the append is written."""
    for payload, meta in payloads:
        if meta.attributes & ATTR_CONTROL:
            continue  # transaction markers carry no key
        nulls = payload.column("key").null_count
        if nulls:
            raise InvalidRecordError(
                f"{name}: {nulls} record(s) without a key; topic {name.rsplit('-', 1)[0]!r} is compacted "
                "(cleanup.policy contains 'compact'), and compacted topics require a key on every record"
            )


def conformed(payloads: Payloads, layout: TypedLayout, topic: str, history: SchemaHistory) -> Payloads:
    """Each payload's value as exactly ``layout``'s struct, checked (PROTOCOL.md 11.8, *Checked on write*).

    A payload built for an older version of the topic's schema is converted as a reader of ``layout``
    would read it (a removed field dropped, a narrower type cast up), then checked; anything else must
    conform as it is."""
    out = []
    for payload, meta in payloads:
        value = payload.column(2)
        older = _older_layout(value.type, layout, history)
        if older is not None:
            value = read_value(value, older, Projection(layout), what=f"topic {topic!r}: ")
        value = layout.conform(value, topic)
        if value is not payload.column(2):
            payload = pa.RecordBatch.from_arrays(
                [payload.column(0), payload.column(1), value, payload.column(3)], schema=layout.payload_schema
            )
        out.append((payload, meta))
    return out


def _older_layout(value_type: pa.DataType, layout: TypedLayout, history: SchemaHistory) -> TypedLayout | None:
    """The layout of the older schema version whose in-memory value type ``value_type`` is, if any."""
    if value_type.equals(layout.value_type):
        return None
    for entry in reversed(history.entries[: layout.version - 1]):
        older = entry_layout(entry)
        if value_type.equals(older.value_type):
            return older
    return None


@dataclass
class Tail:
    """What a writer knows of the log's end, and since when (PROTOCOL.md 2, assumption A4)."""

    end_offset: int
    running_max_timestamp: int
    learned_monotonic: float
    #: ``writer_epoch`` of the object that ends at ``end_offset`` (-1 if it has none).
    writer_epoch: int = -1


def _writer_epoch(idx: SegmentIndex) -> int:
    """The writer epoch an object was appended under, -1 if none."""
    return -1 if idx.meta.writer_epoch is None else idx.meta.writer_epoch


class Appender:
    """Appends batches to one partition as new segment objects, retrying lost races and ambiguous failures."""

    def __init__(
        self, chain: LogChain, producers: ProducerStateManager, config: dict[str, Any], writer_id: str, name: str
    ) -> None:
        self.chain = chain
        self.store = chain.store
        self.prefix = chain.prefix
        self.config = config
        self.producers = producers
        self.name = name
        self.writer_id = writer_id
        #: The log end this writer last knew; None: resolve the chain before the next append.
        self.tail: Tail | None = None
        self._tried_key: str | None = None
        self._options = ipc_options(config["compression.type"])
        #: A typed topic's schema source (set by the log's owner); None: the topic is untyped.
        self.schemas: SchemaSource | None = None

    def config_changed(self) -> None:
        """The shared config was replaced by a newer version's: derive again what was derived from it."""
        self._options = ipc_options(self.config["compression.type"])

    def fresh_tail(self) -> Tail:
        """The known tail if younger than ``writer.max.staleness.ms``, else the tail of a fresh resolution."""
        staleness_s = self.config["writer.max.staleness.ms"] / 1000
        tail = self.tail
        if tail is None or time.monotonic() - tail.learned_monotonic > staleness_s:
            learned = time.monotonic()
            view = self.chain.view()
            epoch = _writer_epoch(self.chain.index(view.segments[-1])) if view.segments else -1
            tail = Tail(view.end_offset, view.running_max_timestamp, learned, epoch)
            self.tail = tail
        return tail

    def learn(self, end_offset: int, running_max_timestamp: int, since_ms: int) -> None:
        """Take a log end handed over by another process: a tail hint (PROTOCOL.md 11.2).

        ``since_ms`` is the other process's wall clock read before it created the object ending at
        ``end_offset``; the knowledge counts as learned ``TAIL_HINT_SKEW_MS`` before that on this
        machine's clock, and is used only while assumption A4's staleness bound holds for it. Knowledge of a
        later end that this writer holds itself, still fresh, is kept. Only for writers that
        append without writer epochs: a hint does not say the epoch of the object before.
        """
        staleness_s = self.config["writer.max.staleness.ms"] / 1000
        age_s = max(0, now_ms() - since_ms + TAIL_HINT_SKEW_MS) / 1000
        if age_s > staleness_s:
            return
        mono = time.monotonic()
        current = self.tail
        if current is not None and current.writer_epoch >= 0:
            return  # a writer with epochs: a hint would drop the epoch its fencing check needs (11.3)
        if current is None or mono - current.learned_monotonic > staleness_s or end_offset > current.end_offset:
            self.tail = Tail(end_offset, running_max_timestamp, mono - age_s)

    def append(
        self,
        payloads: Payloads,
        *,
        durable: bool = True,
        compression: str | None = None,
        writer_epoch: int | None = None,
        extra: dict[str, Any] | None = None,
        transaction_timeout_ms: int | None = None,
        keep_bytes: int = 0,
    ) -> AppendResult:
        """Append batches as one new segment object (see :meth:`.partition_log.PartitionLog.append`)."""
        if is_compacted(self.config):
            refuse_null_keys(payloads, self.name)
        history, layout = self.current_layout()
        if layout is not None and history is not None:
            payloads = conformed(payloads, layout, self.name.rsplit("-", 1)[0], history)
        first = payloads[0][1]
        earlier = self.producers.earlier_attempt([meta for _, meta in payloads])
        if earlier is not None:
            self.tail = None
            return _landed(earlier)[0]
        self.producers.check(payloads)
        self._tried_key = None
        try:
            return self._append(
                payloads, durable, compression, writer_epoch, extra, transaction_timeout_ms, layout, keep_bytes
            )
        except StorageError:
            if self._tried_key is not None:
                self.producers.failed_ambiguously(first, self._tried_key)
            raise

    def _append(
        self,
        payloads: Payloads,
        durable: bool,
        compression: str | None,
        writer_epoch: int | None,
        extra: dict[str, Any] | None,
        transaction_timeout_ms: int | None,
        layout: TypedLayout | None,
        keep_bytes: int,
    ) -> AppendResult:
        log_append_time = self.config["message.timestamp.type"] == "LogAppendTime"
        codec = compression or self.config["compression.type"]
        options = self._options if compression is None else ipc_options(compression)
        failures = 0
        lost = 0
        started = time.monotonic()
        tail: Tail | None = None
        staleness_s = self.config["writer.max.staleness.ms"] / 1000
        while True:
            if lost and time.monotonic() - started > CONTENTION_TIMEOUT_S:
                raise ConcurrentAppendError(
                    f"append to {self.name} lost the race for offsets {lost} times "
                    f"in {CONTENTION_TIMEOUT_S:.0f} s to other writers"
                )
            if tail is None or time.monotonic() - tail.learned_monotonic > staleness_s:
                # Step 1 of PROTOCOL.md 8 holds for every attempt, retries included: a create retried after a
                # store error (which may have taken up to the store's deadline) or a run of lost races must
                # not act on knowledge older than W, or the key it retries may have been merged, collected
                # and freed meanwhile, and creating it again would acknowledge offsets that hold other records.
                tail = self.fresh_tail()
            if writer_epoch is not None and tail.writer_epoch > writer_epoch:
                raise FencedError(
                    f"{self.name}: an append of writer epoch {tail.writer_epoch} ends at {tail.end_offset}; "
                    f"this writer's epoch {writer_epoch} has been fenced"
                )
            if layout is not None:
                # Every create writes the version current within W (PROTOCOL.md 11.8): retries included.
                history, current = self.current_layout()
                if current is not None and history is not None and current.version != layout.version:
                    layout = current
                    payloads = conformed(payloads, layout, self.name.rsplit("-", 1)[0], history)
            append_ms = now_ms()
            jobs = []
            base_offsets = []
            offset = tail.end_offset
            for payload, meta in payloads:
                jobs.append((payload, meta, offset))
                base_offsets.append(offset)
                offset += payload.num_rows
            attempt_id = uuid.uuid4().hex
            # The batches compress on the pool while the store writes the first ones (a backend that can).
            parts = SegmentParts(
                encode_batches(jobs, options, append_ms if log_append_time else None, layout),
                {
                    "base_offset": tail.end_offset,
                    "next_offset": offset,
                    "compression": codec,
                    "created_ms": append_ms,
                    "min_append_ms": append_ms,
                    "max_append_ms": append_ms,
                    "writer": self.writer_id,
                    "append_id": attempt_id,
                    "writer_epoch": writer_epoch,
                    "transaction_timeout_ms": transaction_timeout_ms,
                    "extra": extra or {},
                },
                layout,
                running_max_floor=tail.running_max_timestamp,
            )
            key = self.prefix + "log/" + appended_name(tail.end_offset)
            self._tried_key = key
            errored = False
            try:
                # No try of this create may be sent on knowledge older than W (assumption A4, I5): the store's
                # retries stop there, and the next attempt resolves the chain again (above).
                with self.store.deadline(tail.learned_monotonic + staleness_s):
                    created = self.store.put_if_absent_parts(key, parts, durable=durable)
            except StorageError:
                parts.close()
                failures += 1
                if failures > MAX_AMBIGUOUS_FAILURES:
                    raise
                created, errored = False, True
            found = None
            if not created:
                try:
                    stored = self.producers.read_index(key)  # cached: following the chain reads it again below
                except ObjectNotFoundError:
                    # The failed create did not land: try the same offsets again. (Refused, yet gone: the
                    # winner's object vanished; counted as a lost race so that this cannot go on forever.)
                    lost += not errored
                    continue
                except CorruptRecordError:
                    stored = None  # someone else's object, unreadable: lost the race all the same
                if stored is not None and self.producers.matches(stored, attempt_id, [meta for _, meta in payloads]):
                    found = stored
            if created:
                data = b"".join(parts.parts) if parts.size <= keep_bytes else None
                result = AppendResult(key, base_offsets, offset, append_ms, parts.meta.running_max_timestamp, data)
                new_tail = Tail(
                    offset,
                    parts.meta.running_max_timestamp,
                    tail.learned_monotonic,
                    -1 if writer_epoch is None else writer_epoch,
                )
                size = parts.size
            elif found is not None:
                result, new_tail, size = _landed(found)
                new_tail.learned_monotonic = tail.learned_monotonic
            else:
                # Lost the race: another writer holds these offsets. Learn the new end by
                # following the objects from the one that won, not by listing again.
                self.tail = tail = self._tail_after_loss(tail, [meta for _, meta in payloads])
                lost += 1
                _back_off(lost)
                continue
            self.producers.record(payloads)
            self.tail = new_tail
            self.chain.appended(
                SegmentRef(key, result.base_offsets[0], result.next_offset, 0, size), new_tail.running_max_timestamp
            )
            return result

    def shared_run(self, payloads: Payloads, layout: TypedLayout | None, compression: str | None) -> SharedRun:
        """This partition's run of a shared flush, checked as an append is (PROTOCOL.md 7.3): the producer's
        sequences, a compacted topic's keys (by the caller), a typed topic's values (conformed to ``layout``)."""
        self.producers.check(payloads)
        topic, topic_id = self.topic_and_id()
        if self.config["message.timestamp.type"] == "LogAppendTime":
            # The bit, set here, makes readers take the commit's append time for every record (7.3).
            payloads = [(p, replace(m, attributes=m.attributes | ATTR_LOG_APPEND_TIME)) for p, m in payloads]
        return SharedRun(
            topic,
            topic_id,
            self.chain.partition,
            list(payloads),
            layout,
            compression or self.config["compression.type"],
        )

    def topic_and_id(self) -> tuple[str, str]:
        """The topic's name and id, from the log's name and prefix (``topics/<topic>/<id>/<partition>/``)."""
        parts = self.prefix.rstrip("/").split("/")
        return parts[-3], parts[-2]

    def check_schema(self, layout: TypedLayout | None) -> None:
        """Raise unless ``layout`` (the version a run was encoded in) is the topic's current one within W (11.8)."""
        _history, current = self.current_layout()
        if layout is not None and current is not None and current.version != layout.version:
            raise IncompatibleSchemaError(
                f"{self.name}: the topic's value schema moved to version {current.version} while this write "
                f"was encoded as version {layout.version}; send again"
            )

    def shared_committed(self, payloads: Payloads, commit: Commit) -> AppendResult:
        """Record a run that ``commit`` claimed: the producer's sequences move on, the view takes the run."""
        self.producers.record(payloads)
        if self.chain._view is not None:
            self.chain.extend_with_runs()
        return _committed(commit, self.chain.partition)

    def shared_failed(self, payloads: Payloads, tried_sequence: int) -> None:
        """A commit that may or may not have landed: the retry first looks there (PROTOCOL.md 11.1)."""
        self.producers.failed_ambiguously(payloads[0][1], f"commit:{tried_sequence}")

    def earlier_commit(self, payloads: Payloads) -> AppendResult | None:
        """After a shared append whose commit failed ambiguously: the commit it may have landed as, if it did
        (PROTOCOL.md 11.1: the commit numbers it tried hold its rows with the same producers and sequences, all
        of them: another writer's entry may begin with one of its batches and hold none of the others)."""
        wanted = batch_identities([meta for _, meta in payloads])
        tried = self.producers.take_ambiguous(payloads[0][1])
        if tried is None or not tried.startswith("commit:"):
            return None
        sequence = self.chain.sequence
        assert sequence is not None
        number = int(tried.split(":", 1)[1])
        try:
            sequence.follow_head()
        except StorageError:
            return None
        for element in sequence.elements:
            if not element.first <= number < element.end:
                continue
            for entry in element.commit.entries:
                if (
                    entry.partition == self.chain.partition
                    and wanted is not None
                    and wanted == [(row[8], row[9], row[10]) for row in entry.rows]
                ):
                    return _committed(element.commit, self.chain.partition)
        return None

    def current_layout(self) -> tuple[SchemaHistory | None, TypedLayout | None]:
        """The topic's value schemas and the layout of the version to write: the current one, confirmed
        within W (11.8); (None, None) for an untyped topic."""
        if self.schemas is None:
            return None, None
        history = self.schemas(self.config["writer.max.staleness.ms"] / 1000)
        return history, None if history is None else entry_layout(history.current)

    def _tail_after_loss(self, tail: Tail, metas: Sequence[BatchMeta]) -> Tail | None:
        """The log end after losing the race at ``tail.end_offset``, found by following the appended objects.

        A loser that listed the partition before each retry would always be
        slower than a winner appending back to back (which knows its end), and
        would lose again and again until ``ConcurrentAppendError``; following
        costs one index read per object the others appended. The knowledge
        keeps the age of ``tail`` (PROTOCOL.md 2, assumption A4): the objects followed were
        all created after ``tail`` was learned, so none can have been deleted
        while it is younger than W. None (resolve the chain) if following fails. Raises
        ``ConcurrentAppendError`` if an object followed holds one of the batches ``metas`` describe.
        """
        end, running, epoch = tail.end_offset, tail.running_max_timestamp, tail.writer_epoch
        while True:
            try:
                idx = self.chain.cache.get(self.store, self.prefix + "log/" + appended_name(end), None)
            except ObjectNotFoundError:
                break
            except CorruptRecordError:
                return None
            if idx.meta.base_offset != end or idx.meta.next_offset <= end:
                return None
            self.producers.refuse_written_elsewhere(idx, metas, self.name)
            end, running = idx.meta.next_offset, idx.meta.running_max_timestamp
            epoch = _writer_epoch(idx)
        if end == tail.end_offset:
            return None  # the object we lost to is gone already: list again
        return Tail(end, running, tail.learned_monotonic, epoch)


def _back_off(lost: int) -> None:
    """Pause a random while after the ``lost``-th race lost in a row (from the second on).

    A loser whose retry takes as long as a winner's next append would lose in
    step with it again and again; a random pause breaks the step, and it
    keeps the requests a contended append spends (a create and a read per
    lost race) from growing with the winners' rate.
    """
    if lost >= 2:
        numbered.backoff(lost, cap_s=CONTENTION_BACKOFF_MAX_S)


def _committed(commit: Commit, partition: int) -> AppendResult:
    """A shared append's result from its commit: each batch's base offset is its run's base plus its row's."""
    entry = next(e for e in commit.entries if e.partition == partition)
    return AppendResult(
        entry.object,
        [entry.base_offset + row[2] for row in entry.rows],
        entry.next_offset,
        commit.append_ms,
        commit.max_timestamp_of(partition),
    )


def _landed(idx: SegmentIndex) -> tuple[AppendResult, Tail, int]:
    """An append found already stored, as its result, the tail after it, and its object's size."""
    result = AppendResult(
        idx.key,
        [int(b) for b in idx.base_offsets],
        idx.meta.next_offset,
        idx.meta.created_ms,
        idx.meta.running_max_timestamp,
    )
    tail = Tail(idx.meta.next_offset, idx.meta.running_max_timestamp, time.monotonic(), _writer_epoch(idx))
    return result, tail, idx.size
