"""The one JSON codec for stored documents (segment_format/documents.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pytest

from segment_format.documents import JsonDocument
from segment_format.errors import CorruptRecordError, PlogError
from segment_format.topic import TOPIC_CONFIG_DEFAULTS, TopicMetadata


@dataclass(frozen=True)
class Example(JsonDocument):
    name: str
    count: int
    tags: tuple[str, ...] = ()
    limit: int | None = None
    flag: bool = False
    renamed: int = field(default=0, metadata={"json": "renamed.ms"})


def test_round_trip_keeps_names_and_types() -> None:
    doc = Example("a", 3, ("x", "y"), None, True, 7)
    data = doc.to_json()
    assert data == b'{"count":3,"flag":true,"limit":null,"name":"a","renamed.ms":7,"tags":["x","y"]}'
    assert Example.from_json(data) == doc


def test_unknown_fields_are_ignored_and_optional_fields_default() -> None:
    assert Example.from_json(b'{"name": "a", "count": 1, "future": {"x": 1}}') == Example("a", 1)


@pytest.mark.parametrize(
    ("data", "culprit"),
    [
        (b'{"count": 1}', "'name'"),
        (b'{"name": "a", "count": "1"}', "'count'"),
        (b'{"name": "a", "count": true}', "'count'"),
        (b'{"name": "a", "count": 1, "tags": "x"}', "'tags'"),
        (b"[1, 2]", "JSON object"),
        (b"\xff{", "not valid JSON"),
    ],
)
def test_corrupt_documents_name_the_document_and_field(data: bytes, culprit: str) -> None:
    with pytest.raises(CorruptRecordError, match="groups/g/x.json") as info:
        Example.from_json(data, what="groups/g/x.json")
    assert culprit in str(info.value)
    assert isinstance(info.value, PlogError)


# --------------------------------------------------------------------------- topic metadata


#: A topic metadata object as every version before TopicMetadata became a JsonDocument wrote it.
OLD_TOPIC_METADATA = b"""{
 "config": {
  "cleanup.policy": "delete",
  "compression.type": "zstd",
  "retention.ms": 604800000
 },
 "created_ms": 1795363000000,
 "name": "clicks",
 "partitions": 3,
 "topic_id": "5c0f6d0c3a1b4e2f9a8b7c6d5e4f3a2b",
 "version": 2
}"""


def test_topic_metadata_reads_objects_written_before_it_was_a_document() -> None:
    meta = TopicMetadata.from_json(OLD_TOPIC_METADATA)
    assert meta == TopicMetadata(
        "clicks",
        "5c0f6d0c3a1b4e2f9a8b7c6d5e4f3a2b",
        3,
        {**TOPIC_CONFIG_DEFAULTS, "compression.type": "zstd"},  # keys the object lacks read as their defaults
        2,
        1795363000000,
    )
    assert TopicMetadata.from_json(meta.to_json()) == meta
    old = json.loads(OLD_TOPIC_METADATA)
    assert meta.to_dict() == {**old, "config": {**TOPIC_CONFIG_DEFAULTS, **old["config"]}}  # same names
    assert (
        TopicMetadata.from_json(b'{"name": "t", "topic_id": "x", "partitions": 1, "config": {"new.key": 1}}').config[
            "new.key"
        ]
        == 1
    )  # a key from a newer writer is kept
    with pytest.raises(CorruptRecordError, match="'partitions'"):
        TopicMetadata.from_json(b'{"name": "t", "topic_id": "x", "partitions": "3"}', what="meta")
    future = TopicMetadata.from_json(OLD_TOPIC_METADATA[:-1] + b', "typed": {"schema": 1}}')
    assert future == meta  # fields a newer writer adds are ignored


def test_fields_that_repeat_the_key_must_agree_with_it() -> None:
    """PROTOCOL.md 3.1: the key is authoritative; another object's bytes under this key are corrupt."""
    meta = TopicMetadata("t", "0" * 32, 1, {}, 3)
    key = "topics/t/meta/00000000000000000003.json"
    read = TopicMetadata.from_json(meta.to_json(), what=key, keyed={"name": "t", "version": 3})
    assert (read.name, read.version, read.topic_id) == ("t", 3, "0" * 32)
    with pytest.raises(CorruptRecordError, match=r"field 'version' is 3, its key says 4 \(object 'k4'\)"):
        TopicMetadata.from_json(meta.to_json(), what="k4", keyed={"name": "t", "version": 4})
    with pytest.raises(CorruptRecordError, match="field 'name' is 't', its key says 'u'"):
        TopicMetadata.from_json(meta.to_json(), what="k", keyed={"name": "u"})


def test_mapping_and_sequence_fields_are_checked_like_dict_and_list() -> None:
    @dataclass(frozen=True)
    class Counts(JsonDocument):
        counts: Mapping[str, int]
        pairs: Sequence[tuple[str, int]] = ()

    assert Counts.from_json(b'{"counts": {"a": 1}, "pairs": [["t", 2]]}') == Counts({"a": 1}, [("t", 2)])
    for bad in (b'{"counts": {"a": "x"}}', b'{"counts": [1]}', b'{"counts": {}, "pairs": [["t", true]]}'):
        with pytest.raises(CorruptRecordError, match="has an invalid value"):
            Counts.from_json(bad)
