"""Which addresses a listener may bind: without authentication, loopback only, unless explicitly allowed."""

from __future__ import annotations

import ipaddress

from pyspark_logsource.gateway.security.errors import UnauthenticatedRemoteListenerError

ALLOW_FLAG = "--allow-unauthenticated-remote"


def is_loopback(host: str) -> bool:
    """True if ``host`` binds loopback only: ``localhost``, 127.0.0.0/8, ``::1`` (also bracketed, and the
    IPv4-mapped ``::ffff:127.x.y.z``). Any other name is not loopback: it may resolve to anything."""
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def check_listener(host: str, authenticated: bool, allow_unauthenticated_remote: bool) -> None:
    """Refuse a listener without authentication on a non-loopback address (``0.0.0.0``, ``::``, ``""``, a LAN
    address, a host name other than ``localhost``) unless ``allow_unauthenticated_remote``: raise
    UnauthenticatedRemoteListenerError naming the address and the ``--allow-unauthenticated-remote`` flag."""
    if authenticated or allow_unauthenticated_remote or is_loopback(host):
        return
    shown = host if host else "<all interfaces>"
    raise UnauthenticatedRemoteListenerError(
        f"refusing to listen on {shown!r} without authentication: anyone who can reach it could read and write "
        f"every topic. Listen on 127.0.0.1 or localhost, configure SASL (--users), or pass {ALLOW_FLAG} "
        "(allow_unauthenticated_remote=True in GatewayConfig) to accept that"
    )
