"""Shared objects (PROTOCOL.md 7.3): one flush's batches of many partitions and topics, offsets relative.

::

    shared/<created_ms:013d>-<object_id>.arrow
    +--------------------------------------------------------------+
    | section (topic a, schema v): Arrow IPC stream                |
    |   schema message | run a/0: batch, batch | run a/3: batch |  |
    |   end-of-stream                                              |
    | section (topic b, ...): ...                                  |
    +--------------------------------------------------------------+
    | index: INDEX_SCHEMA + topic + partition, a row per batch,    |
    |   offsets counted from 0 per run; metadata "plog.shared"     |
    +--------------------------------------------------------------+
    | tail, 24 bytes: index position | index crc32c | 3 | PLOGSHR1 |
    +--------------------------------------------------------------+

A run is one partition's batches of the flush; its records get absolute offsets from the commit that
claims it (``run base + stored``), so an object is written once, before its offsets are known, and a
writer that loses the race for a commit never rewrites it. The commit carries each run's index rows
(:class:`~segment_format.shared.commit.CommitEntry`), so a reader of one partition needs only its run's
byte range; the object's own index serves the verifier, the notebooks and merges.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from ..documents import JsonDocument
from ..encoding import EncodeJob, EncodeRun, encode_runs
from ..errors import CorruptRecordError
from ..records import RECORD_SCHEMA
from ..segment import END_OF_STREAM, INDEX_SCHEMA, TAIL, BatchMeta, crc32c, ipc_options
from ..segment.format import SegmentTail
from ..segment.writer import EncodedBatch, index_with_tail
from ..stores.base import Store
from ..typed.layout import TypedLayout

__all__ = [
    "INDEX_SUFFIX_BYTES",
    "read_shared_meta",
    "SHARED_FORMAT_VERSION",
    "SHARED_MAGIC",
    "SHARED_INDEX_SCHEMA",
    "EncodedRun",
    "assemble_shared_object",
    "RunRows",
    "SharedIndex",
    "SharedMeta",
    "SharedObject",
    "SharedRun",
    "build_shared_object",
    "decode_value_stats",
    "encode_value_stats",
    "read_shared_index",
]

#: The format version of shared objects (PROTOCOL.md 12.4), and their magic: no reader takes one for a segment.
SHARED_FORMAT_VERSION = 3
SHARED_MAGIC = b"PLOGSHR1"
#: The shared object's index: a segment's columns, then the run each row belongs to.
SHARED_INDEX_SCHEMA = INDEX_SCHEMA.append(pa.field("topic", pa.string(), nullable=False)).append(
    pa.field("partition", pa.int32(), nullable=False)
)
_RECORD_SCHEMA_BYTES = RECORD_SCHEMA.serialize().to_pybytes()


@dataclass
class SharedRun:
    """One partition's batches for a shared object: payloads without offsets, in send order."""

    topic: str
    topic_id: str
    partition: int
    payloads: list[tuple[pa.RecordBatch, BatchMeta]]
    #: A typed topic's layout of the version the payloads conform to (PROTOCOL.md 11.8); None: untyped.
    layout: TypedLayout | None = None
    #: The topic's ``compression.type`` (a section is compressed as its topic says); None: the object's.
    compression: str | None = None


@dataclass
class RunRows:
    """Where a run landed in its object: its index rows (relative offsets, absolute positions)."""

    topic: str
    topic_id: str
    partition: int
    rows: list[dict[str, Any]]
    value_schema_version: int | None
    #: A typed run's per-batch field statistics, as its commit entry carries them (``encode_value_stats``).
    value_stats: str | None = None

    @property
    def span(self) -> int:
        """Offsets the run takes: its last row's relative ``last_offset`` + 1."""
        return int(self.rows[-1]["last_offset"]) + 1

    @property
    def record_count(self) -> int:
        """Records in the run."""
        return sum(int(r["record_count"]) for r in self.rows)


