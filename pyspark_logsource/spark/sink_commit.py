"""The sink's exactly-once logic, in one place to audit (PROTOCOL.md 11.2; see ``sink``'s docstring).

* the sink's identity: ``sink_id_for`` and ``transactional_id_for`` (the checkpoint and its query id);
* which producer id a micro-batch is written under (``run_producer``, ``_batch_producer``): the sink's
  own, or the first retry id whose transaction was not aborted; a committed decision means a replay,
  whose tasks write nothing;
* what a task reports (``PlogCommitMessage``) and what the driver's decision lists (``merge``,
  ``merge_tails``): exactly the offset ranges the successful tasks reported, and those the driver's own
  commits of the tasks' shared objects gave (``commit_shared``).

The driver's commit itself (``PlogStreamWriter.commit``, ``_SinkBase._decide``) is in ``sink``.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any

from coordinator.transactions import Decision, TransactionCoordinator, retry_transactional_id
from pyspark_logsource.spark.compat import WriterCommitMessage  # the class differs by PySpark version
from segment_format.log.appender import TAIL_HINT_SKEW_MS
from segment_format.log.flush import WrittenObject, commit_written
from segment_format.log.reader import COMMITTED
from segment_format.records import now_ms
from segment_format.root import LogRoot

from .option_schema import sink_option_error


def sink_id_for(options: dict[str, str]) -> str:
    """The sink's id: ``transactionalId``, else derived from ``checkpointLocation`` (streaming only)."""
    lowered = {k.lower(): v for k, v in options.items()}
    if lowered.get("transactionalid"):
        return lowered["transactionalid"]
    checkpoint = lowered.get("checkpointlocation")
    if checkpoint:
        if checkpoint.startswith("file:"):  # file:/x, file:///x and /x are one directory
            checkpoint = "/" + checkpoint[len("file:") :].lstrip("/")
        normalized = checkpoint if "://" in checkpoint else os.path.abspath(checkpoint)
        return "spark-sink:" + hashlib.sha256(normalized.rstrip("/").encode()).hexdigest()
    raise sink_option_error(
        "checkpointLocation",
        "missing: the plog streaming sink needs a 'checkpointLocation' (or 'transactionalId') option to "
        "write exactly once; it does not fall back to at-least-once",
    )


def transactional_id_for(sink_id: str, query_id: str | None) -> str:
    """The transactional id of a run of the sink: its id and the (persistent) query id of its checkpoint."""
    return sink_id if not query_id else f"{sink_id}/query:{query_id}"


@dataclass
class PlogCommitMessage(WriterCommitMessage):
    """What one task wrote: offset ranges per topic and partition, its record count, and under which id."""

    batches: dict[str, dict[str, list[list[int]]]] = field(default_factory=dict)
    records: int = 0
    producer_id: int = -1
    txn: int = -1
    #: True when the task found its micro-batch committed already (a replay) and wrote nothing.
    replayed: bool = False
    #: Tail hints of the partitions it appended to (``Decision.tails``' shape, PROTOCOL.md 11.2).
    tails: dict[str, dict[str, dict[str, list[int]]]] = field(default_factory=dict)
    #: Small objects it created, by key, with their bytes: for the driver's maintenance (PROTOCOL.md 10.1).
    objects: dict[str, bytes] = field(default_factory=dict)
    #: The shared objects it created, which the driver commits (PROTOCOL.md 11.2, *The Spark sink on shared
    #: topics*): each one's key, creation time and runs' rows.
    written: list[WrittenObject] = field(default_factory=list)


# ---------------------------------------------------------------------------- executor side

_PRODUCER_IDS: dict[tuple[str, str, str], int] = {}


def _producer_id(url: str, storage_key: str, coordinator: TransactionCoordinator, tid: str) -> int:
    key = (url, storage_key, tid)
    found = _PRODUCER_IDS.get(key)
    if found is None:
        found = _PRODUCER_IDS[key] = coordinator.producer_id_for(tid)
    return found


#: Per worker and query run: the first micro-batch whose decision a task of this worker looked up, and
#: the producer id it was to be written under. Only the first micro-batch of a run can be a replay.
_RUN_FIRST_BATCH: dict[tuple[str, str, str, str], tuple[int, int]] = {}


