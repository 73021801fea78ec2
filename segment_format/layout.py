"""Object names: where every object of a plog root lives (PROTOCOL.md 3).

::

    <root>/
      _protocol/<n:020d>.json                                    the root's protocol version, newest wins
      topics/<topic>/meta/<version:020d>.json                    topic metadata, versioned
      topics/<topic>/<topic_id>/<partition>/log/<base:020d>.arrow              appended segment
      topics/<topic>/<topic_id>/<partition>/log/<base:020d>-<end:020d>.g<gen>.arrow   rewritten segment
      topics/<topic>/<topic_id>/<partition>/log/<base:020d>-<end:020d>.g<gen>.c<id>.arrow
                                  rewritten segment of a compacted topic (PROTOCOL.md 11.6)
      topics/<topic>/<topic_id>/<partition>/start/<offset:020d>.json           log start offset marker
      topics/<topic>/<topic_id>/notice.json                                    change notice, replaced by writers
      _notice.json                                               root change notice, replaced by writers
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from .errors import InvalidTopicError

TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
#: Digits of every number in an object name: 20 holds any non-negative int64 and sorts lexically.
#: This module is the one place that knows it (segment_format.numbered builds on format_number).
NUMBER_DIGITS = 20
_N = rf"(\d{{{NUMBER_DIGITS}}})"
_APPENDED = re.compile(rf"^{_N}\.arrow$")
_REWRITTEN = re.compile(rf"^{_N}-{_N}\.g(\d+)(?:\.c(\d{{13}}[0-9a-f]{{8}}))?\.arrow$")
_START = re.compile(rf"^{_N}\.json$")
#: Prefix of the root's protocol objects (PROTOCOL.md 12), numbered objects of :mod:`segment_format.numbered`.
PROTOCOL_PREFIX = "_protocol/"
#: Key of the root change notice (PROTOCOL.md 9.1): replaced after the topic notices of every write.
ROOT_NOTICE_KEY = "_notice.json"


def format_number(n: int) -> str:
    """``n`` as the zero-padded 20-digit string that every numbered object name uses, so names sort by number."""
    return f"{n:0{NUMBER_DIGITS}d}"


def validate_topic_name(name: object) -> str:
    """Return ``name`` if it is a legal Kafka topic name, else raise :class:`InvalidTopicError`.

    The rule (``[a-zA-Z0-9._-]``, 1 to 249 characters, not ``.`` or ``..``) is
    also what keeps a topic name from escaping the root as a path.
    """
    if not isinstance(name, str):
        raise InvalidTopicError(f"topic name must be a str, not {type(name).__name__}")
    if name in (".", "..") or not TOPIC_NAME.match(name):
        raise InvalidTopicError(
            f"invalid topic name {name!r}: use 1 to 249 characters of [a-zA-Z0-9._-], not '.' or '..'"
        )
    return name


def topic_prefix(topic: str) -> str:
    """Prefix of everything belonging to ``topic``."""
    return f"topics/{validate_topic_name(topic)}/"


def topic_meta_prefix(topic: str) -> str:
    """Prefix of the topic's metadata versions."""
    return f"{topic_prefix(topic)}meta/"


def topic_meta_key(topic: str, version: int) -> str:
    """Key of metadata version ``version`` of ``topic``."""
    return f"{topic_meta_prefix(topic)}{format_number(version)}.json"


def partition_prefix(topic: str, topic_id: str, partition: int) -> str:
    """Prefix of one partition's objects; the topic id keeps a re-created topic apart from the old one."""
    return f"{incarnation_prefix(topic, topic_id)}{partition}/"


def incarnation_prefix(topic: str, topic_id: str) -> str:
    """Prefix of one incarnation of a topic: its partitions and its change notice."""
    return f"{topic_prefix(topic)}{topic_id}/"


def notice_key(topic: str, topic_id: str) -> str:
    """Key of the topic's change notice (PROTOCOL.md 9.1): beside its partitions, one per incarnation."""
    return f"{incarnation_prefix(topic, topic_id)}notice.json"


def appended_name(base_offset: int) -> str:
    """File name of an appended (generation 0) segment object."""
    return f"{format_number(base_offset)}.arrow"


def rewritten_name(base_offset: int, end_offset: int, generation: int, rewrite_id: str | None = None) -> str:
    """File name of a rewritten (merged or compacted) segment covering ``[base, end)``.

    ``rewrite_id`` (PROTOCOL.md 11.6): every rewrite of a compacted topic names its object with one,
    ``<ms:013d><8 hex>``, so that two rewrites of one range with different contents never share a key.
    """
    suffix = "" if rewrite_id is None else f".c{rewrite_id}"
    return f"{format_number(base_offset)}-{format_number(end_offset)}.g{generation}{suffix}.arrow"


def new_rewrite_id(at_ms: int) -> str:
    """A fresh rewrite id: the time first, so that of two rewrites of a range the later sorts last (11.6)."""
    return f"{at_ms:013d}{secrets.token_hex(4)}"


def start_marker_name(offset: int) -> str:
    """File name of a log start offset marker."""
    return f"{format_number(offset)}.json"


@dataclass(frozen=True)
class ParsedSegmentName:
    """What a segment object's name says: its base, its end if known, its generation, its rewrite id."""

    base_offset: int
    end_offset: int | None
    generation: int
    #: The ``.c<id>`` of a rewritten object of a compacted topic (PROTOCOL.md 11.6), else None.
    rewrite_id: str | None = None


def parse_segment_name(name: str) -> ParsedSegmentName | None:
    """Parse a name under ``log/``; None for names that are not segment objects."""
    m = _APPENDED.match(name)
    if m:
        return ParsedSegmentName(int(m.group(1)), None, 0)
    m = _REWRITTEN.match(name)
    if m:
        return ParsedSegmentName(int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4))
    return None


def rewrite_id_of(key: str) -> str | None:
    """The rewrite id (``.c<id>``, PROTOCOL.md 11.6) that a segment object's key names, None when none."""
    parsed = parse_segment_name(key.rsplit("/", 1)[-1])
    return None if parsed is None else parsed.rewrite_id


def parse_start_marker(name: str) -> int | None:
    """Offset of a start marker name, None for other names."""
    m = _START.match(name)
    return int(m.group(1)) if m else None
