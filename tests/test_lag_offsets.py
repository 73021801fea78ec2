"""The Spark source's lag-offsets writer loses races as contention, not as data loss."""

from __future__ import annotations

import uuid

import pytest

from pyspark_logsource import DataLossError
from pyspark_logsource.spark.planning import GroupOffsetsWriter
from segment_format import numbered
from segment_format.errors import ConcurrentCreateError
from segment_format.stores import MemoryStore


class _AlwaysTaken(MemoryStore):
    """A store where every create loses the race."""

    def put_if_absent(self, key, data, *, durable=True):
        return False


def test_write_contention_is_a_concurrency_error_not_data_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(numbered, "backoff", lambda attempt: None)
    writer = GroupOffsetsWriter(_AlwaysTaken(f"lag-{uuid.uuid4().hex}"), "grp")
    with pytest.raises(ConcurrentCreateError, match="groups/grp/offsets/") as info:
        writer.commit({"t": {"0": 1}})
    assert not isinstance(info.value, DataLossError)


def test_keys_come_from_the_coordinator_keys_module() -> None:
    writer = GroupOffsetsWriter(MemoryStore(f"lag-{uuid.uuid4().hex}"), "grp")
    assert writer.commit({"t": {"0": 1}}) == numbered.numbered_key("groups/grp/offsets/", 0)
