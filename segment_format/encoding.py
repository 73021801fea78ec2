"""Encoding the batches of one append: offsets and append time stamped, then serialised, in parallel.

Encoding is mostly compression, which releases the GIL, so the batches of one
append are encoded on the process-wide thread pool of ``parallel.py``, several
batches to an Arrow call (``BATCHES_PER_CALL``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from .parallel import ordered_imap, ordered_map
from .records import TIMESTAMP_TYPE, with_offsets
from .segment import ATTR_LOG_APPEND_TIME, BatchMeta, EncodedBatch, encode_batches_together
from .typed.layout import TypedLayout

#: One batch to encode: its payload columns (no offsets), what its producer states, and its first offset.
EncodeJob = tuple[pa.RecordBatch, BatchMeta, int]


#: Batches encoded by one Arrow call (``encode_batches_together``): few calls, so that an encoding thread
#: seldom has to take the GIL back from a busy caller, yet several per append, so that the store writes
#: the first batches while later ones compress and the pool's threads share the work.
BATCHES_PER_CALL = 16


def _stamped(job: EncodeJob, append_ms: int | None) -> tuple[pa.RecordBatch, BatchMeta]:
    """A job's batch with its offsets, and its producer's statement; with ``append_ms`` (LogAppendTime)
    every record stamped with it, and the batch flagged as stamped by the log."""
    payload, meta, offset = job
    if append_ms is not None:  # LogAppendTime: the log stamps the records
        payload = payload.set_column(
            0, "timestamp", pa.array(np.full(payload.num_rows, append_ms, np.int64)).cast(TIMESTAMP_TYPE)
        )
        meta = replace(meta, attributes=meta.attributes | ATTR_LOG_APPEND_TIME)
    return with_offsets(payload, offset), meta


def _encode_chunk(
    jobs: list[EncodeJob], options: ipc.IpcWriteOptions, append_ms: int | None, layout: TypedLayout | None
) -> list[EncodedBatch]:
    stamped = [_stamped(job, append_ms) for job in jobs]
    return encode_batches_together([b for b, _ in stamped], [m for _, m in stamped], options, layout)


def _calls(jobs: list[EncodeJob]) -> list[list[EncodeJob]]:
    """``jobs`` cut into the groups of one Arrow call each (``BATCHES_PER_CALL``)."""
    return [jobs[i : i + BATCHES_PER_CALL] for i in range(0, len(jobs), BATCHES_PER_CALL)]


def encode_batches(
    jobs: list[EncodeJob], options: ipc.IpcWriteOptions, append_ms: int | None, layout: TypedLayout | None = None
) -> Iterator[EncodedBatch]:
    """Encode the batches of one append, yielded in order as each is ready: ``BATCHES_PER_CALL`` at a
    time, every group started on the pool at once, so the first can be written while later ones
    compress; the first failure in order is raised when reached, as one by one.

    With ``append_ms`` (the topic's ``LogAppendTime``) every record's timestamp
    is replaced by it and the batch is flagged as stamped by the log. ``layout``: a typed topic's
    payloads, already conformed to that version, stored as its columns (PROTOCOL.md 11.8).
    """
    encoded = ordered_imap(lambda chunk: _encode_chunk(chunk, options, append_ms, layout), _calls(jobs))
    return (batch for chunk in encoded for batch in chunk)


#: One run of batches to encode on its own: its jobs, its topic's write options and its typed layout.
EncodeRun = tuple[list[EncodeJob], ipc.IpcWriteOptions, TypedLayout | None]


def encode_runs(runs: Sequence[EncodeRun]) -> list[list[EncodedBatch]]:
    """Encode several runs (a shared object's partitions), each run's batches in order, with every run's
    groups of ``BATCHES_PER_CALL`` on the pool at once: a flush of a few partitions has a group or two per
    partition, so encoding them one run after the other would leave the pool's other threads idle while the
    flush, not the cores, bounds a gateway's rate. The first failure in order is raised."""
    groups = [
        (number, chunk, options, layout)
        for number, (jobs, options, layout) in enumerate(runs)
        for chunk in _calls(jobs)
    ]
    encoded: list[list[EncodedBatch]] = [[] for _ in runs]
    chunks = ordered_map(lambda group: _encode_chunk(group[1], group[2], None, group[3]), groups)
    for (number, *_), chunk in zip(groups, chunks, strict=True):
        encoded[number].extend(chunk)
    return encoded
