"""``plog verify [TOPIC ...]``: check every checksum and index of a root, like an fsck, changing nothing.

The checks are :func:`segment_format.inspect.verify.verify`'s (every object read whole: tail, index CRC and
schema, each batch's CRC32C and decoding, index against data, names, start markers, topic metadata,
chain gaps and overlaps); this module picks the topics, shows progress and prints the findings, as a
table or as one JSON document for scripts. Exit codes: 0 clean, 1 problems found, 2 bad usage or a
plog error (an unknown topic, an unreadable root).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING, Any

from rich.table import Table

from pyspark_logsource.cli.common import EXIT_FAILED, EXIT_OK, CliError, Env, progress_bar
from pyspark_logsource.views.terminal import cell_text
from segment_format.errors import UnknownTopicOrPartitionError
from segment_format.inspect.listings import human_bytes
from segment_format.root import LogRoot

if TYPE_CHECKING:
    from pyspark_logsource.cli.common import Commands
    from segment_format.inspect.verify import VerifyReport

#: The fields of each problem in ``--json`` output, in order (a stable shape for scripts).
JSON_PROBLEM_FIELDS = ("topic", "partition", "object", "offset", "problem", "detail", "on_chain")


def register(commands: Commands, common: argparse.ArgumentParser) -> None:
    """Add ``plog verify`` to ``commands``."""
    verify = commands.add_parser(
        "verify",
        parents=[common],
        help="check every checksum and index of the root (an fsck; changes nothing)",
        description="Read every segment object of the named topics (default: all) whole and check its "
        "tail, index, batch checksums and contents, its name, the start markers, the topic metadata, and "
        "that each partition's chain has no gap or overlap. Nothing is written. Exit status: 0 when "
        "everything is sound, 1 when problems were found (listed on stdout), 2 on bad usage or a plog "
        "error such as an unknown topic.",
    )
    verify.add_argument("topics", nargs="*", metavar="TOPIC", help="topics to check (default: every topic)")
    verify.add_argument(
        "--json",
        action="store_true",
        help='print one JSON document and nothing else on stdout: {"clean", "checked", "problems"}',
    )
    verify.add_argument("--progress", action="store_true", help="show a progress bar even when stderr is not a TTY")
    verify.set_defaults(handler=cmd_verify)


def cmd_verify(env: Env) -> int:
    """``plog verify [TOPIC ...]``: check the root (or the named topics); exit 1 if anything is wrong."""
    # The verifier builds pandas frames, a second of start-up that only this command (and inspect) needs.
    from segment_format.inspect.verify import verify

    args = env.args
    named = list(dict.fromkeys(args.topics))  # each once, in the order given
    missing = _missing_local_directory(env.url)
    if missing is not None:
        # Opening a local store creates its directory: a check must neither do that nor call nothing "clean".
        raise CliError(f"no plog root at {env.url}: {missing!r} is not a directory")
    root = LogRoot(env.url, env.options)
    try:
        if named:
            # Fail before reading anything, naming every unknown topic (verify() would stop at the first).
            known = set(root.catalog.names())
            unknown = [name for name in named if name not in known]
            if unknown:
                listed = ", ".join(repr(name) for name in unknown)
                raise UnknownTopicOrPartitionError(
                    f"unknown topic{'s' if len(unknown) > 1 else ''} {listed} in {env.url}"
                )
        with progress_bar(env.err, env.err.is_terminal or bool(args.progress), unit="objects") as progress:
            task = progress.add_task("verifying", total=None)
            checked_bytes = 0

            def advance(key: str, size: int) -> None:
                nonlocal checked_bytes
                checked_bytes += size
                progress.update(task, advance=1, description=f"verifying ({human_bytes(checked_bytes)})")

            report = verify(root, named or None, on_object=advance)
    finally:
        root.close()
    if not report.topics and not args.json:
        env.note(f"no topics in {env.url}: nothing to verify")
    if args.json:
        env.out.file.write(json.dumps(report_document(report), indent=2) + "\n")
        env.out.file.flush()
    else:
        _print_report(env, report)
    return EXIT_OK if report.ok else EXIT_FAILED


def _missing_local_directory(url: str) -> str | None:
    """The directory a local root URL names (plain path, ``file://``, ``local://``) when it does not exist."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme.lower() not in ("file", "local"):
        return None  # another store: its own client says what is wrong with it
    path = rest if sep else url
    return None if not path or os.path.isdir(path) else path


def report_document(report: VerifyReport) -> dict[str, Any]:
    """The ``--json`` document: ``{"clean": bool, "checked": {...}, "problems": [{...}, ...]}``.

    ``checked`` counts what readers see (topics by name, partitions, and the objects, batches, records and bytes
    of the chains); ``superseded`` what was checked too but is off the chains, awaiting deletion;
    each problem has the fields :data:`JSON_PROBLEM_FIELDS` (partition, object and offset may be null).
    """
    return {
        "clean": report.ok,
        "checked": {
            "topics": list(report.topics),
            "partitions": report.partitions,
            "objects": report.objects,
            "batches": report.batches,
            "records": report.records,
            "bytes": report.bytes,
        },
        "superseded": {
            "objects": report.superseded_objects,
            "batches": report.superseded_batches,
            "records": report.superseded_records,
            "bytes": report.superseded_bytes,
        },
        "problems": [
            {name: getattr(problem, name) for name in JSON_PROBLEM_FIELDS} for problem in report.problem_list()
        ],
    }


def _print_report(env: Env, report: VerifyReport) -> None:
    """The problems as a table (when there are any), then the one-line summary."""
    problems = report.problem_list()
    if problems:
        table = Table(title=f"{len(problems)} problem(s)", title_justify="left")
        # Where comes first and is never cut. The key stays whole on one line (to copy) when there is room
        # for it and a readable detail beside it, and folds rather than losing its end on a narrow terminal.
        longest = max(len(p.object or "-") for p in problems)
        whole_keys = env.out.width >= longest + 80
        table.add_column("topic", no_wrap=True)
        table.add_column("partition", justify="right", no_wrap=True, min_width=9)
        table.add_column("offset", justify="right", no_wrap=True, min_width=6)
        table.add_column("problem", no_wrap=True, style="red", min_width=14)
        table.add_column("object", overflow="fold", no_wrap=whole_keys)
        table.add_column("detail", min_width=16)
        for p in problems:
            where = cell_text(p.object or "-", "" if p.on_chain else "dim")
            table.add_row(
                cell_text(p.topic),
                cell_text("-" if p.partition is None else str(p.partition)),
                # Plain digits, no separators: an offset to paste into `plog inspect --batch`.
                cell_text("-" if p.offset is None else str(p.offset)),
                cell_text(p.problem),
                where,
                cell_text(p.detail if p.on_chain else f"{p.detail} (superseded object, off the chain)"),
            )
        env.out.print(table)
    env.out.print(cell_text(report.summary(), "green" if report.ok else "bold red"), soft_wrap=True)
