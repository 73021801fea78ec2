"""The options of the Spark source and sink, declared, and the parsers of their values.

::

    format("plog") options, as Spark hands them (keys lower-cased, values strings)
        SOURCE_OPTIONS / SINK_OPTIONS   names, defaults, scalar values: counts, flags, choices, and
                                        duration_ms ("15m"), byte_count ("64m") as their parsers
        parse_offsets_json, parse_assign, parse_value_fields
                                        the structured values: JSON offsets by topic and partition,
                                        assigned partitions, value field lists
        option_error                    the InvalidConfigError naming the option first

The options are declared once, with the project's one config-schema mechanism
(:mod:`segment_format.config`), which refuses an unknown or misspelt name and a bad scalar value with
a message naming the option, so the error a user sees when the query starts points at the culprit.
Putting a read's options together (one subscription, where it starts and ends, the root, ``storage.*``)
is :mod:`pyspark_logsource.spark.options`' work, a write's :mod:`pyspark_logsource.spark.sink`'s; nothing
here touches storage.
"""

from __future__ import annotations

import json
import re
from typing import Any

from coordinator.quotas import ANONYMOUS, MAX_NAME_BYTES
from segment_format.config import (
    ConfigKey,
    ConfigSchema,
    boolean_from_text,
    integer_from_text,
    lowercase_text,
)
from segment_format.errors import InvalidConfigError, InvalidTopicError
from segment_format.layout import TOPIC_NAME, validate_topic_name
from segment_format.notice import NOTICE_INTERVAL_MS
from segment_format.segment import COMPRESSIONS

#: Offsets of a stream or a batch read: topic -> partition -> offset.
OffsetMap = dict[str, dict[int, int]]

#: Kafka's special offsets in JSON offset specs.
EARLIEST = -2
LATEST = -1

# What duration_ms and byte_count take: a number and an optional unit, in any case.
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|sec|secs|m|min|mins|h|hour|hours|d|day|days)?\s*$", re.IGNORECASE)
_DURATION_MS = {
    None: 1,
    "ms": 1,
    "s": 1000,
    "sec": 1000,
    "secs": 1000,
    "m": 60_000,
    "min": 60_000,
    "mins": 60_000,
    "h": 3_600_000,
    "hour": 3_600_000,
    "hours": 3_600_000,
    "d": 86_400_000,
    "day": 86_400_000,
    "days": 86_400_000,
}
_BYTES = re.compile(r"^\s*(\d+)\s*(b|k|kb|m|mb|g|gb|t|tb)?\s*$", re.IGNORECASE)
_BYTES_MULT = {
    None: 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "t": 1 << 40,
    "tb": 1 << 40,
}


def option_error(name: str, message: str, what: str = "option") -> InvalidConfigError:
    """An ``InvalidConfigError`` whose message names the option first: ``plog option 'name': message``
    (``what="sink option"`` for the sink's)."""
    return InvalidConfigError(f"plog {what} '{name}': {message}")


def sink_option_error(name: str, message: str) -> InvalidConfigError:
    """:func:`option_error` for an option of the sink (``plog sink option 'name': message``)."""
    return option_error(name, message, "sink option")


def duration_ms(value: str) -> int:
    """``15m``, ``30s``, ``500ms``, ``2h``, ``1d`` or a plain number of milliseconds; ``ValueError`` otherwise."""
    m = _DURATION.match(value) if isinstance(value, str) else None
    if not m:
        raise ValueError("is not a duration such as 500ms, 30s, 15m or 1h")
    unit = m.group(2).lower() if m.group(2) else None
    return int(m.group(1)) * _DURATION_MS[unit]


def byte_count(value: str) -> int:
    """A positive byte count: ``1048576``, ``512k``, ``64m``, ``1g``; ``ValueError`` otherwise."""
    m = _BYTES.match(value) if isinstance(value, str) else None
    if not m:
        raise ValueError("is not a byte count such as 1048576, 512k, 64m or 1g")
    unit = m.group(2).lower() if m.group(2) else None
    number = int(m.group(1)) * _BYTES_MULT[unit]
    if number < 1:
        raise ValueError("must be a positive byte count")
    return number


def _group_id_problem(group: str) -> str | None:
    return None if TOPIC_NAME.match(group) else "is not a group id: use 1 to 249 characters of [a-zA-Z0-9._-]"


def _text(name: str, doc: str) -> ConfigKey:
    return ConfigKey(name, str, None, doc, nullable=True)


def _count(name: str, minimum: int, doc: str) -> ConfigKey:
    return ConfigKey(name, int, None, doc, minimum=minimum, parse=integer_from_text, nullable=True)


def _flag(name: str, default: bool, doc: str) -> ConfigKey:
    return ConfigKey(name, bool, default, doc, parse=boolean_from_text)


#: The client id of a Spark query's tasks when the ``clientId`` option names none (its quota entity, 11.10).
SPARK_CLIENT_ID = "plog-spark"
#: Kafka's principal of an unauthenticated client: the quota user when ``quotaUser`` names none.
SPARK_QUOTA_USER = ANONYMOUS