@dataclass
class SharedMeta(JsonDocument):
    """The shared JSON (``plog.shared`` in the index's schema metadata)."""

    object_id: str
    created_ms: int
    record_count: int
    batch_count: int
    #: ``{"<topic>": {"topic_id": ..., "partitions": [...]}}``: the runs' incarnations and partitions.
    topics: dict[str, Any] = field(default_factory=dict)
    writer: str = ""
    compression: str = ""
    format_version: int = SHARED_FORMAT_VERSION


@dataclass
class SharedObject:
    """A shared object ready to create: its key, its bytes, and each run's rows for the commits."""

    key: str
    data: bytes
    meta: SharedMeta
    runs: list[RunRows]


def shared_object_key(created_ms: int, object_id: str) -> str:
    """``shared/<created_ms:013d>-<object_id>.arrow``: the time first, so a listing sorts by age (10.2)."""
    return f"shared/{created_ms:013d}-{object_id}.arrow"


def parse_shared_key(key: str) -> tuple[int, str] | None:
    """``(created_ms, object_id)`` of a shared object's key; None for any other key."""
    if not key.startswith("shared/") or not key.endswith(".arrow"):
        return None
    stem = key[len("shared/") : -len(".arrow")]
    stamp, _, object_id = stem.partition("-")
    if len(stamp) != 13 or not stamp.isdigit() or len(object_id) != 32:
        return None
    try:
        int(object_id, 16)
    except ValueError:
        return None
    return int(stamp), object_id


def _section_of(run: SharedRun) -> tuple[str, int]:
    return run.topic, 0 if run.layout is None else run.layout.version


_OPTIONS: dict[str, ipc.IpcWriteOptions] = {}


def _options(compression: str) -> ipc.IpcWriteOptions:
    found = _OPTIONS.get(compression)
    if found is None:
        found = _OPTIONS[compression] = ipc_options(compression)
    return found


@dataclass
class EncodedRun:
    """One run's batches already encoded, ready to place in a shared object: a fresh flush's, or a run copied
    byte for byte from another shared object (PROTOCOL.md 10.2, *Merging shared objects*)."""

    topic: str
    topic_id: str
    partition: int
    #: The schema message of the run's section: RECORD_SCHEMA's, or a typed layout's.
    schema: bytes
    value_schema_version: int | None
    batches: list[EncodedBatch]
    #: The run's statistics for its commit entry (PROTOCOL.md 7.3, 11.8): None for an untyped run or one
    #: whose batches lack them.
    value_stats: str | None = None

    @property
    def section(self) -> tuple[str, int]:
        """The (topic, value schema version) section the run belongs to."""
        return self.topic, self.value_schema_version or 0


def build_shared_object(
    runs: Sequence[SharedRun], compression: str, created_ms: int, writer: str = "", object_id: str | None = None
) -> SharedObject:
    """Encode ``runs`` as one shared object: a section per (topic, value schema version), runs by partition.

    Offsets are relative to each run (PROTOCOL.md 7.3); ``created_ms`` is noted in the key and the shared
    JSON (the commit deadline counts from it).
    """
    if not runs:
        raise ValueError("a shared object holds at least one run")
    ordered = sorted(runs, key=lambda r: (*_section_of(r), r.partition))
    work: list[EncodeRun] = []
    for run in ordered:
        if not run.payloads:
            raise ValueError(f"run {run.topic}-{run.partition} holds no batch")
        jobs: list[EncodeJob] = []
        offset = 0
        for payload, batch_meta in run.payloads:
            jobs.append((payload, batch_meta, offset))
            offset += payload.num_rows
        work.append((jobs, _options(run.compression or compression), run.layout))
    encoded: list[EncodedRun] = []
    for run, batches in zip(ordered, encode_runs(work), strict=True):
        schema = _RECORD_SCHEMA_BYTES if run.layout is None else run.layout.schema_bytes
        version = None if run.layout is None else run.layout.version
        stats = None if run.layout is None else encode_value_stats(batches, run.layout)
        encoded.append(EncodedRun(run.topic, run.topic_id, run.partition, schema, version, batches, stats))
    return assemble_shared_object(encoded, compression, created_ms, writer, object_id)


