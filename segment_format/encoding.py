"""Encoding the batches of one append: offsets and append time stamped, then serialised, in parallel.

Encoding is mostly compression, which releases the GIL, so the batches of one
append are encoded on a small process-wide thread pool. The pool is created on
first use and again in a forked child, which cannot use its parent's threads.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from .records import TIMESTAMP_TYPE, with_offsets
from .segment import ATTR_LOG_APPEND_TIME, BatchMeta, EncodedBatch, encode_batch

#: Batches of one append are encoded (mostly compression, which releases the GIL) on up to this many threads.
ENCODE_THREADS = min(4, os.cpu_count() or 1)
_encode_pool_lock = threading.Lock()
_encode_pool_owner: tuple[int, ThreadPoolExecutor] | None = None

#: One batch to encode: its payload columns (no offsets), what its producer states, and its first offset.
EncodeJob = tuple[pa.RecordBatch, BatchMeta, int]


def _encode_one(job: EncodeJob, options: ipc.IpcWriteOptions, append_ms: int | None) -> EncodedBatch:
    payload, meta, offset = job
    if append_ms is not None:  # LogAppendTime: the log stamps the records
        payload = payload.set_column(
            0, "timestamp", pa.array(np.full(payload.num_rows, append_ms, np.int64)).cast(TIMESTAMP_TYPE)
        )
        meta = replace(meta, attributes=meta.attributes | ATTR_LOG_APPEND_TIME)
    return encode_batch(with_offsets(payload, offset), meta, options)


def encode_batches(jobs: list[EncodeJob], options: ipc.IpcWriteOptions, append_ms: int | None) -> list[EncodedBatch]:
    """Encode the batches of one append, in order; the first failure (in order) is raised, as one by one.

    With ``append_ms`` (the topic's ``LogAppendTime``) every record's timestamp
    is replaced by it and the batch is flagged as stamped by the log.
    """
    global _encode_pool_owner
    if len(jobs) < 2 or ENCODE_THREADS < 2:
        return [_encode_one(job, options, append_ms) for job in jobs]
    owner = _encode_pool_owner
    if owner is None or owner[0] != os.getpid():  # a forked child cannot use its parent's threads
        with _encode_pool_lock:
            owner = _encode_pool_owner
            if owner is None or owner[0] != os.getpid():
                owner = _encode_pool_owner = (
                    os.getpid(),
                    ThreadPoolExecutor(ENCODE_THREADS, thread_name_prefix="plog-encode"),
                )
    return list(owner[1].map(lambda job: _encode_one(job, options, append_ms), jobs))
