"""``plog inspect``: the segment objects of a topic's partitions, their indexes, and the batch holding an offset.

The facts come from the listings of :mod:`segment_format.inspect.listings` (the
frames a notebook shows) and are drawn by :mod:`pyspark_logsource.views.terminal`;
this module only picks what to show.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from coordinator.transactions import TransactionCoordinator
from pyspark_logsource.cli.common import EXIT_OK, CliError, Env
from pyspark_logsource.client.admin import LogStore
from pyspark_logsource.views.terminal import (
    batch_table,
    cell_text,
    index_table,
    records_table,
    segments_table,
    shared_objects_table,
)
from segment_format.errors import OffsetOutOfRangeError
from segment_format.log.partition_log import PartitionLog
from segment_format.records import now_ms
from segment_format.topic import TopicMetadata, is_compacted, is_shared

if TYPE_CHECKING:
    import pandas as pd

    from pyspark_logsource.cli.common import Commands


def register(commands: Commands, common: argparse.ArgumentParser) -> None:
    """Add ``plog inspect`` to ``commands``."""
    inspect = commands.add_parser("inspect", parents=[common], help="segment objects, indexes and batches")
    inspect.add_argument("topic")
    inspect.add_argument("--partition", type=int, help="only this partition (default: all)")
    inspect.add_argument("--index", action="store_true", help="also print each segment's batch index")
    inspect.add_argument("--batch", metavar="OFFSET", type=int, help="dump the batch holding this offset")
    inspect.add_argument("--limit", type=int, default=20, help="with --batch: records to show (default %(default)s)")
    inspect.add_argument(
        "--width",
        type=int,
        default=80,
        help="with --batch: truncate values to this many characters (default %(default)s)",
    )
    inspect.set_defaults(handler=cmd_inspect)


def cmd_inspect(env: Env) -> int:
    """``plog inspect TOPIC``: the segment objects of one or all partitions; ``--index``, ``--batch``."""
    # The listings bring pandas, a second of start-up that only this command needs.
    from segment_format.inspect.listings import element_name, index_frame, segments_frame, shared_objects

    args = env.args
    with LogStore(env.url, env.options) as store:
        root = store.root
        meta = root.topic(args.topic, refresh=True)
        if args.partition is not None:
            meta.check_partition(args.partition)
        if args.batch is not None:
            partition = _single_partition(meta, args.partition, "--batch")
            _dump_batch(env, root.partition(args.topic, partition, meta), args.batch)
            return EXIT_OK
        partitions = [args.partition] if args.partition is not None else list(range(meta.partitions))
        compacted = is_compacted(meta.config)
        shared = is_shared(meta.config)
        if shared:  # each shared object once, with its partitions; the partitions below list their segments
            typed = meta.schema_history is not None
            env.out.print(shared_objects_table(shared_objects(root, args.topic), f"{args.topic}: commit part", typed))
        for p in partitions:
            log = root.partition(args.topic, p, meta)
            view = log.view()
            frame = segments_frame(log, view, superseded=False)
            runs = frame[frame["generation"] < 0] if shared else frame.iloc[0:0]
            if shared:
                frame = frame[frame["generation"] >= 0].reset_index(drop=True)
            # A typed topic's objects each hold one value schema version (PROTOCOL.md 11.8).
            versions = frame["value_schema_version"].tolist() if meta.schema_history is not None else None
            if shared and frame.empty:
                env.out.print(
                    cell_text(f"{log.name}  start {view.start_offset:,}  end {view.end_offset:,}  (no segment)")
                )
            else:
                table = segments_table(frame, log.name, view.start_offset, view.end_offset, compacted, versions)
                env.out.print(table)
            _print_runs(env, runs, view.end_offset)
            if compacted:
                env.out.print(cell_text(_compaction_summary(store, log, meta), "dim"))
            if view.superseded:
                env.out.print(
                    cell_text(f"  {len(view.superseded)} superseded object(s) off the chain, awaiting deletion", "dim")
                )
            if args.index:
                for ref in view.segments:
                    index = log.index(ref)
                    env.out.print(index_table(index_frame(index), f"index of {element_name(ref.key, index)}"))
    return EXIT_OK


def _print_runs(env: Env, runs: pd.DataFrame, end_offset: int) -> None:
    """One line for a shared partition's commit part: its runs, listed once per object in the table above."""
    if len(runs):
        first = int(runs["base_offset"].iloc[0])
        objects = runs["object"].nunique()
        env.out.print(
            cell_text(
                f"  partition's commit part: {len(runs)} run(s), offsets [{first:,}, {end_offset:,}), in {objects} "
                "shared object(s) listed above",
                "dim",
            )
        )


