"""Topic metadata checked without a listing (PROTOCOL.md 4): two GETs say whether a known version is current."""

from __future__ import annotations

from pathlib import Path

import pytest

from segment_format.errors import UnknownTopicOrPartitionError
from segment_format.root import LogRoot
from segment_format.stores.local import LocalStore
from tests.counting_store import CountingStore


def _roots(tmp_path: Path) -> tuple[LogRoot, LogRoot, CountingStore]:
    """A reader root counting its requests, and a writer root changing the topic under it."""
    url = str(tmp_path / "root")
    writer = LogRoot(url)
    writer.catalog.create("t", 2)
    store = CountingStore(LocalStore(url))
    return LogRoot(url, store=store), writer, store


def test_an_unchanged_topic_costs_two_gets_and_no_listing(tmp_path: Path) -> None:
    reader, _, store = _roots(tmp_path)
    known = reader.catalog.get("t")
    before = dict(store.counts)
    assert reader.catalog.current(known) is known
    delta = {op: n - before.get(op, 0) for op, n in store.counts.items() if n != before.get(op, 0)}
    assert delta == {"get": 2}


def test_a_new_version_is_found(tmp_path: Path) -> None:
    reader, writer, _ = _roots(tmp_path)
    known = reader.catalog.get("t")
    writer.catalog.update("t", partitions=5)
    writer.catalog.update("t", config={"retention.ms": 1000})
    current = reader.catalog.current(known)
    assert (current.version, current.partitions, current.config["retention.ms"]) == (2, 5, 1000)


def test_a_deleted_topic_is_unknown(tmp_path: Path) -> None:
    reader, writer, _ = _roots(tmp_path)
    known = reader.catalog.get("t")
    writer.catalog.delete("t")
    with pytest.raises(UnknownTopicOrPartitionError, match="'t'"):
        reader.catalog.current(known)


def test_a_topic_created_again_is_the_new_incarnation(tmp_path: Path) -> None:
    """Version 0 exists again after a delete and a create, under a new topic id: not the known one."""
    reader, writer, _ = _roots(tmp_path)
    known = reader.catalog.get("t")
    writer.catalog.delete("t")
    again = writer.catalog.create("t", 3)
    current = reader.catalog.current(known)
    assert (current.topic_id, current.partitions) == (again.topic_id, 3) != (known.topic_id, known.partitions)


def test_the_root_refreshes_cached_metadata_with_the_probe(tmp_path: Path) -> None:
    url = str(tmp_path / "root")
    LogRoot(url).catalog.create("t", 1)
    store = CountingStore(LocalStore(url))
    root = LogRoot(url, store=store, metadata_max_age_s=0.0)
    root.topic("t")
    lists = store.counts.get("list", 0)
    for _ in range(3):
        assert root.topic("t").partitions == 1  # expired at once: checked again each time
    assert store.counts.get("list", 0) == lists
