"""A connection's SASL exchange: feeding client tokens to the chosen mechanism."""

from __future__ import annotations

import struct

from .context import Session
from .errors import GatewayError, MalformedRequestError


def sasl_step(session: Session, token: bytes) -> bytes:
    """One step of the connection's mechanism; on completion the session takes its principal."""
    server = session.sasl
    if server is None:
        raise MalformedRequestError(f"{session.peer} sent SASL bytes without a handshake")
    reply = server.step(token)
    if server.complete:
        session.principal = server.principal
        session.sasl = None
    return bytes(reply)


def raw_sasl_token(session: Session, frame: bytes) -> bytes:
    """A SASL token sent as a bare frame after SaslHandshake v0; the reply is a bare frame too."""
    try:
        reply = sasl_step(session, frame)
    except GatewayError as exc:
        raise MalformedRequestError(f"SASL authentication of {session.peer} failed: {exc}") from exc
    return struct.pack(">i", len(reply)) + reply