def _compaction_summary(store: LogStore, log: PartitionLog, meta: TopicMetadata) -> str:
    """One line on a compacted partition's clean and dirty parts and whether a pass would compact it."""
    compactor = log.cleaner.compactor
    assert compactor is not None
    transactions = TransactionCoordinator(store.root.store)
    view = log.view(refresh=False)
    plan = compactor.plan(view, now_ms(), transactions.resolve, transactions.decided_ms)
    elements = view.segments
    dirty_from = elements[plan.first_dirty].base_offset if plan.first_dirty < len(elements) else view.end_offset
    clean_end = elements[plan.cleanable].base_offset if plan.cleanable < len(elements) else view.end_offset
    ratio = plan.dirty_bytes / plan.cleanable_bytes if plan.cleanable_bytes else 0.0
    wanted = meta.config["min.cleanable.dirty.ratio"]
    return (
        f"  compaction: clean [{view.start_offset:,}, {dirty_from:,}), dirty [{dirty_from:,}, {clean_end:,}) "
        f"of the cleanable run ({plan.dirty_bytes:,} of {plan.cleanable_bytes:,} bytes, ratio {ratio:.2f}; "
        f"min.cleanable.dirty.ratio {wanted}), the rest not yet cleanable (last element, open transaction or "
        f"min.compaction.lag.ms); {'due: the next pass compacts it' if plan.due else 'not due'}"
    )


def _dump_batch(env: Env, log: PartitionLog, offset: int) -> None:
    """The batch holding ``offset``: its index fields, then up to ``--limit`` of its records around the offset."""
    from segment_format.inspect.listings import batches_frame, element_name, segment_at, segment_records

    view = log.view()
    ref = view.segments[segment_at(log, view, offset)]
    idx = log.index(ref)
    b = idx.batch_for_offset(offset)
    if b >= idx.batch_count or int(idx.base_offsets[b]) > offset:
        raise OffsetOutOfRangeError(f"no record at offset {offset} in {log.name} (removed by compaction)")
    row = batches_frame(log.store, idx, check=False).iloc[b]
    title = f"{log.name}: batch {b} of {idx.batch_count} in {element_name(ref.key, idx)}"
    env.out.print(batch_table(row, title, ref.key, idx.meta.compression, idx.meta.value_schema_version))

    batch = segment_records(log, idx, b)
    offsets = batch.column("offset").to_pylist()
    at = offsets.index(offset) if offset in offsets else 0
    limit = env.args.limit
    lo = max(0, min(at - limit // 2, batch.num_rows - limit))
    hi = min(batch.num_rows, lo + limit)
    shown = batch.slice(lo, hi - lo)
    title = f"records {lo + 1}..{hi} of {batch.num_rows} in the batch"
    env.out.print(records_table(shown, title, highlight=offset, width=env.args.width))


def _single_partition(meta: TopicMetadata, partition: int | None, flag: str) -> int:
    if partition is not None:
        return partition
    if meta.partitions == 1:
        return 0
    raise CliError(f"{flag} needs --partition: topic {meta.name!r} has {meta.partitions} partitions")
