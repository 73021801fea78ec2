"""What a request handler is given: the gateway's services and the request's connection."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass
class Session:
    """One client connection: who it is and what it has proven."""

    peer: str
    client_id: str | None = None
    #: Kafka's principal once authenticated ("User:alice"), "User:ANONYMOUS" on a listener without SASL.
    principal: str | None = None
    #: The SASL mechanism a SaslHandshake chose, waiting for SaslAuthenticate.
    sasl: Any = None
    #: Whether the client authenticates with SaslAuthenticate (handshake v1) or raw SASL frames (v0).
    sasl_authenticate_api: bool = True
    #: Transactional state and the like that handlers keep per connection.
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass
class RequestContext:
    """A request's view of the gateway, passed to every handler."""

    #: The :class:`~pyspark_logsource.gateway.server.Gateway` (typed loosely: the server imports this module).
    gateway: Any
    session: Session
    api_key: int
    api_version: int
    correlation_id: int
    #: Set by the Produce handler once the request's batches are queued in order (before they are
    #: written): the server may then read the connection's next request while this one waits.
    queued: asyncio.Event | None = None

    def allowed(self, resource: str, name: str, operation: str) -> bool:
        """Whether the connection's principal may do ``operation`` on the resource (ACLs, Kafka's names)."""
        return self.gateway.authorizer.allowed(self.session.principal or "User:ANONYMOUS", resource, name, operation)

    async def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking plog call (store requests) off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self.gateway.executor, lambda: fn(*args))


Handler = Callable[[RequestContext, Any], Awaitable[Any]]


@dataclass(frozen=True)
class Api:
    """One Kafka API the gateway serves: its key, the versions it answers, and its handler.

    The versions are those whose fields the handler reads and fills, no more:
    a client negotiates the highest both sides know (ApiVersions).
    """

    key: int
    name: str
    min_version: int
    max_version: int
    handler: Handler
    #: False only for the APIs a client may send before it authenticates (ApiVersions, SASL).
    needs_auth: bool = True
