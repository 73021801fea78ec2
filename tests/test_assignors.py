"""The assignors against Kafka's documented and tested results, and properties over random inputs.

Expected values come from Kafka itself: the javadoc of ``RangeAssignor``,
``RoundRobinAssignor`` and ``StickyAssignor`` (apache/kafka,
clients/src/main/java/org/apache/kafka/clients/consumer/) and
``AbstractStickyAssignorTest``; the 7-partition range series is the worked
example of the RangeAssignor in the usual Kafka write-ups ("the first
partitions % consumers consumers get one more").
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.groups.assignors import (
    STRATEGIES,
    assign,
    compute_assignment,
    cooperative_sticky_assign,
    range_assign,
    roundrobin_assign,
    sticky_assign,
)


def tps(*names: str) -> list[tuple[str, int]]:
    """``"t0p1"`` -> ``("t0", 1)``."""
    out = []
    for name in names:
        topic, _, p = name.rpartition("p")
        out.append((topic, int(p)))
    return out


def as_sets(assignment: dict[str, list[tuple[str, int]]]) -> dict[str, set[tuple[str, int]]]:
    return {m: set(v) for m, v in assignment.items()}


# ---------------------------------------------------------------------------------------------- range


@pytest.mark.parametrize(
    ("consumers", "expected"),
    [
        (1, [[0, 1, 2, 3, 4, 5, 6]]),
        (2, [[0, 1, 2, 3], [4, 5, 6]]),
        (3, [[0, 1, 2], [3, 4], [5, 6]]),
        (4, [[0, 1], [2, 3], [4, 5], [6]]),
        (5, [[0, 1], [2, 3], [4], [5], [6]]),
        (6, [[0, 1], [2], [3], [4], [5], [6]]),
        (7, [[0], [1], [2], [3], [4], [5], [6]]),
        (8, [[0], [1], [2], [3], [4], [5], [6], []]),
    ],
)
def test_range_seven_partitions_one_to_eight_consumers(consumers: int, expected: list[list[int]]) -> None:
    subs = {f"C{i}": ["t"] for i in range(consumers)}
    got = range_assign({"t": 7}, subs)
    assert got == {f"C{i}": [("t", p) for p in ps] for i, ps in enumerate(expected)}


def test_range_two_topics_of_three_partitions_two_consumers() -> None:
    subs = {"C0": ["t0", "t1"], "C1": ["t0", "t1"]}
    got = range_assign({"t0": 3, "t1": 3}, subs)
    assert got == {"C0": tps("t0p0", "t0p1", "t1p0", "t1p1"), "C1": tps("t0p2", "t1p2")}


def test_range_is_per_topic_over_lexicographic_members() -> None:
    # members sorted as strings ("C10" < "C2"); a member not subscribed to a topic gets none of it
    subs = {"C2": ["a"], "C10": ["a", "b"]}
    got = range_assign({"a": 3, "b": 2, "unrelated": 4}, subs)
    assert got == {"C10": tps("ap0", "ap1", "bp0", "bp1"), "C2": tps("ap2")}


# ---------------------------------------------------------------------------------------------- roundrobin


def test_roundrobin_two_topics_of_three_partitions_two_consumers() -> None:
    subs = {"C0": ["t0", "t1"], "C1": ["t0", "t1"]}
    got = roundrobin_assign({"t0": 3, "t1": 3}, subs)
    assert got == {"C0": tps("t0p0", "t0p2", "t1p1"), "C1": tps("t0p1", "t1p0", "t1p2")}


def test_roundrobin_unequal_subscriptions() -> None:
    subs = {"C0": ["t0"], "C1": ["t0", "t1"], "C2": ["t0", "t1", "t2"]}
    got = roundrobin_assign({"t0": 1, "t1": 2, "t2": 3}, subs)
    assert got == {"C0": tps("t0p0"), "C1": tps("t1p0"), "C2": tps("t1p1", "t2p0", "t2p1", "t2p2")}


# ---------------------------------------------------------------------------------------------- sticky

FOUR_TOPICS = {"t0": 2, "t1": 2, "t2": 2, "t3": 2}


def test_sticky_example_1_initial_assignment_equals_roundrobin() -> None:
    """StickyAssignor javadoc, example 1: three consumers, four topics of two partitions."""
    subs = {c: list(FOUR_TOPICS) for c in ("C0", "C1", "C2")}
    expected = {"C0": tps("t0p0", "t1p1", "t3p0"), "C1": tps("t0p1", "t2p0", "t3p1"), "C2": tps("t1p0", "t2p1")}
    assert as_sets(sticky_assign(FOUR_TOPICS, subs)) == as_sets(expected)
    assert roundrobin_assign(FOUR_TOPICS, subs) == expected


def test_sticky_example_1_after_c1_leaves_general_algorithm_matches_the_javadoc() -> None:
    """The javadoc's result: C1's partitions go to the least loaded member, in partition order.

    It was written for the original (KIP-54) algorithm, which Kafka still runs
    when subscriptions differ ("general"); ``algorithm="general"`` forces it.
    """
    before = {"C0": tps("t0p0", "t1p1", "t3p0"), "C1": tps("t0p1", "t2p0", "t3p1"), "C2": tps("t1p0", "t2p1")}
    subs = {c: list(FOUR_TOPICS) for c in ("C0", "C2")}
    got = sticky_assign(FOUR_TOPICS, subs, owned=before, algorithm="general")
    assert got == {"C0": tps("t0p0", "t1p1", "t3p0", "t2p0"), "C2": tps("t1p0", "t2p1", "t0p1", "t3p1")}
    # round robin moves partitions that had an owner who is still there
    assert as_sets(roundrobin_assign(FOUR_TOPICS, subs)) == as_sets(
        {"C0": tps("t0p0", "t1p0", "t2p0", "t3p0"), "C2": tps("t0p1", "t1p1", "t2p1", "t3p1")}
    )


def test_sticky_example_1_after_c1_leaves_current_kafka() -> None:
    """What Kafka 2.8+ computes for the same input: equal subscriptions take the constrained path.

    ``ConstrainedAssignmentBuilder`` keeps every owned partition (3 + 2) and
    deals the unassigned ones (t0p1, t2p0, t3p1) round-robin over the unfilled
    members in name order, so C0 gets t0p1 where the javadoc says t2p0. Both
    answers preserve all five previous assignments and are balanced.
    """
    before = {"C0": tps("t0p0", "t1p1", "t3p0"), "C1": tps("t0p1", "t2p0", "t3p1"), "C2": tps("t1p0", "t2p1")}
    subs = {c: list(FOUR_TOPICS) for c in ("C0", "C2")}
    got = sticky_assign(FOUR_TOPICS, subs, owned=before)
    assert as_sets(got) == as_sets(
        {"C0": tps("t0p0", "t1p1", "t3p0", "t0p1"), "C2": tps("t1p0", "t2p1", "t2p0", "t3p1")}
    )
    for member in ("C0", "C2"):
        assert set(before[member]) <= set(got[member])


def test_sticky_example_2_unequal_subscriptions() -> None:
    """StickyAssignor javadoc, example 2: balanced where round robin is not, and stickier when C0 leaves."""
    parts = {"t0": 1, "t1": 2, "t2": 3}
    subs = {"C0": ["t0"], "C1": ["t0", "t1"], "C2": ["t0", "t1", "t2"]}
    first = sticky_assign(parts, subs)
    assert as_sets(first) == as_sets({"C0": tps("t0p0"), "C1": tps("t1p0", "t1p1"), "C2": tps("t2p0", "t2p1", "t2p2")})
    del subs["C0"]
    second = sticky_assign(parts, subs, owned=first)
    assert as_sets(second) == as_sets({"C1": tps("t1p0", "t1p1", "t0p0"), "C2": tps("t2p0", "t2p1", "t2p2")})
    assert as_sets(roundrobin_assign(parts, subs)) == as_sets(
        {"C1": tps("t0p0", "t1p1"), "C2": tps("t1p0", "t2p0", "t2p1", "t2p2")}
    )


def test_sticky_kafka_unit_tests() -> None:
    """Expected values of Kafka's ``AbstractStickyAssignorTest`` (two-consumers-six-partitions, mixed)."""
    subs = {"consumer1": ["topic1", "topic2"], "consumer2": ["topic1", "topic2"]}
    got = sticky_assign({"topic1": 3, "topic2": 3}, subs)
    assert got == {
        "consumer1": tps("topic1p0", "topic1p2", "topic2p1"),
        "consumer2": tps("topic1p1", "topic2p0", "topic2p2"),
    }
    subs = {"consumer1": ["topic1"], "consumer2": ["topic1", "topic2"], "consumer3": ["topic1"]}
    got = sticky_assign({"topic1": 3, "topic2": 2}, subs)
    assert got == {
        "consumer1": tps("topic1p0", "topic1p2"),
        "consumer2": tps("topic2p0", "topic2p1"),
        "consumer3": tps("topic1p1"),
    }
    # testOnlyAssignsPartitionsFromSubscribedTopics: owned partitions of other topics are dropped
    got = sticky_assign(
        {"topic": 2},
        {"consumer": ["topic"]},
        owned={"consumer": [("topic", 0), ("topic", 1), ("other", 0), ("other", 1)]},
    )
    assert got == {"consumer": [("topic", 0), ("topic", 1)]}


