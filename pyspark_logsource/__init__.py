"""plog: a Kafka-style durable log as Arrow record batches on any fsspec filesystem.

The client API mirrors kafka-python: :class:`LogStore` (topics), :class:`Producer`
and :class:`Consumer`. Errors derive from :class:`PlogError`.
"""

from segment_format.errors import (
    ConcurrentAppendError,
    CorruptRecordError,
    FencedError,
    InvalidConfigError,
    InvalidRecordError,
    InvalidTopicError,
    KafkaTimeoutError,
    ObjectNotFoundError,
    OffsetOutOfRangeError,
    PlogError,
    ProducerClosedError,
    StorageError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

from .admin import LogStore
from .consumer import Consumer
from .producer import BatchSendResult, FutureRecordMetadata, Producer
from .types import ConsumerRecord, OffsetAndTimestamp, RecordMetadata, TopicPartition

__all__ = [
    "BatchSendResult",
    "ConcurrentAppendError",
    "Consumer",
    "ConsumerRecord",
    "CorruptRecordError",
    "FencedError",
    "FutureRecordMetadata",
    "InvalidConfigError",
    "InvalidRecordError",
    "InvalidTopicError",
    "KafkaTimeoutError",
    "LogStore",
    "ObjectNotFoundError",
    "OffsetOutOfRangeError",
    "PlogError",
    "Producer",
    "ProducerClosedError",
    "RecordMetadata",
    "StorageError",
    "TopicAlreadyExistsError",
    "TopicPartition",
    "UnknownTopicOrPartitionError",
]
