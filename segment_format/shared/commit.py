"""Commits (PROTOCOL.md 7.3): a shared topic's numbered documents that give runs their offsets.

::

    topics/<topic>/<topic_id>/commits/00000000000000000041.json                        commit 41
    topics/<topic>/<topic_id>/commits/00000000000000000000-00000000000000000032.g1.json  commits [0, 32) merged

    {"sequence": 41, "commit_id": "9f3c...", "created_ms": ..., "append_ms": ...,
     "entries": [{"partition": 3, "object": "shared/...arrow", "base_offset": 1200, "next_offset": 1257,
                  "rows": [[position, length, base, last, records, first_ts, max_ts, attributes,
                            producer_id, producer_epoch, base_sequence, transaction, crc32c,
                            uncompressed_bytes], ...]}],
     "ends": [e0, e1, ...], "max_timestamps": [m0, m1, ...]}

An entry is the index of the run it commits: :meth:`CommitEntry.index` turns it into a
:class:`~segment_format.segment.SegmentIndex` over the shared object's bytes (absolute offsets, the run's
byte range), so the log's reader reads a run as it reads a chain element.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from ..documents import JsonDocument
from ..errors import CorruptRecordError
from ..layout import NUMBER_DIGITS, format_number
from ..segment import ATTR_LOG_APPEND_TIME, INDEX_SCHEMA, SegmentIndex, SegmentMeta
from ..segment.index import INDEX_NUMPY_TYPES
from ..typed.layout import TypedLayout
from .object import decode_value_stats

__all__ = [
    "COMMITS",
    "ROW_FIELDS",
    "Commit",
    "CommitEntry",
    "commit_key",
    "commit_range_key",
    "parse_commit_name",
]

#: The folder of a topic incarnation's commits.
COMMITS = "commits/"
#: The index columns an entry's rows hold, in order (PROTOCOL.md 7.3).
ROW_FIELDS = (
    "position",
    "length",
    "base_offset",
    "last_offset",
    "record_count",
    "first_timestamp",
    "max_timestamp",
    "attributes",
    "producer_id",
    "producer_epoch",
    "base_sequence",
    "transaction",
    "crc32c",
    "uncompressed_bytes",
)
_PLAIN = re.compile(rf"^(\d{{{NUMBER_DIGITS}}})\.json$")
_RANGE = re.compile(rf"^(\d{{{NUMBER_DIGITS}}})-(\d{{{NUMBER_DIGITS}}})\.g(\d+)\.json$")


def commit_key(incarnation_prefix: str, sequence: int) -> str:
    """``<incarnation>/commits/<n:020d>.json``."""
    return f"{incarnation_prefix}{COMMITS}{format_number(sequence)}.json"


def commit_range_key(incarnation_prefix: str, first: int, end: int, generation: int) -> str:
    """``<incarnation>/commits/<a:020d>-<b:020d>.g<gen>.json``: commits ``[first, end)`` merged (10.2)."""
    return f"{incarnation_prefix}{COMMITS}{format_number(first)}-{format_number(end)}.g{generation}.json"


def parse_commit_name(name: str) -> tuple[int, int, int] | None:
    """``(first, end, generation)`` of a commit's file name: a plain commit ``n`` is ``(n, n + 1, 0)``."""
    found = _PLAIN.match(name)
    if found:
        n = int(found[1])
        return n, n + 1, 0
    found = _RANGE.match(name)
    if found:
        first, end, gen = int(found[1]), int(found[2]), int(found[3])
        if first < end and gen >= 1:
            return first, end, gen
    return None


#: Entry fields written only when they have a value.
_OPTIONAL_ENTRY_FIELDS = (
    "value_schema_version",
    "transaction_timeout_ms",
    "sequence",
    "created_ms",
    "append_ms",
    "running_max_timestamp",
    "value_stats",
)


def _rows(value: Any) -> list[list[int]]:
    if not isinstance(value, list) or not value:
        raise TypeError("expected a non-empty array of rows")
    for row in value:
        if not isinstance(row, list) or len(row) != len(ROW_FIELDS) or not all(type(v) is int for v in row):
            raise TypeError(f"a row is an array of {len(ROW_FIELDS)} integers")
    return value


