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
    #: Set once the request has done what must happen in the order requests arrived (see ``in_order_done``).
    ordered: asyncio.Event = field(default_factory=asyncio.Event)

    def in_order_done(self) -> None:
        """Let the connection read its next request while this one waits (a produce, once its batches are
        queued): what is left of this one does not depend on the order of requests."""
        self.ordered.set()

    def allowed(self, resource: str, name: str, operation: str) -> bool:
        """Whether the connection's principal may do ``operation`` on the resource (ACLs, Kafka's names)."""
        return self.gateway.authorizer.allowed(self.session.principal or "User:ANONYMOUS", resource, name, operation)

    def allowed_on_any(self, resource: str, operation: str) -> bool:
        """Whether the principal may do ``operation`` on at least one resource of the type (any name)."""
        return bool(
            self.gateway.authorizer.allowed_on_any(self.session.principal or "User:ANONYMOUS", resource, operation)
        )

    def quota(self, byte_key: str) -> Any:
        """The connection's side of a byte quota (a :class:`~coordinator.quotas.ClientQuota`)."""
        from coordinator.quotas import connection_quota

        return connection_quota(self.gateway.store, byte_key, self.session.principal, self.session.client_id)

    async def wait_for_quota(self, byte_key: str, nbytes: int) -> int:
        """Hold the request until the connection's quotas allow ``nbytes`` (and one store request); return the
        milliseconds held, which the response carries as ``throttle_time_ms`` (PROTOCOL.md 11.10).

        The hold comes before a produce is written or a fetch is answered, and the connection reads no
        request meanwhile, so a client never runs ahead of its quota, whether or not it backs off itself."""
        from coordinator.quotas import RECHECK_S

        quota = self.quota(byte_key)
        step = await self.blocking(quota.reserve, nbytes, 1)
        loop = asyncio.get_running_loop()
        start = loop.time()
        while (pause := await self.blocking(step.wait_s)) > 0:
            await asyncio.sleep(min(pause, RECHECK_S))
        return round((loop.time() - start) * 1000)

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
