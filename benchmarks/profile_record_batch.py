"""Throughput of the gateway's Kafka record-batch codec (pyspark_logsource/gateway/record_batch.py).

Decodes and encodes batches of 500 records with 100 B and 1 KiB values, uncompressed and lz4, and runs
kafka-python's own pure-Python record batch reader and builder on the same data as the same-run reference.
MB/s counts value bytes. Run: ``PYTHONPATH=. python benchmarks/profile_record_batch.py``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from pyspark_logsource.gateway.record_batch import decode_batches, encode_batch
from segment_format.records import payload_batch, with_offsets

RECORDS = 500
KAFKA_CODECS = {None: 0, "lz4": 3}


def _rate(fn: Callable[[], object], seconds: float = 0.5) -> float:
    """Calls per second of ``fn``, best of three runs of about ``seconds`` / 3 each."""
    fn()
    best = float("inf")
    for _ in range(3):
        calls = 0
        start = time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed > seconds / 3:
                break
        best = min(best, elapsed / calls)
    return 1 / best


def main() -> None:
    """Print the table."""
    print(f"{'case':<34}{'MB/s':>10}{'records/s':>14}")
    for size in (100, 1024):
        values = [os.urandom(size // 2) * 2 for _ in range(RECORDS)]  # compressible, as real payloads are
        keys = [b"key-%d" % i for i in range(RECORDS)]
        stamps = np.int64(1_700_000_000_000) + np.arange(RECORDS, dtype=np.int64) // 10
        batch = with_offsets(payload_batch(stamps, keys, values), 0)
        for codec in (None, "lz4"):
            encoded = encode_batch(batch, compression=codec)

            def ours_decode(encoded: bytes = encoded) -> object:
                return decode_batches(encoded, max_uncompressed_bytes=64 << 20)

            def ours_encode(codec: str | None = codec, batch: pa.RecordBatch = batch) -> object:
                return encode_batch(batch, compression=codec)

            def kp_decode(encoded: bytes = encoded) -> object:
                return [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in DefaultRecordBatch(encoded)]

            def kp_encode(
                codec: str | None = codec,
                stamps: np.ndarray = stamps,
                keys: list[bytes] = keys,
                values: list[bytes] = values,
            ) -> object:
                builder = DefaultRecordBatchBuilder(2, KAFKA_CODECS[codec], False, -1, -1, -1, 1 << 30)
                for i in range(RECORDS):
                    builder.append(i, int(stamps[i]), keys[i], values[i], [])
                return builder.build()

            for name, fn in (
                ("decode", ours_decode),
                ("decode kafka-python", kp_decode),
                ("encode", ours_encode),
                ("encode kafka-python", kp_encode),
            ):
                rate = _rate(fn)
                label = f"{name} {size} B {codec or 'none'}"
                print(f"{label:<34}{rate * RECORDS * size / 1e6:>10.0f}{rate * RECORDS:>14,.0f}")


if __name__ == "__main__":
    main()
