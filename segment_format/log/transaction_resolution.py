"""Resolving decided transactions as batches are rewritten (PROTOCOL.md 10, *Resolving transactions*).

::

    stored batch                                  written as
    control (a marker), or non-transactional  ->  its stored bytes
    transactional, undecided                  ->  its stored bytes (its decision still decides it)
    transactional, aborted or unlisted        ->  nothing
    transactional, committed                  ->  its records as one non-transactional batch (plain_batch)

Once a transaction's outcome is written into the data, readers need no decision to read it, and the
decisions can be collected. Two rewrites apply this rule, rule 1 of PROTOCOL.md 11.6, *What a rewrite keeps*:
a merge in a root listing ``boundedHistory`` (:mod:`segment_format.log.maintenance`), with
:func:`resolve_transactions`; and a compaction pass (:mod:`segment_format.log.compaction`), which filters
records besides, and writes the kept records of a committed transaction with :func:`plain_batch`.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.ipc as ipc

from ..segment import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    BatchMeta,
    EncodedBatch,
    SegmentIndex,
    decode_batch,
    encode_batch,
    ipc_options,
)
from .reader import COMMITTED, TransactionResolver, batch_outcome


def plain_batch(records: pa.RecordBatch, idx: SegmentIndex, i: int, options: ipc.IpcWriteOptions) -> EncodedBatch:
    """``records`` (kept records of batch ``i`` of ``idx``) written as one non-transactional batch: the
    outcome of a committed transaction is known (PROTOCOL.md 11.6, *What a rewrite keeps*). The batch keeps
    its producer fields, timestamp type and ``base_sequence``; a typed topic's keeps its object's layout."""
    meta = BatchMeta(
        producer_id=int(idx.producer_ids[i]),
        producer_epoch=int(idx.producer_epochs[i]),
        base_sequence=int(idx.base_sequences[i]),
        attributes=int(idx.attributes[i]) & ~ATTR_TRANSACTIONAL,
        transaction=-1,
    )
    return encode_batch(records, meta, options, idx.meta.layout)


def resolve_transactions(
    idx: SegmentIndex, raw: list[EncodedBatch], resolver: TransactionResolver, topic: str, partition: int
) -> tuple[list[EncodedBatch], bool]:
    """An object's batches as a merge in a root listing ``boundedHistory`` writes them, and whether a
    transactional batch is among them (PROTOCOL.md 10, *Resolving transactions*).

    Control and non-transactional batches, and transactional ones still undecided, are copied byte for
    byte; decided ones are resolved as compaction's rule 1 says: aborted (or unlisted) ones dropped,
    committed ones written as non-transactional (:func:`plain_batch`). Only those are decoded.
    """
    out: list[EncodedBatch] = []
    remains = False
    options = None
    for i, stored in enumerate(raw):
        attributes = int(idx.attributes[i])
        if attributes & ATTR_CONTROL or not attributes & ATTR_TRANSACTIONAL:
            out.append(stored)
            continue
        outcome = batch_outcome(resolver, idx, i, topic, partition)
        if outcome is None:
            out.append(stored)
            remains = True
        elif outcome == COMMITTED:
            options = options or ipc_options(idx.meta.compression)
            out.append(plain_batch(decode_batch(idx, i, stored.message), idx, i, options))
    return out, remains