def test_sticky_keeps_maxquota_for_the_expected_number_of_members_only() -> None:
    # 7 partitions over 3 members: quotas 2..3, one member may keep 3
    parts = {"t": 7}
    owned = {"A": tps("tp0", "tp1", "tp2"), "B": tps("tp3", "tp4", "tp5"), "C": tps("tp6")}
    got = sticky_assign(parts, {m: ["t"] for m in "ABC"}, owned=owned)
    assert sorted(len(v) for v in got.values()) == [2, 2, 3]
    assert set(owned["A"]) <= set(got["A"]) and set(owned["C"]) <= set(got["C"])


def test_cooperative_sticky_withholds_partitions_that_change_owner() -> None:
    before = {"C0": tps("t0p0", "t1p1", "t3p0"), "C1": tps("t0p1", "t2p0", "t3p1"), "C2": tps("t1p0", "t2p1")}
    subs = {c: list(FOUR_TOPICS) for c in ("C0", "C1", "C2", "C3")}
    assignment, withheld = cooperative_sticky_assign(FOUR_TOPICS, subs, owned=before)
    full = sticky_assign(FOUR_TOPICS, subs, owned=before)
    moved = {tp: old for old, ts in before.items() for tp in ts if tp not in full[old]}
    assert withheld == moved and withheld  # each moved partition is revoked by its old owner first
    assert assignment["C3"] == []  # the newcomer gets its share in the follow-up rebalance
    for member, ts in assignment.items():
        assert set(ts) == set(full[member]) - set(withheld)
    # the follow-up: nothing is owned twice any more, so the withheld partitions are assigned directly
    follow, withheld2 = cooperative_sticky_assign(FOUR_TOPICS, subs, owned=assignment)
    assert withheld2 == {} and as_sets(follow) == as_sets(full)


