"""Merging a shared topic's commits into commit ranges (PROTOCOL.md 10.2, *Merging commits*).

::

    commits/  00..00-00..16.g1.json  00..16-00..32.g1.json  32.json  33.json ... 47.json  48.json (head)
              [ range: 0..15       ][ range: 16..31       ][ 16 plain commits, merged next ][ stays ]
    then      00..00-00..256.g2.json once sixteen g1 ranges follow each other, and so on

A reader resolving a topic reads every element of its commit chain: ranges keep that to about 16 documents
per generation, whatever the flushes made, as merged segments keep a partition's objects few (10, *Tiers*).
A range whose live runs are few bytes names one shared object that they are copied into
(:mod:`.shared_merge`), so a slow topic's small flushes do not each stay an object to read.
A range holds its elements' entries, each with its own commit's number and times, without the entries
that already lie in their partitions' segments (moved), and the state of its last commit.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping
from dataclasses import replace

from ..records import now_ms
from ..shared.commit import Commit, CommitEntry, commit_range_key
from ..shared.sequence import CommitElement, TopicSequence
from .commit_collection import moved_view
from .move import move_bound
from .partition_log import PartitionLog
from .shared_merge import copy_small_runs

__all__ = ["COMMIT_FANOUT", "merge_commits", "own_small_tier"]

#: Elements one commit range covers (PROTOCOL.md 10.2): sixteen of one generation make one of the next.
COMMIT_FANOUT = 16


def merge_commits(
    sequence: TopicSequence,
    logs: Mapping[int, PartitionLog],
    listed_monotonic: float,
    writer: str = "",
    chain_ends: Mapping[int, int] | None = None,
) -> int:
    """Write a range for every ``COMMIT_FANOUT`` consecutive elements of one generation on ``sequence``'s chain
    (the head excepted), from a chain resolved at ``listed_monotonic``; returns how many were written. Nothing
    is sent once that listing is W old (the next pass merges them). The entries below their partition's chain
    end are left out: by ``chain_ends`` (from the same listing) when given, else by the views ``logs`` hold."""
    send_by = listed_monotonic + sequence.config["writer.max.staleness.ms"] / 1000
    written = 0
    group: list[CommitElement] = []
    for element in sequence.elements[:-1]:  # the head stays: writers and readers probe the number after it
        if group and (element.generation != group[0].generation or element.first != group[-1].end):
            group = []
        group.append(element)
        if len(group) == COMMIT_FANOUT:
            if time.monotonic() >= send_by:
                return written
            commit = _range(group, logs, writer, chain_ends)
            with sequence.store.deadline(send_by):
                commit.entries = copy_small_runs(sequence, commit.entries, logs, writer)
                sequence.store.put_if_absent(_range_key(sequence, group), commit.to_json())
            written += 1
            group = []
    return written


def own_small_tier(sequence: TopicSequence) -> int | None:
    """``F + 16`` when this process made that commit and ``[F, F + 16)``, the first plain commits at the commit
    frontier of ``sequence``'s chain, hold small runs (at most ``segment.bytes`` / 8 bytes in all) and were not
    merged yet by it: the tier this writer merges at once (PROTOCOL.md 10.2, *A writer merges its small
    tier*); else None. No request."""
    # Past the tier last merged: the chain this process holds is not resolved again after its own merge.
    after = sequence.tier_tried or 0
    plain = [element for element in sequence.elements if element.generation == 0 and element.first >= after]
    if len(plain) <= COMMIT_FANOUT:
        return None
    tier = plain[:COMMIT_FANOUT]
    end = tier[-1].end
    if not sequence.made(end) or end - tier[0].first != COMMIT_FANOUT:
        return None
    if sum(entry.stored_bytes for element in tier for entry in element.commit.entries) > move_bound(sequence.config):
        return None
    return end


def _range_key(sequence: TopicSequence, group: list[CommitElement]) -> str:
    return commit_range_key(sequence.incarnation, group[0].first, group[-1].end, group[0].generation + 1)


def _range(
    group: list[CommitElement], logs: Mapping[int, PartitionLog], writer: str, chain_ends: Mapping[int, int] | None
) -> Commit:
    """The range document of ``group``: its elements' live entries, each with its commit's times, and the
    last element's state."""
    entries: list[CommitEntry] = []
    for element in group:
        commit = element.commit
        for entry in commit.entries:
            moved = (
                moved_view(logs.get(entry.partition), entry) is not None
                if chain_ends is None
                else entry.next_offset <= chain_ends.get(entry.partition, 0)
            )
            if moved:
                continue  # in its partition's segments: readers skip it, and the range need not name its object
            if entry.sequence is None:  # a plain commit's entry: it takes its commit's number and times
                entry = replace(
                    entry,
                    sequence=commit.sequence,
                    created_ms=commit.created_ms,
                    append_ms=commit.append_ms,
                    running_max_timestamp=commit.max_timestamp_of(entry.partition),
                )
            entries.append(entry)
    last = group[-1].commit
    return Commit(
        sequence=group[-1].end - 1,
        commit_id=secrets.token_hex(16),
        created_ms=now_ms(),
        append_ms=last.append_ms,
        entries=entries,
        ends=list(last.ends),
        max_timestamps=list(last.max_timestamps),
        writer=writer,
    )
