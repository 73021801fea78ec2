"""Gathering what clients produce into few objects (group commit), and Kafka's idempotence checks, per partition.

The gateway writes what its clients produced in flushes, one at a time: a flush
starts as soon as batches wait and the previous flush is done, no sooner than
``flush_interval_ms`` after the previous one started (a bound on what flushes
cost on an object store; a local root flushes back to back), or at once when
``batch_bytes`` wait. Whatever arrives during a flush goes out together in the
next, so a busy gateway writes large flushes and a quiet one answers in one
flush's time. A flush writes every shared topic's partitions as one shared
object and a commit per topic (PROTOCOL.md 7.3), each partitioned topic's
partition as one object, then one change notice, and answers every waiting
request with its batches' offsets. Clients' batches keep their own producer id,
epoch and first sequence in the index (PROTOCOL.md 11.1), so a retried batch is
recognised after a gateway dies, by whichever gateway the client retries on.

Sequence checks happen here, before batches are gathered, so one client's
out-of-order batch fails that client's partition only, never the object it
would have shared with others::

    submit(batch) --check sequence--> PartitionQueue --(previous flush done, rate bound)--> flush
                                      one shared object + a commit per topic, one notice
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from segment_format.errors import PlogError
from segment_format.log.move import is_run
from segment_format.log.partition_log import append_together
from segment_format.records import now_ms
from segment_format.segment import BatchMeta

from .maintenance import MaintenanceProcess

if TYPE_CHECKING:
    from segment_format.log.partition_log import PartitionLog

    from .server import Gateway

log = logging.getLogger(__name__)

#: Kafka's error codes used here.
NONE, CORRUPT_MESSAGE, UNKNOWN_SERVER_ERROR = 0, 2, -1
OUT_OF_ORDER_SEQUENCE_NUMBER, INVALID_PRODUCER_EPOCH = 45, 47
KAFKA_STORAGE_ERROR = 56
#: Kafka keeps the metadata of a producer's last five batches per partition to answer retries.
RECENT_BATCHES = 5
#: How far back a gateway that never saw a producer looks for its batches (PROTOCOL.md 11.9): stored objects
#: (a shared topic's runs are not counted: their indexes are in memory), and the age of their newest record. A
#: client retries within its delivery timeout (120 s by default).
RECOVERY_OBJECTS = 256
RECOVERY_WINDOW_MS = 10 * 60 * 1000
#: The longest a request still queueing its partitions holds back a flush (decoding a large request's
#: partitions takes a few ms; many connections queueing in turn must not keep flushes from starting).
HOLD_MAX_S = 0.005
#: The least time between two tier merges of a topic (PROTOCOL.md 10.2, *A writer merges its small tier*): each
#: lists the whole topic, and at hundreds of flushes a second a merge per tier of 16 would cost more than them.
TIER_MERGE_SPACING_S = 1.0


class ProduceError(PlogError):
    """A batch refused with a Kafka error code (the request's other partitions go on)."""

    def __init__(self, message: str, error_code: int) -> None:
        super().__init__(message)
        self.error_code = error_code


@dataclass
class ProducerSequence:
    """What a partition knows of one idempotent producer: its epoch, next sequence and recent batches."""

    epoch: int
    next_sequence: int
    #: (first sequence, last sequence) -> future of the batch's base offset, newest last.
    recent: collections.OrderedDict[tuple[int, int], asyncio.Future[int]] = field(
        default_factory=collections.OrderedDict
    )


@dataclass
class Pending:
    """A decoded batch waiting to be written, and the future its request awaits."""

    payload: Any
    meta: BatchMeta
    future: asyncio.Future[int]
    nbytes: int
    transaction_timeout_ms: int | None = None
    #: Called with (base offset, last offset) once written (a transaction records its ranges).
    on_written: Any = None


@dataclass
class PartitionQueue:
    pending: list[Pending] = field(default_factory=list)
    nbytes: int = 0
    producers: dict[int, ProducerSequence] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class ProduceBatcher:
    """The gateway's produce path (``gateway.services["produce"]``)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.interval_s = gateway.config.flush_interval_for(gateway.root.store.billed_per_request) / 1000
        self.batch_bytes = gateway.config.batch_bytes
        self._queues: dict[tuple[str, int], PartitionQueue] = {}
        #: Partitions with batches waiting, oldest first, and their bytes.
        self._waiting: dict[tuple[str, int], None] = {}
        self._waiting_bytes = 0
        self._flush_task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        #: Requests queueing their partitions now, and the timer that ends their hold on a flush.
        self._holding = 0
        self._hold_timer: asyncio.TimerHandle | None = None
        self._last_flush = float("-inf")
        #: Shared topics whose tier merge runs (one at a time per topic).
        self._merging: set[str] = set()
        #: When each topic's last tier merge started (loop time).
        self._tier_merged: dict[str, float] = {}
        #: Objects and bytes written, for the benchmark and metrics.
        self.objects_written = 0
        self.notices_written = 0
        #: Maintains the partitions flushes wrote (PROTOCOL.md 10.1): the gateway is their writer. None on a
        #: ``memory://`` root, which no other process can open.
        config = gateway.config
        self.maintenance = (
            None
            if config.url.startswith("memory://")
            else MaintenanceProcess(config.url, config.storage_options, f"gateway-{gateway.directory.gateway_id}")
        )

    def _queue(self, topic: str, partition: int) -> PartitionQueue:
        key = (topic, partition)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = PartitionQueue()
        return queue

    # ---------------------------------------------------------------- submitting

    async def submit(
        self,
        topic: str,
        partition: int,
        batches: list[tuple[Any, BatchMeta, int]],
        transaction_timeout_ms: int | None = None,
        on_written: Any = None,
        queued: asyncio.Event | None = None,
    ) -> int:
        """Queue a partition's batches (payload, meta, bytes) and wait until written; the first one's base offset.

        Raises :class:`ProduceError` with Kafka's code for a sequence that does not continue its
        producer's, and whatever the append raised if the object could not be written. ``queued`` is set
        once the batches hold their place in the partition's order.
        """
        futures = await self.enqueue(topic, partition, batches, transaction_timeout_ms, on_written)
        if queued is not None:
            queued.set()  # in the partition's order now: the caller may take the next request
        offsets = await asyncio.gather(*futures)
        return int(offsets[0])

    async def enqueue(
        self,
        topic: str,
        partition: int,
        batches: list[tuple[Any, BatchMeta, int]],
        transaction_timeout_ms: int | None = None,
        on_written: Any = None,
    ) -> list[asyncio.Future[int]]:
        """Check and queue a partition's batches; the futures of their base offsets (see :meth:`submit`).

        Once this returns, the batches hold their place in the partition's order: a later call queues
        after them, whatever the futures' state.
        """
        queue = self._queue(topic, partition)
        futures: list[asyncio.Future[int]] = []
        async with queue.lock:
            loop = asyncio.get_running_loop()
            for payload, meta, nbytes in batches:
                duplicate = await self._check_sequence(topic, partition, queue, payload, meta)
                if duplicate is not None:
                    futures.append(duplicate)
                    continue
                future: asyncio.Future[int] = loop.create_future()
                queue.pending.append(Pending(payload, meta, future, nbytes, transaction_timeout_ms, on_written))
                queue.nbytes += nbytes
                self._waiting[(topic, partition)] = None
                self._waiting_bytes += nbytes
                futures.append(future)
                if meta.producer_id >= 0 and meta.base_sequence >= 0:
                    self.remember(topic, partition, meta, payload.num_rows, future)
            self._kick()
        return futures

    async def _check_sequence(
        self, topic: str, partition: int, queue: PartitionQueue, payload: Any, meta: BatchMeta
    ) -> asyncio.Future[int] | None:
        """Kafka's idempotence rules; returns the earlier batch's future for a retried duplicate."""
        if meta.producer_id < 0 or meta.base_sequence < 0:
            return None
        state = queue.producers.get(meta.producer_id)
        first, last = meta.base_sequence, meta.base_sequence + payload.num_rows - 1
        if state is None:
            state = await self._recover(topic, partition, meta.producer_id)
            if state is not None:
                queue.producers[meta.producer_id] = state
            elif first != 0:
                # Neither this gateway nor the log's window knows the producer here, yet its batch does not
                # start it: its earlier batches may still be on their way through another gateway (the client's
                # leader moved). Taking this one as the start would refuse those as duplicates later.
                raise ProduceError(
                    f"{topic}-{partition}: producer {meta.producer_id} sent sequence {first} and none of its "
                    "earlier batches is known here",
                    OUT_OF_ORDER_SEQUENCE_NUMBER,
                )
        elif not _continues(state, meta.producer_epoch, first, last) and not any(
            p.meta.producer_id == meta.producer_id for p in queue.pending
        ):
            # What this gateway remembers may be stale: another gateway led the partition for a while (its
            # registration lapsed under load, or this one's did) and wrote the producer's next batches. The log
            # is the truth (PROTOCOL.md 11.9): read the producer's state from it again before refusing.
            recovered = await self._recover(topic, partition, meta.producer_id)
            if recovered is not None:
                state = queue.producers[meta.producer_id] = recovered
                appender = self.gateway.root.partition(topic, partition).appender
                appender.producers.adopt(meta.producer_id, recovered.epoch, recovered.next_sequence)
        if state is not None:
            if meta.producer_epoch < state.epoch:
                raise ProduceError(
                    f"{topic}-{partition}: producer {meta.producer_id} epoch {meta.producer_epoch} is older than "
                    f"{state.epoch}",
                    INVALID_PRODUCER_EPOCH,
                )
            if meta.producer_epoch == state.epoch:
                earlier = state.recent.get((first, last))
                if earlier is not None:
                    return earlier  # a retry of a batch written or being written: answered with its offset
                if first != state.next_sequence:
                    # Never DUPLICATE_SEQUENCE_NUMBER: a Kafka client takes it as "written", and a batch below the
                    # next sequence that is none of the recent ones is not known to be in the log.
                    raise ProduceError(
                        f"{topic}-{partition}: producer {meta.producer_id} sent sequence {first}, "
                        f"expected {state.next_sequence}",
                        OUT_OF_ORDER_SEQUENCE_NUMBER,
                    )
            elif first != 0:
                raise ProduceError(
                    f"{topic}-{partition}: producer {meta.producer_id}'s new epoch {meta.producer_epoch} starts at "
                    f"sequence {first}, not 0",
                    OUT_OF_ORDER_SEQUENCE_NUMBER,
                )
        if state is None or meta.producer_epoch != state.epoch:
            state = queue.producers[meta.producer_id] = ProducerSequence(meta.producer_epoch, first)
        state.next_sequence = last + 1
        return None

    def remember(self, topic: str, partition: int, meta: BatchMeta, count: int, future: asyncio.Future[int]) -> None:
        """Keep a queued batch among its producer's recent ones (a retry of it gets the same answer)."""
        state = self._queue(topic, partition).producers.get(meta.producer_id)
        if state is None:
            return
        state.recent[(meta.base_sequence, meta.base_sequence + count - 1)] = future
        while len(state.recent) > RECENT_BATCHES:
            state.recent.popitem(last=False)

    async def _recover(self, topic: str, partition: int, producer_id: int) -> ProducerSequence | None:
        """A producer this gateway has not seen in a partition: its newest batches, read from the log's indexes."""
        found = await asyncio.get_running_loop().run_in_executor(
            self.gateway.executor, recover_producer, self.gateway.root.partition(topic, partition), producer_id
        )
        if found is None:
            return None
        epoch, next_sequence, recent = found
        state = ProducerSequence(epoch, next_sequence)
        loop = asyncio.get_running_loop()
        for key, base_offset in recent:
            done: asyncio.Future[int] = loop.create_future()
            done.set_result(base_offset)
            state.recent[key] = done
        return state

    # ---------------------------------------------------------------- flushing (group commit)

    def hold(self) -> None:
        """A request is queueing its partitions' batches: a flush waits for the rest of them (see :meth:`release`)."""
        self._holding += 1

    def release(self) -> None:
        """The request's partitions are all queued: a flush they wait for may start."""
        self._holding -= 1
        if not self._holding:
            self._kick()

    def _kick(self, force: bool = False) -> None:
        """Start a flush when batches wait, none is running and the flush-rate bound allows one; else make sure
        one starts when it does. A flush running is what gathers the next: whatever arrives meanwhile goes out
        together as soon as it is done. A request still queueing its partitions holds a flush back, at most
        :data:`HOLD_MAX_S`, so that a request is not split over two flushes (``force`` ends the hold)."""
        if self._flush_task is not None or not self._waiting:
            return
        loop = asyncio.get_running_loop()
        due = self._last_flush + self.interval_s
        if loop.time() < due and self._waiting_bytes < self.batch_bytes:
            if self._timer is None:
                self._timer = loop.call_at(due, self._timer_fired)
            return
        if self._holding and not force:
            if self._hold_timer is None:
                self._hold_timer = loop.call_later(HOLD_MAX_S, self._hold_expired)
            return
        for timer in (self._timer, self._hold_timer):
            if timer is not None:
                timer.cancel()
        self._timer = self._hold_timer = None
        self._last_flush = loop.time()
        self._flush_task = loop.create_task(self._flush())
        self._flush_task.add_done_callback(self._flushed)

    def _timer_fired(self) -> None:
        self._timer = None
        self._kick()

    def _hold_expired(self) -> None:
        self._hold_timer = None
        self._kick(force=True)

    def _flushed(self, task: asyncio.Task[None]) -> None:
        self._flush_task = None
        if not task.cancelled() and task.exception() is not None:
            log.error("a produce flush failed unexpectedly", exc_info=task.exception())
        self._kick()

    def _take(self) -> dict[tuple[str, int], list[Pending]]:
        """The waiting partitions' batches, oldest first, up to ``batch_bytes`` (a partition's are taken whole)."""
        work: dict[tuple[str, int], list[Pending]] = {}
        taken = 0
        for key in list(self._waiting):
            queue = self._queues[key]
            work[key] = queue.pending
            taken += queue.nbytes
            self._waiting_bytes -= queue.nbytes
            queue.pending, queue.nbytes = [], 0
            del self._waiting[key]
            if taken >= self.batch_bytes:
                break
        return work

    async def _flush(self) -> None:
        """One flush of what waits (one at a time, so each partition's batches go out in submission order)."""
        work = self._take()
        if not work:
            return
        outcome = await self._write(work)
        for (topic, partition), result in outcome.items():
            pendings = work[(topic, partition)]
            if isinstance(result, BaseException):
                self._forget_producers(topic, partition, pendings)
                self._fail_later_batches(topic, partition, pendings)
                for pending in pendings:
                    if not pending.future.done():
                        pending.future.set_exception(result)
                continue
            for pending, (base, last) in zip(pendings, result, strict=True):
                if pending.on_written is not None:
                    pending.on_written(topic, partition, base, last)
                if not pending.future.done():
                    pending.future.set_result(base)

    def _forget_producers(self, topic: str, partition: int, pendings: list[Pending]) -> None:
        """After a failed write it is unknown what landed: the producers' state is read again from the log."""
        queue = self._queue(topic, partition)
        for pending in pendings:
            queue.producers.pop(pending.meta.producer_id, None)

    def _fail_later_batches(self, topic: str, partition: int, pendings: list[Pending]) -> None:
        """Refuse the batches the failed producers queued since (a client pipelines its requests): written
        after a gap, they would break the producer's order. Kafka refuses them so too."""
        producers = {p.meta.producer_id for p in pendings if p.meta.producer_id >= 0}
        queue = self._queue(topic, partition)
        later = [p for p in queue.pending if p.meta.producer_id in producers]
        if not later:
            return
        queue.pending = [p for p in queue.pending if p.meta.producer_id not in producers]
        self._waiting_bytes -= queue.nbytes
        queue.nbytes = sum(p.nbytes for p in queue.pending)
        self._waiting_bytes += queue.nbytes
        if not queue.pending:
            self._waiting.pop((topic, partition), None)
        for pending in later:
            if not pending.future.done():
                pending.future.set_exception(
                    ProduceError(
                        f"{topic}-{partition}: an earlier batch of producer {pending.meta.producer_id} was not written",
                        OUT_OF_ORDER_SEQUENCE_NUMBER,
                    )
                )

    async def _write(self, work: dict[tuple[str, int], list[Pending]]) -> dict[tuple[str, int], Any]:
        """Write a flush: every shared topic's partitions as one shared object and a commit per topic
        (PROTOCOL.md 7.3), a partitioned topic's as one object per partition, at once; then one change notice
        for every topic written. Per partition: each batch's (base, last) offsets, or the error."""
        loop = asyncio.get_running_loop()
        outcome: dict[tuple[str, int], Any] = {}
        shared: dict[tuple[str, int], list[Pending]] = {}
        calls = []
        for key, pendings in work.items():
            try:
                is_shared = self.gateway.root.partition(*key).chain.sequence is not None
            except Exception as exc:  # noqa: BLE001 - this partition's requests fail; the others go on
                outcome[key] = exc
                continue
            if is_shared:
                shared[key] = pendings
            else:
                calls.append(loop.run_in_executor(self.gateway.executor, self._append, key, pendings))
        if shared:
            calls.append(loop.run_in_executor(self.gateway.executor, self._append_together, shared))
        for result in await asyncio.gather(*calls):
            outcome.update(result)
        written: dict[str, list[int]] = {}
        for (topic, partition), result in outcome.items():
            if not isinstance(result, BaseException):
                written.setdefault(topic, []).append(partition)
        if written:
            for topic in written:
                self.gateway.services_wake(topic)
            failure = await loop.run_in_executor(self.gateway.executor, self._notify, written)
            if failure is not None:
                for topic, partitions in written.items():
                    for partition in partitions:
                        outcome[(topic, partition)] = failure
            self._merge_tiers({topic for topic, _ in shared if topic in written})
            if self.maintenance is not None:
                self.maintenance.submit(written)
        return outcome

    def _append(self, key: tuple[str, int], pendings: list[Pending]) -> dict[tuple[str, int], Any]:
        """One partitioned topic's partition as one object (runs in a thread)."""
        topic, partition = key
        try:
            partition_log = self.gateway.root.partition(topic, partition)
            timeouts = [p.transaction_timeout_ms for p in pendings if p.transaction_timeout_ms is not None]
            result = partition_log.append(
                [(p.payload, p.meta) for p in pendings],
                durable=True,
                notify=False,
                transaction_timeout_ms=max(timeouts) if timeouts else None,
            )
        except Exception as exc:  # noqa: BLE001 - this partition's requests fail; the others go on
            log.warning("produce to %s-%d failed: %s", topic, partition, exc)
            return {key: exc}
        self.objects_written += 1
        return {key: _offsets(pendings, result.base_offsets)}

    def _append_together(self, work: dict[tuple[str, int], list[Pending]]) -> dict[tuple[str, int], Any]:
        """Every shared topic's partitions of a flush as one shared object (runs in a thread)."""
        keys = sorted(work)
        try:
            logs = [self.gateway.root.partition(topic, partition) for topic, partition in keys]
        except Exception as exc:  # noqa: BLE001 - these requests fail; the partitioned topics' go on
            return dict.fromkeys(keys, exc)
        timeouts = [
            q.transaction_timeout_ms for ps in work.values() for q in ps if q.transaction_timeout_ms is not None
        ]
        results = append_together(
            [(plog, [(p.payload, p.meta) for p in work[key]]) for plog, key in zip(logs, keys, strict=True)],
            durable=True,
            transaction_timeout_ms=max(timeouts) if timeouts else None,
        )
        outcome: dict[tuple[str, int], Any] = {}
        for key, result in zip(keys, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("produce to %s-%d failed: %s", *key, result)
                outcome[key] = result
            else:
                outcome[key] = _offsets(work[key], result.base_offsets)
        if any(not isinstance(r, BaseException) for r in results):
            self.objects_written += 1
        return outcome

    def _notify(self, written: dict[str, list[int]]) -> BaseException | None:
        """The change notices of the topics written (runs in a thread): one root notice for the flush; the error
        if it failed.

        As plog's producer: an append is acknowledged only with its notice (PROTOCOL.md 9.1). When it fails
        the objects exist; the client's retry is recognised as one (11.9) and gets their offsets."""
        try:
            self.gateway.root.notify_topics(written)
        except PlogError as exc:
            log.warning("change notice of %s failed: %s", ", ".join(sorted(written)), exc)
            return exc
        self.notices_written += 1
        return None

    def _merge_tiers(self, topics: set[str]) -> None:
        """After a flush is acknowledged: merge a tier of small commits it completed (PROTOCOL.md 10.2), in a
        thread and off the produce path, at most every ``TIER_MERGE_SPACING_S`` per topic; no request unless a
        tier is due."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        for topic in topics - self._merging:
            if now - self._tier_merged.get(topic, float("-inf")) < TIER_MERGE_SPACING_S:
                continue  # a tier completed meanwhile waits for the next flush after the spacing
            self._tier_merged[topic] = now
            self._merging.add(topic)
            task = loop.run_in_executor(self.gateway.executor, self._merge_tier, topic)
            task.add_done_callback(functools.partial(self._merged, topic))

    def _merged(self, topic: str, _: asyncio.Future[None]) -> None:
        self._merging.discard(topic)

    def _merge_tier(self, topic: str) -> None:
        try:
            self.gateway.root.merge_own_tier(topic)
        except Exception as exc:  # noqa: BLE001 - a pass merges it later
            log.warning("merging the commits of %s failed: %s", topic, exc)

    def close(self) -> None:
        """Let the maintenance process finish what flushes asked of it, for a bounded time (requests wait for their
        flush, so a closing gateway has answered or failed them)."""
        if self.maintenance is not None:
            self.maintenance.close()


def _continues(state: ProducerSequence, epoch: int, first: int, last: int) -> bool:
    """Whether a batch fits what this gateway remembers of its producer: the next sequence or a recent batch of
    the same epoch, a newer epoch's first batch, or an older (fenced) epoch. Anything else may mean the memory is
    stale (the producer wrote through another gateway meanwhile, in this epoch or a newer one)."""
    if epoch == state.epoch:
        return first == state.next_sequence or (first, last) in state.recent
    return epoch < state.epoch or first == 0


def _offsets(pendings: list[Pending], base_offsets: list[int]) -> list[tuple[int, int]]:
    """Each written batch's (base, last) offsets."""
    return [(base, base + p.payload.num_rows - 1) for p, base in zip(pendings, base_offsets, strict=True)]


def recover_producer(
    partition_log: PartitionLog, producer_id: int, now: int | None = None
) -> tuple[int, int, list[tuple[tuple[int, int], int]]] | None:
    """The producer's epoch, next sequence and recent batches ((first, last) sequence -> base offset) in a
    partition, from the indexes of its newest objects (PROTOCOL.md 11.9); None when none of them holds its batches."""
    now = now_ms() if now is None else now
    view = partition_log.view(refresh=True)
    recent: list[tuple[tuple[int, int], int]] = []
    found: tuple[int, int] | None = None
    examined = 0
    for ref in reversed(view.segments):
        if not is_run(ref):  # a run's index is its commit entry, in memory: only stored indexes are counted
            if examined >= RECOVERY_OBJECTS:
                break
            examined += 1
        elif not partition_log.may_hold_producer(ref, producer_id):
            continue  # thousands of runs not moved yet: their entries' rows say, without an index each
        index = partition_log.index(ref)
        # One comparison over the index: a segment that maintenance merged holds the batches of every producer.
        rows = np.flatnonzero(index.producer_ids == producer_id)
        for i in reversed(rows.tolist()):
            epoch = int(index.producer_epochs[i])
            first = int(index.base_sequences[i])
            count = int(index.last_offsets[i]) - int(index.base_offsets[i]) + 1
            if found is None:
                found = (epoch, first + count)
            if epoch == found[0] and len(recent) < RECENT_BATCHES:
                recent.append(((first, first + count - 1), int(index.base_offsets[i])))
        if found is not None and len(recent) >= RECENT_BATCHES:
            break
        if len(index.max_timestamps) and now - int(max(index.max_timestamps)) > RECOVERY_WINDOW_MS:
            break
    if found is None:
        return None
    return found[0], found[1], list(reversed(recent))
