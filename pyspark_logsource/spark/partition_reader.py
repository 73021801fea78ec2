"""What a Spark task runs: reading one partition's offset range as Arrow batches, with read-ahead."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator, Iterator
from typing import Any

import pyarrow as pa

from coordinator.transactions import TransactionCoordinator
from pyspark_logsource.spark.compat import InputPartition
from pyspark_logsource.spark.conversion import to_spark_batch, to_spark_typed_batch
from pyspark_logsource.spark.input_partition import PlogInputPartition, PlogObjectsInputPartition
from pyspark_logsource.spark.options import SourceOptions
from pyspark_logsource.spark.planning import (
    OffsetRange,
    data_loss,
    split_ranges,
)
from pyspark_logsource.spark.shared_planning import plan_shared
from pyspark_logsource.spark.typed import ReaderSchema
from pyspark_logsource.spark.workers import executor_quota, executor_root
from segment_format.errors import (
    DataLossError,
    OffsetOutOfRangeError,
    PlogError,
    UnknownTopicOrPartitionError,
)
from segment_format.log.chain import LogChain, LogView, SegmentRef
from segment_format.log.partition_log import PartitionLog
from segment_format.log.reader import READ_COMMITTED
from segment_format.log.shared_spans import run_ranges
from segment_format.records import clip_before
from segment_format.root import LogRoot
from segment_format.topic import is_shared
from segment_format.typed.layout import FieldFilter, Projection, TypedLayout, layout_for

#: Stored bytes a task asks the log for at a time (a soft bound: whole batches are read). Small
#: ranges keep each batch in the CPU caches between decompression and Spark's Arrow writer.
READ_CHUNK_BYTES = 4 * 1024 * 1024
#: Batches a task reads ahead of Spark in a background thread (0: read in the task's own thread).
PREFETCH_BATCHES = 16


# ---------------------------------------------------------------------------- reading (executors)


def _past_removed(fail: bool, where: str, position: int, until: int, log_start: int) -> int:
    """Offsets from ``position`` were removed (retention, delete_records): report it, return where to go on."""
    skip_to = min(log_start, until)
    data_loss(fail, f"offsets [{position}, {skip_to}) of {where} are gone: the log now starts at {log_start}")
    return skip_to


class _Raised:
    """An exception carried from the prefetch thread to the task's generator."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


_DONE = object()