def _quota_name_problem(name: str) -> str | None:
    # The limit of a quota entity's names (PROTOCOL.md 11.10), checked when the query starts, not in a task.
    return None if len(name.encode()) <= MAX_NAME_BYTES else f"is longer than {MAX_NAME_BYTES} bytes"


def _quota_keys(kind: str) -> list[ConfigKey]:
    """``clientId`` and ``quotaUser``: the ``(user, client-id)`` whose ``kind`` quota the tasks enforce."""
    return [
        ConfigKey(
            "clientId",
            str,
            SPARK_CLIENT_ID,
            f"the client id of the tasks' quota entity ({kind}, PROTOCOL.md 11.10)",
            validator=_quota_name_problem,
        ),
        ConfigKey(
            "quotaUser",
            str,
            SPARK_QUOTA_USER,
            "the user of the tasks' quota entity (Kafka's principal name)",
            validator=_quota_name_problem,
        ),
    ]


def _min_offsets_not_above_max(values: dict[str, Any], schema: ConfigSchema) -> None:
    low, high = values["minOffsetsPerTrigger"], values["maxOffsetsPerTrigger"]
    if low is not None and high is not None and low > high:
        raise option_error("minOffsetsPerTrigger", f"{low} is above maxOffsetsPerTrigger ({high})")


#: Every option of ``format("plog")`` reads. Values are checked here; the structured ones (topic lists,
#: JSON offsets) are parsed by the functions below, called by :func:`~pyspark_logsource.spark.options.parse_options`,
#: which knows the other options they depend on.
SOURCE_OPTIONS = ConfigSchema(
    "plog option",
    [
        _text("url", "the plog root: a directory or an fsspec URL"),
        _text("path", "the plog root as given to load()"),
        _text("subscribe", "comma-separated topic names"),
        _text("subscribePattern", "a regular expression over topic names"),
        _text("assign", 'JSON {"topic": [partition, ...]}'),
        _text("startingOffsets", 'earliest, latest or JSON {"topic": {"partition": offset}}'),
        _count("startingTimestamp", 0, "start at the first record at or after this time (ms)"),
        _text("startingOffsetsByTimestamp", 'JSON {"topic": {"partition": ms}}'),
        ConfigKey(
            "startingOffsetsByTimestampStrategy",
            str,
            "error",
            "what to do when no record is that recent: error, or start at latest",
            allowed=("error", "latest"),
            parse=lowercase_text,
        ),
        _text("endingOffsets", 'latest or JSON {"topic": {"partition": offset}} (batch queries)'),
        _count("endingTimestamp", 0, "end at the first record at or after this time (ms; batch queries)"),
        _text("endingOffsetsByTimestamp", 'JSON {"topic": {"partition": ms}} (batch queries)'),
        _count("maxOffsetsPerTrigger", 1, "at most this many records per micro-batch"),
        _count("minOffsetsPerTrigger", 1, "wait for this many records, up to maxTriggerDelay"),
        ConfigKey(
            "maxTriggerDelay",
            int,
            15 * 60 * 1000,
            "longest wait for minOffsetsPerTrigger (500ms, 30s, 15m, 1h)",
            parse=duration_ms,
        ),
        ConfigKey(
            "noticeInterval",
            int,
            NOTICE_INTERVAL_MS,
            "how often an idle stream reads a change notice, its topic's or the root's (1s; 0: on every trigger)",
            parse=duration_ms,
            minimum=0,
        ),
        ConfigKey("maxBytesPerTrigger", int, None, "at most about this many bytes per micro-batch", parse=byte_count),
        _count("minPartitions", 1, "split offset ranges into at least this many Spark partitions"),
        _flag("failOnDataLoss", True, "fail when offsets were deleted before they were read"),
        _flag("includeHeaders", False, "add the headers column"),
        ConfigKey(
            "isolationLevel",
            str,
            "read_committed",
            "read_committed or read_uncommitted",
            allowed=("read_committed", "read_uncommitted"),
            parse=lowercase_text,
        ),
        ConfigKey(
            "groupIdForLag",
            str,
            None,
            "record progress for lag tools under this group",
            nullable=True,
            validator=_group_id_problem,
        ),
        _flag(
            "flattenValue",
            False,
            "typed topics: the value's fields as top-level columns after the metadata columns, not a value struct",
        ),
        _text("valueFields", "typed topics: comma-separated value fields to read (only these are decoded)"),
        *_quota_keys("consumer_byte_rate"),
    ],
    case_insensitive=True,
    checks=[_min_offsets_not_above_max],
    value_message="{what} '{key}': {value!r} {problem}",
    unknown_message="{what} '{key}': unknown option; known options are {known} and storage.* (passed to fsspec)",
)

#: Rows per stored batch the sink writes when ``batchSize`` is not given.
DEFAULT_SINK_BATCH_ROWS = 65536

#: The sink's default transaction timeout: Kafka's broker maximum (``transaction.max.timeout.ms``), longer
#: than any healthy micro-batch, so that readers move past a query that died mid-batch within minutes
#: (PROTOCOL.md 11.2, *Timeouts*).
SINK_TRANSACTION_TIMEOUT_MS = 15 * 60 * 1000

