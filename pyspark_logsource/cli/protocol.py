"""``plog protocol``: show what a root requires of its readers and writers, and enable features (PROTOCOL.md 12).

``plog protocol --enable changeNotices`` upgrades a root written before that feature existed. As
PROTOCOL.md 9.1 says, do it only once every writer of an older plog version has stopped.
``--enable boundedHistory`` enables ``compaction`` with it (its objects are compaction's); merges resolve
transactions once it has been listed for max(D, 10 min) (PROTOCOL.md 10, *Resolving transactions*).
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from pyspark_logsource.cli.common import EXIT_OK, ROOT_CREATED, CliError, Env, require_root
from segment_format.protocol import FEATURES, INITIAL, LEGACY, ProtocolVersion
from segment_format.root import LogRoot

if TYPE_CHECKING:
    from pyspark_logsource.cli.common import Commands


def register(commands: Commands, common: argparse.ArgumentParser) -> None:
    """Add ``plog protocol`` to ``commands``."""
    protocol = commands.add_parser(
        "protocol", parents=[common], help="show the root's protocol requirements; enable features"
    )
    protocol.add_argument(
        "--enable",
        action="append",
        default=[],
        metavar="FEATURE",
        help=f"require this feature from now on (known: {', '.join(sorted(FEATURES))}); repeatable",
    )
    # ``--enable`` on a location without a root makes one (its object 0); a bare look needs a root there.
    protocol.set_defaults(handler=cmd_protocol, root=ROOT_CREATED)


def cmd_protocol(env: Env) -> int:
    """``plog protocol [--enable FEATURE ...]``: print the root's protocol object (after enabling features)."""
    unknown = [name for name in env.args.enable if name not in FEATURES]
    if unknown:
        raise CliError(f"unknown feature {unknown[0]!r}: this plog knows {', '.join(sorted(FEATURES)) or 'none'}")
    if not env.args.enable:
        require_root(env.url, env.options)
    root = LogRoot(env.url, env.options)
    try:
        if env.args.enable:
            readers = tuple(name for name in env.args.enable if FEATURES[name].reader)
            wanted = ProtocolVersion(1, 1, readers, tuple(env.args.enable))
            if root.protocol.number is None and not root.catalog.names():
                # A new root: object 0 lists what a topic's creation would have listed, plus what was asked.
                # A root with topics but no object predates the protocol object; it gets only what is asked.
                wanted = INITIAL.merged(wanted)
            root.protocol.upgrade(wanted)
        doc = root.protocol.version
        number = root.protocol.number
        shown = {"object": None if number is None else number, **doc.to_dict()}
        if doc == LEGACY and number is None:
            env.note("this root has no protocol object: reader version 1, writer version 1, no features")
        env.out.print_json(json.dumps(shown))
    finally:
        root.close()
    return EXIT_OK
