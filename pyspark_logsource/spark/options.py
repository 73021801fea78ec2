"""Options of the Spark source (``format("plog")``), named after Spark's Kafka source, assembled.

Spark hands a Python data source its options as a case-insensitive map of
strings (keys arrive lower-cased). :func:`parse_options` checks every one of
them and returns a :class:`SourceOptions`; a bad or unknown option raises
:class:`~segment_format.errors.InvalidConfigError` whose message starts with
the option's name, so the error a user sees when the query starts points at
the culprit. The options are declared once, in
:data:`~pyspark_logsource.spark.option_schema.SOURCE_OPTIONS` (the project's
one config-schema mechanism, :mod:`segment_format.config`), which checks names
and scalar values; here the options that depend on each other are put together
(one subscription, where a read starts and ends, the root URL) and the
``storage.*`` options split off for fsspec, for the source and the sink alike.
Nothing here touches storage: checks that need the log (unknown topics,
offsets past the end) happen when the query plans its first batch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from coordinator.quotas import ANONYMOUS
from pyspark_logsource.spark.credentials import (
    SECRET_PREFIX,
    STORAGE_PREFIX,
    check_root_url,
    check_storage_option,
    storage_name,
)
from pyspark_logsource.spark.option_schema import (
    EARLIEST,
    KNOWN_OPTIONS,
    LATEST,
    SOURCE_OPTIONS,
    OffsetMap,
    option_error,
    parse_assign,
    parse_offsets_json,
    parse_value_fields,
    topic_name,
)
from segment_format.config import did_you_mean
from segment_format.errors import InvalidConfigError
from segment_format.notice import NOTICE_INTERVAL_MS
from segment_format.stores.credentials import is_credential_name

__all__ = [
    "BATCH_START_KEY",
    "OffsetSpec",
    "SourceOptions",
    "Subscription",
    "checkpoint_offsets",
    "parse_options",
    "split_options",
    "storage_value",
]

#: Options of batch queries only: a streaming query refuses them.
_BATCH_ONLY = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")


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
        return Subscription("subscribe", topics=tuple(sorted({topic_name("subscribe", t) for t in topics})))
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
