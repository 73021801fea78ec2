"""Building a segment object: encoding record batches, their index rows, and the assembled object."""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import google_crc32c
import pyarrow as pa
import pyarrow.ipc as ipc

from ..records import RECORD_SCHEMA
from ..typed.layout import TypedLayout
from .format import END_OF_STREAM, INDEX_SCHEMA, MAGIC, SCHEMA_CRC_KEY, TAIL, TYPED_FORMAT_VERSION, SegmentMeta, crc32c


@dataclass(frozen=True)
class BatchMeta:
    """What a producer states about a batch besides its records."""

    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    attributes: int = 0
    #: Transaction number of a transactional batch (PROTOCOL.md 11.2), -1 otherwise.
    transaction: int = -1


@dataclass
class EncodedBatch:
    """One record batch already serialised as an Arrow IPC message, with its index row.

    ``message`` is any bytes-like object (an Arrow buffer when freshly encoded, bytes or a memoryview
    when taken from a stored object): the segment's assembly copies it into the object once.
    """

    message: bytes | pa.Buffer | memoryview
    #: The index row: INDEX_SCHEMA's columns, and a typed batch's ``value_stats`` (PROTOCOL.md 11.8).
    row: dict[str, Any]


#: The schema message that opens every IPC stream of RECORD_SCHEMA (computed once).
_RECORD_SCHEMA_BYTES = RECORD_SCHEMA.serialize().to_pybytes()


def encode_batch(
    batch: pa.RecordBatch, meta: BatchMeta, options: ipc.IpcWriteOptions, layout: TypedLayout | None = None
) -> EncodedBatch:
    """Serialise one record batch (with offsets) to its IPC message and index row.

    ``layout``: the batch is a typed topic's (its ``value`` a struct of that version's fields), stored
    as that version's columns (PROTOCOL.md 11.8).
    """
    return encode_batches_together([batch], [meta], options, layout)[0]


def encode_batches_together(
    batches: Sequence[pa.RecordBatch],
    metas: Sequence[BatchMeta],
    options: ipc.IpcWriteOptions,
    layout: TypedLayout | None = None,
) -> list[EncodedBatch]:
    """Serialise record batches (with offsets, one schema) to their IPC messages and index rows, with
    one Arrow call for them all: each message is the one its batch alone would give (Arrow writes a
    stream message by message), a slice of one stream buffer.

    One call rather than one per batch matters beyond the arithmetic. A thread that encodes while
    another runs Python (a producer's sender under a loop of ``send``) takes the GIL back after each
    Arrow call that let go of it, and each time it waits out the interpreter's switch interval first.
    ``layout``: as for :func:`encode_batch`.
    """
    if any(batch.num_rows == 0 for batch in batches):
        raise ValueError("a stored batch holds at least one record")
    stored = list(batches) if layout is None else [layout.to_stored(batch) for batch in batches]
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, stored[0].schema, options=options) as writer:
        writer.write_table(pa.Table.from_batches(stored))  # a message per batch: chunks are kept as they are
    stream = sink.getvalue()
    reader = pa.BufferReader(stream)
    ipc.read_message(reader)  # the schema message
    start = reader.tell()
    encoded = []
    for batch, stored_batch, meta in zip(batches, stored, metas, strict=True):
        ipc.read_message(reader)
        end = reader.tell()
        # A slice of the stream's buffer, not a bytes copy: the segment's assembly copies it once, into the object.
        message = stream.slice(start, end - start)
        encoded.append(EncodedBatch(message, _index_row(batch, stored_batch, meta, message, layout)))
        start = end
    return encoded


def _index_row(
    batch: pa.RecordBatch,
    stored: pa.RecordBatch,
    meta: BatchMeta,
    message: pa.Buffer,
    layout: TypedLayout | None,
) -> dict[str, Any]:
    """A freshly encoded batch's index row (``stored``: the batch as stored, ``message`` its IPC message)."""
    offsets = batch.column(0)
    timestamps = batch.column(1).view(pa.int64())  # timestamp[ms] as its int64 ms, without a cast kernel
    ts_np = timestamps.to_numpy(zero_copy_only=False)
    row = {
        "base_offset": int(offsets[0].as_py()),
        "last_offset": int(offsets[-1].as_py()),
        "record_count": batch.num_rows,
        "first_timestamp": int(ts_np[0]),
        "max_timestamp": int(ts_np.max()),
        "crc32c": int(google_crc32c.value(message)),
        "producer_id": meta.producer_id,
        "producer_epoch": meta.producer_epoch,
        "base_sequence": meta.base_sequence,
        "attributes": meta.attributes,
        "uncompressed_bytes": stored.nbytes,
        "transaction": meta.transaction,
    }
    if layout is not None:
        row["value_stats"] = layout.batch_stats(stored)
    return row


def assemble_segment(
    batches: Sequence[EncodedBatch], meta_fields: dict[str, Any], layout: TypedLayout | None = None
) -> tuple[bytes, SegmentMeta]:
    """Lay out already-encoded batches as one segment object (:class:`SegmentParts`, joined)."""
    parts = SegmentParts(batches, meta_fields, layout)
    data = b"".join(parts)
    return data, parts.meta


