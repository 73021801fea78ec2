"""A shared flush (PROTOCOL.md 7.3): one object for every partition and topic of a write, one commit per topic.

::

    append_shared([(appender a/0, batches), (appender a/3, batches), (appender b/1, batches)])
        1. each appender checks its run       producer sequences, compacted keys, typed values
        2. build_shared_object(runs)          one object: section a (runs 0, 3), section b (run 1)
        3. put_if_absent(shared/<ms>-<id>)    nobody races for the key
        4. per topic: sequence.commit(runs)   commits/<head+1> of a, then of b; lost races retry the commit
        5. each appender records its run      sequences move on, views take the runs

A flush's cost is one object and a commit per topic, whatever its number of partitions; a failure is the
failed topic's runs' alone (a topic whose commit landed is written). Notices are the caller's: it
writes them once the flush's commits exist, before acknowledging (PROTOCOL.md 9.1).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

from ..errors import PlogError, StorageError
from ..records import now_ms
from ..shared.object import SharedRun, build_shared_object
from ..topic import is_compacted
from ..typed.layout import TypedLayout
from .appender import AppendResult, conformed, refuse_null_keys
from .move import move_bound
from .producer_state import Payloads

if TYPE_CHECKING:
    from .appender import Appender

__all__ = ["append_shared"]

#: One partition's share of a flush: its appender, its batches (payloads without offsets), and, for a typed
#: topic, the layout they conform to (None: the appender's current one).
FlushItem = tuple["Appender", Payloads, TypedLayout | None]


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
