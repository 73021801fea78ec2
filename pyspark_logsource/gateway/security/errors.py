"""Errors of the gateway's security layer.

Each is a :class:`~pyspark_logsource.gateway.errors.GatewayError` (so the server answers a client with its
Kafka code) and names its culprit: the file, the user, the rule index, the mechanism or the address. The
configuration errors (a bad credentials or ACL file, a refused listener) stop ``plog serve`` before it
listens; they carry Kafka's UNKNOWN_SERVER_ERROR because no client ever sees them.
"""

from __future__ import annotations

from pyspark_logsource.gateway.errors import AuthenticationFailedError, GatewayError


class InvalidCredentialsFileError(GatewayError, ValueError):
    """A credentials file that does not parse, or a user name, password or iteration count that breaks the rules."""


class UnknownUserError(GatewayError, KeyError):
    """``remove_user`` was asked for a user the credentials file does not hold."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want the plain sentence.
        return str(self.args[0]) if self.args else ""


class UnsupportedSaslMechanismError(GatewayError):
    """A client asked for a SASL mechanism the gateway does not offer."""

    error_code = 33  # UNSUPPORTED_SASL_MECHANISM


class IllegalSaslStateError(AuthenticationFailedError):
    """A SASL message arrived after the exchange had completed or failed (a replayed or extra message)."""

    error_code = 34  # ILLEGAL_SASL_STATE


class InvalidAclFileError(GatewayError, ValueError):
    """An ACL file that does not parse, or a rule in it that breaks the rules; the message names the rule index."""


class TlsConfigError(GatewayError, ValueError):
    """A certificate, key or CA file that cannot be loaded into the server's TLS context."""


class UnauthenticatedRemoteListenerError(GatewayError, ValueError):
    """A listener without authentication asked to bind a non-loopback address without the explicit opt-in."""
