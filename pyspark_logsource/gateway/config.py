"""Settings of one gateway process (``plog serve``)."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Any

from .directory import DEFAULT_PROBE_MS

#: Kafka's ``socket.request.max.bytes``: a frame announcing more is refused before it is read.
DEFAULT_MAX_REQUEST_BYTES = 100 * 1024 * 1024
#: The diskless Kafkas' produce window: what a gateway gathers for a partition before one object is written.
DEFAULT_LINGER_MS = 250
DEFAULT_BATCH_BYTES = 8 * 1024 * 1024
#: How often a gateway renews its registration, and how long one stays valid (PROTOCOL.md 11.9).
DEFAULT_HEARTBEAT_MS = 10_000
DEFAULT_REGISTRATION_MS = 30_000


@dataclass
class GatewayConfig:
    """Where the gateway listens, what it serves, and how it guards it."""

    url: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 9092
    #: The address clients are told to connect to (Metadata, FindCoordinator); the listener's by default.
    advertised_host: str | None = None
    advertised_port: int | None = None
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    linger_ms: int = DEFAULT_LINGER_MS
    batch_bytes: int = DEFAULT_BATCH_BYTES
    heartbeat_ms: int = DEFAULT_HEARTBEAT_MS
    registration_ms: int = DEFAULT_REGISTRATION_MS
    #: Peers refusing a TCP connection are not named to clients (a SIGKILLed gateway's registration lives on).
    probe_ms: int = DEFAULT_PROBE_MS
    #: SASL: a credentials file (hashed secrets); None serves without authentication.
    users_file: str | None = None
    #: ACLs by principal; None allows every principal everything.
    acls_file: str | None = None
    #: TLS for the listener.
    ssl_context: ssl.SSLContext | None = None
    allow_unauthenticated_remote: bool = False
    #: Worker threads for store requests (each blocks on one request at a time).
    threads: int = 32

    @property
    def advertised(self) -> tuple[str, int]:
        """The (host, port) clients are told to connect to."""
        return (self.advertised_host or self.host, self.advertised_port or self.port)