def _ints(value: Any) -> list[int]:
    if not isinstance(value, list) or not all(type(v) is int for v in value):
        raise TypeError("expected an array of integers")
    return value


@dataclass
class CommitEntry(JsonDocument):
    """One run a commit claims: its partition, its object, its absolute offsets and its index rows."""

    partition: int
    object: str
    base_offset: int
    next_offset: int
    rows: list[list[int]] = field(metadata={"decode": _rows})
    value_schema_version: int | None = None
    transaction_timeout_ms: int | None = None
    #: In a commit range (10.2): the commit the entry was made by, its times, and its partition's running
    #: maximum timestamp after it. A plain commit's entries take the commit's own.
    sequence: int | None = None
    created_ms: int | None = None
    append_ms: int | None = None
    running_max_timestamp: int | None = None
    #: A typed run's per-batch field statistics (PROTOCOL.md 7.3, 11.8): base64 of an Arrow IPC record batch
    #: message, a row per row of ``rows``; None when the run has none.
    value_stats: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object, optional fields left out when they have no value."""
        doc = super().to_dict()
        for name in _OPTIONAL_ENTRY_FIELDS:
            if doc[name] is None:
                del doc[name]
        return doc

    @property
    def record_count(self) -> int:
        """Records in the run."""
        return sum(row[4] for row in self.rows)

    @property
    def stored_bytes(self) -> int:
        """Bytes of the run in its object."""
        return sum(row[1] for row in self.rows)

    def byte_range(self) -> tuple[int, int]:
        """``[start, end)`` of the run in its object."""
        return self.rows[0][0], self.rows[-1][0] + self.rows[-1][1]

    def check(self, what: str) -> None:
        """Raise :class:`CorruptRecordError` unless the rows agree with themselves and the offsets (6.3)."""
        previous_last = -1
        position = -1
        for row in self.rows:
            pos, length, base, last, count = row[:5]
            if length <= 0 or pos <= position or count < 1 or last < base or last - base + 1 < count:
                raise CorruptRecordError(f"{what}: a row of partition {self.partition} is impossible: {row}")
            if base <= previous_last:
                raise CorruptRecordError(f"{what}: rows of partition {self.partition} are not in offset order")
            previous_last, position = last, pos
        if self.rows[0][2] != 0 or self.next_offset != self.base_offset + previous_last + 1:
            raise CorruptRecordError(
                f"{what}: partition {self.partition}'s run [{self.base_offset}, {self.next_offset}) disagrees "
                "with its rows"
            )

    def index(self, key: str, commit: Commit, layout: TypedLayout | None) -> SegmentIndex:
        """The run as a chain element's index: absolute offsets, positions in the shared object ``self.object``.

        ``key`` names the element (a cache key, unique per commit element and partition). Rows whose
        LogAppendTime bit is set take the commit's ``append_ms`` as every timestamp (PROTOCOL.md 7.3).
        """
        append_ms = commit.append_ms if self.append_ms is None else self.append_ms
        created_ms = commit.created_ms if self.created_ms is None else self.created_ms
        running_max = (
            self.running_max_timestamp
            if self.running_max_timestamp is not None
            else commit.max_timestamp_of(self.partition)
        )
        stamp_ms = append_ms if self.rows[0][7] & ATTR_LOG_APPEND_TIME else None
        columns: dict[str, list[int]] = {name: [row[i] for row in self.rows] for i, name in enumerate(ROW_FIELDS)}
        columns["base_offset"] = [v + self.base_offset for v in columns["base_offset"]]
        columns["last_offset"] = [v + self.base_offset for v in columns["last_offset"]]
        if stamp_ms is not None:
            columns["first_timestamp"] = [stamp_ms] * len(self.rows)
            columns["max_timestamp"] = [stamp_ms] * len(self.rows)
        table = pa.table({field.name: _int_array(columns[field.name], field.type) for field in INDEX_SCHEMA})
        if self.value_stats is not None and layout is not None:  # what typed readers skip batches by (11.8)
            table = table.append_column("value_stats", decode_value_stats(self.value_stats, layout, len(self.rows)))
        meta = SegmentMeta(
            base_offset=self.base_offset,
            next_offset=self.next_offset,
            record_count=self.record_count,
            batch_count=len(self.rows),
            min_timestamp=min(columns["first_timestamp"]),
            max_timestamp=max(columns["max_timestamp"]),
            running_max_timestamp=max(running_max, max(columns["max_timestamp"])),
            compression="",
            created_ms=created_ms,
            writer=commit.writer,
            transaction_timeout_ms=self.transaction_timeout_ms,
            min_append_ms=append_ms,
            max_append_ms=append_ms,
            value_schema_version=None if layout is None else layout.version,
            value_schema=None if layout is None else layout.encoded,
            format_version=1 if layout is None else 2,
        )
        index = SegmentIndex(key, 0, meta, table)
        index.run_of(self.object, self.base_offset, stamp_ms)
        return index


def _int_array(values: list[int], arrow_type: pa.DataType) -> pa.Array:
    """An index column from Python ints, through NumPy: ``pa.array`` of a list imports pandas (about 150 ms
    of CPU in a fresh process) to check for pandas objects, and reading a shared topic's view needs none."""
    data = np.asarray(values, dtype=INDEX_NUMPY_TYPES[arrow_type])
    return pa.Array.from_buffers(arrow_type, len(data), [None, pa.py_buffer(data)])


