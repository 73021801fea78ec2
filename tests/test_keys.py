"""coordinator.keys: every coordinator object name, built on segment_format.numbered."""

from __future__ import annotations

import pytest

from coordinator import groups, keys
from segment_format.errors import InvalidConfigError
from segment_format.numbered import parse_number


def test_group_keys_keep_their_layout():
    assert keys.heartbeat_key("g", "m1", 3) == "groups/g/members/m1/00000000000000000003.json"
    assert keys.generation_key("g", 2) == "groups/g/generations/00000000000000000002.json"
    assert keys.rebalance_key("g", 2) == "groups/g/rebalances/00000000000000000002.json"
    assert keys.commit_key("g", 2, 5) == "groups/g/commits/00000000000000000002/00000000000000000005.json"
    assert keys.lag_offsets_prefix("g") == "groups/g/offsets/"
    assert parse_number(keys.commit_key("g", 2, 5)) == 5


def test_coordinator_keys_keep_their_layout():
    assert keys.transactions_prefix(7) == "_coordinator/transactions/00000000000000000007/"
    assert (
        keys.materialized_key(7, 1)
        == "_coordinator/transactions/00000000000000000007/00000000000000000001.materialized"
    )
    assert keys.lease_epoch_prefix("partition=t-0", 4) == "_coordinator/leases/partition=t-0/00000000000000000004/"


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "x" * 250, 3])
def test_group_ids_follow_the_topic_name_rule(bad):
    with pytest.raises(InvalidConfigError, match="invalid group_id"):
        keys.validate_group_id(bad)


def test_groups_module_still_exports_the_keys():
    assert groups.generation_key is keys.generation_key
    assert groups.validate_group_id is keys.validate_group_id
