"""``plog top``: a live view of a root: its topics' produce rates, its groups' lag, and what watching costs.

Each refresh reads the root as a reader would, and nothing else: the topic names (a LIST), each topic's
metadata while it is cached (a LIST and a GET every 30 s), each partition's end offset (the first frame
lists each partition; later frames only probe a shared topic's next commit, one request per topic, or check
a partitioned topic's next object, one request per idle partition, more for a partition that grew), the group
names (a LIST of ``groups/``) and each group's description (``GroupClient.describe``: its committed offsets, its
members' heartbeats and its rebalance marker, about six requests per group); ``tests/test_metrics.py`` checks the
count. Rates are differences between two refreshes, so the first frame has none: produced records/s of end
offsets, stored bytes/s of the sizes of the objects appended (compressed, with each batch's index: not the
payload's size), and a group's consumed records/s of its committed offsets. The frame shows the requests
``plog top`` itself made, counted by its store, and their price; ``q`` or Ctrl-C quits.
"""

from __future__ import annotations

import argparse
import os
import select
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from coordinator.groups import GroupClient, list_groups
from pyspark_logsource.cli.common import EXIT_OK, CliError, Env
from pyspark_logsource.client.admin import LogStore
from segment_format.errors import PlogError, UnknownTopicOrPartitionError
from segment_format.stores.counting import CountingStore, estimated_cost_usd

if TYPE_CHECKING:
    from pyspark_logsource.cli.common import Commands

#: The help's statement of a refresh's cost (kept beside the module docstring that explains it).
COST_HELP = (
    "Cost: after the first frame a refresh makes one store request per shared topic (a probe of its next "
    "commit) and per partition of a partitioned topic (a check for a new object; more for a partition that "
    "grew), a LIST of the topics, a LIST of groups/ and about six requests per "
    "group (its committed offsets, members and state); the first frame also lists each partition, and each "
    "topic's metadata is read (a LIST and a GET) every 30 s. The frame shows the count."
)


def register(commands: Commands, common: argparse.ArgumentParser) -> None:
    """Add ``plog top`` to ``commands``."""
    top = commands.add_parser(
        "top",
        parents=[common],
        help="a live view: topics and their produce rates, groups, their members, consume rates and lag",
        description="A live view of a root: per topic its partitions, end offsets and produce rate "
        "(records/s, and stored bytes/s: compressed objects, not payload), per group its state and live members, "
        "and per topic its committed offsets, consume rate and lag. Press q or Ctrl-C to quit. " + COST_HELP,
    )
    top.add_argument("--once", action="store_true", help="print one frame and exit (no rates: they need two)")
    top.add_argument("--interval", type=float, default=2.0, metavar="SECONDS", help="seconds between refreshes (2)")
    top.set_defaults(handler=cmd_top)


@dataclass
class TopicRow:
    """One topic of a frame."""

    name: str
    partitions: int
    end: int
    records_per_s: float | None
    bytes_per_s: float | None


@dataclass
class GroupRow:
    """One group's offsets in one topic, with the group's state and live members."""

    group: str
    topic: str
    committed: int
    lag: int | None
    consumed_per_s: float | None = None
    state: str = ""
    live_members: int = 0


@dataclass
class Frame:
    """What one refresh found, and what it cost."""

    topics: list[TopicRow] = field(default_factory=list)
    groups: list[GroupRow] = field(default_factory=list)
    requests: int = 0
    requests_total: int = 0
    cost_usd_total: float = 0.0
    seconds: float = 0.0


class TopSampler:
    """Reads a root's end offsets and committed offsets, refresh after refresh (see the module docstring)."""

    def __init__(self, store: LogStore) -> None:
        self.store = store
        self.root = store.root
        #: Per partition: (monotonic time, end offset) of the previous refresh.
        self._previous: dict[tuple[str, int], tuple[float, int]] = {}
        #: Per group and topic: the committed offsets' sum at the previous refresh.
        self._committed: dict[tuple[str, str], int] = {}
        self._listed: set[tuple[str, int]] = set()
        #: When the previous refresh began (None before the first).
        self._last: float | None = None

    def _requests(self) -> tuple[int, dict[str, int]]:
        counting = self.root.store
        if isinstance(counting, CountingStore):
            counts = counting.counts()
            return sum(counts.values()), counts
        return 0, {}

    def _end(self, topic: str, partition: int) -> tuple[int, int]:
        """The partition's end offset, and the stored bytes of the objects from ``since`` (its last end) on."""
        log = self.root.partition(topic, partition)
        key = (topic, partition)
        view = log.follow_tail() if key in self._listed else log.view()
        self._listed.add(key)
        previous = self._previous.get(key)
        since = previous[1] if previous is not None else view.end_offset
        grown = sum(s.size for s in view.segments if s.base_offset >= since)
        return view.end_offset, grown

    def sample(self) -> Frame:
        """One refresh."""
        started = time.monotonic()
        self.root.index_cache.round_started = started  # a refresh probes each shared topic once (PROTOCOL.md 9.1)
        before, _ = self._requests()
        frame = Frame()
        elapsed = started - self._last if self._last is not None else 0.0
        ends: dict[tuple[str, int], int] = {}
        for name in sorted(self.root.catalog.names()):
            total = records = grown = 0
            known = elapsed > 0  # a rate needs every partition's previous end
            try:
                meta = self.root.topic(name)
                for p in range(meta.partitions):
                    end, new_bytes = self._end(name, p)
                    previous = self._previous.get((name, p))
                    if previous is None:
                        known = False
                    else:
                        records += end - previous[1]
                        grown += new_bytes
                    ends[(name, p)] = end
                    total += end
                    self._previous[(name, p)] = (started, end)
            except UnknownTopicOrPartitionError:  # deleted while we looked
                continue
            rates = (records / elapsed, grown / elapsed) if known else (None, None)
            frame.topics.append(TopicRow(name, meta.partitions, total, *rates))
        for group in sorted(list_groups(self.root.store)):
            described = GroupClient(self.root.store, group).describe()
            live = sum(m.alive for m in described.members)
            by_topic: dict[str, list[tuple[int, int]]] = {}
            for (topic, partition), offset in described.committed.items():
                by_topic.setdefault(topic, []).append((partition, offset))
            for topic, offsets in sorted(by_topic.items()):
                lags = [ends[(topic, p)] - o for p, o in offsets if (topic, p) in ends]
                lag = sum(max(0, x) for x in lags) if len(lags) == len(offsets) else None
                committed = sum(o for _, o in offsets)
                before_sum = self._committed.get((group, topic))
                consumed = (committed - before_sum) / elapsed if elapsed > 0 and before_sum is not None else None
                self._committed[(group, topic)] = committed
                frame.groups.append(GroupRow(group, topic, committed, lag, consumed, described.state, live))
        after, counts = self._requests()
        frame.requests = after - before
        frame.requests_total = after
        frame.cost_usd_total = estimated_cost_usd(counts)
        frame.seconds = time.monotonic() - started
        self._last = started
        return frame


