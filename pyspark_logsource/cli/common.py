"""What every ``plog`` command shares: its environment, the common options, consoles, progress bars, errors.

A command is a handler ``(env: Env) -> int`` (the exit code) registered with
argparse by its module's ``register(commands, common)``; ``common`` is the
parent parser holding ``--url`` and ``--storage-option``, which every command
takes. Usage errors the CLI finds itself raise :class:`CliError`, reported
like a :class:`~segment_format.errors.PlogError`: one red line, exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import IO, TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, SpinnerColumn, Task, TextColumn, TimeElapsedColumn
from rich.text import Text

from pyspark_logsource.views.terminal import cell_text
from segment_format.root import LogRoot, holds_root
from segment_format.stores import open_store

if TYPE_CHECKING:
    #: The ``add_subparsers()`` action that each command module adds its parser to.
    Commands = argparse._SubParsersAction[argparse.ArgumentParser]

#: The root used when neither ``--url`` nor ``$PLOG_URL`` is given: a directory in the working directory.
DEFAULT_URL = "./plog-data"
#: Exit codes.
EXIT_OK, EXIT_FAILED, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130
#: What a command does with ``--url`` (its parser's ``root`` default): most need a root there and refuse a
#: location that holds none; ``topics create`` and ``demo`` create one; a few use no root at all.
ROOT_REQUIRED, ROOT_CREATED, ROOT_UNUSED = "require", "create", "none"

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class CliError(Exception):
    """A usage error the CLI detects itself; reported like a :class:`PlogError` (exit code 2)."""


# --------------------------------------------------------------------------- arguments


def parse_timestamp(text: str) -> int:
    """Epoch milliseconds from ``text``: digits are milliseconds, anything else ISO 8601.

    An ISO date/time without a UTC offset is taken as UTC (the zone ``plog inspect``
    prints), so a timestamp copied from its output round-trips.
    """
    value = text.strip()
    if value.isdigit():
        return int(value)
    iso = value[:-1] + "+00:00" if value[-1:] in ("Z", "z") else value
    try:
        stamp = datetime.fromisoformat(iso)
    except ValueError:
        raise CliError(
            f"timestamp {text!r} is neither epoch milliseconds nor ISO 8601 (e.g. 2024-05-01T12:00:00Z)"
        ) from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    ms = (stamp - _EPOCH) // timedelta(milliseconds=1)
    if ms < 0:
        raise CliError(f"timestamp {text!r} is before 1970")
    return ms


def key_value(text: str) -> tuple[str, str]:
    """argparse type of ``KEY=VALUE`` options."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        # Not echoed: a mistyped pair may well be a credential (account_key:...).
        raise argparse.ArgumentTypeError("expected KEY=VALUE (the text given is not shown: it may hold a credential)")
    return key.strip(), value


def storage_options(pairs: Sequence[tuple[str, str]] | None) -> dict[str, Any]:
    """Storage options from ``KEY=VALUE`` pairs; values that parse as JSON (true, 3, {...}) are decoded."""
    options: dict[str, Any] = {}
    for key, raw in pairs or ():
        try:
            options[key] = json.loads(raw)
        except ValueError:
            options[key] = raw
    return options


def storage_option_args(options: dict[str, Any]) -> list[str]:
    """The ``--storage-option KEY=VALUE`` arguments that give ``options`` to a plog command (the inverse of
    :func:`storage_options`: values that are not strings as JSON)."""
    return [
        arg
        for key, value in options.items()
        for arg in ("--storage-option", f"{key}={value if isinstance(value, str) else json.dumps(value)}")
    ]


def common_options() -> argparse.ArgumentParser:
    """The parent parser of every command: ``--url`` and ``--storage-option``."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        default=os.environ.get("PLOG_URL", DEFAULT_URL),
        help="plog root: a local directory or any fsspec URL (default: $PLOG_URL or %(default)s)",
    )
    common.add_argument(
        "--storage-option",
        metavar="KEY=VALUE",
        type=key_value,
        action="append",
        default=[],
        help="fsspec storage option, repeatable; JSON values (true, 3) are decoded",
    )
    return common


# --------------------------------------------------------------------------- output


def records_text(n: int) -> str:
    """``1 record``, ``2,000 records``."""
    return f"{n:,} record" + ("" if n == 1 else "s")


def rate_text(count: float, seconds: float) -> str:
    """``count`` per second, or ``-`` when no time passed."""
    return f"{count / seconds:,.0f}" if seconds > 0 else "-"


def make_console(stream: IO[str]) -> Console:
    """A console on ``stream``; wide when not a terminal so tables are not squeezed in pipes and logs."""
    width = None
    if not stream.isatty() and "COLUMNS" not in os.environ:
        width = 160
    return Console(file=stream, width=width, highlight=False)


class RateColumn(ProgressColumn):
    """Progress column: items per second."""

    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        """Render the current speed of ``task``."""
        speed = task.finished_speed or task.speed
        return Text("-" if speed is None else f"{speed:,.0f} {self.unit}/s", style="progress.data.speed")


def progress_bar(console: Console, enabled: bool, unit: str = "records", auto_refresh: bool = True) -> Progress:
    """A progress bar on ``console`` (stderr) counting ``unit``; drawn only when ``enabled``."""
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,.0f} " + unit),
        RateColumn(unit),
        TimeElapsedColumn(),
        console=console,
        disable=not enabled,
        auto_refresh=auto_refresh,
    )


@dataclass
class Env:
    """What every command gets: its arguments and the two consoles (``out``: stdout, ``err``: stderr)."""

    args: argparse.Namespace
    out: Console
    err: Console

    @property
    def url(self) -> str:
        """The root URL."""
        return str(self.args.url)

    @property
    def options(self) -> dict[str, Any]:
        """The storage options."""
        return storage_options(self.args.storage_option)

    def note(self, message: str, style: str = "dim") -> None:
        """A remark on stderr."""
        self.err.print(cell_text(message, style), soft_wrap=True)


def _local_path(url: str) -> str | None:
    """The directory a local URL names (as ``open_store`` reads it), None for any other URL."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    return rest if scheme.lower() in ("file", "local") else None


def require_root(url: str, options: dict[str, Any]) -> None:
    """Refuse a location that holds no plog root (a mistyped ``--url``), creating nothing there: a local
    directory is looked at before it is opened (opening creates it), any other store is listed."""
    how = f"create one with `plog topics create TOPIC --url {url}`, or check --url and $PLOG_URL"
    local = _local_path(url)
    if local is not None and not os.path.isdir(local):
        raise CliError(f"no plog root at {url}: {local!r} is not a directory ({how})")
    store = open_store(url, options)
    try:
        found = holds_root(store)
    finally:
        store.close()
    if not found:
        raise CliError(f"no plog root at {url}: it holds no protocol object and no topic ({how})")


#: The features a root created empty lists in its protocol object 0, so that its first topic of any kind needs
#: no wait (as a root created by its first topic lists that topic's features, PROTOCOL.md 12.3).
NEW_ROOT_FEATURES = ("compaction", "typedTopics", "sharedObjects")


def create_root(url: str, options: dict[str, Any]) -> None:
    """Make ``url`` an empty plog root (``plog serve --create``): its protocol object 0, nothing else."""
    with LogRoot(url, options) as root:
        if root.protocol.number is None:
            root.protocol.settle_feature(NEW_ROOT_FEATURES, 0)
