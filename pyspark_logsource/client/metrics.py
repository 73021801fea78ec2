"""Client metrics under Kafka's names: sampled rates, averages and maxima, and the store's requests.

Kafka's clients measure over *sampled windows*: a stat keeps ``samples`` samples of ``window_s``
seconds each (2 of 30 s by default, ``metrics.num.samples`` and ``metrics.sample.window.ms``); a rate
is the sum over the samples divided by the time they span, counted as at least ``samples - 1`` whole
windows so that a rate does not spike when the first sample is young (Kafka's ``Rate.windowSize``).
:class:`SampledStat` does the same, and keeps the all-time total and count beside its samples for
the ``-total`` metrics. An average or maximum over no samples is 0.0 here (Kafka reports NaN, which
JSON and most dashboards cannot show).

:class:`ProducerMetrics` is fed by every append of a producer (``TransactionManager.append``: one
append, one object, is plog's produce request) and by the sender's failed buffers (``record-error-*``:
records whose ``send`` future failed; ``send_batch`` raises its failures to its caller instead).
:class:`ConsumerMetrics` is fed by every fetch round of a consumer (``Fetcher.fetch``). ``records-lag``
is each assigned partition's lag after its last read (the log end the read saw minus the position), and
``records-lag-max`` the largest of those now, not over the sample windows as Kafka's, so that it reads 0
once a consumer has caught up.

The store's requests are counted by a :class:`~segment_format.stores.counting.CountingStore` under
the client's root (:func:`counting_root`); :func:`store_metrics` names them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa

from segment_format.root import LogRoot
from segment_format.stores import open_store
from segment_format.stores.counting import REQUEST_KINDS, CountingStore, estimated_cost_usd

__all__ = [
    "ConsumerMetrics",
    "ProducerMetrics",
    "SampledStat",
    "counting_root",
    "store_metrics",
]

#: Kafka's client defaults: ``metrics.sample.window.ms`` (30 s) and ``metrics.num.samples`` (2).
WINDOW_S = 30.0
SAMPLES = 2


class SampledStat:
    """Values recorded over time: their rate, count rate, average and maximum over the sample windows,
    and their all-time total and count. Thread-safe; ``clock`` is for tests."""

    def __init__(
        self, window_s: float = WINDOW_S, samples: int = SAMPLES, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window_s = window_s
        self.samples = samples
        self.clock = clock
        #: Each sample: [start, count, sum, max].
        self._samples: list[list[float]] = []
        self._lock = threading.Lock()
        #: Every value recorded, summed, and how many (never purged).
        self.total = 0.0
        self.count = 0

    def record(self, value: float = 1.0) -> None:
        """Record one value (1 for an event counted)."""
        now = self.clock()
        with self._lock:
            self.total += value
            self.count += 1
            if not self._samples or now - self._samples[-1][0] >= self.window_s:
                self._samples.append([now, 0.0, 0.0, value])
                del self._samples[: -self.samples]
            current = self._samples[-1]
            current[1] += 1
            current[2] += value
            current[3] = max(current[3], value)

    def _live(self, now: float) -> list[list[float]]:
        """The samples not yet obsolete (started within ``samples`` windows of ``now``)."""
        return [s for s in self._samples if now - s[0] < self.samples * self.window_s]

    def _span(self, live: list[list[float]], now: float) -> float:
        """Kafka's ``Rate.windowSize``: the time the samples span, at least ``samples - 1`` whole windows."""
        elapsed = now - live[0][0] if live else 0.0
        full = int(elapsed // self.window_s)
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.window_s
        return elapsed

    def rate(self) -> float:
        """Sum of the values per second over the sample windows (``record-send-rate``, ``outgoing-byte-rate``)."""
        now = self.clock()
        with self._lock:
            live = self._live(now)
            return sum(s[2] for s in live) / self._span(live, now) if live else 0.0

    def count_rate(self) -> float:
        """Values recorded per second over the sample windows (``request-rate``, ``fetch-rate``)."""
        now = self.clock()
        with self._lock:
            live = self._live(now)
            return sum(s[1] for s in live) / self._span(live, now) if live else 0.0

    def avg(self) -> float:
        """The values' average over the sample windows (0.0 if none)."""
        now = self.clock()
        with self._lock:
            live = self._live(now)
            n = sum(s[1] for s in live)
            return sum(s[2] for s in live) / n if n else 0.0

    def max(self) -> float:
        """The largest value over the sample windows (0.0 if none)."""
        now = self.clock()
        with self._lock:
            live = self._live(now)
            return max((s[3] for s in live), default=0.0)


class ProducerMetrics:
    """A producer's sends, under Kafka's producer metric names (see the module docstring)."""

    def __init__(self) -> None:
        self.records = SampledStat()  # records per request
        self.bytes = SampledStat()  # bytes per request
        self.requests = SampledStat()  # latency (ms) per request
        self.batches = SampledStat()  # bytes per batch
        self.errors = SampledStat()  # records per failed buffer

    def appended(self, batches: Iterable[pa.RecordBatch], seconds: float) -> None:
        """One append (a produce request) wrote ``batches`` in ``seconds``."""
        records = nbytes = 0
        for batch in batches:
            records += batch.num_rows
            nbytes += batch.nbytes
            self.batches.record(batch.nbytes)
        self.records.record(records)
        self.bytes.record(nbytes)
        self.requests.record(seconds * 1000)

    def failed(self, records: int) -> None:
        """The futures of ``records`` records of ``send`` failed (a buffer the sender could not write)."""
        self.errors.record(records)

    def snapshot(self) -> dict[str, float]:
        """The metrics, by Kafka name."""
        return {
            "record-send-rate": self.records.rate(),
            "record-send-total": self.records.total,
            "outgoing-byte-rate": self.bytes.rate(),
            "outgoing-byte-total": self.bytes.total,
            "request-rate": self.requests.count_rate(),
            "request-total": self.requests.count,
            "request-latency-avg": self.requests.avg(),
            "request-latency-max": self.requests.max(),
            "record-error-rate": self.errors.rate(),
            "record-error-total": self.errors.total,
            "batch-size-avg": self.batches.avg(),
            "batch-size-max": self.batches.max(),
            "records-per-request-avg": self.records.avg(),
        }


class ConsumerMetrics:
    """A consumer's fetches, under Kafka's consumer fetch-manager metric names (see the module docstring)."""

    def __init__(self) -> None:
        self.records = SampledStat()  # records per fetch
        self.bytes = SampledStat()  # bytes per fetch
        self.fetches = SampledStat()  # latency (ms) per fetch
        #: Per assigned partition, its lag after its last read: "topic-partition" -> records.
        self.lag: dict[Any, int] = {}

    def fetched(self, batches: Iterable[pa.RecordBatch], seconds: float, assignment: Iterable[Any]) -> None:
        """One fetch round returned ``batches`` in ``seconds``; lags of partitions no longer in
        ``assignment`` are dropped."""
        records = nbytes = 0
        for batch in batches:
            records += batch.num_rows
            nbytes += batch.nbytes
        self.records.record(records)
        self.bytes.record(nbytes)
        self.fetches.record(seconds * 1000)
        assigned = set(assignment)
        for tp in [tp for tp in self.lag if tp not in assigned]:
            del self.lag[tp]

    def snapshot(self) -> dict[str, Any]:
        """The metrics, by Kafka name; ``records-lag`` maps ``topic-partition`` to its lag."""
        lags = dict(self.lag)
        return {
            "records-consumed-rate": self.records.rate(),
            "records-consumed-total": self.records.total,
            "bytes-consumed-rate": self.bytes.rate(),
            "bytes-consumed-total": self.bytes.total,
            "fetch-rate": self.fetches.count_rate(),
            "fetch-total": self.fetches.count,
            "fetch-latency-avg": self.fetches.avg(),
            "fetch-latency-max": self.fetches.max(),
            "fetch-size-avg": self.bytes.avg(),
            "fetch-size-max": self.bytes.max(),
            "records-per-request-avg": self.records.avg(),
            "records-lag-max": max(lags.values(), default=0),
            "records-lag": {f"{tp[0]}-{tp[1]}": lag for tp, lag in sorted(lags.items())},
        }


def counting_root(url: str, storage_options: dict[str, Any] | None = None) -> LogRoot:
    """A ``LogRoot`` on ``url`` whose store counts its requests (``root.store`` is a ``CountingStore``)."""
    store = CountingStore(open_store(url, storage_options))
    try:
        return LogRoot(url, store=store)
    except BaseException:
        store.close()  # the root did not take it: a store passed in is the caller's to release
        raise


def store_metrics(store: Any) -> dict[str, float]:
    """plog's own metrics of a root's store: requests by kind, errors, retries and their estimated cost
    (empty for a store that does not count, see :class:`~segment_format.stores.counting.CountingStore`)."""
    if not isinstance(store, CountingStore):
        return {}
    counts = store.counts()
    out: dict[str, float] = {f"plog-store-{kind.lower()}-total": counts[kind] for kind in REQUEST_KINDS}
    out["plog-store-requests-total"] = sum(counts.values())
    out["plog-store-errors-total"] = store.errors
    out["plog-store-retries-total"] = store.retries
    out["plog-store-cost-usd-total"] = estimated_cost_usd(counts)
    return out
