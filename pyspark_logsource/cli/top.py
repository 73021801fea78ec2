"""``plog top``: a live view of a root: its topics' produce rates, its groups' lag, and what watching costs.

Each refresh reads the root as a reader would, and nothing else: the topic names (a LIST), each topic's
metadata while it is cached (a LIST and a GET every 30 s), each partition's end offset (the first frame
lists each partition; later frames only probe a shared topic's next commit, one request per topic, or check
a partitioned topic's next object, one request per idle partition, more for a partition that grew), the group
names (a LIST of ``groups/``) and each group's committed offsets (``GroupClient.committed``: about four requests
per group); ``tests/test_metrics.py`` checks the count.
Rates are differences of end offsets (records) and of the stored sizes of the objects appended (bytes,
compressed) between two refreshes, so the first frame has none. The frame shows the requests ``plog top``
itself made, counted by its store, and their price.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

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
    "grew), a LIST of the topics, a LIST of groups/ and about four requests per "
    "group (its committed offsets); the first frame also lists each partition, and each topic's metadata is "
    "read (a LIST and a GET) every 30 s. The frame shows the count."
)


def register(commands: Commands, common: argparse.ArgumentParser) -> None:
    """Add ``plog top`` to ``commands``."""
    top = commands.add_parser(
        "top",
        parents=[common],
        help="a live view: topics and their produce rates, groups and their lag",
        description="A live view of a root: per topic its partitions, end offsets and produce rate "
        "(records/s, stored bytes/s), per group and topic its committed offsets and lag. " + COST_HELP,
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
    """One group's offsets in one topic."""

    group: str
    topic: str
    committed: int
    lag: int | None


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
            committed = GroupClient(self.root.store, group).committed()
            by_topic: dict[str, list[tuple[int, int]]] = {}
            for (topic, partition), offset in committed.items():
                by_topic.setdefault(topic, []).append((partition, offset))
            for topic, offsets in sorted(by_topic.items()):
                lags = [ends[(topic, p)] - o for p, o in offsets if (topic, p) in ends]
                lag = sum(max(0, x) for x in lags) if len(lags) == len(offsets) else None
                frame.groups.append(GroupRow(group, topic, sum(o for _, o in offsets), lag))
        after, counts = self._requests()
        frame.requests = after - before
        frame.requests_total = after
        frame.cost_usd_total = estimated_cost_usd(counts)
        frame.seconds = time.monotonic() - started
        self._last = started
        return frame


def render(url: str, frame: Frame) -> Group:
    """A frame as rich tables."""
    topics = Table(title=f"topics of {url}", title_justify="left", expand=False)
    for column in ("topic", "partitions", "end offsets", "records/s", "bytes/s"):
        topics.add_column(column, justify="left" if column == "topic" else "right")
    for row in frame.topics:
        topics.add_row(
            row.name,
            f"{row.partitions:,}",
            f"{row.end:,}",
            "-" if row.records_per_s is None else f"{row.records_per_s:,.1f}",
            "-" if row.bytes_per_s is None else f"{row.bytes_per_s:,.0f}",
        )
    groups = Table(title="consumer groups", title_justify="left", expand=False)
    for column in ("group", "topic", "committed", "lag"):
        groups.add_column(column, justify="left" if column in ("group", "topic") else "right")
    for g in frame.groups:
        groups.add_row(g.group, g.topic, f"{g.committed:,}", "-" if g.lag is None else f"{g.lag:,}")
    cost = Text(
        f"this refresh: {frame.requests:,} store requests in {frame.seconds:.2f} s; plog top so far: "
        f"{frame.requests_total:,} requests, ${frame.cost_usd_total:.6f} at object-store request prices",
        style="dim",
    )
    return Group(topics, groups, cost)


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

        with Live(render(env.url, sampler.sample()), console=env.out, auto_refresh=False) as live:
            try:
                while True:
                    time.sleep(interval)
                    try:
                        live.update(render(env.url, sampler.sample()), refresh=True)
                    except PlogError as exc:  # a store hiccup: say so, try again next refresh
                        env.note(f"refresh failed: {exc}", style="yellow")
            except KeyboardInterrupt:
                pass
    return EXIT_OK
