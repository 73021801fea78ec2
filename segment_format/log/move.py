"""Moving a shared partition's runs into a segment of its own (PROTOCOL.md 10.2).

::

    partition p   segments (7.2)                       | commit part (runs in shared objects, 7.3)
    before        [ g2 0..1000 ][ g1 1000..1800 ]      | c41#p 1800..1850  c42#p 1850..1900 ... c57#p ..2400
    after         [ g2 0..1000 ][ g1 1000..1800 ][ g1.c<id> 1800..2400 ]
                  the chain end is now 2400: readers skip the runs below it, collection deletes what
                  nothing names any more

A shared topic's flush costs one object whatever the partitions it touches; a partition's records leave
the shared objects once they are worth a segment (``segment.bytes`` / 8 of them) or old
(``shared.move.ms``), so that neither a hot nor a cold partition pins commits and shared objects. Each
batch is checked, decoded with its absolute offsets (and its commit's time, in a ``LogAppendTime`` run),
resolved when its transaction is decided, and encoded again with the topic's compression.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

import pyarrow as pa

from ..layout import new_rewrite_id, rewritten_name
from ..records import now_ms
from ..segment import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    BatchMeta,
    EncodedBatch,
    assemble_segment,
    encode_batch,
    ipc_options,
)
from ..segment.index import SegmentIndex
from ..segment.reader import batch_range, decode_range, read_batches
from .chain import LogChain, LogView, SegmentRef
from .move_reads import TOGETHER_REACH, MoveReads
from .reader import COMMITTED, TransactionResolver, batch_outcome

__all__ = ["RunMover", "is_run", "move_bound", "segments_only"]

#: A partition's runs move once they hold this share of ``segment.bytes`` (PROTOCOL.md 10.2): 8 MiB by default.
MOVE_SHARE = 8


def move_bound(config: Any) -> int:
    """The stored bytes of a partition's runs that make it due to move (``segment.bytes`` / 8, PROTOCOL.md
    10.2); also the most a merge copies into one shared object, never more than a move makes a segment of."""
    return int(config["segment.bytes"]) // MOVE_SHARE


def is_run(ref: SegmentRef) -> bool:
    """Whether a chain element is a run of a shared object (PROTOCOL.md 7.3), not a segment of the partition."""
    return ref.generation < 0


def segments_only(view: LogView, chain_end: int) -> LogView:
    """``view`` without its commit part: the partition's segments, ending at ``chain_end`` (PROTOCOL.md 7.3
    step 1). Merging, compaction, retention and garbage collection work on segments alone (10.2)."""
    segments = [ref for ref in view.segments if not is_run(ref)]
    running_max = view.running_max_timestamp if len(segments) == len(view.segments) else -1
    return LogView(
        segments,
        min(view.start_offset, chain_end),
        chain_end,
        view.superseded,
        view.start_marker,
        running_max,
        view.stale_markers,
    )


class RunMover:
    """Writes a shared partition's commit part, or its first entries, as one rewritten object (10.2)."""

    def __init__(
        self, chain: LogChain, writer_id: str, topic: str, partition: int, reads: MoveReads | None = None
    ) -> None:
        self.chain = chain
        self.writer_id = writer_id
        self.topic = topic
        self.partition = partition
        #: Where runs' bytes come from: a pass's spans read for every partition it moves, else the store.
        self.reads = reads

    def reach(self, view: LogView, now: int) -> float:
        """How far the commit part has come towards a move (PROTOCOL.md 10.2): the larger of its stored bytes
        over ``segment.bytes`` / 8 and its oldest run's age over ``shared.move.ms``; 1 is due, 0 no runs."""
        runs = [ref for ref in view.segments if is_run(ref)]
        if not runs:
            return 0.0
        config = self.chain.config
        stored = sum(ref.size for ref in runs) / move_bound(config)
        age_ms = now - min(self.chain.index(ref).meta.created_ms for ref in runs)
        move_ms = config["shared.move.ms"]
        aged = age_ms / move_ms if move_ms > 0 else (math.inf if age_ms >= 0 else 0.0)
        return max(stored, aged)

    def due_runs(self, view: LogView, now: int, together: bool = False) -> list[SegmentRef]:
        """The runs a move takes now: all of the commit part once it has reached a bound (:meth:`reach`),
        else none; ``together``: half of one, for a pass that moves other partitions of the topic anyway."""
        if self.reach(view, now) >= (TOGETHER_REACH if together else 1.0):
            return [ref for ref in view.segments if is_run(ref)]
        return []

    def move(
        self, runs: list[SegmentRef], listed_monotonic: float, resolver: TransactionResolver | None, chain_end: int
    ) -> int:
        """Write ``runs`` (the commit part's first entries) as rewritten objects from ``chain_end`` on, one per
        value schema version in a typed topic; returns how many were written. Nothing is sent once the listing
        the runs came from is W old (PROTOCOL.md 10.2): the next pass moves them."""
        written = 0
        group: list[SegmentRef] = []
        for ref in runs:
            if group and self._version(ref) != self._version(group[0]):
                if not self._write(group, listed_monotonic, resolver, chain_end):
                    return written
                written += 1
                group = []
            group.append(ref)
        if group and self._write(group, listed_monotonic, resolver, chain_end):
            written += 1
        return written

    def _version(self, ref: SegmentRef) -> int | None:
        return self.chain.index(ref).meta.value_schema_version

    def _write(
        self, group: list[SegmentRef], listed_monotonic: float, resolver: TransactionResolver | None, chain_end: int
    ) -> bool:
        chain = self.chain
        options = ipc_options(chain.config["compression.type"])
        indexes = [chain.index(ref) for ref in group]
        base = max(group[0].base_offset, chain_end)
        batches: list[EncodedBatch] = []
        holds_transactions = False
        for idx in indexes:
            # One ranged GET per run: its batches, checked, with absolute offsets and stamped times.
            for i, batch in enumerate(self._batches(idx)):
                meta, keep = self._resolved(idx, i, resolver)
                below = base - int(idx.base_offsets[i])
                if not keep or below > int(idx.last_offsets[i]) - int(idx.base_offsets[i]):
                    continue  # dropped, or wholly below a start marker above the segments (7.3 step 1)
                if below > 0:
                    batch = batch.slice(below)
                    if meta.base_sequence >= 0:
                        meta = replace(meta, base_sequence=meta.base_sequence + below)
                holds_transactions |= meta.transaction >= 0
                batches.append(encode_batch(batch, meta, options, idx.meta.layout))
        last = indexes[-1]
        created_ms = now_ms()
        fields: dict[str, Any] = {
            "base_offset": base,
            "next_offset": last.meta.next_offset,
            "running_max_timestamp": last.meta.running_max_timestamp,
            "compression": chain.config["compression.type"],
            "created_ms": created_ms,
            "writer": self.writer_id,
            "generation": 1,
            "min_append_ms": min(idx.meta.append_bounds()[0] for idx in indexes),
            "max_append_ms": max(idx.meta.append_bounds()[1] for idx in indexes),
        }
        if not batches:  # every batch an aborted transaction's: the object still covers the offsets
            fields["min_timestamp"] = min(idx.meta.min_timestamp for idx in indexes)
            fields["max_timestamp"] = max(idx.meta.max_timestamp for idx in indexes)
        timeouts = [idx.meta.transaction_timeout_ms for idx in indexes if idx.meta.transaction_timeout_ms is not None]
        if holds_transactions and timeouts:
            fields["transaction_timeout_ms"] = max(timeouts)
        data, _ = assemble_segment(batches, fields, indexes[0].meta.layout)
        key = chain.prefix + "log/" + rewritten_name(base, last.meta.next_offset, 1, new_rewrite_id(created_ms))
        send_by = listed_monotonic + chain.config["writer.max.staleness.ms"] / 1000
        if time.monotonic() >= send_by:
            return False
        with chain.store.deadline(send_by):
            chain.store.put_if_absent(key, data)
        return True

    def _batches(self, idx: SegmentIndex) -> list[pa.RecordBatch]:
        """Every batch of run ``idx``, checked: one ranged read, or bytes the pass's reads already hold."""
        if self.reads is None:
            return read_batches(self.chain.store, idx, 0, idx.batch_count - 1)
        start, end = batch_range(idx, 0, idx.batch_count - 1)
        data = self.reads.get_range(idx.data_key, start, end)
        return [b for b in decode_range(idx, 0, idx.batch_count - 1, start, data) if b is not None]

    def _resolved(self, idx: SegmentIndex, i: int, resolver: TransactionResolver | None) -> tuple[BatchMeta, bool]:
        """Batch ``i``'s producer fields as written, and whether it is written at all: an aborted
        transaction's batch is dropped, a committed one's is plain (PROTOCOL.md 10, *Resolving transactions*)."""
        attributes = int(idx.attributes[i])
        meta = BatchMeta(
            producer_id=int(idx.producer_ids[i]),
            producer_epoch=int(idx.producer_epochs[i]),
            base_sequence=int(idx.base_sequences[i]),
            attributes=attributes,
            transaction=int(idx.transactions[i]),
        )
        if attributes & ATTR_CONTROL or not attributes & ATTR_TRANSACTIONAL or resolver is None:
            return meta, True
        outcome = batch_outcome(resolver, idx, i, self.topic, self.partition)
        if outcome is None:
            return meta, True
        if outcome != COMMITTED:
            return meta, False
        plain = BatchMeta(meta.producer_id, meta.producer_epoch, meta.base_sequence, attributes & ~ATTR_TRANSACTIONAL)
        return plain, True