def assemble_shared_object(
    runs: Sequence[EncodedRun], compression: str, created_ms: int, writer: str = "", object_id: str | None = None
) -> SharedObject:
    """Lay ``runs`` out as one shared object, in the order given (callers sort them by section, then
    partition, so that a partition's and a topic's runs are each one byte range): a section is opened by its
    schema message and closed by an end-of-stream marker; the index follows, then the tail."""
    object_id = object_id or secrets.token_hex(16)
    parts: list[bytes | pa.Buffer | memoryview] = []
    size = 0
    out: list[RunRows] = []
    index_rows: list[dict[str, Any]] = []
    topics: dict[str, dict[str, Any]] = {}
    section: tuple[str, int] | None = None
    for run in runs:
        if run.section != section:
            if section is not None:
                parts.append(END_OF_STREAM)
                size += len(END_OF_STREAM)
            section = run.section
            parts.append(run.schema)
            size += len(run.schema)
        rows = []
        for batch in run.batches:
            row = {k: v for k, v in batch.row.items() if k != "value_stats"}
            row.update(position=size, length=len(batch.message))
            rows.append(row)
            index_rows.append({**row, "topic": run.topic, "partition": run.partition})
            parts.append(batch.message)
            size += len(batch.message)
        out.append(RunRows(run.topic, run.topic_id, run.partition, rows, run.value_schema_version, run.value_stats))
        described = topics.setdefault(run.topic, {"topic_id": run.topic_id, "partitions": []})
        if run.partition not in described["partitions"]:
            described["partitions"].append(run.partition)
    parts.append(END_OF_STREAM)
    size += len(END_OF_STREAM)
    meta = SharedMeta(
        object_id=object_id,
        created_ms=created_ms,
        record_count=sum(r.record_count for r in out),
        batch_count=len(index_rows),
        topics=topics,
        writer=writer,
        compression=compression,
    )
    table = pa.Table.from_pylist(index_rows, schema=SHARED_INDEX_SCHEMA).replace_schema_metadata(
        {"plog.shared": meta.to_json()}
    )
    parts.append(index_with_tail(table, size, SHARED_FORMAT_VERSION, SHARED_MAGIC))
    data = b"".join(bytes(p) if isinstance(p, pa.Buffer) else p for p in parts)
    return SharedObject(shared_object_key(created_ms, object_id), data, meta, out)


def encode_value_stats(batches: Sequence[EncodedBatch], layout: TypedLayout) -> str | None:
    """A typed run's per-batch statistics (PROTOCOL.md 11.8, *Filtering on fields*) as its commit entry carries
    them (7.3): base64 of one Arrow IPC record batch message, a row per batch, of the single column
    ``value_stats`` of ``layout.stats_type``. None when a batch has none."""
    stats = [batch.row.get("value_stats") for batch in batches]
    if any(entry is None for entry in stats):
        return None
    column = pa.array(stats, type=layout.stats_type)
    message = pa.RecordBatch.from_arrays([column], names=["value_stats"]).serialize()
    return base64.b64encode(message.to_pybytes()).decode("ascii")


def decode_value_stats(encoded: str, layout: TypedLayout, rows: int) -> pa.Array:
    """The statistics column :func:`encode_value_stats` made, checked to hold ``rows`` rows of the layout's type."""
    try:
        schema = pa.schema([pa.field("value_stats", layout.stats_type)])
        batch = ipc.read_record_batch(pa.py_buffer(base64.b64decode(encoded, validate=True)), schema)
    except (ValueError, pa.ArrowException, OSError) as exc:
        raise CorruptRecordError(f"a run's value_stats do not decode: {exc}") from exc
    if batch.num_rows != rows:
        raise CorruptRecordError(f"a run's value_stats hold {batch.num_rows} rows for {rows} batches")
    return batch.column(0)


