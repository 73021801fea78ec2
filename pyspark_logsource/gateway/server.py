"""The gateway process: an asyncio Kafka-protocol listener in front of one plog root.

Each connection is served one request at a time, in order, as Kafka's broker
does (it mutes a connection until its response is sent), so responses need no
reordering and a client's pipelined produce requests reach a partition in the
order it sent them. Handlers run plog's blocking store calls in a thread pool.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, cast

from pyspark_logsource.client.metrics import counting_root

from .config import GatewayConfig
from .context import Api, RequestContext, Session
from .directory import GatewayDirectory
from .errors import GatewayError, ListenError, MalformedRequestError
from .stats import GatewayStats
from .wire import API_VERSIONS_KEY, Request, UnsupportedVersion, decode_request, encode_response, response_type

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Requests of one connection read but not yet answered, at most, and their bytes: a client's pipelined produce
#: requests are read while a flush is written, so that the next flush takes them all (group commit), within a
#: memory bound per connection (a request may be up to ``max_request_bytes``; one past the bound is still read).
MAX_UNANSWERED = 64
MAX_UNANSWERED_BYTES = 64 * 1024 * 1024
_SIZE = struct.Struct(">i")
#: How long a gateway that is told to stop (SIGTERM, SIGINT) waits for the requests it has read to be answered
#: before it closes their connections: a produce's flush, a fetch's wait.
DRAIN_TIMEOUT_S = 10.0
#: The smallest request: api key, version, correlation id and a null client id.
_MIN_FRAME = 10


#: Kafka's ``sasl.server.max.receive.size``: the largest frame read from a connection that has not authenticated
#: (ApiVersions, SASL). Without it, anyone who can connect makes the gateway buffer up to a whole
#: ``max_request_bytes`` per connection before proving who they are.
MAX_UNAUTHENTICATED_FRAME_BYTES = 512 * 1024

#: Kafka's ``connection.failed.authentication.delay.ms``: how long a connection whose authentication failed stays
#: open after its answer. Closing at once races the answer: bytes the client sends meanwhile (TLS records) reach a
#: closed socket, the kernel resets the connection, and the client may lose the answer and see only
#: "disconnected" instead of SASL_AUTHENTICATION_FAILED. It also slows password guessing.
FAILED_AUTHENTICATION_DELAY_S = 0.1


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
        self.root = counting_root(config.url, config.storage_options)  # its store requests, for the metrics
        self.store = self.root.store
        self.executor = ThreadPoolExecutor(config.threads, thread_name_prefix="plog-gateway")
        self.apis = apis
        self.supported = {key: (api.min_version, api.max_version) for key, api in self.apis.items()}
        self.credentials, self.authorizer = load_security(config)
        host, port = config.advertised
        self.directory = GatewayDirectory(
            self.store, host, port, config.heartbeat_ms, config.registration_ms, probe_ms=config.probe_ms
        )
        #: Per-concern state the handler modules keep (the produce accumulator, group bridges, ...).
        self.services: dict[str, Any] = {}
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        #: Each connection's requests read and not answered yet, for the drain of :meth:`close`.
        self._rooms: set[_Unanswered] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Requests, bytes and connections, for ``plog serve --metrics-port`` (``stats.py``).
        self.stats = GatewayStats()

    def service(self, name: str, make: Callable[[], T]) -> T:
        """The gateway-wide object a handler module keeps under ``name``, made by ``make`` on first use."""
        found = self.services.get(name)
        if found is None:
            found = self.services[name] = make()
        return cast(T, found)

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
        try:
            self._server = await asyncio.start_server(
                self._serve_connection, self.config.host, self.config.port, ssl=self.config.ssl_context, limit=2**20
            )
        except OSError as exc:  # nothing is registered yet: the root is left as it was
            where = f"{self.config.host}:{self.config.port}"
            raise ListenError(f"cannot listen on {where}: {_bind_reason(exc)}") from None
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
                probe_ms=self.config.probe_ms,
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

    async def close(self, drain_s: float = 0.0) -> None:
        """Stop accepting, let the requests already read be answered for up to ``drain_s``, close the
        connections, finish the services (flush what producers sent), deregister, release the root."""
        if self._server is not None:
            self._server.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + drain_s
        while any(room.count for room in self._rooms) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for task in list(self._connections):
            task.cancel()
        for service in list(self.services.values()):
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
        self.stats.opened()
        peer = writer.get_extra_info("peername")
        session = Session(peer=f"{peer[0]}:{peer[1]}" if peer else "?")
        if not self.authenticating:
            session.principal = "User:ANONYMOUS"
        answers: asyncio.Queue[tuple[asyncio.Task[bytes | None], int] | None] = asyncio.Queue()
        room = _Unanswered()
        self._rooms.add(room)
        sender = asyncio.create_task(self._send_answers(answers, writer, session, room))
        try:
            while not sender.done():
                await room.wait()
                frame = await self._read_frame(reader, session)
                if frame is None:
                    break
                room.add(len(frame))
                ordered = asyncio.Event()
                answer = asyncio.create_task(self._answer(frame, session, ordered))
                answers.put_nowait((answer, len(frame)))
                # The next request is read once this one has done what must happen in order (for a produce:
                # its batches queued), so a produce's wait for its object overlaps the requests after it and
                # a client's pipelined produce requests share one window; responses still go out in order.
                waiter = asyncio.ensure_future(ordered.wait())
                await asyncio.wait({answer, waiter, sender}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
            answers.put_nowait(None)
            await sender
        except MalformedRequestError as exc:
            log.warning("closing %s: %s", session.peer, exc)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away
        except asyncio.CancelledError:
            pass
        except Exception:  # a handler's bug must cost one connection, not the listener; its traceback is logged
            log.exception("closing %s after an unexpected error", session.peer)
        finally:
            sender.cancel()
            self._rooms.discard(room)
            self._connections.discard(task)
            self.stats.closed()
            await self._connection_closed(session)
            writer.close()

    @staticmethod
    async def _send_answers(
        answers: asyncio.Queue[tuple[asyncio.Task[bytes | None], int] | None],
        writer: asyncio.StreamWriter,
        session: Session,
        room: _Unanswered,
    ) -> None:
        """Write the connection's responses in the order of its requests; stop at the first that closes it."""
        try:
            while (item := await answers.get()) is not None:
                answer, size = item
                response = await answer
                room.release(size)
                if response is not None:
                    writer.write(response)
                    await writer.drain()
                if session.attributes.pop("close_after_response", False):
                    # Kafka closes a connection whose authentication failed, after answering, and a moment later
                    # (the request loop goes on reading meanwhile, so nothing the client sent is left unread)
                    await asyncio.sleep(FAILED_AUTHENTICATION_DELAY_S)
                    break
        except MalformedRequestError as exc:
            log.warning("closing %s: %s", session.peer, exc)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            while not answers.empty():
                left = answers.get_nowait()
                if left is not None:
                    left[0].cancel()
            room.close()  # a reader waiting for room goes on, finds the connection closed, and ends
            writer.close()

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
        if session.principal is None and size > MAX_UNAUTHENTICATED_FRAME_BYTES:
            raise MalformedRequestError(
                f"frame of {size} bytes from {session.peer} before it authenticated is larger than "
                f"sasl.server.max.receive.size ({MAX_UNAUTHENTICATED_FRAME_BYTES})"
            )
        return await reader.readexactly(size)

    async def _answer(self, frame: bytes, session: Session, ordered: asyncio.Event) -> bytes | None:
        try:
            return await self._answer_in_order(frame, session, ordered)
        finally:
            ordered.set()

    async def _answer_in_order(self, frame: bytes, session: Session, ordered: asyncio.Event) -> bytes | None:
        if session.sasl is not None and not session.sasl_authenticate_api:
            from .sasl_session import raw_sasl_token

            return raw_sasl_token(session, frame)
        request = decode_request(frame, self.supported)
        if isinstance(request, UnsupportedVersion):
            return self._unsupported(request)
        api = self.apis[request.api_key]
        self.stats.request(api.name, len(frame) + _SIZE.size)
        if api.needs_auth and session.principal is None:
            raise MalformedRequestError(
                f"{session.peer} sent {api.name} before authenticating (SASL is required on this listener)"
            )
        if request.client_id is not None:
            session.client_id = request.client_id
        context = RequestContext(self, session, request.api_key, request.api_version, request.correlation_id, ordered)
        body = await self._handle(api, context, request)
        if body is None:  # a produce with acks=0 is not answered
            return None
        response = encode_response(request.correlation_id, body)
        self.stats.response(len(response))
        return response

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
        # A copy: a request of another connection may add a service while this one awaits a hook.
        for service in list(self.services.values()):
            hook = getattr(service, "connection_closed", None)
            if hook is not None:
                try:
                    await asyncio.get_running_loop().run_in_executor(self.executor, hook, session)
                except Exception as exc:  # noqa: BLE001 - one service's cleanup must not stop the others'
                    log.warning("cleanup after %s failed: %s", session.peer, exc)


def _bind_reason(exc: OSError) -> str:
    """Why a bind failed, in the system's words ("Address already in use"), without asyncio's wrapping."""
    if isinstance(exc, socket.gaierror) or not exc.errno or exc.errno < 0:
        return str(exc.strerror or exc)
    return os.strerror(exc.errno)


class _Unanswered:
    """A connection's requests read but not yet answered: how many and their bytes, each bounded."""

    def __init__(self) -> None:
        self.count = 0
        self.bytes = 0
        self.closed = False
        self._freed = asyncio.Event()

    async def wait(self) -> None:
        """Until another request may be read (or the connection's sender stopped)."""
        while not self.closed and (self.count >= MAX_UNANSWERED or self.bytes >= MAX_UNANSWERED_BYTES):
            self._freed.clear()
            await self._freed.wait()

    def add(self, size: int) -> None:
        self.count += 1
        self.bytes += size

    def release(self, size: int) -> None:
        self.count -= 1
        self.bytes -= size
        self._freed.set()

    def close(self) -> None:
        self.closed = True
        self._freed.set()
