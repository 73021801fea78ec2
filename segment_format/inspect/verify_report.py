"""What ``plog verify`` reports: the kinds of problem, one problem, and the report of a whole check.

:func:`segment_format.inspect.verify.verify` fills a :class:`VerifyReport`: a DataFrame of
:class:`VerifyProblem` rows, what readers see (the chains' objects, batches, records and bytes), and what was
checked off the chains (superseded objects awaiting deletion), counted apart.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import pandas as pd

from ..errors import CorruptRecordError
from .tables import human_bytes

PROBLEMS = {
    "truncated": "the object is shorter than its contents say (or has no plog tail at all)",
    "tail": "the 24-byte tail is damaged: magic, format version or index position",
    "index checksum": "the index fails its CRC32C",
    "index unreadable": "the index passes its CRC but does not parse, or has the wrong schema",
    "schema message": "the Arrow schema message at the start of the data is damaged",
    "framing": "batch positions, lengths or the end-of-stream marker do not fit together",
    "batch checksum": "a record batch fails its CRC32C",
    "batch unreadable": "a record batch passes its CRC but does not decode",
    "index mismatch": "the index disagrees with the data: record counts, offsets or timestamps",
    "name mismatch": "the object's name disagrees with the offsets or generation in its index",
    "chain gap": "offsets of the partition that no segment object holds",
    "chain overlap": "offsets that two consecutive segment objects of the chain both claim",
    "start marker": "a log start marker that does not parse or points outside the log",
    "stray object": "an object under log/ whose name is not a segment object name",
    "topic metadata": "a topic metadata object that does not parse or disagrees with the others",
    "value schema": "a typed object whose schema is not its topic's of that version, or typed and untyped mixed",
    "commit": "a shared topic's commit that does not parse, or whose chain has a gap or does not follow on",
}

PROBLEM_COLUMNS = ["topic", "partition", "object", "offset", "problem", "detail", "on_chain"]


@dataclass
class VerifyProblem:
    """One problem :func:`verify` found: a row of :attr:`VerifyReport.problems`."""

    #: The topic the problem is in.
    topic: str
    #: The partition, or None for a problem of the whole topic (its metadata).
    partition: int | None
    #: The key of the damaged object (a segment object, start marker or metadata version), when there is one.
    object: str | None
    #: Where in the log: the base offset of the damaged batch, the first offset of a gap or overlap, or, for
    #: damage to a whole segment object (tail, index, truncation), the base offset its name gives; None
    #: when no offset applies (topic metadata, a stray object).
    offset: int | None
    #: What is wrong: one of :data:`PROBLEMS`.
    problem: str
    #: A human-readable sentence saying exactly what is wrong.
    detail: str
    #: False for damage to an object off the chain (superseded, awaiting deletion): no data is lost.
    on_chain: bool = True


@dataclass
class VerifyReport:
    """What :func:`verify` found: a DataFrame of problems plus what was checked.

    ``problems`` has one row per problem: topic, partition, object (key),
    offset (of the damaged batch, the start of a gap, or the first offset of
    a segment object damaged as a whole; see :class:`VerifyProblem`),
    problem (one of :data:`PROBLEMS`), a human-readable detail, and whether
    the object is on a chain (damage to a superseded object loses nothing).
    """

    problems: pd.DataFrame
    topics: list[str]
    partitions: int = 0
    #: What readers see: the objects of the partitions' chains and the shared objects whose runs the commit
    #: chains give to readers (not yet moved), and their batches, bytes and records.
    objects: int = 0
    batches: int = 0
    bytes: int = 0
    records: int = 0
    #: Checked too, but off the chains: superseded objects awaiting deletion, and shared objects whose runs
    #: were all moved into segments or merged (PROTOCOL.md 10, 10.2); their records are copies, or gone.
    superseded_objects: int = 0
    superseded_batches: int = 0
    superseded_bytes: int = 0
    superseded_records: int = 0

    @property
    def ok(self) -> bool:
        """True when nothing is wrong."""
        return self.problems.empty

    def to_frame(self) -> pd.DataFrame:
        """The problems, as a DataFrame (a copy)."""
        return self.problems.copy()

    def problem_list(self) -> list[VerifyProblem]:
        """The problems as typed rows (missing partitions, objects and offsets are None), e.g. to print as JSON."""
        return [
            VerifyProblem(
                topic=str(row["topic"]),
                partition=None if pd.isna(row["partition"]) else int(row["partition"]),
                object=None if pd.isna(row["object"]) else str(row["object"]),
                offset=None if pd.isna(row["offset"]) else int(row["offset"]),
                problem=str(row["problem"]),
                detail=str(row["detail"]),
                on_chain=bool(row["on_chain"]),
            )
            for row in self.problems.to_dict("records")
        ]

    def raise_for_problems(self) -> None:
        """Raise :class:`CorruptRecordError` naming the first problem, if there is any."""
        if not self.ok:
            first = self.problems.iloc[0]
            offset = first["offset"]
            raise CorruptRecordError(
                f"verify found {len(self.problems)} problem(s); first: {first['problem']}: {first['detail']}",
                key=first["object"],
                offset=None if pd.isna(offset) else int(offset),
            )

    def summary(self) -> str:
        """One line: what was checked and how many problems were found."""
        checked = (
            f"{len(self.topics)} topic(s), {self.partitions} partition(s), {self.objects} object(s), "
            f"{self.batches:,} batch(es), {self.records:,} record(s), {human_bytes(self.bytes)}"
        )
        if self.superseded_objects:
            checked += (
                f" (and {self.superseded_objects} superseded object(s) awaiting deletion, "
                f"{self.superseded_records:,} record(s), {human_bytes(self.superseded_bytes)})"
            )
        verdict = "no problems" if self.ok else f"{len(self.problems)} problem(s)"
        return f"verified {checked}: {verdict}"

    def __repr__(self) -> str:
        if self.ok:
            return self.summary()
        with pd.option_context("display.max_colwidth", 100, "display.width", 200):
            return self.summary() + "\n" + self.problems.to_string(index=False)

    def _repr_html_(self) -> str:
        color = "#1a7f37" if self.ok else "#cf222e"
        head = f'<p style="color:{color}"><b>{html.escape(self.summary())}</b></p>'
        if self.ok:
            return f'<div class="plog-inspect">{head}</div>'
        table = self.problems.to_html(index=False, max_rows=100, border=0, na_rep="–", classes="plog-table")
        return f'<div class="plog-inspect">{head}{table}</div>'