def _entries(value: Any) -> list[CommitEntry]:
    if not isinstance(value, list):
        raise TypeError("expected an array of entries")
    return [CommitEntry.from_dict(entry, what="commit entry") for entry in value]


def _entries_json(entries: list[CommitEntry]) -> list[dict[str, Any]]:
    return [entry.to_dict() for entry in entries]


@dataclass
class Commit(JsonDocument):
    """Commit ``sequence`` of a shared topic (or a commit range ending there): what it adds, and the state after."""

    sequence: int
    commit_id: str
    created_ms: int
    append_ms: int
    entries: list[CommitEntry] = field(metadata={"decode": _entries, "encode": _entries_json})
    ends: list[int] = field(metadata={"decode": _ints})
    max_timestamps: list[int] = field(metadata={"decode": _ints})
    writer: str = ""

    def end_of(self, partition: int) -> int:
        """Partition ``partition``'s log end after this commit (0 for a partition added since)."""
        return self.ends[partition] if partition < len(self.ends) else 0

    def max_timestamp_of(self, partition: int) -> int:
        """Partition ``partition``'s running maximum timestamp after this commit (-1: none)."""
        return self.max_timestamps[partition] if partition < len(self.max_timestamps) else -1

    def check(self, what: str) -> None:
        """Raise :class:`CorruptRecordError` unless the entries and the state vectors agree (7.3)."""
        if len(self.ends) != len(self.max_timestamps):
            raise CorruptRecordError(f"{what}: ends and max_timestamps differ in length")
        for entry in self.entries:
            if not 0 <= entry.partition < len(self.ends):
                raise CorruptRecordError(f"{what}: an entry names partition {entry.partition}, beyond the state")
            entry.check(what)
            if entry.next_offset > self.ends[entry.partition]:
                raise CorruptRecordError(
                    f"{what}: partition {entry.partition}'s run ends at {entry.next_offset}, after the commit's "
                    f"end {self.ends[entry.partition]}"
                )

    @classmethod
    def parse(cls, data: bytes, key: str, first: int, end: int) -> Commit:
        """A commit element's bytes, checked against its key (``[first, end)``: its numbers)."""
        try:
            commit = cls.from_json(data, what=key, keyed={"sequence": end - 1})
        except CorruptRecordError as exc:
            if key in str(exc):
                raise
            raise CorruptRecordError(f"{key}: {exc}", key=key) from exc  # an entry's field: name the document
        commit.check(key)
        return commit