#: The key line under a live frame.
KEYS = "q or Ctrl-C: quit"


def _rate(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def render(url: str, frame: Frame, keys: str | None = None) -> Group:
    """A frame as rich tables; ``keys``: the key line of a live view."""
    topics = Table(title=f"topics of {url}", title_justify="left", expand=False)
    for column in ("topic", "partitions", "end offsets", "produced records/s", "stored bytes/s"):
        topics.add_column(column, justify="left" if column == "topic" else "right")
    for row in frame.topics:
        topics.add_row(
            row.name, f"{row.partitions:,}", f"{row.end:,}", _rate(row.records_per_s), _rate(row.bytes_per_s, 0)
        )
    groups = Table(title="consumer groups", title_justify="left", expand=False)
    for column in ("group", "state", "live members", "topic", "committed", "consumed records/s", "lag"):
        groups.add_column(column, justify="left" if column in ("group", "state", "topic") else "right")
    for g in frame.groups:
        groups.add_row(
            g.group,
            g.state,
            f"{g.live_members:,}",
            g.topic,
            f"{g.committed:,}",
            _rate(g.consumed_per_s),
            "-" if g.lag is None else f"{g.lag:,}",
        )
    cost = Text(
        f"this refresh: {frame.requests:,} store requests in {frame.seconds:.2f} s; plog top so far: "
        f"{frame.requests_total:,} requests, ${frame.cost_usd_total:.6f} at object-store request prices. "
        "Rates need two refreshes; stored bytes are the compressed objects written, not the payload.",
        style="dim",
    )
    parts: list[Table | Text] = [topics, groups, cost]
    if keys is not None:
        parts.append(Text(keys, style="bold"))
    return Group(*parts)


class KeyReader:
    """Keys pressed on a terminal's stdin, without waiting for Enter (nothing when stdin is not a terminal)."""

    def __init__(self) -> None:
        self._saved: list[Any] | None = None
        self._fd = -1
        if sys.stdin.isatty():
            import termios
            import tty

            self._fd = sys.stdin.fileno()
            self._saved = termios.tcgetattr(self._fd)
            tty.setcbreak(self._fd)  # keys arrive one by one; Ctrl-C still interrupts

    def wait(self, seconds: float) -> str:
        """Wait up to ``seconds`` for a key; the key, or "" after the wait."""
        if self._saved is None:
            time.sleep(seconds)
            return ""
        ready, _, _ = select.select([self._fd], [], [], seconds)
        return os.read(self._fd, 1).decode(errors="replace") if ready else ""

    def close(self) -> None:
        """Give the terminal back as it was."""
        if self._saved is not None:
            import termios

            termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)
            self._saved = None


def cmd_top(env: Env) -> int:
    """``plog top [--once] [--interval SECONDS]``: the live view (one frame with ``--once``)."""
    interval = env.args.interval
    if not interval > 0:
        raise CliError(f"--interval takes a positive number of seconds, got {interval}")
    with LogStore(env.url, env.options) as store:
        sampler = TopSampler(store)
        if env.args.once:
            env.out.print(render(env.url, sampler.sample()))
            return EXIT_OK
        from rich.live import Live

        keys = KeyReader()
        try:
            with Live(render(env.url, sampler.sample(), KEYS), console=env.out, auto_refresh=False) as live:
                next_refresh = time.monotonic() + interval
                while True:
                    key = keys.wait(max(0.0, next_refresh - time.monotonic()))
                    if key in ("q", "Q"):
                        break
                    if time.monotonic() < next_refresh:
                        continue  # another key: ignored
                    next_refresh = time.monotonic() + interval
                    try:
                        live.update(render(env.url, sampler.sample(), KEYS), refresh=True)
                    except PlogError as exc:  # a store hiccup: say so, try again next refresh
                        env.note(f"refresh failed: {exc}", style="yellow")
        except KeyboardInterrupt:
            pass
        finally:
            keys.close()
    return EXIT_OK
