"""segment_format.numbered: naming, latest, create_next under races, the retry bound."""

from __future__ import annotations

import threading
import uuid

import pytest

from segment_format import numbered
from segment_format.errors import ConcurrentCreateError, PlogError
from segment_format.layout import format_number
from segment_format.stores import LocalStore, MemoryStore


@pytest.fixture(params=["memory", "local"])
def store(request, tmp_path):
    return MemoryStore(f"numbered-{uuid.uuid4().hex}") if request.param == "memory" else LocalStore(str(tmp_path))


def test_naming_round_trip():
    key = numbered.numbered_key("a/b/", 42)
    assert key == "a/b/00000000000000000042.json"
    assert numbered.parse_number(key) == 42
    assert numbered.parse_number("00000000000000000042.json") == 42
    assert format_number(7) == "00000000000000000007"


@pytest.mark.parametrize("name", ["42.json", "00000000000000000042.arrow", "x/0000000000000000004a.json", "p/"])
def test_parse_number_rejects_other_names(name):
    assert numbered.parse_number(name) is None


def test_latest_on_empty_and_ignores_other_keys(store):
    assert numbered.latest(store, "seq/") is None
    store.put_if_absent("seq/readme.txt", b"x")
    store.put_if_absent(numbered.numbered_key("seq/00000000000000000009/", 1), b"x")  # deeper: not ours
    assert numbered.latest(store, "seq/") is None
    store.put_if_absent(numbered.numbered_key("seq/", 3), b"x")
    store.put_if_absent(numbered.numbered_key("seq/", 11), b"x")
    assert numbered.latest(store, "seq/") == 11
    assert numbered.numbers(store, "seq/") == [3, 11]


def test_create_next_starts_at_first_and_builds_body_for_its_number(store):
    made = []

    def body(n):
        made.append(n)
        return str(n).encode()

    assert numbered.create_next(store, "s/", body, first=1) == (1, b"1")
    assert numbered.create_next(store, "s/", body) == (2, b"2")
    assert store.get(numbered.numbered_key("s/", 2)) == b"2"
    assert made == [1, 2]


def test_create_next_races_between_threads_give_distinct_contiguous_numbers(store):
    results: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def worker(i):
        barrier.wait()
        for _ in range(5):
            n, _ = numbered.create_next(store, "race/", lambda n: f"{i}:{n}".encode())
            with lock:
                results.append(n)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == list(range(40))
    assert numbered.numbers(store, "race/") == list(range(40))


class _AlwaysTaken(MemoryStore):
    """A store where every create loses the race."""

    def put_if_absent(self, key, data, *, durable=True):
        return False


def test_retry_bound_exhaustion_raises_a_plog_error_naming_the_prefix(monkeypatch):
    monkeypatch.setattr(numbered, "backoff", lambda attempt: None)
    calls = []
    with pytest.raises(ConcurrentCreateError, match="'busy/'.*3 races") as info:
        numbered.create_next(
            _AlwaysTaken(f"busy-{uuid.uuid4().hex}"), "busy/", lambda n: calls.append(n) or b"x", attempts=3
        )
    assert isinstance(info.value, PlogError)
    assert len(calls) == 3


def test_body_none_lists_again(store):
    answers = iter([None, b"ok"])
    assert numbered.create_next(store, "n/", lambda n: next(answers)) == (0, b"ok")


def test_make_body_may_raise_to_give_up(store):
    def refuse(n):
        raise PlogError("no")

    with pytest.raises(PlogError, match="no"):
        numbered.create_next(store, "g/", refuse)
    assert numbered.latest(store, "g/") is None
