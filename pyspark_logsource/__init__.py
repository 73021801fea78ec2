"""plog: a Kafka-style durable log as Arrow record batches on any fsspec filesystem.

What users touch, one subpackage per concern, composed from ``segment_format``
(storage) and ``coordinator`` (producer ids, transactions, groups):

* ``client/``: :class:`LogStore` (topics), :class:`Producer` and :class:`Consumer`,
  with kafka-python's names; may import segment_format and coordinator.
* ``spark/``: the ``format("plog")`` Python Data Source (source and exactly-once
  sink); may import the client too.
* ``views/``: presentation of a root for notebooks and terminals (frames, cards,
  plots); may import the client.
* ``cli/``: the ``plog`` command; may import everything above; nothing imports it.

This module re-exports the public API; ``DefaultSource`` (what Spark discovers
for ``format("plog")``) and the inspection entry points are imported on first
use, so ``import pyspark_logsource`` stays fast and does not start pyspark.
Every error plog raises derives from :class:`PlogError` and is exported here.
"""

from segment_format.errors import (
    CommitFailedError,
    ConcurrentAppendError,
    ConcurrentCreateError,
    CorruptRecordError,
    DataLossError,
    FencedError,
    IncompatibleSchemaError,
    InvalidConfigError,
    InvalidRecordError,
    InvalidTopicError,
    KafkaTimeoutError,
    ObjectNotFoundError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    PlogError,
    ProducerClosedError,
    StorageError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
    UnsupportedProtocolError,
)

from .client.admin import LogStore
from .client.consumer import Consumer
from .client.futures import BatchSendResult, FutureRecordMetadata
from .client.producer import Producer
from .client.table_reader import read_topic
from .client.types import ConsumerRecord, OffsetAndTimestamp, RecordMetadata, TopicPartition

__all__ = [
    "BatchSendResult",
    "CommitFailedError",
    "ConcurrentAppendError",
    "ConcurrentCreateError",
    "Consumer",
    "ConsumerRecord",
    "CorruptRecordError",
    "DataLossError",
    "DefaultSource",
    "FencedError",
    "FutureRecordMetadata",
    "IncompatibleSchemaError",
    "InvalidConfigError",
    "InvalidRecordError",
    "InvalidTopicError",
    "KafkaTimeoutError",
    "LogStore",
    "ObjectNotFoundError",
    "OffsetAndTimestamp",
    "OffsetOutOfRangeError",
    "OutOfOrderSequenceError",
    "PlogError",
    "Producer",
    "ProducerClosedError",
    "RecordMetadata",
    "StorageError",
    "TopicAlreadyExistsError",
    "TopicPartition",
    "UnknownTopicOrPartitionError",
    "UnsupportedProtocolError",
    "UnsupportedSparkError",
    "VerifyReport",
    "inspect_root",
    "inspect_topic",
    "read_topic",
    "verify",
]

#: Inspection (pyspark_logsource.views, pandas-based), imported on first use so the package imports fast.
_INSPECT_EXPORTS = ("VerifyReport", "inspect_root", "inspect_topic", "verify")


def __getattr__(name: str) -> object:
    """``DefaultSource``, the Spark data source ``format("plog")``, imported (with pyspark) on first use."""
    if name == "DefaultSource":
        from .spark.source import DefaultSource

        return DefaultSource
    if name == "UnsupportedSparkError":  # defined beside the PySpark feature checks, which import pyspark
        from .spark.compat import UnsupportedSparkError

        return UnsupportedSparkError
    if name in _INSPECT_EXPORTS:
        from . import views

        return getattr(views, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
