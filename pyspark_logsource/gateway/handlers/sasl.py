"""SaslHandshake and SaslAuthenticate: a connection proves who it is before anything else."""

from __future__ import annotations

from typing import Any

from kio.index import load_response_schema

from ..context import Api, RequestContext
from ..entities import make
from ..errors import AuthenticationFailedError, GatewayError
from ..sasl_session import sasl_step
from ..server import Gateway

UNSUPPORTED_SASL_MECHANISM, ILLEGAL_SASL_STATE, SASL_AUTHENTICATION_FAILED = 33, 34, 58


def _mechanisms(gateway: Gateway) -> list[str]:
    if gateway.credentials is None:
        return []
    from ..security.sasl import mechanisms

    return list(mechanisms())


async def sasl_handshake(ctx: RequestContext, request: Any) -> Any:
    """SaslHandshake: choose a mechanism. v0 then exchanges raw SASL frames, v1 SaslAuthenticate requests."""
    gateway, session = ctx.gateway, ctx.session
    offered = _mechanisms(gateway)
    response_type = load_response_schema(17, ctx.api_version)
    if session.principal is not None and gateway.authenticating:
        return make(response_type, error_code=ILLEGAL_SASL_STATE, mechanisms=offered)
    if request.mechanism not in offered:
        return make(response_type, error_code=UNSUPPORTED_SASL_MECHANISM, mechanisms=offered)
    from ..security.sasl import new_sasl_server

    session.sasl = new_sasl_server(request.mechanism, gateway.credentials)
    session.sasl_authenticate_api = ctx.api_version >= 1
    return make(response_type, error_code=0, mechanisms=offered)


def failure_message(exc: GatewayError) -> str:
    """The message a client shows for a failed exchange: the mechanism's own sentence, said once.

    The mechanisms' failures already start with "Authentication failed:" (a client prints the message after
    its own "SASL authentication error:"), so it is not repeated; other refusals get the prefix.
    """
    text = str(exc)
    return text if text.startswith("Authentication failed") else f"Authentication failed: {text}"


async def sasl_authenticate(ctx: RequestContext, request: Any) -> Any:
    """SaslAuthenticate: one step of the chosen mechanism; a failure is answered, then the connection closes."""
    session = ctx.session
    response_type = load_response_schema(36, ctx.api_version)
    if session.sasl is None:
        return make(response_type, error_code=ILLEGAL_SASL_STATE, error_message="no SASL handshake", auth_bytes=b"")
    try:
        reply = sasl_step(session, bytes(request.auth_bytes))
    except (AuthenticationFailedError, GatewayError) as exc:
        session.sasl = None
        session.attributes["close_after_response"] = True
        return make(
            response_type,
            error_code=SASL_AUTHENTICATION_FAILED,
            error_message=failure_message(exc),
            auth_bytes=b"",
        )
    return make(response_type, error_code=0, error_message=None, auth_bytes=reply, session_lifetime_ms=0)


APIS = [
    Api(17, "SaslHandshake", 0, 1, sasl_handshake, needs_auth=False),
    Api(36, "SaslAuthenticate", 0, 2, sasl_authenticate, needs_auth=False),
]
