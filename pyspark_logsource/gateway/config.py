"""Settings of one gateway process (``plog serve``)."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Any

from .directory import DEFAULT_PROBE_MS

#: Kafka's ``socket.request.max.bytes``: a frame announcing more is refused before it is read.
DEFAULT_MAX_REQUEST_BYTES = 100 * 1024 * 1024
#: The least time between the starts of two flushes (group commit), by store: a local root flushes as soon as
#: the previous flush is done; on an object store at most four flushes a second keep a busy gateway's requests
#: (an object, a commit and a notice per flush) near 12 PUTs a second, what the fixed 250 ms window cost.
DEFAULT_FLUSH_INTERVAL_MS = {"local": 0, "object store": 250}
#: A flush takes at most this many bytes of waiting batches, and starts at once when this many wait.
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
    #: The least time between two flushes' starts; None: :data:`DEFAULT_FLUSH_INTERVAL_MS` for the root's store.
    flush_interval_ms: int | None = None
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

    def flush_interval_for(self, billed_per_request: bool) -> int:
        """The flush interval in effect on a store that bills per request (an object store) or not."""
        if self.flush_interval_ms is not None:
            return self.flush_interval_ms
        return DEFAULT_FLUSH_INTERVAL_MS["object store" if billed_per_request else "local"]

    @property
    def advertised(self) -> tuple[str, int]:
        """The (host, port) clients are told to connect to."""
        return (self.advertised_host or self.host, self.advertised_port or self.port)
