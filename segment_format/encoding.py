"""Encoding the batches of one append: offsets and append time stamped, then serialised, in parallel.

Encoding is mostly compression, which releases the GIL, so the batches of one
append are encoded on the process-wide thread pool of ``parallel.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from .parallel import ordered_imap
from .records import TIMESTAMP_TYPE, with_offsets
from .segment import ATTR_LOG_APPEND_TIME, BatchMeta, EncodedBatch, encode_batch
from .typed_layout import TypedLayout

#: One batch to encode: its payload columns (no offsets), what its producer states, and its first offset.
EncodeJob = tuple[pa.RecordBatch, BatchMeta, int]


def _encode_one(
    job: EncodeJob, options: ipc.IpcWriteOptions, append_ms: int | None, layout: TypedLayout | None
) -> EncodedBatch:
    payload, meta, offset = job
    if append_ms is not None:  # LogAppendTime: the log stamps the records
        payload = payload.set_column(
            0, "timestamp", pa.array(np.full(payload.num_rows, append_ms, np.int64)).cast(TIMESTAMP_TYPE)
        )
        meta = replace(meta, attributes=meta.attributes | ATTR_LOG_APPEND_TIME)
    return encode_batch(with_offsets(payload, offset), meta, options, layout)


def encode_batches(
    jobs: list[EncodeJob], options: ipc.IpcWriteOptions, append_ms: int | None, layout: TypedLayout | None = None
) -> Iterator[EncodedBatch]:
    """Encode the batches of one append, yielded in order as each is ready (all start on the pool at
    once, so the first can be written while later ones compress); the first failure in order is raised
    when reached, as one by one.

    With ``append_ms`` (the topic's ``LogAppendTime``) every record's timestamp
    is replaced by it and the batch is flagged as stamped by the log. ``layout``: a typed topic's
    payloads, already conformed to that version, stored as its columns (PROTOCOL.md 11.8).
    """
    return ordered_imap(lambda job: _encode_one(job, options, append_ms, layout), jobs)