class SegmentParts:
    """A segment object's bytes, produced in order, part by part, as its batches arrive::

        schema message | batch message 1 | ... | batch message n | end of stream | index | tail

    Iterating yields the parts; once it is done, :attr:`meta` and :attr:`size` describe the object and
    :attr:`parts` holds every part (to send the object again after a failed create). Batches may be an
    iterator that encodes them on the fly: the index and the tail, which depend on every batch, come
    last, so a store can write the first batches while later ones are still being compressed.

    ``meta_fields`` supplies the fields of :class:`SegmentMeta` that the batches cannot tell
    (next_offset, compression, writer, append_id, writer_epoch...); counts, timestamps and the schema
    CRC are computed here. With ``running_max_floor`` the object's ``running_max_timestamp`` is the
    greater of it and the batches' greatest timestamp (an append's, PROTOCOL.md 6). Batch messages are
    copied verbatim, so their CRCs stay valid when segments are merged. ``layout``: the batches were
    encoded as that value schema version's (PROTOCOL.md 11.8), which the object states.
    """

    def __init__(
        self,
        batches: Iterable[EncodedBatch],
        meta_fields: dict[str, Any],
        layout: TypedLayout | None = None,
        running_max_floor: int | None = None,
    ) -> None:
        self._batches = batches
        self._meta_fields = meta_fields
        self._layout = layout
        self._running_max_floor = running_max_floor
        self.parts: list[bytes | pa.Buffer | memoryview] = []
        self._meta: SegmentMeta | None = None
        self.size = 0
        self._producer = self._produce()
        self._failure: BaseException | None = None

    @property
    def meta(self) -> SegmentMeta:
        """The object's segment JSON, once every part has been produced."""
        if self._meta is None:
            raise RuntimeError("the segment's parts have not all been produced yet")
        return self._meta

    def __iter__(self) -> Iterator[bytes | pa.Buffer | memoryview]:
        """Every part in order. Iterating again, after a complete or an interrupted pass (a store that
        failed mid-write), yields the parts produced so far and then produces the rest."""
        done = 0
        while True:
            while done < len(self.parts):
                yield self.parts[done]
                done += 1
            if self._meta is not None:
                return
            if self._failure is not None:
                raise self._failure
            try:
                next(self._producer)
            except StopIteration:
                pass
            except BaseException as exc:  # an encoding failure: every later pass raises it too
                self._failure = exc
                raise

    def close(self) -> None:
        """Stop producing (after a store gave up mid-write): batches not yet encoded are cancelled, and
        the producing generator, which refers to this object, lets it go now rather than at the next
        garbage collection. Parts produced so far stay; a complete object is unaffected."""
        self._producer.close()

    def _produce(self) -> Generator[None, None, None]:
        """Append the next part to :attr:`parts` at each step; the last step also sets :attr:`meta`."""
        layout = self._layout
        schema_bytes = _RECORD_SCHEMA_BYTES if layout is None else layout.schema_bytes
        self._part(schema_bytes)
        yield None
        rows = []
        for encoded in self._batches:
            rows.append({**encoded.row, "position": self.size, "length": len(encoded.message)})
            self._part(encoded.message)
            yield None
        position = self.size
        self._part(END_OF_STREAM)
        position += len(END_OF_STREAM)
        meta_fields = self._meta_fields
        if not rows and "min_timestamp" not in meta_fields:
            # Only a compacted object may hold no batch (PROTOCOL.md 11.6), and it states its timestamps.
            raise ValueError("a segment holds at least one batch")
        if layout is not None:
            meta_fields = {
                **meta_fields,
                "value_schema_version": layout.version,
                "value_schema": layout.encoded,
                "format_version": TYPED_FORMAT_VERSION,
            }
        if self._running_max_floor is not None:
            batch_max = max(r["max_timestamp"] for r in rows)
            meta_fields = {**meta_fields, "running_max_timestamp": max(self._running_max_floor, batch_max)}
        stated = ("base_offset", "extra", SCHEMA_CRC_KEY, "min_timestamp", "max_timestamp")
        meta = SegmentMeta(
            base_offset=meta_fields.get("base_offset", rows[0]["base_offset"] if rows else 0),
            record_count=sum(r["record_count"] for r in rows),
            batch_count=len(rows),
            min_timestamp=min(r["first_timestamp"] for r in rows) if rows else meta_fields["min_timestamp"],
            max_timestamp=max(r["max_timestamp"] for r in rows) if rows else meta_fields["max_timestamp"],
            # The schema message is outside every batch CRC; the (checksummed) index carries its CRC.
            schema_crc32c=crc32c(schema_bytes),
            extra=dict(meta_fields.get("extra", {})),
            **{k: v for k, v in meta_fields.items() if k not in stated},
        )
        index_schema = INDEX_SCHEMA
        if layout is not None and rows and all(r.get("value_stats") is not None for r in rows):
            # Statistics only when every batch has them (a merge of objects that lack them omits the column).
            index_schema = INDEX_SCHEMA.append(pa.field("value_stats", layout.stats_type))
        else:
            rows = [{k: v for k, v in r.items() if k != "value_stats"} for r in rows]
        table = pa.Table.from_pylist(rows, schema=index_schema).replace_schema_metadata(
            {"plog.segment": meta.to_json()}
        )
        self._part(index_with_tail(table, position, meta.format_version, MAGIC))
        self._meta = meta

    def _part(self, part: bytes | pa.Buffer | memoryview) -> None:
        self.parts.append(part)
        self.size += len(part)


def index_with_tail(table: pa.Table, index_position: int, format_version: int, magic: bytes) -> bytes:
    """An object's index stream (``table``, its metadata included) and the 24-byte tail after it: where the
    index starts, its CRC32C, the format version and the magic (PROTOCOL.md 6.1)."""
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    index_bytes = sink.getvalue().to_pybytes()
    return index_bytes + TAIL.pack(index_position, crc32c(index_bytes), format_version, magic)
