"""The gateway process: an asyncio Kafka-protocol listener in front of one plog root.

Each connection's requests are handled in order and answered in order, as
Kafka's broker does. One exception keeps a producer from being bound by the
produce window: once a Produce request's batches are queued in the batcher
(their place in each partition fixed), the connection's next request is read
while the first waits for its object to be written. A Kafka broker answers a
produce in milliseconds; a gateway holds it for ``linger_ms``, so without this a
client's pipelined requests (librdkafka sends up to five, often one partition
each) would each wait for a window of their own. Responses are still written
in request order, and any other request waits until every earlier one is
answered. Handlers run plog's blocking store calls in a thread pool.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from segment_format.root import LogRoot

from .config import GatewayConfig
from .context import Api, RequestContext, Session
from .directory import GatewayDirectory
from .errors import GatewayError, MalformedRequestError
from .wire import API_VERSIONS_KEY, Request, UnsupportedVersion, decode_request, encode_response, response_type

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
#: The smallest request: api key, version, correlation id and a null client id.
_MIN_FRAME = 10
_API_KEY = struct.Struct(">h")
PRODUCE_KEY = 0
#: Produce requests of one connection waiting for their objects at once (librdkafka sends up to 5):
#: the next frame is read only when fewer wait, so a client cannot make the gateway hold more.
MAX_PIPELINED = 8


def _close_on_failure(task: asyncio.Task[None], writer: asyncio.StreamWriter) -> None:
    """A pipelined request that failed closes its connection at once (its read then ends), as an inline
    failure does."""
    if not task.cancelled() and task.exception() is not None:
        writer.close()


def api_version_entries(gateway: Gateway, version: int) -> list[dict[str, int]]:
    """The ApiVersions answer's entries: every served API with its version range."""
    return [
        {"api_key": api.key, "min_version": api.min_version, "max_version": api.max_version}
        for api in sorted(gateway.apis.values(), key=lambda a: a.key)
    ]


