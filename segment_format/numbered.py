"""Numbered objects: ``<prefix><n:020d>.json``, created in order with put-if-absent.

Topic metadata versions, group generations, commit logs, rebalance markers,
lag offsets, transactional-id epochs, producer ids, decisions and lease epochs
are all sequences of immutable objects named by a number. This module is the
one implementation of their naming (:func:`numbered_key`, :func:`parse_number`,
with the digits from :func:`segment_format.layout.format_number`) and of
"find the newest, create the next one, retry on a race" (:func:`create_next`).

Why listing then put-if-absent is safe (PROTOCOL.md 2, assumption A4: W): a listing may
be stale, it may miss objects created after it started. A stale listing can only
make us propose a number that is already taken; put-if-absent then refuses the
create, and we list again. It can never make two writers both own the same
number, because put-if-absent is atomic (assumption A1). What a stale listing must not do
is make us build a body on top of a state that has since been superseded; the
body is therefore built by ``make_body(n)`` for the number being created, from
what the caller reads for ``n - 1``, and only the create that wins stands. Numbers
are never reused: objects are deleted only from the old end (GC after the delay
D > W), so a listing younger than W always sees the newest number or a newer one.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Iterable

from .errors import ConcurrentCreateError
from .layout import NUMBER_DIGITS, format_number
from .stores.base import Store

#: How many lost races :func:`create_next` accepts before it gives up; the one bound for every sequence.
MAX_CREATE_ATTEMPTS = 100
#: Back-off after a lost race: a random sleep up to ``min(cap, base * 2**attempt)`` seconds,
#: so that writers that collided spread out instead of colliding again.
BACKOFF_BASE_S = 0.001
BACKOFF_CAP_S = 0.05

_SUFFIX = ".json"
_NAME = re.compile(rf"^(\d{{{NUMBER_DIGITS}}}){re.escape(_SUFFIX)}$")


def numbered_key(prefix: str, n: int) -> str:
    """Key of object ``n`` of the sequence under ``prefix``: ``<prefix><n:020d>.json``."""
    return f"{prefix}{format_number(n)}{_SUFFIX}"


def parse_number(name: str) -> int | None:
    """The number of a numbered object's key or name (its last path segment), None for other names."""
    m = _NAME.match(name.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def numbers(store: Store, prefix: str) -> list[int]:
    """The numbers of the objects directly under ``prefix``, ascending (deeper keys are ignored)."""
    return numbers_in([info.key for info in store.list(prefix)], prefix)


def numbers_in(keys: Iterable[str], prefix: str) -> list[int]:
    """The numbers of the numbered objects directly under ``prefix`` among ``keys`` (a listing), ascending."""
    found = []
    for key in keys:
        if key.startswith(prefix):
            rest = key[len(prefix) :]
            if "/" not in rest and (n := parse_number(rest)) is not None:
                found.append(n)
    return sorted(found)


def latest(store: Store, prefix: str) -> int | None:
    """The highest number under ``prefix``, None if the sequence is empty."""
    found = numbers(store, prefix)
    return found[-1] if found else None


def create(store: Store, prefix: str, n: int, body: bytes, *, durable: bool = True) -> bool:
    """Create exactly object ``n`` with put-if-absent; False if it exists (someone else got it)."""
    return store.put_if_absent(numbered_key(prefix, n), body, durable=durable)


def backoff(attempt: int, cap_s: float = BACKOFF_CAP_S) -> None:
    """Sleep a random, growing time after lost race number ``attempt`` (0-based): full jitter, doubling
    from ``BACKOFF_BASE_S`` up to ``cap_s``."""
    # The exponent is bounded: 2**1024 would not convert to a float, and the cap is reached long before.
    time.sleep(random.uniform(0, min(cap_s, BACKOFF_BASE_S * 2 ** min(attempt, 30))))


def create_next(
    store: Store,
    prefix: str,
    make_body: Callable[[int], bytes | None],
    *,
    durable: bool = True,
    attempts: int = MAX_CREATE_ATTEMPTS,
    first: int = 0,
    max_staleness_ms: int | None = None,
) -> tuple[int, bytes]:
    """Create the object after the newest under ``prefix`` (``first`` if there is none); return (number, body).

    ``make_body(n)`` builds the body for number ``n``; it is called again for
    each attempt, so it may read object ``n - 1``, may raise to give up, and may
    return None to say the listing went stale (list again). With
    ``max_staleness_ms`` (W), a body built from a listing older than that is not
    written (assumption A4). A lost race lists again after a back-off; after ``attempts``
    tries :class:`ConcurrentCreateError` names the prefix.
    """
    for attempt in range(attempts):
        started = time.monotonic()
        newest = latest(store, prefix)
        n = first if newest is None else max(first, newest + 1)
        body = make_body(n)
        if body is None or (max_staleness_ms is not None and (time.monotonic() - started) * 1000 > max_staleness_ms):
            continue
        if create(store, prefix, n, body, durable=durable):
            return n, body
        backoff(attempt)
    raise ConcurrentCreateError(f"could not create the next object under {prefix!r}: lost {attempts} races in a row")
