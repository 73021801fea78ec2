"""Verifying a shared topic (PROTOCOL.md 7.3): its commits, their chain, and every shared object they name.

::

    topics/<t>/<id>/commits/   each document parsed and checked (its number, its entries against its state);
                               the chain resolved: contiguous, each commit following the one before
    shared/<ms>-<id>.arrow     each object a commit names, read whole: tail, index CRC, and every run a
                               commit gives it checked batch by batch (CRC32C, decoding, offsets and times)

Problems are rows of the same report as a partitioned topic's (:mod:`segment_format.inspect.verify`); a
commit's damage is a ``commit`` problem naming its key, a shared object's the kinds a segment object's are.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Protocol

import pyarrow as pa
import pyarrow.ipc as ipc

from ..errors import CorruptRecordError, ObjectNotFoundError
from ..layout import incarnation_prefix
from ..records import RECORD_SCHEMA
from ..segment import END_OF_STREAM, batch_problems, check_batch_checksum, decode_message, placed_batch
from ..shared.commit import COMMITS, Commit, CommitEntry, parse_commit_name
from ..shared.object import SHARED_MAGIC, SharedIndex, parse_shared_index
from ..shared.sequence import TopicSequence
from ..stores.base import Store
from ..topic import TopicMetadata
from ..typed.layout import TypedLayout, entry_layout

__all__ = ["check_shared_topic"]


class Checker(Protocol):
    """What the verifier gives this module: its counters, and ``add(topic, partition, key, offset, problem,
    detail)``, which records a problem (:class:`segment_format.inspect.verify.VerifyProblem`)."""

    objects: int
    batches: int
    bytes: int
    records: int
    #: Each partition's chain end, known before a shared topic is checked.
    chain_ends: dict[tuple[str, int], int]

    @property
    def add(self) -> Callable[..., None]:
        """Records one problem."""

    def count_superseded(self, delta: tuple[int, int, int, int]) -> None:
        """Moves ``(objects, batches, bytes, records)`` counted as the chains' to the superseded counts."""


def check_shared_topic(checker: Checker, store: Store, name: str, meta: TopicMetadata) -> None:
    """Check every commit of ``name``'s incarnation and every shared object one names (read-only)."""
    incarnation = incarnation_prefix(name, meta.topic_id)
    prefix = incarnation + COMMITS
    infos = store.list(prefix)
    named: dict[str, list[tuple[Commit, CommitEntry, str]]] = defaultdict(list)
    damaged = False
    for info in sorted(infos, key=lambda i: i.key):
        numbers = parse_commit_name(info.key[len(prefix) :])
        if numbers is None:
            checker.add(name, None, info.key, None, "stray object", "not a commit's name under commits/")
            continue
        try:
            commit = Commit.parse(store.get(info.key), info.key, numbers[0], numbers[1])
        except ObjectNotFoundError:
            continue  # collected since the listing
        except CorruptRecordError as exc:
            checker.add(name, None, info.key, None, "commit", str(exc))
            damaged = True
            continue
        for entry in commit.entries:
            named[entry.object].append((commit, entry, info.key))
    on_chain: set[str] = set()
    try:
        if not damaged:  # else the chain fails on the document already named
            sequence = TopicSequence(store, incarnation, dict(meta.config), name)
            sequence.resolve(infos)
            on_chain = {element.key for element in sequence.elements}
    except CorruptRecordError as exc:  # a gap, or a commit that does not follow the one before
        checker.add(name, None, exc.key or prefix, None, "commit", str(exc))
    for key in sorted(named):
        runs = [(commit, entry) for commit, entry, _ in named[key]]
        # What readers read: a run of a commit on the chain that its partition's chain end has not passed.
        live = [
            document in on_chain and entry.next_offset > checker.chain_ends.get((name, entry.partition), 0)
            for _commit, entry, document in named[key]
        ]
        _check_object(checker, store, name, meta, key, runs, live)


