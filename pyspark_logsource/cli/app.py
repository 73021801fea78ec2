"""``plog``: the command line of plog (topics, produce, consume, inspect, verify, maintain, groups, ship, demo).

Every command works on a plog root named by ``--url`` (any fsspec URL or a
local directory; default ``./plog-data``, or ``$PLOG_URL`` when set) with
backend options given as repeatable ``--storage-option KEY=VALUE``.

Records go to stdout untouched by any formatting; tables, progress bars and
summaries are drawn with ``rich`` (progress bars and notes on stderr, so
``plog consume ... | jq`` stays clean). Exit codes: 0 success, 1 a check
failed (``plog verify`` found problems in the root, or the demo's
verification failed), 2 bad usage or a plog error such as an unknown topic
(printed as one red line ``error: ...``), 130 interrupted.

Examples::

    plog topics create clicks --partitions 3 --config retention.ms=86400000
    printf 'a\\nb\\n' | plog produce clicks
    plog consume clicks --from-beginning --format json
    plog inspect clicks --partition 0 --batch 42
    plog verify                       # every checksum and index of the root; exit 1 on any problem
    plog verify clicks --json | jq '.problems[] | .object'
    plog groups describe my-group
    plog demo

Each command lives in its own module with its parser (``register``) next to
its handler; this module composes them and runs one.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from rich.text import Text

from pyspark_logsource.cli import (
    demo,
    groups,
    maintain,
    protocol,
    quotas,
    records,
    segments,
    serve,
    ship,
    top,
    topics,
    verify,
)
from pyspark_logsource.cli.common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    ROOT_REQUIRED,
    CliError,
    Env,
    common_options,
    make_console,
    require_root,
)
from segment_format.errors import PlogError

#: The command modules, in the order ``plog --help`` lists them.
COMMANDS = (topics, records, segments, verify, maintain, groups, quotas, top, protocol, serve, ship, demo)


def build_parser() -> argparse.ArgumentParser:
    """The ``plog`` argument parser (exposed for documentation and tests)."""
    parser = argparse.ArgumentParser(
        prog="plog",
        description="plog: a Kafka-style durable log as Arrow record batches on any fsspec filesystem. "
        "Create topics, produce, consume, inspect and verify (fsck) their segment objects, maintain, "
        "manage consumer groups. Exit status: 0 success, 1 a check failed (verify found problems), "
        "2 bad usage or a plog error, 130 interrupted.",
        epilog="Start with `plog demo`. Every command takes --url and --storage-option.",
    )
    try:
        from importlib.metadata import version

        parser.add_argument("--version", action="version", version=f"plog {version('pyspark-logsource')}")
    except Exception:  # noqa: BLE001 - not installed as a distribution: no --version
        pass
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = common_options()
    for module in COMMANDS:
        module.register(commands, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``plog`` with ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version or a usage error: argparse already printed
        return exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None else EXIT_ERROR)
    env = Env(args, make_console(sys.stdout), make_console(sys.stderr))
    try:
        if getattr(args, "root", ROOT_REQUIRED) == ROOT_REQUIRED and not getattr(args, "create", False):
            require_root(env.url, env.options)
        return int(args.handler(env))
    except (PlogError, CliError) as exc:
        env.err.print(Text(f"error: {exc}", style="bold red"), soft_wrap=True)
        return EXIT_ERROR
    except KeyboardInterrupt:
        env.err.print(Text("interrupted", style="yellow"))
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (e.g. `plog consume ... | head`)
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
