"""The client's configuration schemas: the producer's and the consumer's keys, declared once.

kafka-python's names (``linger_ms``, ``auto_offset_reset``, ...) with its
defaults where plog has the same meaning. Both are
:class:`~segment_format.config.ConfigSchema` declarations, the mechanism that
also validates topic configs and Spark options, so every bad value is reported
the same way: ``producer config linger_ms=-1 is below its minimum 0``.
"""

from __future__ import annotations

from typing import Any

from coordinator.groups.assignors import STRATEGIES
from segment_format.config import ConfigKey, ConfigSchema
from segment_format.notice import LOCAL_NOTICE_INTERVAL_MS, NOTICE_INTERVAL_MS
from segment_format.segment import COMPRESSIONS

__all__ = ["CONSUMER_CONFIG", "PRODUCER_CONFIG"]

_VALUE_MESSAGE = "{what} {key}={value!r} {problem}"


def _acks(value: Any) -> int | str:
    # Kafka accepts -1 for "all"; the command line gives text.
    if value in (-1, "-1", "all"):
        return "all"
    if value in (0, 1, "0", "1") and not isinstance(value, bool):
        return int(value)
    raise ValueError("must be 0, 1 or 'all'")


def _callable(value: Any) -> str | None:
    return None if callable(value) else "must be callable"


def _strategies(value: Any) -> tuple[str, ...]:
    strategies = (value,) if isinstance(value, str) else value
    if not isinstance(strategies, list | tuple) or not strategies or any(s not in STRATEGIES for s in strategies):
        raise ValueError(f"must be one or a list of {', '.join(STRATEGIES)}")
    return tuple(strategies)


def _count(name: str, default: int, minimum: int, doc: str) -> ConfigKey:
    # Strict: a client config comes from Python code, where "1MB" or 1.5 is a mistake, not text to convert.
    return ConfigKey(name, int, default, doc, minimum=minimum)


def _optional_callable(name: str, doc: str) -> ConfigKey:
    return ConfigKey(name, object, None, doc, nullable=True, validator=_callable)


PRODUCER_CONFIG = ConfigSchema(
    "producer config",
    [
        ConfigKey("acks", object, "all", "0, 1 or 'all' (-1): when a send counts as done", parse=_acks),
        _count("linger_ms", 5, 0, "how long a batch waits for more records before it is sent"),
        ConfigKey(
            "flush_interval_ms",
            int,
            None,
            "least time between two flushes while records keep coming, unless someone waits on them "
            "(default: 0 on a local root, 1000 on an object store)",
            nullable=True,
            minimum=0,
        ),
        _count("batch_size", 1024 * 1024, 0, "bytes at which a partition's batch is sealed"),
        _count("buffer_memory", 64 * 1024 * 1024, 0, "bytes of unsent records before send blocks"),
        _count("max_block_ms", 60_000, 0, "how long send blocks for room in the buffer"),
        ConfigKey(
            "compression_type",
            str,
            None,
            "Arrow IPC compression of new batches (default: the topic's compression.type)",
            nullable=True,
            allowed=tuple(sorted(COMPRESSIONS)),
        ),
        _optional_callable("partitioner", "f(key bytes, all partitions, available partitions) -> partition"),
        _optional_callable("key_serializer", "f(key) -> bytes"),
        _optional_callable("value_serializer", "f(value) -> bytes"),
        ConfigKey("client_id", str, "", "a name for this client in logs and metadata"),
        ConfigKey("quota_user", str, "", "the user of Kafka's quota entities (PROTOCOL.md 11.10); '' is ANONYMOUS"),
        _count("quota_refresh_ms", 5000, 1, "how often the process reads the root's quotas (one LIST)"),
        ConfigKey("enable_idempotence", bool, True, "sequence numbers so that retries never duplicate"),
        ConfigKey("transactional_id", str, None, "enables transactions under this stable id", nullable=True),
        _count("transaction_timeout_ms", 60_000, 1, "a transaction undecided for longer may be aborted"),
    ],
    value_message=_VALUE_MESSAGE,
)


def _heartbeat_below_session(config: dict[str, Any], schema: ConfigSchema) -> None:
    if config["heartbeat_interval_ms"] >= config["session_timeout_ms"]:
        raise schema.error(
            "heartbeat_interval_ms",
            config["heartbeat_interval_ms"],
            f"must be lower than session_timeout_ms={config['session_timeout_ms']}",
        )


CONSUMER_CONFIG = ConfigSchema(
    "consumer config",
    [
        ConfigKey(
            "auto_offset_reset",
            str,
            "latest",
            "where to start without a committed offset",
            allowed=("earliest", "latest", "none"),
        ),
        _count("max_poll_records", 500, 1, "records per poll() at most"),
        _count("fetch_max_bytes", 50 * 1024 * 1024, 1, "stored bytes per fetch round, soft (Kafka's fetch.max.bytes)"),
        _count(
            "max_partition_fetch_bytes",
            1024 * 1024,
            1,
            "stored bytes per partition per fetch round, soft (Kafka's max.partition.fetch.bytes)",
        ),
        _count("fetch_poll_max_ms", 100, 1, "longest back-off between probes while poll waits for records"),
        ConfigKey(
            "notice_interval_ms",
            int,
            None,
            "how often a consumer waiting at the end reads a change notice (its topic's, or the root's for "
            f"several); default {NOTICE_INTERVAL_MS} on an object store, {LOCAL_NOTICE_INTERVAL_MS} on a local root",
            minimum=1,
            nullable=True,
        ),
        ConfigKey(
            "isolation_level",
            str,
            "read_committed",
            "read_committed hides open and aborted transactions",
            allowed=("read_committed", "read_uncommitted"),
        ),
        ConfigKey("enable_auto_commit", bool, True, "commit positions every auto_commit_interval_ms"),
        _count("auto_commit_interval_ms", 5000, 1, "how often positions are committed automatically"),
        # Kafka's defaults since 3.0 (KIP-735): with 45 s an idle member refreshes its heartbeat every
        # 15 s in place of a listing, one request per heartbeat interval (PROTOCOL.md 11.4)
        _count("session_timeout_ms", 45_000, 1, "how long a silent member stays in its group"),
        _count(
            "heartbeat_interval_ms",
            3000,
            1,
            "how often a member checks its group (one request); it writes its heartbeat at least every "
            "session_timeout_ms/3",
        ),
        _count("max_poll_interval_ms", 300_000, 1, "longest pause between polls before a member leaves"),
        ConfigKey(
            "partition_assignment_strategy",
            object,
            ("range", "cooperative-sticky"),
            "assignors a member supports, preferred first",
            parse=_strategies,
        ),
        ConfigKey("client_id", str, "", "a name for this client in logs and group metadata"),
        ConfigKey("quota_user", str, "", "the user of Kafka's quota entities (PROTOCOL.md 11.10); '' is ANONYMOUS"),
        _count("quota_refresh_ms", 5000, 1, "how often the process reads the root's quotas (one LIST)"),
        _optional_callable("key_deserializer", "f(bytes) -> key"),
        _optional_callable("value_deserializer", "f(bytes) -> value"),
        # Kafka's default: each refresh reads every subscribed topic's metadata (a LIST and a GET on S3).
        _count("metadata_max_age_ms", 300_000, 1, "how often subscriptions look for new topics and partitions"),
    ],
    checks=[_heartbeat_below_session],
    value_message=_VALUE_MESSAGE,
)