def _check_object(
    checker: Checker,
    store: Store,
    name: str,
    meta: TopicMetadata,
    key: str,
    runs: list[tuple[Commit, CommitEntry]],
    live: list[bool],
) -> None:
    """Check one shared object and the runs commits give it; ``live[i]``: whether run ``i`` is what readers read
    (the object and those runs count as the chains', the rest as superseded)."""
    first = runs[0][1]
    try:
        data = store.get(key)
    except ObjectNotFoundError:
        checker.add(name, first.partition, key, first.base_offset, "truncated", "a commit names it, but it is gone")
        return
    checker.objects += 1
    checker.bytes += len(data)
    if not any(live):
        checker.count_superseded((1, 0, len(data), 0))
    try:
        index = parse_shared_index(key, data)
    except CorruptRecordError as exc:
        problem = "index checksum" if "CRC32C" in str(exc) else "index unreadable"
        if not data.endswith(SHARED_MAGIC) or "tail" in str(exc):
            problem = "tail"
        checker.add(name, first.partition, key, first.base_offset, problem, str(exc))
    else:
        _check_sections(checker, name, meta, index, data, runs)
    for (commit, entry), readers_read in zip(runs, live, strict=True):
        before = (checker.batches, checker.records)
        layout = _layout(meta, entry.value_schema_version)
        idx = entry.index(f"{key}#{entry.partition}", commit, layout)
        for i in range(idx.batch_count):
            start = int(idx.positions[i])
            message = data[start : start + int(idx.lengths[i])]
            offset = int(idx.base_offsets[i])
            try:
                check_batch_checksum(idx, i, message)
            except CorruptRecordError as exc:
                checker.add(name, entry.partition, key, offset, "batch checksum", str(exc))
                continue
            try:
                batch = placed_batch(idx, decode_message(idx, i, message))
            except CorruptRecordError as exc:
                checker.add(name, entry.partition, key, offset, "batch unreadable", str(exc))
                continue
            for problem in batch_problems(idx, i, batch):
                checker.add(name, entry.partition, key, offset, "index mismatch", problem)
            checker.batches += 1
            checker.records += batch.num_rows
        if not readers_read:
            checker.count_superseded((0, checker.batches - before[0], 0, checker.records - before[1]))


def _check_sections(
    checker: Checker,
    name: str,
    meta: TopicMetadata,
    index: SharedIndex,
    data: bytes,
    runs: list[tuple[Commit, CommitEntry]],
) -> None:
    """Check the bytes no batch CRC covers (7.3): each section's schema message, which must be that of the
    version its runs are committed as, and its end-of-stream marker. A section is a stretch of batches with
    nothing between them; between two sections lie an end-of-stream marker and the next schema message."""
    batches = sorted(
        zip(index.table.column("position").to_pylist(), index.table.column("length").to_pylist(), strict=True)
    )
    sections: list[tuple[int, int, int]] = []  # (schema message's start, first batch's, end of the last batch)
    for position, length in batches:
        if sections and position == sections[-1][2]:
            sections[-1] = (*sections[-1][:2], position + length)
        else:
            sections.append((sections[-1][2] + len(END_OF_STREAM) if sections else 0, position, position + length))
    for _, _, end in sections:
        if data[end : end + len(END_OF_STREAM)] != END_OF_STREAM:
            checker.add(name, None, index.key, None, "framing", f"no end-of-stream marker at byte {end}")
    checked: set[tuple[int, int | None]] = set()
    for _, entry in runs:
        section = next((s for s in sections if s[1] <= entry.rows[0][0] < s[2]), None)
        if section is None or (section[0], entry.value_schema_version) in checked:
            continue  # a run outside every batch is the batch checks' to report
        checked.add((section[0], entry.value_schema_version))
        layout = _layout(meta, entry.value_schema_version)
        try:
            found = ipc.read_schema(pa.py_buffer(data[section[0] : section[1]]))
            ok = found.equals(RECORD_SCHEMA if layout is None else layout.stored_schema, check_metadata=True)
        except (pa.ArrowException, OSError, ValueError):  # pyarrow raises OSError for bad framing
            ok = False
        if not ok:
            detail = f"bytes [{section[0]}, {section[1]}) are not the schema message of the run's version"
            checker.add(name, entry.partition, index.key, entry.base_offset, "schema message", detail)


def _layout(meta: TopicMetadata, version: int | None) -> TypedLayout | None:
    """The layout a typed topic's run of value schema ``version`` is read with (None: untyped)."""
    history = meta.schema_history
    return None if history is None or version is None else entry_layout(history.entry(version))
