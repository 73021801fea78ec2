"""The verifier: an fsck for a plog root that reads every object and lists every problem, changing nothing.

:func:`verify` reads each segment object of a topic whole and checks it with
the reader's own parsing steps (``segment_format.segment``: the tail, the
index CRC and schema, the schema message, every batch's CRC32C and decoding,
the end-of-stream marker), so an object verifies clean exactly when a reader
accepts it, including index columns and ``extra`` keys a later writer
appended (PROTOCOL.md 12.4). On top of what a reader needs,
it checks what a reader trusts: that the index agrees with the data (record
counts, offsets, timestamps), that each object's name agrees with its index,
the framing of the batches, start markers, topic metadata, and that the chain
of each partition has no gap or overlap. Each failed check is one row of the
:class:`VerifyReport`, one of the :data:`PROBLEMS`::

    from segment_format.inspect.verify import verify

    report = verify("plog-data", "clicks")
    report.ok                      # True when nothing is wrong
    report.problems                # DataFrame: topic, partition, object, offset, problem, detail, on_chain
    report.raise_for_problems()    # CorruptRecordError naming the first problem

Only ``list``, ``get`` and ``get_range`` are called on the store.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import pandas as pd
import pyarrow as pa

from .. import numbered
from ..errors import CorruptRecordError, ObjectNotFoundError
from ..layout import parse_segment_name, partition_prefix, topic_meta_prefix
from ..log.chain import PartitionListing, parse_listing, resolve_chain
from ..segment import (
    END_OF_STREAM,
    MAGIC,
    TAIL,
    SegmentIndex,
    SegmentMeta,
    batch_problems,
    check_batch_checksum,
    check_end_of_stream,
    check_index_checksum,
    check_schema_message,
    decode_message,
    index_problems,
    parse_index_bytes,
    parse_tail,
)
from ..stores.base import ObjectInfo, Store
from ..topic import TopicCatalog, is_shared, read_topic_version
from ..typed.value_schema import SchemaHistory, object_schema_problem
from .tables import as_root, object_name
from .verify_report import PROBLEM_COLUMNS, PROBLEMS, VerifyProblem, VerifyReport
from .verify_shared import check_shared_topic


#: Kinds of problem :func:`verify` reports, in the ``problem`` column.
def _tail_problem(data: bytes) -> str:
    """What a tail the reader refused means: ``tail`` if it is damaged, ``truncated`` if there is none.

    A magic within two bytes of ``PLOGSEG1`` is a damaged tail (bit rot); anything else at the end means
    the object was cut short, or is not a segment at all.
    """
    if len(data) < TAIL.size:
        return "truncated"
    magic = data[-len(MAGIC) :]
    return "tail" if sum(a != b for a, b in zip(magic, MAGIC, strict=True)) <= 2 else "truncated"


def _detail(exc: CorruptRecordError) -> str:
    """The reader's sentence without the ``(object ..., offset ...)`` it ends with: the report has columns for those."""
    text = str(exc)
    where = str(CorruptRecordError("", exc.key, exc.offset))  # the same suffix, by the error's own rule
    return text[: -len(where)] if where and text.endswith(where) else text


