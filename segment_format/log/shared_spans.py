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
from collections.abc import Iterable

import pyarrow as pa

from ..segment import SegmentIndex


def run_spans(runs: Iterable[SegmentIndex]) -> dict[str, tuple[int, int]]:
    """For each shared object holding some of ``runs`` (run indexes, PROTOCOL.md 7.3), the one byte range
    ``[first, stop)`` that holds them all: what a reader that knows every run it will read asks for at once."""
    spans: dict[str, tuple[int, int]] = {}
    for run in runs:
        low = int(run.positions.min())
        high = int((run.positions + run.lengths).max())
        first, stop = spans.get(run.data_key, (low, high))
        spans[run.data_key] = (min(first, low), max(stop, high))
    return spans


#: Default bound of the bytes kept, over all spans.
DEFAULT_CAPACITY_BYTES = 64 * 1024 * 1024
#: The longest span read for several partitions: past it, each reads its own range as a lone reader does.
MAX_SPAN_BYTES = 16 * 1024 * 1024


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
        self._planned: dict[str, tuple[int, int]] = {}
        self._spans: OrderedDict[str, tuple[int, pa.Buffer]] = OrderedDict()
        self._bytes = 0
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

    def plan(self, spans: dict[str, tuple[int, int]]) -> None:
        """The spans to read of shared objects, ``[first, stop)`` by key, as a planner that knows which runs
        will be read gave them (a Spark task's runs): used instead of the commits this process knows."""
        with self._lock:
            self._planned = dict(spans)

    def planned(self, data_key: str) -> tuple[int, int] | None:
        """The span :meth:`plan` gave for ``data_key``, if any."""
        with self._lock:
            return self._planned.get(data_key)

    def put(self, data_key: str, start: int, data: pa.Buffer) -> None:
        """Keep ``data``, the bytes of shared object ``data_key`` from ``start`` on, evicting the oldest spans."""
        if data.size > self.capacity_bytes:
            return
        with self._lock:
            old = self._spans.pop(data_key, None)
            if old is not None:
                self._bytes -= old[1].size
            self._spans[data_key] = (start, data)
            self._bytes += data.size
            while self._bytes > self.capacity_bytes:
                _key, (_start, evicted) = self._spans.popitem(last=False)
                self._bytes -= evicted.size

    def covering(self, data_key: str, start: int, end: int) -> tuple[int, pa.Buffer] | None:
        """The kept span of ``data_key`` that holds bytes ``[start, end)`` (its first byte and its bytes), left
        in place for the other partitions' readers; None if no kept span holds them."""
        with self._lock:
            found = self._spans.get(data_key)
            if found is None or not (found[0] <= start and end <= found[0] + found[1].size):
                return None
            self._spans.move_to_end(data_key)
            return found

    @property
    def nbytes(self) -> int:
        """Bytes kept now (never more than ``capacity_bytes``)."""
        with self._lock:
            return self._bytes
