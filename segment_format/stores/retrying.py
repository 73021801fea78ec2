"""Retrying object-store requests within a deadline (PROTOCOL.md 2, *Retries*).

An object store fails transiently: S3 answers ``503 SlowDown`` when a prefix
is busy and ``500 InternalError`` now and then, connections are reset and
answers time out. Client libraries retry by themselves (botocore, s3fs), but
know no bound on the whole operation, so on S3 plog turns theirs off and
retries here, where every try is checked against the deadline. This module
gives both: :class:`RetryPolicy` (the deadline and back-off, read from storage
options) and :func:`is_transient` (whether a failure is worth another try).

Nothing here imports a backend package: failures are recognised by the names
of their classes and by the status and error code they carry, so that
``segment_format`` keeps working without botocore or aiohttp installed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

from segment_format.errors import InvalidConfigError

#: Storage options that plog reads itself (and removes before the filesystem sees them).
DEADLINE_OPTION = "plog_deadline_ms"
BACKOFF_OPTION = "plog_retry_backoff_ms"
BACKOFF_MAX_OPTION = "plog_retry_backoff_max_ms"

#: HTTP statuses that say "try again": throttling, server errors, gateways.
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
#: S3 (and S3-compatible) error codes of the same meaning, for answers whose status is not at hand.
#: ``ConditionalRequestConflict`` (409) is a conditional write that raced another request on
#: the key: nothing was written, and S3 asks for the request to be repeated.
TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "InternalError",
        "ServiceUnavailable",
        "RequestTimeout",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "BandwidthLimitExceeded",
        "ConditionalRequestConflict",
    }
)
#: Exception classes (by name, anywhere in the class hierarchy) of a failed or cut connection,
#: a timed-out answer or a garbled one: botocore's HTTPClientError family (connection closed,
#: read/connect timeouts, endpoint unreachable), aiohttp's payload and connection errors,
#: http.client's incomplete read, botocore's unparsable answer (throttling proxies send broken
#: XML) and fsspec's timeout.
TRANSIENT_CLASS_NAMES = frozenset(
    {
        "HTTPClientError",
        "ConnectionError",
        "ResponseParserError",
        "ClientPayloadError",
        "ClientConnectionError",
        "ServerDisconnectedError",
        "IncompleteRead",
        "FSTimeoutError",
    }
)


class TransientError(Exception):
    """A failure a backend recognised as transient in an answer that was otherwise a success.

    S3's DeleteObjects answers 200 with a list of per-key errors, some of
    which (``SlowDown``, ``InternalError``) ask for the request to be repeated.
    """


def error_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or during, each once."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def service_error(exc: BaseException) -> tuple[str, int | None]:
    """The service's error code and HTTP status behind ``exc``.

    Read from the first boto ``ClientError`` in the chain (its ``response``);
    ``("", None)`` when there is none.
    """
    for e in error_chain(exc):
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            code = str(response.get("Error", {}).get("Code", ""))
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            return code, status if isinstance(status, int) else None
    return "", None


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure that another try of the same request may not meet.

    A missing object, a refused conditional write (412), a denied request or
    a malformed one are answers, not transient failures, and are never retried.
    The outermost exception of the chain that says either way decides: a
    connection error raised while some earlier refusal was being handled is
    a connection error, and a generic ``OSError`` that s3fs made of a 503 is
    judged by the 503 it was raised from.
    """
    for e in error_chain(exc):
        verdict = _verdict(e)
        if verdict is not None:
            return verdict
    return False


def _verdict(e: BaseException) -> bool | None:
    """True (transient), False (an answer) or None (this exception does not say)."""
    if isinstance(e, TransientError):
        return True
    if isinstance(e, (FileNotFoundError, FileExistsError, PermissionError)):
        return False
    response = getattr(e, "response", None)
    if isinstance(response, dict):  # a boto ClientError: the service answered
        code, status = service_error(e)
        return code in TRANSIENT_CODES or status in TRANSIENT_STATUSES
    if isinstance(e, (ConnectionError, TimeoutError)):
        return True
    if any(cls.__name__ in TRANSIENT_CLASS_NAMES for cls in type(e).__mro__):
        return True
    # gcsfs' HttpError carries ``code``; azure-core's HttpResponseError ``status_code``.
    for attr in ("code", "status_code"):
        value = getattr(e, attr, None)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 400:
            return value in TRANSIENT_STATUSES
    return None


def _option_ms(options: MutableMapping[str, Any], name: str, default_ms: int) -> float:
    raw = options.pop(name, None)
    if raw is None:
        return default_ms / 1000
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise InvalidConfigError(f"storage option {name!r} must be an integer (milliseconds), got {raw!r}") from None
    if isinstance(raw, bool) or value <= 0:
        raise InvalidConfigError(f"storage option {name!r} must be a positive number of milliseconds, got {raw!r}")
    return value / 1000


@dataclass(frozen=True)
class RetryPolicy:
    """How long one storage operation may take, all its tries included, and how tries are spaced.

    After a transient failure the store sleeps a random time in
    ``[0, min(backoff_max_s, backoff_s * 2**attempt))`` ("full jitter", so
    that clients throttled together do not come back together) and tries
    again, unless that would end past ``deadline_s`` from the operation's
    start; then it gives up with a ``StorageError``.
    """

    #: The bound on one operation, every try and back-off included (the first try is always made).
    deadline_s: float = 60.0
    #: The first back-off's upper bound; it doubles with every try.
    backoff_s: float = 0.1
    #: The cap of a single back-off.
    backoff_max_s: float = 2.0

    @classmethod
    def pop_options(cls, options: MutableMapping[str, Any]) -> RetryPolicy:
        """The policy the storage options ask for, removing its keys from ``options``.

        ``plog_deadline_ms`` (default 60000), ``plog_retry_backoff_ms``
        (default 100) and ``plog_retry_backoff_max_ms`` (default 2000);
        ``InvalidConfigError`` names a value that is not a positive integer.
        """
        default = cls()
        return cls(
            deadline_s=_option_ms(options, DEADLINE_OPTION, round(default.deadline_s * 1000)),
            backoff_s=_option_ms(options, BACKOFF_OPTION, round(default.backoff_s * 1000)),
            backoff_max_s=_option_ms(options, BACKOFF_MAX_OPTION, round(default.backoff_max_s * 1000)),
        )

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """The back-off before try ``attempt + 1`` (``attempt`` counts from 0)."""
        cap = min(self.backoff_max_s, self.backoff_s * 2 ** min(attempt, 30))
        return (rng or random).uniform(0, cap)