def test_unknown_strategy_is_refused() -> None:
    with pytest.raises(ValueError, match="fair"):
        assign("fair", {"t": 1}, {"a": ["t"]})


# ---------------------------------------------------------------------------------------------- properties


Inputs = tuple[dict[str, int], dict[str, list[str]], dict[str, list[tuple[str, int]]]]


@st.composite
def group_inputs(draw: st.DrawFn) -> Inputs:
    topics = {f"t{i}": draw(st.integers(0, 7)) for i in range(draw(st.integers(1, 4)))}
    names = draw(
        st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f", "C10", "C2"]), min_size=1, max_size=6, unique=True)
    )
    same = draw(st.booleans())
    common = draw(st.lists(st.sampled_from(sorted(topics)), min_size=1, unique=True))
    subs = {
        m: common if same else draw(st.lists(st.sampled_from(sorted(topics)), min_size=1, unique=True)) for m in names
    }
    # a previous assignment: any valid one, possibly with departed members and vanished topics
    previous_members = names + draw(st.lists(st.sampled_from(["x", "y"]), unique=True))
    all_tps = [(t, p) for t, n in topics.items() for p in range(n)] + [("gone", 0)]
    owned: dict[str, list[tuple[str, int]]] = {}
    for tp in all_tps:
        if draw(st.booleans()):
            owned.setdefault(draw(st.sampled_from(previous_members)), []).append(tp)
    return topics, subs, owned


