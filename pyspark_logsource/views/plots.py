"""Plots of a plog root for notebooks: partition sizes, offsets over time, consumer lag.

Drawn from the data-only listings of :mod:`segment_format.inspect.listings` (or a
card of :mod:`pyspark_logsource.views.cards`)::

    from pyspark_logsource import views as pi

    topic = pi.inspect_topic("plog-data", "clicks")
    pi.plot_partition_sizes(topic)          # records and bytes per partition
    pi.plot_offsets_over_time(topic)        # offsets against time, and records/s
    pi.plot_consumer_lag({0: (120, 400), 1: (400, 400)})   # {partition: (committed, end)}

Each plot function returns a :class:`matplotlib.figure.Figure` made without
pyplot, so no global state leaks and a notebook shows it once, as a PNG, when
it is a cell's value (a script calls ``fig.savefig``); or it draws on the
``ax`` / ``axes`` given and returns their figure. matplotlib is
imported when a plot is made, so the rest works without it
(``pip install pyspark-logsource[notebook]``).
"""

from __future__ import annotations

import functools
import io
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from pyspark_logsource.views.cards import PartitionView, TopicView
from segment_format.inspect.listings import lag_frame, throughput

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


@functools.cache
def _figure_class() -> type[Figure]:
    from matplotlib.figure import Figure

    class InspectFigure(Figure):
        """A matplotlib Figure that shows itself as a PNG in any notebook, whether or not pyplot is in use.

        It is made without pyplot, so the inline backend never shows it a second time.
        """

        def _repr_png_(self) -> bytes:
            buffer = io.BytesIO()
            self.savefig(buffer, format="png")
            return buffer.getvalue()

    return InspectFigure


def _figure(
    ncols: int = 1, nrows: int = 1, *, figsize: tuple[float, float], sharex: bool = False
) -> tuple[Figure, list[Axes]]:
    fig = _figure_class()(figsize=figsize, layout="constrained")
    axes = fig.subplots(nrows, ncols, sharex=sharex, squeeze=False)
    return fig, list(axes.ravel())


def _bytes_formatter() -> Any:
    from matplotlib.ticker import FuncFormatter

    def fmt(value: float, _pos: int) -> str:
        for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
            if abs(value) < 1024 or unit == "TiB":
                return f"{value:.0f} {unit}" if unit == "B" else f"{value:.3g} {unit}"
            value /= 1024
        return str(value)  # pragma: no cover

    return FuncFormatter(fmt)


def _partitions_data(topic: TopicView | pd.DataFrame) -> tuple[pd.DataFrame, str]:
    if isinstance(topic, TopicView):
        return topic.partitions(), topic.name
    if isinstance(topic, pd.DataFrame):
        missing = {"partition", "records", "bytes"} - set(topic.columns)
        if missing:
            raise ValueError(f"partition DataFrame lacks column(s) {sorted(missing)}; use partitions(root, topic)")
        return topic, ""
    raise TypeError(f"expected a TopicView or the DataFrame of partitions(), not {type(topic).__name__}")


def plot_partition_sizes(
    topic: TopicView | pd.DataFrame, *, axes: Sequence[Axes] | None = None, title: str | None = None
) -> Figure:
    """Records and bytes per partition, side by side: two bar charts.

    ``topic`` is a :class:`TopicView` or the DataFrame of :func:`partitions`.
    Bytes show what is stored (on the chain) and, when known, the uncompressed size.
    """
    frame, name = _partitions_data(topic)
    if axes is None:
        fig, (ax_records, ax_bytes) = _figure(2, figsize=(10, 3.6))
    else:
        ax_records, ax_bytes = axes
        fig = ax_records.get_figure()  # type: ignore[assignment]
    x = np.arange(len(frame))
    labels = [str(p) for p in frame["partition"]]
    bars = ax_records.bar(x, frame["records"].to_numpy(dtype=float), color="C0")
    ax_records.bar_label(bars, labels=[f"{int(v):,}" for v in frame["records"]], fontsize=8)
    ax_records.set_title("records per partition")
    ax_records.set_ylabel("records (end − start offset)")
    if "uncompressed_bytes" in frame.columns:
        width = 0.4
        ax_bytes.bar(x - width / 2, frame["bytes"].to_numpy(dtype=float), width, label="on storage", color="C1")
        ax_bytes.bar(
            x + width / 2,
            frame["uncompressed_bytes"].to_numpy(dtype=float),
            width,
            label="uncompressed",
            color="C1",
            alpha=0.4,
        )
        ax_bytes.legend(fontsize=8)
    else:
        ax_bytes.bar(x, frame["bytes"].to_numpy(dtype=float), color="C1")
    ax_bytes.set_title("bytes per partition")
    ax_bytes.yaxis.set_major_formatter(_bytes_formatter())
    for ax in (ax_records, ax_bytes):
        ax.set_xticks(x, labels)
        ax.set_xlabel("partition")
        ax.margins(y=0.15)
    if title or name:
        fig.suptitle(title or f"topic {name}")
    return fig