@dataclass
class SharedIndex:
    """A shared object's parsed, checksummed index: its rows (relative offsets) and its shared JSON."""

    key: str
    size: int
    meta: SharedMeta
    table: pa.Table

    def runs(self) -> dict[tuple[str, int], list[dict[str, Any]]]:
        """The rows of each (topic, partition) run, in byte order."""
        out: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for row in self.table.to_pylist():
            out.setdefault((row["topic"], int(row["partition"])), []).append(row)
        return out


def parse_shared_tail(key: str, size: int, tail_bytes: bytes | memoryview) -> SegmentTail:
    """The checked tail of shared object ``key`` (``size`` bytes), from bytes ending where it ends."""
    if size < TAIL.size or len(tail_bytes) < TAIL.size:
        raise CorruptRecordError(f"shared object is {size} bytes, too short for its {TAIL.size}-byte tail", key=key)
    tail = SegmentTail(*TAIL.unpack(bytes(tail_bytes[-TAIL.size :])))
    if tail.magic != SHARED_MAGIC:
        raise CorruptRecordError(f"shared object ends in {tail.magic!r}, not the magic {SHARED_MAGIC!r}", key=key)
    if tail.format_version != SHARED_FORMAT_VERSION:
        raise CorruptRecordError(
            f"shared object format version {tail.format_version} is not one this reader knows "
            f"({SHARED_FORMAT_VERSION})",
            key=key,
        )
    if not 0 < tail.index_position < size - TAIL.size:
        raise CorruptRecordError(f"shared object tail points outside the object ({tail.index_position})", key=key)
    return tail


def parse_shared_index(key: str, data: bytes | memoryview) -> SharedIndex:
    """The index of a whole shared object's bytes, checked: tail, index CRC, columns and shared JSON."""
    size = len(data)
    tail = parse_shared_tail(key, size, data)
    table, meta = _parse_index_stream(key, tail, memoryview(data)[tail.index_position : size - TAIL.size])
    if table.schema.names[: len(SHARED_INDEX_SCHEMA)] != SHARED_INDEX_SCHEMA.names:
        raise CorruptRecordError("shared object index has other columns than the format's", key=key)
    return SharedIndex(key, size, meta, table)


def read_shared_index(store: Store, key: str) -> SharedIndex:
    """Read a shared object whole and parse its index (the verifier and merges read it whole anyway)."""
    return parse_shared_index(key, store.get(key))


#: Bytes a reader of a shared object's index asks for first: the whole index of most objects.
INDEX_SUFFIX_BYTES = 64 * 1024


def read_shared_meta(store: Store, key: str) -> SharedMeta:
    """A shared object's shared JSON (the topics and partitions it holds) from its index, without its batches:
    one suffix request, a second when the index is longer than :data:`INDEX_SUFFIX_BYTES`."""
    suffix, size = store.get_suffix(key, INDEX_SUFFIX_BYTES)
    tail = parse_shared_tail(key, size, suffix)
    start = tail.index_position
    fits = size - start <= len(suffix)
    suffix = suffix[len(suffix) - (size - start) :] if fits else store.get_range(key, start, size)
    return _parse_index_stream(key, tail, memoryview(suffix)[: len(suffix) - TAIL.size])[1]


def _parse_index_stream(key: str, tail: SegmentTail, index_bytes: memoryview) -> tuple[pa.Table, SharedMeta]:
    """The index stream of shared object ``key``, checked against its tail's CRC32C, and its shared JSON."""
    actual = crc32c(index_bytes)
    if actual != tail.index_crc:
        raise CorruptRecordError(
            f"shared object index fails its CRC32C ({actual:08x}, the tail says {tail.index_crc:08x})", key=key
        )
    try:
        table = ipc.open_stream(pa.py_buffer(index_bytes)).read_all()
        return table, SharedMeta.from_json(table.schema.metadata[b"plog.shared"], what=f"{key}: shared JSON")
    except (pa.ArrowException, OSError, ValueError, KeyError, TypeError) as exc:
        raise CorruptRecordError(f"shared object index does not parse: {exc}", key=key) from exc
