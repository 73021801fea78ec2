"""What the Spark source's planner hands a task: a partition's offset range, or a shared topic's runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coordinator.quotas import ANONYMOUS
from pyspark_logsource.spark.compat import InputPartition
from pyspark_logsource.spark.option_schema import SPARK_CLIENT_ID
from pyspark_logsource.spark.typed import Pin
from segment_format.log.chain import SegmentRef
from segment_format.segment import SegmentIndex
from segment_format.typed.layout import FieldFilter

__all__ = ["PlogInputPartition", "PlogObjectsInputPartition"]


@dataclass(frozen=True)
class PlogInputPartition(InputPartition):
    """What one Spark task reads: offsets ``[start, until)`` of one partition, and how to reach the root."""

    url: str
    storage_options: dict[str, Any]
    topic: str
    topic_id: str
    partition: int
    start: int
    until: int
    fail_on_data_loss: bool = True
    include_headers: bool = False
    isolation_level: str = "read_committed"
    #: The log start the planner knew, and the chain elements it resolved covering ``[start, until)``
    #: (PROTOCOL.md 9, planned reads): the task reads them without listing the partition itself.
    log_start: int = 0
    segments: tuple[SegmentRef, ...] = ()
    #: A typed topic (PROTOCOL.md 11.8): the value schema version every batch is read as, fixed when the
    #: query was defined (None: untyped). Carried here so that executors read as the driver planned.
    value_schema: Pin | None = None
    #: ``valueFields``: the only value fields read, and decoded (None: all of them).
    value_fields: tuple[str, ...] | None = None
    #: ``flattenValue``: the value's fields as top-level columns.
    flatten_value: bool = False
    #: Pushed conditions on value fields: batches their statistics rule out are not decoded (11.8).
    value_filters: tuple[FieldFilter, ...] = ()
    #: The ``(user, client-id)`` whose ``consumer_byte_rate`` the task enforces (``quotaUser``, ``clientId``).
    quota_user: str = ANONYMOUS
    client_id: str = SPARK_CLIENT_ID
    #: The indexes of the runs of a shared topic among ``segments`` (PROTOCOL.md 7.3), by key, from the
    #: planner's commits: the task reads them without listing or reading a commit.
    runs: tuple[tuple[str, SegmentIndex], ...] = ()

    def __repr__(self) -> str:  # storage options may hold credentials: never show them
        return (
            f"PlogInputPartition({self.topic}-{self.partition} [{self.start}, {self.until}) topic_id={self.topic_id})"
        )


@dataclass(frozen=True)
class PlogObjectsInputPartition(InputPartition):
    """What one Spark task reads of a shared topic (PROTOCOL.md 7.3): ``pieces``, each one partition's run of
    one commit (with the run's index), in commit order, read one after the other; each shared object they
    come from is read once, one span for all their partitions' runs."""

    topic: str
    pieces: tuple[PlogInputPartition, ...]

    @property
    def partitions(self) -> frozenset[int]:
        """The topic's partitions the task reads."""
        return frozenset(piece.partition for piece in self.pieces)

    def __repr__(self) -> str:  # storage options may hold credentials: never show them
        return f"PlogObjectsInputPartition({self.topic}: {len(self.pieces)} runs of {len(self.partitions)} partitions)"
