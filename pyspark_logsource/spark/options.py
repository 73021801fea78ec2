"""Options of the Spark source (``format("plog")``), named after Spark's Kafka source.

Spark hands a Python data source its options as a case-insensitive map of
strings (keys arrive lower-cased). :func:`parse_options` checks every one of
them and returns a :class:`SourceOptions`; a bad or unknown option raises
:class:`~segment_format.errors.InvalidConfigError` whose message starts with
the option's name, so the error a user sees when the query starts points at
the culprit. The options are declared once, in :data:`SOURCE_OPTIONS` (the
project's one config-schema mechanism, :mod:`segment_format.config`), which
checks names and scalar values; the structured values (topic lists, JSON
offsets) are parsed here. Nothing here touches storage: checks that need the log (unknown
topics, offsets past the end) happen when the query plans its first batch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from coordinator.quotas import ANONYMOUS, MAX_NAME_BYTES
from pyspark_logsource.spark.credentials import (
    SECRET_PREFIX,
    STORAGE_PREFIX,
    check_root_url,
    check_storage_option,
    storage_name,
)
from segment_format.config import (
    ConfigKey,
    ConfigSchema,
    boolean_from_text,
    did_you_mean,
    integer_from_text,
    lowercase_text,
)
from segment_format.errors import InvalidConfigError, InvalidTopicError
from segment_format.layout import TOPIC_NAME, validate_topic_name
from segment_format.notice import NOTICE_INTERVAL_MS
from segment_format.segment import COMPRESSIONS
from segment_format.stores.credentials import is_credential_name

#: Offsets of a stream or a batch read: topic -> partition -> offset.
OffsetMap = dict[str, dict[int, int]]

#: Kafka's special offsets in JSON offset specs.
EARLIEST = -2
LATEST = -1

_BATCH_ONLY = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")
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


@dataclass(frozen=True)
class OffsetSpec:
    """Where a read starts or ends, as given by the options.

    ``kind`` is ``earliest``, ``latest``, ``offsets`` (``offsets`` holds
    topic -> partition -> offset, with -2/-1 meaning earliest/latest),
    ``timestamp`` (one ``timestamp`` in ms for every partition) or
    ``timestamps`` (topic -> partition -> ms in ``offsets``). ``option``
    is the option it came from, for messages.
    """

    kind: str
    option: str
    offsets: OffsetMap = field(default_factory=dict)
    timestamp: int = 0


@dataclass(frozen=True)
class Subscription:
    """Which partitions to read: ``subscribe`` topics, a ``subscribePattern``, or ``assign``ed partitions."""

    kind: str
    topics: tuple[str, ...] = ()
    pattern: str = ""
    assigned: tuple[tuple[str, int], ...] = ()

    def matches(self, topic: str) -> bool:
        """Whether ``topic`` belongs to the subscription (for ``assign``: has an assigned partition)."""
        if self.kind == "subscribe":
            return topic in self.topics
        if self.kind == "subscribePattern":
            return re.fullmatch(self.pattern, topic) is not None
        return any(t == topic for t, _ in self.assigned)


@dataclass(frozen=True)
class SourceOptions:
    """All options of one ``format("plog")`` read, checked."""

    url: str
    storage_options: dict[str, Any]
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec | None
    starting_timestamp_strategy: str = "error"
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60 * 1000
    #: How often ``latestOffset`` reads a topic's change notice while its partitions wait (PROTOCOL.md 9.1).
    notice_interval_ms: int = NOTICE_INTERVAL_MS
    max_bytes_per_trigger: int | None = None
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    isolation_level: str = "read_committed"
    group_id_for_lag: str | None = None
    #: Typed topics (PROTOCOL.md 11.8): the value's fields as top-level columns instead of a ``value`` struct.
    flatten_value: bool = False
    #: Typed topics: only these value fields are read and decoded (None: all of them).
    value_fields: tuple[str, ...] | None = None
    #: The client id and user of the query's quota entities (PROTOCOL.md 11.10), enforced by each task.
    client_id: str = "plog-spark"
    quota_user: str = ANONYMOUS


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
#: JSON offsets) are parsed by the functions below, which know the other options they depend on.
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

#: Every option of ``writeStream.format("plog")`` / ``write.format("plog")``, checked by the same mechanism as
#: the source's (``storage.*`` options go to fsspec and are not declared).
#: The sink's default transaction timeout: Kafka's broker maximum (``transaction.max.timeout.ms``), longer
#: than any healthy micro-batch, so that readers move past a query that died mid-batch within minutes
#: (PROTOCOL.md 11.2, *Timeouts*).
SINK_TRANSACTION_TIMEOUT_MS = 15 * 60 * 1000

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


def _topic(name: str, topic: object) -> str:
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
        _topic(name, topic)
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
        _topic("assign", topic)
        if not isinstance(partitions, list) or not partitions:
            raise option_error("assign", f"topic {topic!r} must map to a non-empty list of partition numbers")
        for p in partitions:
            if not isinstance(p, int) or isinstance(p, bool) or p < 0:
                raise option_error("assign", f"partition {p!r} of topic {topic!r} is not a partition number")
            pairs.add((topic, p))
    return tuple(sorted(pairs))


def storage_value(key: str, value: str) -> Any:
    """A ``storage.<key>`` option's string as fsspec expects it: a boolean, JSON object/list, integer or the string.

    Never an integer for a credential-like key, whose digits must stay a string.
    """
    text = value.strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if text[:1] in ("{", "["):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise option_error(STORAGE_PREFIX + key, "looks like JSON but does not parse") from None
    if not is_credential_name(key) and re.fullmatch(r"-?\d+", text):
        return int(text)
    return value


def _subscription(options: Mapping[str, str]) -> Subscription:
    given = [KNOWN_OPTIONS[k] for k in ("subscribe", "subscribepattern", "assign") if k in options]
    if len(given) != 1:
        what = "none of them was given" if not given else f"got {' and '.join(given)}"
        raise option_error(
            "subscribe" if not given else given[1],
            f"exactly one of 'subscribe', 'subscribePattern' or 'assign' must be given; {what}",
        )
    kind = given[0]
    if kind == "subscribe":
        topics = [t.strip() for t in options["subscribe"].split(",") if t.strip()]
        if not topics:
            raise option_error("subscribe", "needs at least one topic name (comma-separated)")
        return Subscription("subscribe", topics=tuple(sorted({_topic("subscribe", t) for t in topics})))
    if kind == "subscribePattern":
        pattern = options["subscribepattern"]
        try:
            re.compile(pattern)
        except re.error as exc:
            raise option_error("subscribePattern", f"{pattern!r} is not a valid regular expression: {exc}") from None
        return Subscription("subscribePattern", pattern=pattern)
    return Subscription("assign", assigned=parse_assign(options["assign"]))


def _by_timestamp(options: Mapping[str, str], values: Mapping[str, Any], side: str) -> OffsetSpec | None:
    """``<side>Timestamp`` or else ``<side>OffsetsByTimestamp`` (``side`` is starting or ending), if given."""
    one, per_partition = f"{side}Timestamp", f"{side}OffsetsByTimestamp"
    if values[one] is not None:
        return OffsetSpec("timestamp", one, timestamp=values[one])
    if per_partition.lower() in options:
        return OffsetSpec(
            "timestamps",
            per_partition,
            offsets=parse_offsets_json(per_partition, options[per_partition.lower()], minimum=0),
        )
    return None


def _starting(options: Mapping[str, str], values: Mapping[str, Any], streaming: bool | None) -> OffsetSpec:
    # Kafka's precedence: startingTimestamp, then startingOffsetsByTimestamp, then startingOffsets.
    by_time = _by_timestamp(options, values, "starting")
    if by_time is not None:
        return by_time
    value = options.get("startingoffsets")
    if value is None:
        return OffsetSpec("earliest" if streaming is False else "latest", "startingOffsets")
    lowered = value.strip().lower()
    if lowered in ("earliest", "latest"):
        if lowered == "latest" and streaming is False:
            raise option_error("startingOffsets", "'latest' is not allowed for batch queries (nothing would be read)")
        return OffsetSpec(lowered, "startingOffsets")
    _refuse_misspelt_word("startingOffsets", value, ("earliest", "latest"))
    offsets = parse_offsets_json("startingOffsets", value, minimum=EARLIEST)
    if streaming is False and any(o == LATEST for per in offsets.values() for o in per.values()):
        raise option_error("startingOffsets", "-1 (latest) is not allowed for batch queries")
    return OffsetSpec("offsets", "startingOffsets", offsets=offsets)


def _refuse_misspelt_word(name: str, value: str, words: tuple[str, ...]) -> None:
    """An offsets option that is neither JSON nor one of ``words``: say what is valid and the closest word."""
    if value.strip()[:1] not in ("{", "["):
        valid = " or ".join(repr(w) for w in words)
        raise option_error(name, f"{value!r} is not {valid} nor a JSON object of offsets{did_you_mean(value, words)}")


def parse_value_fields(value: str | None) -> tuple[str, ...] | None:
    """The ``valueFields`` option: field names, comma-separated, duplicates dropped (None: not given)."""
    if value is None:
        return None
    names = tuple(dict.fromkeys(name.strip() for name in value.split(",") if name.strip()))
    if not names:
        raise option_error("valueFields", f"{value!r} names no field; give comma-separated value field names")
    return names


def _ending(options: Mapping[str, str], values: Mapping[str, Any]) -> OffsetSpec:
    by_time = _by_timestamp(options, values, "ending")
    if by_time is not None:
        return by_time
    value = options.get("endingoffsets")
    if value is None or value.strip().lower() == "latest":
        return OffsetSpec("latest", "endingOffsets")
    if value.strip().lower() == "earliest":
        raise option_error("endingOffsets", "'earliest' is not allowed (nothing would be read)")
    _refuse_misspelt_word("endingOffsets", value, ("latest",))
    offsets = parse_offsets_json("endingOffsets", value, minimum=LATEST)
    return OffsetSpec("offsets", "endingOffsets", offsets=offsets)


def split_options(
    lowered: Mapping[str, str], error: Callable[[str, str], InvalidConfigError] = option_error
) -> tuple[dict[str, str], dict[str, Any]]:
    """(the plog options, the ``storage.*`` options for fsspec with their values decoded) of lower-cased options.

    ``storage.secret.<name>`` gives fsspec ``<name>``, as ``storage.<name>`` does, under a name Spark redacts.
    A credential-like storage option under any other name, or a root URL with a password, raises
    ``InvalidConfigError`` naming the option and the safe spelling (:mod:`pyspark_logsource.spark.credentials`):
    the source's and the sink's options both come through here, before Spark has a plan to print.
    """
    plain: dict[str, str] = {}
    storage: dict[str, Any] = {}
    given: dict[str, str] = {}  # fsspec name -> the option that gave it
    for key, value in lowered.items():
        if key.startswith(STORAGE_PREFIX):
            name = storage_name(key)
            if not name:
                example = "storage.secret.key" if key.startswith(SECRET_PREFIX) else "storage.endpoint_url"
                raise error(key, f"needs a name after {key!r}, e.g. {example}")
            if name in given:
                raise error(key, f"gives fsspec option {name!r}, which '{given[name]}' gives already")
            given[name] = key
            storage[name] = storage_value(name, value)
            check_storage_option(key, storage[name], error)
        else:
            plain[key] = value
    for key in ("url", "path"):
        check_root_url(key, plain.get(key), error)
    return plain, storage


def parse_options(options: Mapping[str, str], *, streaming: bool | None) -> SourceOptions:
    """Check the options of a ``format("plog")`` read; raise ``InvalidConfigError`` naming a bad one.

    ``streaming``: True for ``readStream``, False for ``read``, None when not
    known yet (``schema()``), which skips the checks that depend on it.
    """
    opts = {str(k).lower(): str(v) for k, v in options.items()}
    plain, storage = split_options(opts)
    values = SOURCE_OPTIONS.validate(plain)  # unknown options, scalar values, defaults
    for name in _BATCH_ONLY:
        if name.lower() in opts and streaming is True:
            raise option_error(name, "is only for batch queries (spark.read), not streaming ones")

    url, path = values["url"], values["path"]
    if url and path and url != path:
        raise option_error("url", f"given both as option 'url' ({url!r}) and as load() path ({path!r})")
    url = url or path
    if not url:
        raise option_error("url", "the plog root is required: .option('url', ...) or .load(url)")
    if url.lower().startswith("memory://"):
        raise option_error(
            "url",
            f"{url!r}: a memory:// root lives in one process, but Spark reads in "
            "other processes; use a directory or an object store",
        )

    return SourceOptions(
        url=url,
        storage_options=storage,
        subscription=_subscription(opts),
        starting=_starting(opts, values, streaming),
        ending=None if streaming is True else _ending(opts, values),
        starting_timestamp_strategy=values["startingOffsetsByTimestampStrategy"],
        max_offsets_per_trigger=values["maxOffsetsPerTrigger"],
        min_offsets_per_trigger=values["minOffsetsPerTrigger"],
        max_trigger_delay_ms=values["maxTriggerDelay"],
        notice_interval_ms=values["noticeInterval"],
        max_bytes_per_trigger=values["maxBytesPerTrigger"],
        min_partitions=values["minPartitions"],
        fail_on_data_loss=values["failOnDataLoss"],
        include_headers=values["includeHeaders"],
        isolation_level=values["isolationLevel"],
        group_id_for_lag=values["groupIdForLag"],
        flatten_value=values["flattenValue"],
        value_fields=parse_value_fields(values["valueFields"]),
        client_id=values["clientId"],
        quota_user=values["quotaUser"],
    )


#: Key of the start offsets a first micro-batch's end offset carries ("@" is not allowed in topic names).
BATCH_START_KEY = "@start"


def checkpoint_offsets(data: Mapping[str, Any]) -> dict[tuple[str, int], int]:
    """The offsets of a Spark checkpoint's JSON (written by ``coordinator.groups.documents.offsets_to_json``,
    one canonical text since Spark compares offsets by it), by (topic, partition); ``@`` keys are not topics."""
    return {
        (str(topic), int(p)): int(o)
        for topic, partitions in data.items()
        if not str(topic).startswith("@")
        for p, o in partitions.items()
    }
