"""Spans of shared objects read once for every partition a process reads of a topic (PROTOCOL.md 7.3, *Reading*).

::

    shared object:  | topic a: p0 run | p1 run | p2 run | p3 run | topic b: ... |
    wanted a: {0, 2, 3}     one range read:  [p0 run ............... p3 run]
                            p0's reader decodes its run, p2's and p3's take theirs from the kept span

A shared object's sections are sorted by topic, then partition, so the runs of the partitions a process reads
lie in one byte range per topic. A process that reads several partitions of a topic (a consumer's assignment,
a Spark task's partitions) says which (:meth:`SharedSpans.want`); the first of their readers to need bytes of
a shared object reads that one range, and the others take their runs from it instead of one request each.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Future

import pyarrow as pa

from ..segment import SegmentIndex


def run_ranges(runs: Iterable[SegmentIndex]) -> dict[str, list[tuple[int, int]]]:
    """For each shared object holding some of ``runs`` (run indexes, PROTOCOL.md 7.3), the byte range
    ``[first, stop)`` of each of them, in the order given."""
    ranges: dict[str, list[tuple[int, int]]] = {}
    for run in runs:
        low = int(run.positions.min())
        high = int((run.positions + run.lengths).max())
        ranges.setdefault(run.data_key, []).append((low, high))
    return ranges


def run_spans(runs: Iterable[SegmentIndex]) -> dict[str, tuple[int, int]]:
    """For each shared object holding some of ``runs``, the one byte range ``[first, stop)`` that holds them
    all: what a reader that knows every run it will read asks for at once."""
    return {
        key: (min(low for low, _ in ranges), max(high for _, high in ranges))
        for key, ranges in run_ranges(runs).items()
    }


#: Default bound of the bytes kept, over all spans.
DEFAULT_CAPACITY_BYTES = 64 * 1024 * 1024
#: The longest span read at once: the runs of a larger object are read in windows of at most this many bytes.
MAX_SPAN_BYTES = 16 * 1024 * 1024


def span_window(ranges: Iterable[tuple[int, int]], start: int, end: int) -> tuple[int, int]:
    """The window of a shared object to read for bytes ``[start, end)``, given the byte ranges of every run the
    process will read of it: consecutive ranges packed, from the lowest on, into windows of at most
    :data:`MAX_SPAN_BYTES` (a longer range is a window of its own), and the one holding ``[start, end)``.
    The windows depend on the ranges alone, so the partitions' readers, whatever their order, share them and
    read each once: a flush larger than one window costs a read per window, not one per partition."""
    window: tuple[int, int] | None = None
    for low, high in sorted([*ranges, (start, end)]):
        if window is not None and high - window[0] <= MAX_SPAN_BYTES:
            window = (window[0], max(window[1], high))
            continue
        if window is not None and window[0] <= start and end <= window[1]:
            return window
        window = (low, high)
    assert window is not None  # ranges holds (start, end) at least
    return window


class SharedSpans:
    """A thread-safe, byte-bounded LRU of spans of shared objects, each handed to every reader it covers.

    Shared objects never change, so a kept span stays right for as long as its key exists. Losing one (it was
    evicted, or never read because the partitions' readers ran far apart) only costs a request: the reader
    reads its own range, as it would without it. The bytes are unverified: every batch is checked against its
    CRC32C when it is decoded, exactly as if it had just been read.
    """

    def __init__(self, capacity_bytes: int = DEFAULT_CAPACITY_BYTES) -> None:
        self.capacity_bytes = capacity_bytes
        self._wanted: dict[str, frozenset[int]] = {}
        self._planned: dict[str, list[tuple[int, int]]] = {}
        #: Kept bytes by (object, first byte), oldest use first; and each object's first bytes kept.
        self._spans: OrderedDict[tuple[str, int], pa.Buffer] = OrderedDict()
        self._starts: dict[str, set[int]] = {}
        self._bytes = 0
        #: Spans being read now, by (object, first byte): a reader that needs one waits for it (see :meth:`read`).
        self._reading: dict[tuple[str, int], Future[pa.Buffer]] = {}
        self._lock = threading.Lock()

    def want(self, topic: str, partitions: Iterable[int]) -> None:
        """``partitions`` of ``topic`` are read together from now on (an empty set: none)."""
        chosen = frozenset(partitions)
        with self._lock:
            if len(chosen) > 1:
                self._wanted[topic] = chosen
            else:
                self._wanted.pop(topic, None)

    def wanted(self, topic: str) -> frozenset[int]:
        """The partitions of ``topic`` read together (none, or at least two)."""
        with self._lock:
            return self._wanted.get(topic, frozenset())

    def plan(self, ranges: dict[str, list[tuple[int, int]]]) -> None:
        """The byte ranges of the runs to read of each shared object (:func:`run_ranges`), as a planner that
        knows which runs will be read gave them (a Spark task's runs): used instead of the commits this
        process knows."""
        with self._lock:
            self._planned = dict(ranges)

    def planned(self, data_key: str) -> list[tuple[int, int]] | None:
        """The ranges :meth:`plan` gave for ``data_key``, if any."""
        with self._lock:
            return self._planned.get(data_key)

    def read(self, data_key: str, first: int, read: Callable[[], pa.Buffer]) -> pa.Buffer:
        """The span of ``data_key`` from ``first`` on that ``read`` reads, read once however many threads ask for
        it at the same time (a gateway's fetches, woken together by one notice, reach a new object together):
        the first reads and keeps it, the others wait for its bytes. A failed read fails every reader waiting for
        it, as their own reads would have failed."""
        with self._lock:
            pending = self._reading.get((data_key, first))
            mine = pending is None
            if mine:
                pending = self._reading[(data_key, first)] = Future()
        assert pending is not None
        if not mine:
            return pending.result()
        try:
            data = read()
            self.put(data_key, first, data)  # kept before it stops being read: a reader finds it one way or the other
        except BaseException as exc:
            pending.set_exception(exc)
            raise
        finally:
            with self._lock:
                del self._reading[(data_key, first)]
        pending.set_result(data)
        return data

    def put(self, data_key: str, start: int, data: pa.Buffer) -> None:
        """Keep ``data``, the bytes of shared object ``data_key`` from ``start`` on, evicting the oldest spans."""
        if data.size > self.capacity_bytes:
            return
        with self._lock:
            self._drop((data_key, start))
            self._spans[(data_key, start)] = data
            self._starts.setdefault(data_key, set()).add(start)
            self._bytes += data.size
            while self._bytes > self.capacity_bytes:
                self._drop(next(iter(self._spans)))

    def _drop(self, span: tuple[str, int]) -> None:
        dropped = self._spans.pop(span, None)
        if dropped is None:
            return
        self._bytes -= dropped.size
        starts = self._starts[span[0]]
        starts.discard(span[1])
        if not starts:
            del self._starts[span[0]]

    def covering(self, data_key: str, start: int, end: int) -> tuple[int, pa.Buffer] | None:
        """A kept span of ``data_key`` that holds bytes ``[start, end)`` (its first byte and its bytes), left
        in place for the other partitions' readers; None if no kept span holds them."""
        with self._lock:
            for first in self._starts.get(data_key, ()):
                data = self._spans[(data_key, first)]
                if first <= start and end <= first + data.size:
                    self._spans.move_to_end((data_key, first))
                    return first, data
            return None

    @property
    def nbytes(self) -> int:
        """Bytes kept now (never more than ``capacity_bytes``)."""
        with self._lock:
            return self._bytes