class _Verifier:
    """Reads every object of a topic (read-only: get, get_range and list only) and records problems."""

    def __init__(self, store: Store, on_object: Callable[[str, int], None] | None = None) -> None:
        self.store = store
        self.on_object = on_object
        self.problems: list[VerifyProblem] = []
        self.objects = self.batches = self.bytes = self.records = 0
        self.superseded_objects = self.superseded_batches = self.superseded_bytes = self.superseded_records = 0
        #: Each partition's chain end (PROTOCOL.md 7.3 step 1): a shared topic's runs below it were moved.
        self.chain_ends: dict[tuple[str, int], int] = {}
        #: Each checked topic's value schemas (None: untyped), which its objects must agree with (11.8).
        self.histories: dict[str, SchemaHistory | None] = {}
        #: Where to read a topic's metadata again when an object names a version not yet seen.
        self.catalog: TopicCatalog | None = None

    def add(
        self,
        topic: str,
        partition: int | None,
        key: str | None,
        offset: int | None,
        problem: str,
        detail: str,
        on_chain: bool = True,
    ) -> None:
        assert problem in PROBLEMS, problem
        self.problems.append(VerifyProblem(topic, partition, key, offset, problem, detail, on_chain))

    # ---------------------------------------------------------------- one segment object

    def check_object(self, topic: str, partition: int, info: ObjectInfo) -> SegmentMeta | None:
        """Check every byte of one segment object; returns its header when the index is readable.

        The object is parsed by the reader's own steps (``segment_format.segment``), so it passes
        here exactly when a reader accepts it; each step's failure is one kind of problem.
        """
        key = info.key
        # Damage to the whole object (tail, index, truncation) has no batch to point at: it is placed at
        # the object's first offset, as its name gives it, so every segment problem says where in the log.
        named = parse_segment_name(object_name(key))
        object_offset = None if named is None else named.base_offset

        def report(problem: str, detail: str, offset: int | None = None) -> None:
            self.add(topic, partition, key, object_offset if offset is None else offset, problem, detail)

        data = self.store.get(key)
        self.objects += 1
        self.bytes += len(data)
        if self.on_object is not None:
            self.on_object(key, len(data))
        if len(data) != info.size:
            report("truncated", f"object is {len(data):,} bytes but was listed with {info.size:,}")
        try:
            tail = parse_tail(key, len(data), data)
        except CorruptRecordError as exc:
            report(_tail_problem(data), _detail(exc))
            return None
        index_bytes = data[tail.index_position : len(data) - TAIL.size]
        try:
            check_index_checksum(key, tail, index_bytes)
        except CorruptRecordError as exc:
            report("index checksum", _detail(exc))
            return None
        try:
            idx = parse_index_bytes(key, len(data), index_bytes)
        except CorruptRecordError as exc:
            report("index unreadable", _detail(exc))
            return None
        self._check_name(topic, partition, key, idx.meta)
        self._check_value_schema(report, topic, idx.meta)
        self._check_header(report, idx)
        self._check_batches(report, idx, data, tail.index_position)
        return idx.meta

    def _check_name(self, topic: str, partition: int, key: str, meta: SegmentMeta) -> None:
        parsed = parse_segment_name(object_name(key))
        if parsed is None:  # pragma: no cover - callers only pass parsed names
            return
        claims = f"[{parsed.base_offset}, {'…' if parsed.end_offset is None else parsed.end_offset})"
        holds = f"[{meta.base_offset}, {meta.next_offset})"
        if parsed.base_offset != meta.base_offset or (
            parsed.end_offset is not None and parsed.end_offset != meta.next_offset
        ):
            self.add(
                topic,
                partition,
                key,
                meta.base_offset,
                "name mismatch",
                f"name claims offsets {claims} but the index holds {holds}",
            )
        if parsed.generation != meta.generation:
            self.add(
                topic,
                partition,
                key,
                meta.base_offset,
                "name mismatch",
                f"name says generation {parsed.generation}, index says {meta.generation}",
            )

    def _check_value_schema(self, report: Any, topic: str, meta: SegmentMeta) -> None:
        """A typed topic's objects are typed, each with its topic's schema of its version; an untyped
        topic's are untyped (PROTOCOL.md 11.8)."""
        history = self.histories.get(topic)
        version = meta.value_schema_version
        if history is not None and version is not None and version > len(history.entries):
            history = self._newer_history(topic) or history  # an evolution while this check ran
        problem = object_schema_problem(history, version, meta.value_schema)
        if problem:
            report("value schema", problem)

    def _newer_history(self, topic: str) -> SchemaHistory | None:
        """The topic's value schemas read again (None without a catalog)."""
        if self.catalog is None:
            return None
        history = self.catalog.get(topic).schema_history
        self.histories[topic] = history
        return history

    @staticmethod
    def _check_header(report: Any, idx: SegmentIndex) -> None:
        for problem, offset in index_problems(idx):
            report("index mismatch", problem, offset)

    def _check_batches(self, report: Any, idx: SegmentIndex, data: bytes, index_position: int) -> None:
        view = memoryview(data)
        positions, lengths = idx.positions, idx.lengths
        if idx.batch_count == 0:  # an empty compacted object (PROTOCOL.md 11.6): its schema, then its end marker
            schema_end = index_position - len(END_OF_STREAM)
            try:
                check_schema_message(idx, view[:schema_end])
                check_end_of_stream(idx, view[schema_end:index_position])
            except CorruptRecordError as exc:
                report("schema message", _detail(exc))
            return
        first = int(positions[0])
        if not 0 < first < index_position:
            report("framing", f"first batch is said to start at byte {first}, outside the data")
            return
        try:
            check_schema_message(idx, view[:first])
        except CorruptRecordError as exc:
            report("schema message", _detail(exc))
        for i in range(idx.batch_count):
            base = int(idx.base_offsets[i])
            lo, length = int(positions[i]), int(lengths[i])
            hi = lo + length
            self.batches += 1
            if i + 1 < idx.batch_count and hi != int(positions[i + 1]):
                report(
                    "framing",
                    f"batch {i} ends at byte {hi:,} but batch {i + 1} starts at {int(positions[i + 1]):,}",
                    base,
                )
            if length <= 0 or hi > index_position - len(END_OF_STREAM):
                report("framing", f"batch {i} bytes [{lo:,}, {hi:,}) lie outside the data part", base)
                continue
            message = view[lo:hi]
            try:
                check_batch_checksum(idx, i, message)
            except CorruptRecordError as exc:
                report("batch checksum", _detail(exc), base)
                continue
            try:
                batch = decode_message(idx, i, message)
            except CorruptRecordError as exc:
                report("batch unreadable", _detail(exc), base)
                continue
            self.records += batch.num_rows
            self._check_batch_content(report, idx, i, batch)
        end = int(positions[-1] + lengths[-1])
        if end + len(END_OF_STREAM) != index_position:
            report(
                "framing",
                f"batches end at byte {end:,} but the index starts at {index_position:,} "
                f"(expected {end + len(END_OF_STREAM):,})",
            )
            return
        try:
            check_end_of_stream(idx, view[end:index_position])
        except CorruptRecordError as exc:
            report("framing", _detail(exc))

    @staticmethod
    def _check_batch_content(report: Any, idx: SegmentIndex, i: int, batch: pa.RecordBatch) -> None:
        for problem in batch_problems(idx, i, batch):
            report("index mismatch", problem, int(idx.base_offsets[i]))

    # ---------------------------------------------------------------- one partition

    def check_partition(self, topic: str, partition: int, prefix: str) -> None:
        """Check one partition from a listing; list again if an object it named was deleted meanwhile.

        Maintenance may delete superseded objects while the check reads them (PROTOCOL.md 10): that is
        the listing going stale, not damage, so the partition is checked again from a fresh listing.
        """
        for _ in range(8):
            mark = (len(self.problems), self.counts(), self.superseded_counts())
            try:
                self._check_partition(topic, partition, prefix)
                return
            except ObjectNotFoundError:
                del self.problems[mark[0] :]
                self.objects, self.batches, self.bytes, self.records = mark[1]
                (
                    self.superseded_objects,
                    self.superseded_batches,
                    self.superseded_bytes,
                    self.superseded_records,
                ) = mark[2]
        raise CorruptRecordError("partition keeps changing under the verifier; could not check it", key=prefix)

    def _check_partition(self, topic: str, partition: int, prefix: str) -> None:
        def unparsed(info: ObjectInfo, folder: str, name: str) -> None:
            if folder == "log":
                self.add(
                    topic,
                    partition,
                    info.key,
                    None,
                    "stray object",
                    f"{name!r} is not a segment object name",
                    on_chain=False,
                )
            else:
                self.add(topic, partition, info.key, None, "start marker", f"{name!r} is not a marker name")

        listing = parse_listing(
            prefix,
            self.store.list(prefix),
            on_unparsed=unparsed,
            on_marker=lambda offset, key: self._check_marker(topic, partition, key, offset),
        )
        metas = {}
        counted: dict[str, tuple[int, int, int, int]] = {}
        for info in [i for _, i in listing.appended] + [r[3] for r in listing.rewritten]:
            before = self.counts()
            metas[info.key] = self.check_object(topic, partition, info)
            counted[info.key] = tuple(a - b for a, b in zip(self.counts(), before, strict=True))  # type: ignore[assignment]
        chain = self._resolve(topic, partition, prefix, listing, metas)
        on_chain = set(chain)
        for key, delta in counted.items():
            if key not in on_chain:
                self.count_superseded(delta)
        for problem in self.problems:
            if (
                problem.topic == topic
                and problem.partition == partition
                and problem.object is not None
                and problem.problem not in ("start marker",)
                and "/log/" in problem.object
            ):
                problem.on_chain = problem.object in on_chain

    def superseded_counts(self) -> tuple[int, int, int, int]:
        """Objects, batches, bytes and records counted so far as superseded."""
        return self.superseded_objects, self.superseded_batches, self.superseded_bytes, self.superseded_records

    def counts(self) -> tuple[int, int, int, int]:
        """Objects, batches, bytes and records counted so far as the chains'."""
        return self.objects, self.batches, self.bytes, self.records

    def count_superseded(self, delta: tuple[int, int, int, int]) -> None:
        """Move ``delta`` (objects, batches, bytes, records counted as the chains') to the superseded counts."""
        objects, batches, size, records = delta
        self.objects -= objects
        self.batches -= batches
        self.bytes -= size
        self.records -= records
        self.superseded_objects += objects
        self.superseded_batches += batches
        self.superseded_bytes += size
        self.superseded_records += records

    def _check_marker(self, topic: str, partition: int, key: str, offset: int) -> None:
        try:
            body = json.loads(self.store.get(key))
            ok = isinstance(body, dict) and body.get("offset") == offset
        except (ValueError, UnicodeDecodeError):
            ok = False
        if not ok:
            self.add(
                topic, partition, key, offset, "start marker", f'marker does not parse as {{"offset": {offset}, ...}}'
            )

    def _resolve(
        self, topic: str, partition: int, prefix: str, listing: PartitionListing, metas: dict[str, SegmentMeta | None]
    ) -> list[str]:
        """Resolve the chain with :func:`resolve_chain` (PROTOCOL.md 7.2), reporting every gap and overlap."""

        def gap(lo: int, hi: int, key: str | None, why: str) -> None:
            self.add(topic, partition, key, lo, "chain gap", f"offsets {lo}..{hi - 1} are in no segment object ({why})")

        resolved = resolve_chain(prefix, listing, lambda hole: gap(hole.lo, hole.hi, hole.key, hole.why))
        chain = resolved.segments
        ends = [m.next_offset for ref in chain[-1:] if (m := metas.get(ref.key)) is not None]
        self.chain_ends[(topic, partition)] = max([*ends, resolved.marker_offset or 0])
        if not chain:
            return []
        start = resolved.marker_offset
        # Readers accept a log with no start marker that begins above 0 (its start is its first object), so
        # resolve_chain does not call that a hole; but nothing should have left offsets below the first object
        # without a marker past them, so the verifier does.
        if start is None and chain[0].base_offset > 0:
            gap(0, chain[0].base_offset, chain[0].key, "below the first object, with no start marker past them")
        # Only appended objects get their end from their place; a rewritten object's end is in its name,
        # checked against its index already.
        for ref in chain[resolved.appended_from :]:
            key, place_end = ref.key, ref.end_offset
            meta = metas.get(key)
            if meta is None or place_end is None:
                continue
            if meta.next_offset < place_end:
                gap(
                    meta.next_offset,
                    place_end,
                    key,
                    f"{object_name(key)} ends at {meta.next_offset}, "
                    f"the next object of the chain starts at {place_end}",
                )
            elif meta.next_offset > place_end:
                self.add(
                    topic,
                    partition,
                    key,
                    place_end,
                    "chain overlap",
                    f"{object_name(key)} holds offsets up to {meta.next_offset - 1}, but the next object "
                    f"of the chain starts at {place_end}",
                )
        last_meta = metas.get(chain[-1].key)
        if start is not None and last_meta is not None and start > last_meta.next_offset:
            self.add(
                topic,
                partition,
                resolved.marker_key,
                start,
                "start marker",
                f"log start {start} is beyond the log end {last_meta.next_offset}",
            )
        return [ref.key for ref in chain]

    # ---------------------------------------------------------------- topic metadata

    def check_topic_metadata(self, topic: str) -> None:
        topic_ids = set()
        prefix = topic_meta_prefix(topic)
        for info in self.store.list(prefix):
            version = numbered.parse_number(info.key)
            if version is None:
                continue  # not a metadata version: readers never read it
            try:
                meta = read_topic_version(self.store, topic, version)
            except ObjectNotFoundError:
                continue  # deleted since the listing
            except CorruptRecordError as exc:
                self.add(topic, None, info.key, None, "topic metadata", _detail(exc))
                continue
            topic_ids.add(meta.topic_id)
        if len(topic_ids) > 1:
            self.add(
                topic,
                None,
                topic_meta_prefix(topic),
                None,
                "topic metadata",
                f"versions disagree on the topic id: {sorted(topic_ids)}",
            )