@settings(max_examples=300, deadline=None)
@given(group_inputs(), st.sampled_from(STRATEGIES))
def test_every_subscribed_partition_goes_to_exactly_one_subscribed_member(inputs: Inputs, strategy: str) -> None:
    topics, subs, owned = inputs
    assignment, withheld = compute_assignment(strategy, topics, subs, owned)
    assert set(assignment) == set(subs)
    counts = Counter(tp for ts in assignment.values() for tp in ts)
    assert all(n == 1 for n in counts.values())
    subscribed = {(t, p) for ts in subs.values() for t in ts for p in range(topics[t])}
    assert set(counts) | set(withheld) == subscribed and not set(counts) & set(withheld)
    for member, ts in assignment.items():
        assert all(t in subs[member] for t, _ in ts)
    for tp, old in withheld.items():
        assert strategy == "cooperative-sticky" and tp in owned.get(old, []) and old in subs


@settings(max_examples=300, deadline=None)
@given(group_inputs(), st.sampled_from(["sticky", "cooperative-sticky"]))
def test_sticky_results_are_balanced_among_members_with_identical_subscriptions(inputs: Inputs, strategy: str) -> None:
    topics, subs, owned = inputs
    full = sticky_assign(topics, subs, owned)  # cooperative-sticky converges to this after its follow-up
    by_subscription: dict[tuple[str, ...], list[int]] = {}
    for member, ts in full.items():
        by_subscription.setdefault(tuple(sorted(subs[member])), []).append(len(ts))
    for sizes in by_subscription.values():
        assert max(sizes) - min(sizes) <= 1, full
    if strategy == "cooperative-sticky":
        first, withheld = cooperative_sticky_assign(topics, subs, owned)
        follow, withheld2 = cooperative_sticky_assign(topics, subs, first)
        assert withheld2 == {}
        sizes_by_sub: dict[tuple[str, ...], list[int]] = {}
        for member, ts in follow.items():
            sizes_by_sub.setdefault(tuple(sorted(subs[member])), []).append(len(ts))
        for sizes in sizes_by_sub.values():
            assert max(sizes) - min(sizes) <= 1, follow


@settings(max_examples=200, deadline=None)
@given(group_inputs())
def test_sticky_keeps_previous_assignments_when_balance_allows(inputs: Inputs) -> None:
    topics, subs, _owned = inputs
    first = sticky_assign(topics, subs)
    again = sticky_assign(topics, subs, owned=first)
    assert as_sets(again) == as_sets(first)  # nothing changed, nothing moves


def test_cooperative_sticky_follow_up_withholds_nothing_with_mixed_subscriptions() -> None:
    topics = {"t0": 5, "t1": 4, "t2": 3, "t3": 3}
    subs = {"a": ["t0", "t1"], "b": ["t0", "t1", "t2", "t3"], "c": ["t0", "t1"], "d": ["t0"], "e": ["t1", "t2"]}
    owned = {"b": [("t0", 4)], "d": [("t1", 0)]}
    first, _ = cooperative_sticky_assign(topics, subs, owned)
    _, withheld = cooperative_sticky_assign(topics, subs, first)
    assert withheld == {}


def test_cooperative_sticky_follow_up_keeps_what_the_first_rebalance_kept() -> None:
    """Hypothesis: from less owned, the general algorithm balances better and would move d's t0p1 (to b).

    The first rebalance takes that better target at once: d revokes t0p1 too.
    """
    topics = {"t0": 2, "t1": 2}
    subs = {"a": ["t0"], "b": ["t0"], "c": ["t0"], "d": ["t0", "t1"], "e": ["t0"], "f": ["t0", "t1"]}
    owned = {"d": tps("t0p0", "t0p1"), "a": tps("t1p1")}
    first, withheld = cooperative_sticky_assign(topics, subs, owned)
    assert withheld == {("t0", 0): "d", ("t0", 1): "d", ("t1", 1): "a"}
    follow, withheld2 = cooperative_sticky_assign(topics, subs, first)
    assert withheld2 == {}
    for member, ts in first.items():
        assert set(ts) <= set(follow[member])
    assert set(tp for ts in follow.values() for tp in ts) == set(tps("t0p0", "t0p1", "t1p0", "t1p1"))
