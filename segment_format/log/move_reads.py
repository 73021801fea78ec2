"""One read of each shared object for every partition a maintenance pass moves (PROTOCOL.md 10.2).

::

    shared objects    X1: | p0 | p1 | ... | p63 |   X2: | p0 | ... | p63 |   ...   X200
    partitions due    p0 .. p63, 512 MiB of runs in all
    rounds            p0 .. p15 (128 MiB): one range of X1, one of X2, ... -> moves of p0 .. p15
                      p16 .. p31: one range of X1, ...                      -> moves of p16 .. p31   ...

A flush writes every partition it touches into one shared object, so the partitions of a steadily written
topic near a move's bound together. Each moving its runs alone would read every object once per partition:
P requests per object, for a 64-partition topic more than its writes cost. A pass therefore works out first
which partitions are due (from the views it resolves anyway; once one is, every partition past half the bounds
with it, :func:`due_together`), puts them in rounds of at most
:data:`MOVE_READ_BYTES` of runs, and before each round reads, from each object, the one range that holds
that round's runs; the round's movers take their bytes from it. The bytes are unverified here: each batch is
checked against its CRC32C when the mover decodes it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import NamedTuple

from ..parallel import io_map
from ..segment import SegmentIndex
from ..segment.reader import batch_range
from ..stores.base import Store
from .shared_spans import run_spans

__all__ = ["MOVE_READ_BYTES", "TOGETHER_REACH", "MoveCandidate", "MoveReads", "due_together", "move_rounds"]

#: The most bytes of runs one round reads and keeps.
MOVE_READ_BYTES = 128 * 1024 * 1024
#: A pass that moves some partition of a topic also moves those that have come this far towards either bound:
#: their runs lie in the same shared objects, which one round then reads once for all (10.2).
TOGETHER_REACH = 0.5


class MoveReads:
    """The spans of shared objects that hold one round's runs, read at the first request for them (a pass cut
    short before the round reads nothing); ``get_range`` serves a mover from them."""

    def __init__(self, store: Store, runs: Sequence[SegmentIndex] = ()) -> None:
        self.store = store
        self._wanted = run_spans(runs)
        self._spans: dict[str, tuple[int, bytes]] | None = None

    def _load(self) -> dict[str, tuple[int, bytes]]:
        keys = list(self._wanted)
        data = io_map(lambda key: self.store.get_range(key, *self._wanted[key]), keys)
        return {key: (self._wanted[key][0], part) for key, part in zip(keys, data, strict=True)}

    def get_range(self, key: str, start: int, end: int) -> bytes | memoryview:
        """Bytes ``[start, end)`` of ``key``: from the round's span when it holds them, else one request."""
        if key in self._wanted and self._spans is None:
            self._spans = self._load()
        found = (self._spans or {}).get(key)
        if found is not None and found[0] <= start and end <= found[0] + len(found[1]):
            return memoryview(found[1])[start - found[0] : end - found[0]]
        return self.store.get_range(key, start, end)


class MoveCandidate(NamedTuple):
    """A shared partition's runs (its commit part) and how far they have come towards a move (1: due)."""

    runs: Sequence[SegmentIndex]
    reach: float


def due_together(candidates: Mapping[int, MoveCandidate]) -> dict[int, Sequence[SegmentIndex]]:
    """The runs a pass moves, by partition: none while no partition is due, and once one is, every partition's
    that has reached :data:`TOGETHER_REACH`. Partitions falling due one by one would each read a range of
    every shared object; moved together, a round reads each object once for all of them (PROTOCOL.md 10.2)."""
    if not any(candidate.reach >= 1.0 for candidate in candidates.values()):
        return {}
    return {p: c.runs for p, c in candidates.items() if c.runs and c.reach >= TOGETHER_REACH}


def move_rounds(
    store: Store,
    due: Mapping[int, Sequence[SegmentIndex]],
    order: Sequence[int],
    before_round: Callable[[], None] | None = None,
) -> Iterator[tuple[int, MoveReads | None]]:
    """The partitions of ``order`` to maintain, in turn, each with the reads its moves take bytes from: the
    partitions with runs ``due`` first, in rounds of at most :data:`MOVE_READ_BYTES` (each round's spans read
    at its first move), then the others (None: nothing to move). ``before_round`` is called before every round
    but the first (a pass lists its topic again there when its listing is getting old, 10.2)."""
    moving = [p for p in order if due.get(p)]
    rounds: list[list[int]] = []
    size = 0
    for p in moving:
        bytes_due = sum(_run_bytes(idx) for idx in due[p])
        if not rounds or size + bytes_due > MOVE_READ_BYTES:
            rounds.append([])
            size = 0
        rounds[-1].append(p)
        size += bytes_due
    for n, partitions in enumerate(rounds):
        if n and before_round is not None:
            before_round()
        reads = MoveReads(store, [idx for p in partitions for idx in due[p]])
        for p in partitions:
            yield p, reads
    for p in order:
        if not due.get(p):
            yield p, None


def _run_bytes(idx: SegmentIndex) -> int:
    start, end = batch_range(idx, 0, idx.batch_count - 1)
    return end - start