def run_producer(
    url: str, storage_key: str, coordinator: TransactionCoordinator, tid: str, txn: int, run_id: str | None
) -> tuple[int, Decision | None]:
    """``_batch_producer``, looked up once per worker and query run instead of once per task.

    Spark re-runs a micro-batch whose commit it did not record only when a query run starts: only
    the first micro-batch of a run can find its decision made. Within a run, the driver decides
    micro-batch N after all of its tasks succeeded, so a later micro-batch (or another task of the
    first one) on this worker needs no lookup. Were one ever decided already, the tasks would write
    batches its decision does not list, invisible for ever (PROTOCOL.md 11.2), and the driver's
    commit would find that decision standing.
    """
    if run_id is None:
        return _batch_producer(url, storage_key, coordinator, tid, txn)
    key = (url, storage_key, tid, run_id)
    first = _RUN_FIRST_BATCH.get(key)
    if first is not None and txn >= first[0]:
        return (first[1] if txn == first[0] else _producer_id(url, storage_key, coordinator, tid)), None
    producer_id, decided = _batch_producer(url, storage_key, coordinator, tid, txn)
    if decided is None:
        _RUN_FIRST_BATCH[key] = (txn, producer_id)
    return producer_id, decided


def _batch_producer(
    url: str, storage_key: str, coordinator: TransactionCoordinator, tid: str, txn: int
) -> tuple[int, Decision | None]:
    """The producer id micro-batch ``txn`` is written under, and its decision so far (None: undecided).

    Normally the sink's own producer id. If that transaction was aborted (it timed out while the query was
    down), the batch can never commit under it; its re-run goes to the producer id of
    ``<tid>/batch:<txn>/retry:1``, then ``retry:2`` and so on: the first one whose transaction is not aborted.
    Decisions never change, so every task and the driver walk to the same one, and a committed one ends the
    walk: a replay of it writes nothing.
    """
    retry = 0
    while True:
        name = tid if retry == 0 else retry_transactional_id(tid, txn, retry)
        producer_id = _producer_id(url, storage_key, coordinator, name)
        decided = coordinator.decision(producer_id, txn)
        if decided is None or decided.state == COMMITTED:
            return producer_id, decided
        retry += 1


def merge(messages: list[Any]) -> dict[str, dict[str, list[list[int]]]]:
    merged: dict[str, dict[str, list[list[int]]]] = {}
    for message in messages:
        if message is None:
            continue
        for topic, parts in message.batches.items():
            for part, spans in parts.items():
                merged.setdefault(topic, {}).setdefault(part, []).extend(spans)
    for parts in merged.values():
        for spans in parts.values():
            spans.sort()
    return merged


def merge_tails(messages: list[Any]) -> dict[str, dict[str, dict[str, list[int]]]]:
    """The tasks' tail hints, the whole report with the highest end per partition (PROTOCOL.md 11.2).

    A report whose clock is ahead of the driver's by more than the skew bound is dropped: its task's
    clock is off, and a hint dated in the future would be trusted for too long.
    """
    latest = now_ms() + TAIL_HINT_SKEW_MS
    merged: dict[str, dict[str, dict[str, list[int]]]] = {}
    for message in messages:
        for topic, ids in (getattr(message, "tails", None) or {}).items():
            for topic_id, parts in ids.items():
                kept = merged.setdefault(topic, {}).setdefault(topic_id, {})
                for part, hint in parts.items():
                    if hint[2] <= latest and (part not in kept or hint[0] > kept[part][0]):
                        kept[part] = list(hint)
    return merged


# ---------------------------------------------------------------------------- driver side

#: The transaction timeout of a micro-batch's commits into shared topics (PROTOCOL.md 11.2): its entries
#: exist only from the driver's commit, a few requests before its decision, so a killed query holds
#: read_committed readers back for about this long, not for the micro-batch's duration.
SHARED_TRANSACTION_TIMEOUT_MS = 60_000


def commit_shared(
    root: LogRoot, messages: list[Any], *, transaction_timeout_ms: int | None
) -> dict[str, dict[str, list[list[int]]]]:
    """Commit every shared object the tasks of ``messages`` created: one commit per topic, naming every
    task's runs (PROTOCOL.md 7.3, *Committing other processes' objects*). Returns the offset ranges the
    commits gave, in a decision's ``batches`` shape. ``transaction_timeout_ms``: stamped on transactional
    runs (None for a batch write's plain rows)."""
    written = [obj for m in messages if m is not None for obj in getattr(m, "written", None) or []]
    topics = sorted({run.topic for obj in written for run in obj.runs})
    ranges: dict[str, dict[str, list[list[int]]]] = {}
    for topic in topics:
        appender = root.partition(topic, 0).appender
        commit = commit_written(appender, written, transaction_timeout_ms=transaction_timeout_ms)
        parts = ranges.setdefault(topic, {})
        for entry in commit.entries:
            parts.setdefault(str(entry.partition), []).append([entry.base_offset, entry.next_offset - 1])
    return ranges


def merge_ranges(
    into: dict[str, dict[str, list[list[int]]]], more: dict[str, dict[str, list[list[int]]]]
) -> dict[str, dict[str, list[list[int]]]]:
    """``into`` with the ranges of ``more`` added, each partition's sorted."""
    for topic, parts in more.items():
        for part, spans in parts.items():
            merged = into.setdefault(topic, {}).setdefault(part, [])
            merged.extend(spans)
            merged.sort()
    return into