class Gateway:
    """One ``plog serve`` process: the listener, the root it serves, and its registration."""

    def __init__(self, config: GatewayConfig, apis: dict[int, Api]) -> None:
        from .security_setup import load_security

        self.config = config
        self.root = LogRoot(config.url, config.storage_options)
        self.store = self.root.store
        self.executor = ThreadPoolExecutor(config.threads, thread_name_prefix="plog-gateway")
        self.apis = apis
        self.supported = {key: (api.min_version, api.max_version) for key, api in self.apis.items()}
        self.credentials, self.authorizer = load_security(config)
        host, port = config.advertised
        self.directory = GatewayDirectory(self.store, host, port, config.heartbeat_ms, config.registration_ms)
        #: Per-concern state the handler modules keep (the produce accumulator, group bridges, ...).
        self.services: dict[str, Any] = {}
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def services_wake(self, topic: str) -> None:
        """Tell waiting fetches that ``topic`` has new records (called from any thread)."""
        fetch = self.services.get("fetch")
        if fetch is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(fetch.wake, topic)

    @property
    def authenticating(self) -> bool:
        """Whether clients must authenticate with SASL before any other request."""
        return self.credentials is not None

    async def start(self) -> None:
        """Bind the listener and register in the root."""
        from .security.listener import check_listener

        self._loop = asyncio.get_running_loop()
        check_listener(self.config.host, self.authenticating, self.config.allow_unauthenticated_remote)
        self._server = await asyncio.start_server(
            self._serve_connection, self.config.host, self.config.port, ssl=self.config.ssl_context, limit=2**20
        )
        if self.config.port == 0:  # an ephemeral port: tell clients the one the system chose
            bound = self._server.sockets[0].getsockname()[1]
            self.config.port = bound
            host, _ = self.config.advertised
            self.directory = GatewayDirectory(
                self.store,
                host,
                self.config.advertised_port or bound,
                self.config.heartbeat_ms,
                self.config.registration_ms,
            )
        await asyncio.get_running_loop().run_in_executor(self.executor, self.directory.start)
        for service in self.services.values():
            starter = getattr(service, "start", None)
            if starter is not None:
                starter()

    @property
    def port(self) -> int:
        """The port the listener is bound to."""
        return self.config.port

    async def serve_forever(self) -> None:
        """Start, then serve until cancelled."""
        await self.start()
        assert self._server is not None
        async with self._server:
            await self._server.serve_forever()

    async def close(self) -> None:
        """Stop accepting, finish the services (flush what producers sent), deregister, release the root."""
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        for service in self.services.values():
            closer = getattr(service, "close", None)
            if closer is not None:
                await asyncio.get_running_loop().run_in_executor(self.executor, closer)
        await asyncio.get_running_loop().run_in_executor(self.executor, self.directory.close)
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.root.close()

    # ---------------------------------------------------------------- connections

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        session = Session(peer=f"{peer[0]}:{peer[1]}" if peer else "?")
        if not self.authenticating:
            session.principal = "User:ANONYMOUS"
        pending: list[asyncio.Task[None]] = []  # pipelined produce requests, oldest first
        try:
            while True:
                frame = await self._read_frame(reader, session)
                if frame is None:  # the client is done sending: what it sent is still answered
                    while pending:
                        await pending.pop(0)
                    return
                if self._pipelined(frame, session):
                    if len(pending) >= MAX_PIPELINED:
                        await pending.pop(0)
                    queued = asyncio.Event()
                    previous = pending[-1] if pending else None
                    answer = asyncio.create_task(self._answer_in_order(frame, session, queued, previous, writer))
                    pending.append(answer)
                    answer.add_done_callback(lambda t: _close_on_failure(t, writer))
                    waiter = asyncio.ensure_future(queued.wait())
                    await asyncio.wait([answer, waiter], return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
                    for done in [t for t in pending if t.done()]:
                        pending.remove(done)
                        await done  # raises its failure here: the connection closes
                    continue
                for earlier in pending:  # any other request: every earlier one answered first
                    await earlier
                pending.clear()
                response = await self._answer(frame, session)
                if response is not None:
                    writer.write(response)
                    await writer.drain()
                if session.attributes.pop("close_after_response", False):
                    return  # Kafka closes a connection whose authentication failed, after answering
        except MalformedRequestError as exc:
            log.warning("closing %s: %s", session.peer, exc)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away
        except asyncio.CancelledError:
            pass
        finally:
            for answer in pending:
                answer.cancel()  # their batches stay queued and are written; only the answers are dropped
            self._connections.discard(task)
            await self._connection_closed(session)
            writer.close()

    def _pipelined(self, frame: bytes, session: Session) -> bool:
        """Whether the frame is a Produce from an authenticated connection (read on while it waits)."""
        return (
            session.principal is not None
            and (session.sasl is None or session.sasl_authenticate_api)
            and _API_KEY.unpack_from(frame)[0] == PRODUCE_KEY
        )

    async def _answer_in_order(
        self,
        frame: bytes,
        session: Session,
        queued: asyncio.Event,
        previous: asyncio.Task[None] | None,
        writer: asyncio.StreamWriter,
    ) -> None:
        """Answer a pipelined request; write its response after the previous one's."""
        try:
            response = await self._answer(frame, session, queued)
        finally:
            queued.set()
        if previous is not None:
            await previous
        if response is not None:
            writer.write(response)
            await writer.drain()

    async def _read_frame(self, reader: asyncio.StreamReader, session: Session) -> bytes | None:
        try:
            head = await reader.readexactly(4)
        except asyncio.IncompleteReadError:
            return None
        (size,) = _SIZE.unpack(head)
        if size < _MIN_FRAME and not (session.sasl is not None and not session.sasl_authenticate_api and size >= 0):
            raise MalformedRequestError(f"frame of {size} bytes from {session.peer} is shorter than any request")
        if size > self.config.max_request_bytes:
            raise MalformedRequestError(
                f"frame of {size} bytes from {session.peer} is larger than socket.request.max.bytes "
                f"({self.config.max_request_bytes})"
            )
        return await reader.readexactly(size)

    async def _answer(self, frame: bytes, session: Session, queued: asyncio.Event | None = None) -> bytes | None:
        if session.sasl is not None and not session.sasl_authenticate_api:
            from .sasl_session import raw_sasl_token

            return raw_sasl_token(session, frame)
        request = decode_request(frame, self.supported)
        if isinstance(request, UnsupportedVersion):
            return self._unsupported(request)
        api = self.apis[request.api_key]
        if api.needs_auth and session.principal is None:
            raise MalformedRequestError(
                f"{session.peer} sent {api.name} before authenticating (SASL is required on this listener)"
            )
        if request.client_id is not None:
            session.client_id = request.client_id
        context = RequestContext(self, session, request.api_key, request.api_version, request.correlation_id, queued)
        body = await self._handle(api, context, request)
        if body is None:  # a produce with acks=0 is not answered
            return None
        return encode_response(request.correlation_id, body)

    async def _handle(self, api: Api, context: RequestContext, request: Request) -> Any:
        try:
            return await api.handler(context, request.body)
        except GatewayError as exc:
            if isinstance(exc, MalformedRequestError):
                raise
            raise MalformedRequestError(f"{api.name} from {context.session.peer} failed: {exc}") from exc

    def _unsupported(self, request: UnsupportedVersion) -> bytes:
        if request.api_key != API_VERSIONS_KEY:
            raise MalformedRequestError(
                f"API key {request.api_key} at version {request.api_version} is not supported "
                f"(supported: {self.supported[request.api_key]})"
            )
        from kio.schema.errors import ErrorCode

        from .entities import make

        body_type = response_type(API_VERSIONS_KEY, 0)
        body = make(body_type, error_code=ErrorCode.unsupported_version, api_keys=api_version_entries(self, 0))
        return encode_response(request.correlation_id, body)

    async def _connection_closed(self, session: Session) -> None:
        for service in self.services.values():
            hook = getattr(service, "connection_closed", None)
            if hook is not None:
                try:
                    await asyncio.get_running_loop().run_in_executor(self.executor, hook, session)
                except Exception as exc:  # noqa: BLE001 - one service's cleanup must not stop the others'
                    log.warning("cleanup after %s failed: %s", session.peer, exc)