#: Every option of ``writeStream.format("plog")`` / ``write.format("plog")``, checked by the same mechanism as
#: the source's (``storage.*`` options go to fsspec and are not declared).
SINK_OPTIONS = ConfigSchema(
    "plog sink option",
    [
        _text("url", "the plog root: a directory or an fsspec URL"),
        _text("path", "the plog root as given to save() / start()"),
        _text("topic", "the topic to write (else each row's topic column)"),
        _text("checkpointLocation", "the query's checkpoint (its path names the sink's transactions)"),
        _text("transactionalId", "the sink's transactional id (default: derived from checkpointLocation)"),
        ConfigKey(
            "compression",
            str,
            None,
            "Arrow IPC compression of the written batches (default: the topic's compression.type)",
            nullable=True,
            allowed=tuple(sorted(COMPRESSIONS)),
            parse=lowercase_text,
        ),
        ConfigKey(
            "batchSize",
            int,
            DEFAULT_SINK_BATCH_ROWS,
            "rows per stored batch at most",
            minimum=1,
            parse=integer_from_text,
        ),
        ConfigKey(
            "transactionTimeout",
            int,
            SINK_TRANSACTION_TIMEOUT_MS,
            "how long a micro-batch's transaction may stay undecided before readers abort it (Kafka's "
            "transaction.timeout.ms; 30s, 15m, 1h)",
            parse=duration_ms,
            minimum=1000,
            maximum=7 * 24 * 3600 * 1000,
        ),
        *_quota_keys("producer_byte_rate"),
    ],
    case_insensitive=True,
    value_message="{what} '{key}': {value!r} {problem}",
    unknown_message="{what} '{key}': unknown option; the sink's options are {known} and storage.* (passed to fsspec)",
)

#: Every option, by its lower-cased key (how Spark passes it), with its documented spelling.
KNOWN_OPTIONS: dict[str, str] = {name.lower(): name for name in SOURCE_OPTIONS.names()}


def topic_name(name: str, topic: object) -> str:
    """``topic`` as given in option ``name``, checked as a topic name (an error names the option)."""
    try:
        return validate_topic_name(topic)
    except InvalidTopicError as exc:
        raise option_error(name, str(exc)) from None


def _json_object(name: str, value: str) -> dict[str, Any]:
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise option_error(name, f"{value!r} is not valid JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(parsed, dict) or not parsed:
        raise option_error(name, f"{value!r} must be a non-empty JSON object")
    return parsed


def _partition_number(name: str, topic: str, key: object) -> int:
    if isinstance(key, str) and key.strip().isdigit():
        return int(key)
    if isinstance(key, int) and not isinstance(key, bool) and key >= 0:
        return key
    raise option_error(name, f"partition {key!r} of topic {topic!r} is not a partition number")


def parse_offsets_json(name: str, value: str, *, minimum: int) -> OffsetMap:
    """Parse ``{"topic": {"0": 23, "1": -2}}``; values below ``minimum`` are refused."""
    out: OffsetMap = {}
    for topic, partitions in _json_object(name, value).items():
        topic_name(name, topic)
        if not isinstance(partitions, dict) or not partitions:
            raise option_error(name, f"topic {topic!r} must map to a non-empty object of partition -> offset")
        per: dict[int, int] = {}
        for key, offset in partitions.items():
            p = _partition_number(name, topic, key)
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < minimum:
                allowed = {
                    -2: "-2 (earliest), -1 (latest) or an offset >= 0",
                    -1: "-1 (latest) or an offset >= 0",
                    0: "an offset >= 0",
                }.get(minimum, "")
                if name.endswith("Timestamp") or "ByTimestamp" in name:
                    allowed = "a timestamp in milliseconds >= 0"
                raise option_error(name, f"value {offset!r} for {topic}-{p} must be {allowed}")
            per[p] = offset
        out[topic] = dict(sorted(per.items()))
    return out


def parse_assign(value: str) -> tuple[tuple[str, int], ...]:
    """Parse ``{"topic": [0, 1]}`` into sorted (topic, partition) pairs."""
    pairs: set[tuple[str, int]] = set()
    for topic, partitions in _json_object("assign", value).items():
        topic_name("assign", topic)
        if not isinstance(partitions, list) or not partitions:
            raise option_error("assign", f"topic {topic!r} must map to a non-empty list of partition numbers")
        for p in partitions:
            if not isinstance(p, int) or isinstance(p, bool) or p < 0:
                raise option_error("assign", f"partition {p!r} of topic {topic!r} is not a partition number")
            pairs.add((topic, p))
    return tuple(sorted(pairs))


def parse_value_fields(value: str | None) -> tuple[str, ...] | None:
    """The ``valueFields`` option: field names, comma-separated, duplicates dropped (None: not given)."""
    if value is None:
        return None
    names = tuple(dict.fromkeys(name.strip() for name in value.split(",") if name.strip()))
    if not names:
        raise option_error("valueFields", f"{value!r} names no field; give comma-separated value field names")
    return names