def prefetched(batches: Iterator[pa.RecordBatch], depth: int) -> Generator[pa.RecordBatch, None, None]:
    """Run ``batches`` in a thread, ``depth`` batches ahead of the consumer.

    Reading, checking and decompressing the next segment range (pyarrow and
    the stores release the GIL) then overlaps with the Python worker writing
    the current batches to Spark, instead of Spark waiting for each range.
    """
    ready: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for batch in batches:
                if not put(batch):
                    return
            put(_DONE)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            put(_Raised(exc))

    thread = threading.Thread(target=run, name="plog-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = ready.get()
            if item is _DONE:
                return
            if isinstance(item, _Raised):
                raise item.error
            yield item
    finally:
        stop.set()


def read_partition(part: InputPartition) -> Iterator[pa.RecordBatch]:
    """Yield the records of one input partition as Arrow batches of the source's schema."""
    if isinstance(part, PlogObjectsInputPartition):
        batches = _read_runs(part)
    elif isinstance(part, PlogInputPartition):
        batches = _read_partition(part)
    else:  # Spark's placeholder when a batch read has nothing to read
        return iter(())
    if PREFETCH_BATCHES:
        return prefetched(batches, PREFETCH_BATCHES)
    return batches


def _read_runs(part: PlogObjectsInputPartition) -> Iterator[pa.RecordBatch]:
    """A shared topic's runs, in commit order: the partitions read together, each shared object's span once."""
    root, _transactions = executor_root(part.pieces[0].url, part.pieces[0].storage_options)
    root.index_cache.spans.want(part.topic, part.partitions)
    root.index_cache.spans.plan(run_ranges(run for piece in part.pieces for _key, run in piece.runs))
    for piece in part.pieces:
        yield from _read_partition(piece)


def _read_partition(part: PlogInputPartition) -> Iterator[pa.RecordBatch]:
    root, transactions = executor_root(part.url, part.storage_options)
    resolver = transactions.resolve if part.isolation_level == READ_COMMITTED else None
    where = f"{part.topic}-{part.partition}"
    fail = part.fail_on_data_loss
    try:
        meta = root.topic(part.topic)
        if meta.topic_id != part.topic_id:
            meta = root.topic(part.topic, refresh=True)
    except UnknownTopicOrPartitionError:
        data_loss(
            fail,
            f"topic {part.topic!r} no longer exists: offsets [{part.start}, {part.until}) of {where} cannot be read",
        )
        return
    if meta.topic_id != part.topic_id:
        data_loss(
            fail,
            f"topic {part.topic!r} was deleted and re-created: offsets "
            f"[{part.start}, {part.until}) of {where} cannot be read",
        )
        return
    plog = root.partition(part.topic, part.partition, meta)
    projection = None
    if part.value_schema is not None:
        # Every batch read as the query's version, only the wanted fields decoded (PROTOCOL.md 11.8).
        projection = Projection(layout_for(*part.value_schema), part.value_fields, part.value_filters)
    elif meta.schema_history is not None:
        raise PlogError(f"topic {part.topic!r} is typed, but the query was planned to read it as untyped")
    default_type = 1 if meta.config.get("message.timestamp.type") == "LogAppendTime" else 0
    position = part.start
    # The planner's chain and start, not a listing per task (PROTOCOL.md 9, planned reads): a listing per
    # partition and micro-batch would cost more than the records it reads. The start is the later of
    # the planner's and the worker's own last listing's (starts only move forward).
    plog.chain.seed(part.segments, dict(part.runs))
    # The worker's share of the query's consumer_byte_rate (PROTOCOL.md 11.10): each read is at most the
    # quota's burst, and its records wait for their allowance before Spark receives them (in the prefetch
    # thread, as a Kafka consumer waits for a delayed fetch response).
    quota = executor_quota(root, "consumer_byte_rate", part.quota_user, part.client_id)
    log_start = max(part.log_start, plog.chain.listed_start)
    if position < log_start:
        position = _past_removed(fail, where, position, part.until, log_start)
    refreshed = False
    while position < part.until:
        try:
            batches, next_offset = plog.read(
                position,
                max_records=part.until - position,
                max_bytes=READ_CHUNK_BYTES,
                max_decoded_bytes=quota.step_bytes(),
                isolation=part.isolation_level,
                resolver=resolver,
                projection=projection,
            )
        except OffsetOutOfRangeError:
            view = plog.view()
            if position < view.start_offset:
                position = _past_removed(fail, where, position, part.until, view.start_offset)
                continue
            data_loss(
                fail, f"offsets [{position}, {part.until}) of {where} are gone: the log now ends at {view.end_offset}"
            )
            return
        if not batches:
            if next_offset <= position:  # at the log's end, or (read_committed) at an undecided transaction
                end = plog.view().end_offset  # a fresh listing: the read below uses it
                if position < end and not refreshed:
                    # The planned view may name an object a resolving merge replaced, whose transaction's
                    # decision was collected since (PROTOCOL.md 11.2, *Collection*): read again on the fresh chain.
                    refreshed = True
                    continue
                if position < end:
                    raise DataLossError(
                        f"offset {position} of {where} belongs to a transaction that is not "
                        f"decided, below the range [{part.start}, {part.until}) planned as "
                        "stable: its decision object is missing"
                    )
                data_loss(fail, f"offsets [{position}, {part.until}) of {where} are gone: the log now ends at {end}")
                return
            position = next_offset
            continue
        quota.acquire(sum(b.nbytes for b in batches), 1)  # one read counted as one store request
        for batch in batches:
            batch = clip_before(batch, part.until)
            if batch.num_rows:
                first = int(batch.column(0)[0].as_py())
                try:
                    timestamp_type = plog.timestamp_type(first, default_type)
                except (PlogError, IndexError):  # the column's kind is a label: never fail a read over it
                    timestamp_type = default_type
                if projection is None:
                    yield to_spark_batch(batch, part.topic, part.partition, timestamp_type, part.include_headers)
                else:
                    yield to_spark_typed_batch(
                        batch, part.topic, part.partition, timestamp_type, part.include_headers, part.flatten_value
                    )
        position = next_offset


def covering(view: LogView, start: int, until: int) -> tuple[SegmentRef, ...]:
    """The chain elements of ``view`` holding offsets ``[start, until)``; none if the view ends before."""
    if not view.segments or view.end_offset < until or until <= start:
        return ()
    first = max(view.segment_for(start), 0)
    last = view.segment_for(until - 1)
    refs = tuple(view.segments[first : last + 1])
    return refs if all(ref.end_offset is not None for ref in refs) else ()


def input_partitions(
    opts: SourceOptions,
    root: LogRoot,
    ranges: list[OffsetRange],
    reading: ReaderSchema | None = None,
    value_filters: tuple[FieldFilter, ...] = (),
) -> list[PlogInputPartition | PlogObjectsInputPartition]:
    """One input partition per range piece, with its topic's id (a vanished topic is data loss), and the
    chain elements and log start of the planner's view of its partition (PROTOCOL.md 9, planned reads).

    ``reading``: the value schema the query reads typed topics as (None: untyped topics only);
    ``value_filters``: pushed conditions on its fields (batch reads).
    """
    reading = reading if reading is not None else ReaderSchema()
    out: list[PlogInputPartition | PlogObjectsInputPartition] = []
    # A shared topic's ranges are regrouped by commit below, not split per partition (PROTOCOL.md 7.3).
    shared = {r.topic for r in ranges if _is_shared(root, r.topic)}
    unsplit = [r for r in ranges if r.topic in shared and r.size > 0]
    by_topic: dict[str, list[tuple[PlogInputPartition, LogChain]]] = {}
    for r in split_ranges([r for r in ranges if r.topic not in shared], opts.min_partitions) + unsplit:
        try:
            meta = root.topic(r.topic)
            pin = reading.pin_for(meta, opts)
            topic_id = meta.topic_id
            plog = root.partition(r.topic, r.partition, meta)
            view = plog.view(refresh=False)
        except UnknownTopicOrPartitionError:
            data_loss(
                opts.fail_on_data_loss,
                f"topic {r.topic!r} no longer exists: offsets [{r.start}, "
                f"{r.until}) of {r.topic}-{r.partition} cannot be read",
            )
            continue
        part = PlogInputPartition(
            opts.url,
            opts.storage_options,
            r.topic,
            topic_id,
            r.partition,
            r.start,
            r.until,
            opts.fail_on_data_loss,
            opts.include_headers,
            opts.isolation_level,
            view.start_offset,
            covering(view, r.start, r.until),
            pin,
            opts.value_fields if pin is not None else None,
            opts.flatten_value and pin is not None,
            () if pin is None else _known_filters(value_filters, layout_for(*pin)),
            opts.quota_user,
            opts.client_id,
        )
        if r.topic in shared:
            by_topic.setdefault(r.topic, []).append((part, plog.chain))
        else:
            out.append(part)
    for parts in by_topic.values():
        out.extend(plan_shared(parts, opts.min_partitions))
    return out


def _is_shared(root: LogRoot, topic: str) -> bool:
    try:
        return is_shared(root.topic(topic).config)
    except UnknownTopicOrPartitionError:
        return False  # reported where its ranges are planned


def _known_filters(filters: tuple[FieldFilter, ...], layout: TypedLayout) -> tuple[FieldFilter, ...]:
    """The pushed conditions that name fields of the schema read (Spark's names may differ in case)."""
    return tuple(f for f in filters if f[0] in layout.names)


def stable_end(opts: SourceOptions, transactions: TransactionCoordinator) -> Callable[[PartitionLog], int] | None:
    """What "latest" means: the log end, or for read_committed the last stable offset (Kafka's LSO)."""
    if opts.isolation_level != READ_COMMITTED:
        return None
    return lambda plog: plog.last_stable_offset(transactions.resolve, whole=0)  # planning reads no batches