def plot_offsets_over_time(
    topic: TopicView | PartitionView | pd.DataFrame,
    *,
    partitions: Iterable[int] | None = None,
    rate: bool = True,
    axes: Sequence[Axes] | None = None,
    title: str | None = None,
) -> Figure:
    """Offsets against time for each partition (upper panel) and records/s (lower panel, ``rate=True``).

    ``topic`` is a :class:`TopicView`, a :class:`PartitionView`, or the
    DataFrame of :func:`offset_timeline`. Each step is a batch: its last offset
    plotted at its max timestamp, so the slope of a line is the partition's
    throughput. Read from the indexes only.
    """
    if isinstance(topic, TopicView):
        timeline, name = topic.offset_timeline(partitions), f"topic {topic.name}"
    elif isinstance(topic, PartitionView):
        timeline, name = topic.offset_timeline(), f"partition {topic.topic}-{topic.partition}"
    elif isinstance(topic, pd.DataFrame):
        timeline, name = topic, ""
        if partitions is not None:
            timeline = timeline[timeline["partition"].isin(list(partitions))]
    else:
        raise TypeError(
            f"expected a TopicView, PartitionView or offset_timeline() DataFrame, not {type(topic).__name__}"
        )
    panels = 2 if rate else 1
    if axes is None:
        fig, axs = _figure(1, panels, figsize=(10, 3.2 * panels), sharex=True)
    else:
        axs = list(axes)
        fig = axs[0].get_figure()  # type: ignore[assignment]
    ax_offsets = axs[0]
    for p, rows in timeline.groupby("partition", sort=True):
        rows = rows.sort_values("base_offset")
        times = pd.to_datetime(rows["max_timestamp"]).dt.tz_localize(None).to_numpy()
        ax_offsets.step(times, rows["last_offset"].to_numpy() + 1, where="post", label=f"partition {p}")
    ax_offsets.set_ylabel("end offset")
    ax_offsets.set_title("offsets over time")
    if not timeline.empty:
        ax_offsets.legend(fontsize=8, loc="upper left")
    if rate:
        ax_rate = axs[1]
        rates = throughput(timeline)
        if not rates.empty:
            index = rates.index.tz_localize(None) if getattr(rates.index, "tz", None) else rates.index
            for p in rates.columns:
                ax_rate.plot(index.to_numpy(), rates[p].to_numpy(), marker=".", label=f"partition {p}")
            width = rates.index.freqstr if getattr(rates.index, "freqstr", None) else ""
            ax_rate.set_title(f"throughput (records/s, {width} buckets)" if width else "throughput (records/s)")
        ax_rate.set_ylabel("records / s")
        ax_rate.set_xlabel("time (UTC)")
    else:
        ax_offsets.set_xlabel("time (UTC)")
    if axes is None:
        fig.autofmt_xdate()
    if title or name:
        fig.suptitle(title or name)
    return fig


def plot_consumer_lag(
    lag: Mapping[Any, Any] | pd.DataFrame, *, ax: Axes | None = None, title: str | None = None
) -> Figure:
    """Consumer lag per partition: a bar to each end offset, split into consumed (committed) and lag.

    ``lag`` is ``{partition: (committed, end)}`` or a DataFrame with columns
    ``partition``, ``committed`` and ``end_offset`` (see :func:`lag_frame`), as
    a consumer group's committed offsets give. A partition with no committed
    offset (None) is drawn hatched, its lag unknown.
    """
    frame = lag_frame(lag)
    if ax is None:
        fig, (ax,) = _figure(figsize=(max(5.0, 0.9 * len(frame) + 3), 3.6))
    else:
        fig = ax.get_figure()  # type: ignore[assignment]
    x = np.arange(len(frame))
    end = frame["end_offset"].fillna(0).to_numpy(dtype=float)
    unknown = frame["committed"].isna().to_numpy()
    committed = frame["committed"].fillna(0).to_numpy(dtype=float)
    lagging = np.where(unknown, 0.0, np.maximum(end - committed, 0))
    consumed = np.where(unknown, 0.0, np.minimum(committed, end))
    ax.bar(x, consumed, color="C0", label="committed")
    bars = ax.bar(x, lagging, bottom=consumed, color="C3", label="lag")
    ax.bar_label(
        bars, labels=["" if u else f"{int(v):,}" for u, v in zip(unknown, lagging, strict=True)], fontsize=8, padding=2
    )
    if unknown.any():
        hatched = ax.bar(
            x[unknown], end[unknown], color="none", edgecolor="0.5", hatch="//", label="no committed offset"
        )
        ax.bar_label(hatched, labels=["lag unknown"] * int(unknown.sum()), fontsize=8, padding=2)
    if "topic" in frame.columns:
        ticks = [f"{t}-{p}" for t, p in zip(frame["topic"], frame["partition"], strict=True)]
    else:
        ticks = [str(p) for p in frame["partition"]]
    ax.set_xticks(x, ticks)
    ax.set_xlabel("partition")
    ax.set_ylabel("offset")
    # Stacked bars make their tops "sticky" for autoscaling, so leave room for the labels explicitly.
    ax.set_ylim(0, max(1.0, float(end.max(initial=0.0))) * 1.18)
    ax.legend(fontsize=8)
    total = int(frame["lag"].fillna(0).sum())
    ax.set_title(title or f"consumer lag: {total:,} record(s) behind")
    return fig


__all__ = ["plot_consumer_lag", "plot_offsets_over_time", "plot_partition_sizes"]