def verify(
    root: Any,
    topic: str | Iterable[str] | None = None,
    *,
    on_object: Callable[[str, int], None] | None = None,
) -> VerifyReport:
    """Check every checksum and every index of ``topic`` (several, or all when None) against the data.

    Reads each segment object whole and checks, without trusting anything:
    the tail, the index CRC and schema, the schema message and end-of-stream
    marker, each batch's CRC32C, that each batch decodes and holds the
    records, offsets and timestamps its index row claims, that each object's
    name agrees with its index, start markers, topic metadata, and that the
    chain of each partition has no gap or overlap. Superseded objects (off the
    chain, awaiting deletion) are checked too, flagged ``on_chain=False``.

    Nothing is written, changed or deleted: only ``list``, ``get`` and
    ``get_range`` are called. Returns a :class:`VerifyReport`.

    ``on_object(key, size)``, if given, is called as each segment object has
    been read, before it is checked (to show progress over a large root).
    """
    r = as_root(root)
    names = r.catalog.names() if topic is None else [topic] if isinstance(topic, str) else list(topic)
    checker = _Verifier(r.store, on_object)
    checker.catalog = r.catalog
    partition_count = 0
    for name in names:
        checker.check_topic_metadata(name)
        try:
            meta = r.catalog.get(name)  # raises UnknownTopicOrPartitionError for an unknown topic
        except CorruptRecordError:
            continue  # the current metadata is damaged (reported above): its partitions cannot be located
        checker.histories[name] = meta.schema_history
        for p in range(meta.partitions):
            checker.check_partition(name, p, partition_prefix(name, meta.topic_id, p))
            partition_count += 1
        if is_shared(meta.config):  # its commits and shared objects (7.3), after the chain ends are known
            check_shared_topic(checker, r.store, name, meta)
    frame = pd.DataFrame([p.__dict__ for p in checker.problems], columns=PROBLEM_COLUMNS)
    frame["partition"] = frame["partition"].astype("Int64")
    frame["offset"] = frame["offset"].astype("Int64")
    frame["on_chain"] = frame["on_chain"].astype(bool)
    return VerifyReport(
        frame,
        names,
        partition_count,
        *checker.counts(),
        *checker.superseded_counts(),
    )


__all__ = ["PROBLEMS", "VerifyProblem", "VerifyReport", "verify"]
