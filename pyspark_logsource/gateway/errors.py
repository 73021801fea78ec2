"""Errors of the Kafka-protocol gateway (``plog serve``).

Each carries the Kafka error code a client is answered with, so that a handler
that raises one answers with Kafka's code, and the gateway's own log names the culprit.
"""

from __future__ import annotations

from segment_format.errors import PlogError


class GatewayError(PlogError):
    """A request the gateway refuses; ``error_code`` is Kafka's code for it (0 never)."""

    error_code: int = -1  # UNKNOWN_SERVER_ERROR

    def __init__(self, message: str, error_code: int | None = None) -> None:
        super().__init__(message)
        if error_code is not None:
            self.error_code = error_code


class MalformedRequestError(GatewayError):
    """Bytes that are not a Kafka request: a truncated or oversized frame, an unknown API key or version,
    fields that do not decode. The connection is closed; nothing is written."""

    error_code = 42  # INVALID_REQUEST


class CorruptRecordBatchError(GatewayError):
    """A produced record batch that does not decode: wrong CRC, wrong lengths, unknown codec or magic."""

    error_code = 2  # CORRUPT_MESSAGE


class AuthenticationFailedError(GatewayError):
    """SASL authentication failed: unknown user, wrong password, malformed exchange."""

    error_code = 58  # SASL_AUTHENTICATION_FAILED


class AuthorizationDeniedError(GatewayError):
    """A principal's ACLs do not allow the operation on the resource; the code names the resource type."""

    error_code = 29  # TOPIC_AUTHORIZATION_FAILED


class ListenError(GatewayError):
    """The listener could not bind its address (in use, not on this machine, a name that does not resolve)."""
