"""Merging small shared objects into one, as a commit range is written (PROTOCOL.md 10.2).

::

    commits 32..47 name   shared/..a.arrow  shared/..b.arrow  ...  shared/..p.arrow   16 small flushes
    range 32-48.g1 names  shared/..m.arrow                                           their live runs, copied
                          [ section (t, v) | p0: run 32, run 35 | p1: run 32, run 40 | ... ]

A slow topic's flushes are small, and its runs wait in them until ``shared.move.ms`` moves them: a reader
catching up would read each of those objects, and a listing of ``shared/`` would hold them all. When a commit
range is written, the live runs it names, if they are few bytes in all, are copied byte for byte into one new
shared object, each partition's runs next to each other, and the range's entries name it. Runs keep their
relative offsets and rows (each batch's CRC is checked on the way): only positions change. The copied
objects are collected once no commit names them (10.2, *Garbage collection*).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from ..errors import CorruptRecordError
from ..parallel import io_map
from ..records import RECORD_SCHEMA, now_ms
from ..segment import crc32c
from ..segment.writer import EncodedBatch
from ..shared.commit import ROW_FIELDS, CommitEntry
from ..shared.object import EncodedRun, assemble_shared_object
from ..shared.sequence import TopicSequence
from .move import move_bound
from .partition_log import PartitionLog

__all__ = ["copy_small_runs"]

_RECORD_SCHEMA_BYTES = RECORD_SCHEMA.serialize().to_pybytes()
_CRC = ROW_FIELDS.index("crc32c")


def copy_small_runs(
    sequence: TopicSequence, entries: list[CommitEntry], logs: Mapping[int, PartitionLog], writer: str
) -> list[CommitEntry]:
    """``entries`` naming one new shared object that holds their runs, created now, when they name two
    objects or more and hold at most :func:`~.move.move_bound` bytes; else ``entries`` as they are.

    The caller sends the create within its listing's W (the store's deadline): an object whose range is then
    not written is an orphan that collection removes (10.2).
    """
    objects = sorted({entry.object for entry in entries})
    if len(objects) < 2 or sum(entry.stored_bytes for entry in entries) > move_bound(sequence.config):
        return entries
    spans = {key: _span(key, entries) for key in objects}
    store = sequence.store

    def read_span(key: str) -> bytes:
        own = None if sequence.own_objects is None else sequence.own_objects.take(key)
        start, end = spans[key]
        # A writer merging its own tier copies from the bytes it wrote; they are checked as a read's are, below.
        return own[start:end] if own is not None else store.get_range(key, start, end)

    read = dict(zip(objects, io_map(read_span, objects), strict=True))
    topic_id = sequence.incarnation.rstrip("/").rsplit("/", 1)[-1]
    runs = [
        _copied_run(sequence.name, topic_id, entry, read[entry.object], spans[entry.object][0], logs)
        for entry in entries
    ]
    # A partition's runs next to each other, in commit order: one byte range per partition and per section.
    order = sorted(range(len(runs)), key=lambda i: (runs[i].section, runs[i].partition, i))
    compression = str(sequence.config.get("compression.type", ""))
    merged = assemble_shared_object([runs[i] for i in order], compression, now_ms(), writer)
    store.put_if_absent(merged.key, merged.data)
    placed = dict(zip(order, merged.runs, strict=True))
    return [
        replace(entry, object=merged.key, rows=[[row[name] for name in ROW_FIELDS] for row in placed[i].rows])
        for i, entry in enumerate(entries)
    ]


def _span(key: str, entries: list[CommitEntry]) -> tuple[int, int]:
    """``[start, end)`` of object ``key`` that holds every run of ``entries`` it holds (one ranged read)."""
    ranges = [entry.byte_range() for entry in entries if entry.object == key]
    return min(start for start, _ in ranges), max(end for _, end in ranges)


def _copied_run(
    topic: str, topic_id: str, entry: CommitEntry, data: bytes, start: int, logs: Mapping[int, PartitionLog]
) -> EncodedRun:
    """``entry``'s run as the checked bytes of its batches, with their rows but for their positions."""
    batches = []
    for row in entry.rows:
        position, length = row[0], row[1]
        message = memoryview(data)[position - start : position - start + length]
        if len(message) != length or crc32c(message) != row[_CRC]:
            raise CorruptRecordError(
                f"partition {entry.partition}'s batch at byte {position} fails its CRC32C", key=entry.object
            )
        batches.append(EncodedBatch(message, dict(zip(ROW_FIELDS, row, strict=True))))
    version = entry.value_schema_version
    layout = None if version is None else logs[entry.partition].chain.layout_of(version)
    if version is not None and layout is None:
        raise CorruptRecordError(f"partition {entry.partition}'s run has unknown schema version {version}")
    schema = _RECORD_SCHEMA_BYTES if layout is None else layout.schema_bytes
    return EncodedRun(topic, topic_id, entry.partition, schema, version, batches, entry.value_stats)
