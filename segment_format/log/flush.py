"""A shared flush (PROTOCOL.md 7.3): one object for every partition and topic of a write, one commit per topic.

::

    append_shared([(appender a/0, batches), (appender a/3, batches), (appender b/1, batches)])
        1. each appender checks its run       producer sequences, compacted keys, typed values
        2. build_shared_object(runs)          one object: section a (runs 0, 3), section b (run 1)
        3. put_if_absent(shared/<ms>-<id>)    nobody races for the key
        4. per topic: sequence.commit(runs)   commits/<head+1> of a, then of b; lost races retry the commit
        5. each appender records its run      sequences move on, views take the runs

A writer whose commits another process makes (the Spark sink's tasks) stops after step 3
(``write_shared_object``) and hands over a ``WrittenObject``; the committer commits many of them at once
(``commit_written``: one commit per topic naming every object's runs).

A flush's cost is one object and a commit per topic, whatever its number of partitions; a failure is the
failed topic's runs' alone (a topic whose commit landed is written). Notices are the caller's: it
writes them once the flush's commits exist, before acknowledging (PROTOCOL.md 9.1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from ..errors import IncompatibleSchemaError, PlogError, StorageError
from ..records import now_ms
from ..shared.commit import Commit
from ..shared.object import RunRows, SharedObject, SharedRun, build_shared_object
from ..topic import is_compacted
from ..typed.layout import TypedLayout
from .appender import AppendResult, conformed, refuse_null_keys
from .move import move_bound
from .producer_state import Payloads

if TYPE_CHECKING:
    from .appender import Appender

__all__ = ["WrittenObject", "append_shared", "commit_written", "write_shared_object"]

#: One partition's share of a flush: its appender, its batches (payloads without offsets), and, for a typed
#: topic, the layout they conform to (None: the appender's current one).
FlushItem = tuple["Appender", Payloads, TypedLayout | None]


@dataclass(frozen=True)
class WrittenObject:
    """A shared object created and not committed yet: what its committer needs, without the bytes.

    The Spark sink's tasks hand these to the driver, which commits them all at once (``commit_written``).
    """

    key: str
    created_ms: int
    runs: list[RunRows]


def _checked_runs(
    items: Sequence[FlushItem], out: list[AppendResult | BaseException | None], compression: str | None
) -> tuple[dict[int, SharedRun], dict[int, Payloads]]:
    """Each item's run, checked as an append is (step 1); a refused item's error goes in ``out``."""
    runs: dict[int, SharedRun] = {}
    payloads_of: dict[int, Payloads] = {}
    for n, (appender, payloads, layout) in enumerate(items):
        try:
            if is_compacted(appender.config):
                refuse_null_keys(payloads, appender.name)
            if layout is None:
                history, layout = appender.current_layout()
                if layout is not None and history is not None:
                    topic = appender.topic_and_id()[0]
                    payloads = conformed(payloads, layout, topic, history)
            runs[n] = appender.shared_run(payloads, layout, compression)
            payloads_of[n] = payloads
        except PlogError as exc:
            out[n] = exc
    return runs, payloads_of


def write_shared_object(
    items: Sequence[FlushItem], *, durable: bool = True, compression: str | None = None
) -> tuple[SharedObject, WrittenObject]:
    """Steps 1 to 3 alone: ``items`` as one shared object, created and not committed (PROTOCOL.md 7.3).

    For a writer whose commits another process makes (the Spark sink's tasks). Raises the first item's
    refusal, or the create's error: nothing is committed either way.
    """
    out: list[AppendResult | BaseException | None] = [None] * len(items)
    runs, _payloads = _checked_runs(items, out, compression)
    for result in out:
        if isinstance(result, BaseException):
            raise result
    created_ms = now_ms()
    writer = items[0][0].writer_id
    shared = build_shared_object(list(runs.values()), compression or "lz4", created_ms, writer)
    items[0][0].store.put_if_absent(shared.key, shared.data, durable=durable)
    return shared, WrittenObject(shared.key, created_ms, shared.runs)


def commit_written(
    appender: Appender, written: Sequence[WrittenObject], *, transaction_timeout_ms: int | None = None
) -> Commit:
    """Commit the runs of one topic in objects other processes wrote, as one commit
    (PROTOCOL.md 7.3, *Committing other processes' objects*); ``appender``: any partition's of the topic.

    Runs of one partition are given offsets in the order of ``written``, each object's in its own order. A
    typed topic's runs must all be of the topic's current value schema version (11.8), or nothing is
    committed and :class:`IncompatibleSchemaError` says so.
    """
    sequence = appender.chain.sequence
    if sequence is None:
        raise PlogError(f"{appender.name}: not a shared topic's partition (PROTOCOL.md 7.3)")
    topic = appender.topic_and_id()[0]
    pairs = [(obj.key, run) for obj in written for run in obj.runs if run.topic == topic]
    if not pairs:
        raise ValueError(f"no run of topic {topic!r} to commit")
    versions = {run.value_schema_version for _key, run in pairs}

    def check_versions() -> None:
        _history, current = appender.current_layout()
        wanted = None if current is None else current.version
        if versions != {wanted}:
            raise IncompatibleSchemaError(
                f"{topic}: the topic's value schema is version {wanted} while the runs to commit were encoded as "
                f"{sorted(v or 0 for v in versions)}; write them again"
            )

    return sequence.commit(
        [run for _key, run in pairs],
        pairs[0][0],
        min(obj.created_ms for obj in written),
        partitions=1 + max(run.partition for _key, run in pairs),
        log_append_time=appender.config["message.timestamp.type"] == "LogAppendTime",
        transaction_timeout_ms=transaction_timeout_ms,
        before_create=check_versions,
        writer=appender.writer_id,
        run_objects=[key for key, _run in pairs],
    )


def append_shared(
    items: Sequence[FlushItem],
    *,
    durable: bool = True,
    compression: str | None = None,
    timeout_ms: int | None = None,
) -> list[AppendResult | BaseException]:
    """Write ``items`` (partitions of shared topics) as one shared object and commit each topic's runs.

    Returns, per item, its result or the error that failed it: a run refused by its checks fails alone
    (nothing of it is written); a failed object fails every run; a failed commit fails its topic's runs.
    ``timeout_ms``: the transaction timeout stamped on transactional runs (11.2).
    """
    out: list[AppendResult | BaseException | None] = [None] * len(items)
    runs, payloads_of = _checked_runs(items, out, compression)
    if runs:
        created_ms = now_ms()
        writer = items[next(iter(runs))][0].writer_id
        try:
            shared = build_shared_object(list(runs.values()), compression or "lz4", created_ms, writer)
            items[next(iter(runs))][0].store.put_if_absent(shared.key, shared.data, durable=durable)
        except (PlogError, OSError) as exc:
            for n in runs:
                out[n] = exc
            return [r if r is not None else exc for r in out]
        rows = {(r.topic, r.partition): r for r in shared.runs}
        by_topic: dict[str, list[int]] = {}
        for n, run in runs.items():
            by_topic.setdefault(run.topic, []).append(n)
        for numbers in by_topic.values():
            lead = items[numbers[0]][0]
            sequence = lead.chain.sequence
            assert sequence is not None
            if (
                sequence.own_objects is not None
                and lead.config["auto.maintenance.enable"]
                and len(shared.data) <= move_bound(lead.config)
            ):
                # For the copy when this writer merges its small tier (PROTOCOL.md 10.2): no read of its own bytes.
                sequence.own_objects.put(shared.key, shared.data)
            layout = runs[numbers[0]].layout
            try:
                commit = sequence.commit(
                    [rows[(runs[n].topic, runs[n].partition)] for n in numbers],
                    shared.key,
                    created_ms,
                    partitions=1 + max(runs[n].partition for n in numbers),
                    log_append_time=lead.config["message.timestamp.type"] == "LogAppendTime",
                    transaction_timeout_ms=timeout_ms,
                    before_create=partial(lead.check_schema, layout) if layout is not None else None,
                    writer=writer,
                )
            except StorageError as exc:
                tried = sequence.last_tried if sequence.last_tried is not None else 0
                for n in numbers:
                    items[n][0].shared_failed(payloads_of[n], tried)
                    out[n] = exc
                continue
            except PlogError as exc:
                for n in numbers:
                    out[n] = exc
                continue
            for n in numbers:
                out[n] = items[n][0].shared_committed(payloads_of[n], commit)
    return [r if r is not None else RuntimeError("unreachable") for r in out]
