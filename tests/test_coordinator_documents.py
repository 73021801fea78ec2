"""The coordinator's stored documents on the one JSON codec: same bytes as before, tolerant readers."""

from __future__ import annotations

import json

import pytest

from coordinator.groups.documents import Generation, Heartbeat
from coordinator.leases import LeaseEpoch, LeaseRenewal
from coordinator.transactions import Decision, EpochClaim, ProducerIdClaim, TransactionalIdMapping
from segment_format.errors import CorruptRecordError, PlogError


def _old(doc: dict) -> bytes:
    """What the hand-written ``to_json`` methods wrote."""
    return json.dumps(doc, sort_keys=True).encode()


def test_heartbeat_bytes_are_unchanged_and_round_trip() -> None:
    hb = Heartbeat("m", 1, 5, "c", ("t",), ("range",), generation=2, joined=3, leaving=True)
    stored = _old(
        {
            "member_id": "m",
            "seq": 1,
            "sent_ms": 5,
            "client_id": "c",
            "topics": ["t"],
            "protocols": ["range"],
            "session_timeout_ms": 10_000,
            "rebalance_timeout_ms": 300_000,
            "generation": 2,
            "joined": 3,
            "leaving": True,
        }
    )
    assert hb.to_json() == stored
    assert Heartbeat.from_json(stored) == hb


def test_generation_bytes_are_unchanged_and_round_trip() -> None:
    gen = Generation(2, "range", {"m": {"x": 1}}, {"m": (("t", 0),)}, {}, {"z": "why"}, {"t": 3}, {("t", 0): 4}, 7)
    stored = _old(
        {
            "generation": 2,
            "protocol": "range",
            "members": {"m": {"x": 1}},
            "assignment": {"m": [["t", 0]]},
            "revoking": {},
            "rejected": {"z": "why"},
            "partitions": {"t": 3},
            "committed": {"t": {"0": 4}},
            "created_ms": 7,
            "proposer": "",
            "reason": "",
        }
    )
    assert gen.to_json() == stored
    assert Generation.from_json(stored) == gen
    assert Generation.from_json(b'{"generation": 0}') == Generation(0)


def test_decision_bytes_are_unchanged_and_unknown_fields_are_ignored() -> None:
    decision = Decision("committed", 3, 4, {"t": {"0": [[1, 2]]}}, {"g": {"t": {"0": 5}}}, 2, 9)
    stored = _old(dict(decision.__dict__))
    assert decision.to_json() == stored
    newer = json.loads(stored) | {"added.later": [1]}
    assert Decision.from_json(json.dumps(newer)) == decision


@pytest.mark.parametrize(
    ("cls", "data", "culprit"),
    [
        (Decision, b'{"state": "committed", "txn": 1}', "producer_id"),
        (Heartbeat, b'{"member_id": "m", "seq": 1}', "sent_ms"),
        (Generation, b'{"protocol": "range"}', "generation"),
        (EpochClaim, b'{"created_ms": 1}', "holder"),
        (TransactionalIdMapping, b'{"transactional_id": "x"}', "producer_id"),
        (LeaseEpoch, b'{"holder": "h", "epoch": "one", "expires_ms": 1}', "epoch"),
    ],
)
def test_missing_or_wrong_fields_are_corrupt_documents_naming_the_field(cls, data, culprit) -> None:
    with pytest.raises(CorruptRecordError, match=f"{cls.__name__}.*{culprit}") as info:
        cls.from_json(data)
    assert isinstance(info.value, PlogError)


def test_small_documents_round_trip() -> None:
    for doc in (
        ProducerIdClaim("owner", 1),
        TransactionalIdMapping(3, "tid"),
        EpochClaim("h", 2),
        LeaseEpoch("h", 1, 10, 5),
        LeaseRenewal(10),
        LeaseRenewal(0, released=True),
    ):
        assert type(doc).from_json(doc.to_json()) == doc
    assert json.loads(LeaseEpoch("h", 1, 10, 5).to_json()) == {
        "holder": "h",
        "epoch": 1,
        "expires_ms": 10,
        "created_ms": 5,
    }
