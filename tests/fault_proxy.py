"""A fault-injecting HTTP proxy in front of the session's moto S3 server.

Real object stores throttle (``503 SlowDown``), fail (``500 InternalError``),
reset connections and lose answers. :class:`FaultProxy` does the same on
purpose, on a seeded schedule, so that tests can show plog's store and clients
survive it: it listens on 127.0.0.1 (an ephemeral port), forwards each request
to the upstream server byte for byte (a chunked upload stays chunked, headers
such as ``If-None-Match`` pass untouched) and, when the schedule says so,
injects one fault instead of (or after) forwarding:

``slowdown``      answer ``503 SlowDown`` with S3's XML error body, not forwarded;
``internal``      answer ``500 InternalError``, not forwarded;
``reset_before``  reset the connection (RST) before forwarding: nothing happened;
``reset_after``   forward, then reset: the request took effect, its answer is lost;
``delay``         forward, then hold the answer past the client's read timeout;
``lost_put``      forward a PUT, then reset: the case that matters most, since a
                  retried conditional PUT then meets its own object (412).

The proxy counts what it injected, by kind (:attr:`FaultProxy.injected`), so a
test can assert that the faults it relies on really happened. Everything runs
on daemon threads, and :meth:`FaultProxy.stop` (the fixture's finalizer) ends it.
"""

from __future__ import annotations

import http.client
import random
import re
import socket
import struct
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import pytest

#: Every kind of fault the proxy knows.
KINDS = ("slowdown", "internal", "reset_before", "reset_after", "delay", "lost_put")
#: Request headers that belong to one hop, not to the request (RFC 9110 7.6.1); ``Expect`` is
#: answered by the proxy itself (``100 Continue``) and must not make the upstream wait again.
_HOP_HEADERS = frozenset({"connection", "keep-alive", "proxy-connection", "te", "upgrade", "expect"})

_ERROR_BODY = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    "<Error><Code>{code}</Code><Message>{message}</Message>"
    "<RequestId>fault-proxy</RequestId><HostId>fault-proxy</HostId></Error>"
)


@dataclass
class FaultSchedule:
    """Which requests get which fault: a seeded coin per request, optionally filtered.

    A request is eligible when its method is in ``methods`` (all when empty)
    and ``key_pattern`` (a regular expression) is found in its object key (the
    path after the bucket; all when None). An eligible request gets a fault
    with probability ``probability``; the kind is drawn from ``kinds`` (only
    ``lost_put`` is restricted to PUTs: for other methods a draw of it falls
    back to ``reset_after``). After ``max_faults`` faults the schedule stops
    injecting. Decisions come from ``random.Random(seed)`` in the order the
    proxy sees requests.
    """

    seed: int
    probability: float
    kinds: Sequence[str] = KINDS
    methods: frozenset[str] = frozenset()
    key_pattern: str | None = None
    max_faults: int | None = None
    #: How long a ``delay`` holds the answer (longer than the client's read timeout).
    delay_s: float = 2.0
    _rng: random.Random = field(init=False, repr=False)
    _pattern: re.Pattern[str] | None = field(init=False, repr=False)
    _count: int = field(init=False, default=0, repr=False)

    def __post_init__(self) -> None:
        unknown = set(self.kinds) - set(KINDS)
        if unknown or not self.kinds:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {KINDS}")
        self._rng = random.Random(self.seed)
        self._pattern = re.compile(self.key_pattern) if self.key_pattern is not None else None

    def decide(self, method: str, key: str) -> str | None:
        """The fault for this request, or None to forward it untouched (not thread-safe: the proxy locks)."""
        if self.methods and method not in self.methods:
            return None
        if self._pattern is not None and not self._pattern.search(key):
            return None
        if self.max_faults is not None and self._count >= self.max_faults:
            return None
        # Both draws always happen, so one request's filter result does not shift the next one's coin.
        coin, kind = self._rng.random(), self._rng.choice(list(self.kinds))
        if coin >= self.probability:
            return None
        if kind == "lost_put" and method != "PUT":
            kind = "reset_after"
        self._count += 1
        return kind


class FaultProxy:
    """The proxy server: start it once, set a schedule per test, read what it injected."""

    def __init__(self, upstream: str) -> None:
        """Proxy to ``upstream`` (``http://host:port``); call :meth:`start` to listen."""
        parts = urlsplit(upstream)
        self.upstream_host = parts.hostname or "127.0.0.1"
        self.upstream_port = parts.port or 80
        self._lock = threading.Lock()
        self._schedule: FaultSchedule | None = None
        self._injected: Counter[str] = Counter()
        self._by_method: Counter[tuple[str, str]] = Counter()
        self._faults: list[tuple[str, str, str]] = []
        self._forwarded = 0
        self._stopping = threading.Event()
        #: Seconds each answer is held, by HTTP method (an object store's latency: S3's PUT about 30 ms, its
        #: GET about 15 ms), whatever the schedule; empty: none.
        self.latency_s: dict[str, float] = {}
        proxy = self

        class Handler(_ProxyHandler):
            owner = proxy

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)

    @property
    def url(self) -> str:
        """The proxy's endpoint URL, for ``endpoint_url``."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FaultProxy:
        """Listen and serve on a daemon thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, cut short any held answer, close the socket."""
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def set_schedule(self, schedule: FaultSchedule | None) -> None:
        """Inject by ``schedule`` from now on (None: forward everything); resets the counts."""
        with self._lock:
            self._schedule = schedule
            self._injected = Counter()
            self._by_method = Counter()
            self._faults = []
            self._forwarded = 0

    def stop_injecting(self) -> None:
        """Forward everything from now on, keeping the counts of what was injected."""
        with self._lock:
            self._schedule = None

    @property
    def injected(self) -> Counter[str]:
        """How many faults of each kind were injected since the schedule was set."""
        with self._lock:
            return Counter(self._injected)

    @property
    def injected_by_method(self) -> Counter[tuple[str, str]]:
        """How many faults of each (kind, HTTP method) were injected since the schedule was set."""
        with self._lock:
            return Counter(self._by_method)

    @property
    def faults(self) -> list[tuple[str, str, str]]:
        """Every fault injected since the schedule was set, in order, as (kind, HTTP method, object key).

        The key is empty for requests on the bucket (listings, batch deletes).
        """
        with self._lock:
            return list(self._faults)

    def lost_answers(self, method: str = "PUT") -> int:
        """How many ``method`` requests took effect and lost their answer (``lost_put``, ``reset_after``)."""
        by_method = self.injected_by_method
        return by_method[("lost_put", method)] + by_method[("reset_after", method)]

    @property
    def forwarded(self) -> int:
        """How many requests reached the upstream since the schedule was set."""
        with self._lock:
            return self._forwarded

    def _decide(self, method: str, key: str) -> str | None:
        with self._lock:
            kind = self._schedule.decide(method, key) if self._schedule is not None else None
            if kind is not None:
                self._injected[kind] += 1
                self._by_method[(kind, method)] += 1
                self._faults.append((kind, method, key))
            return kind

    def _delay_s(self) -> float:
        with self._lock:
            return self._schedule.delay_s if self._schedule is not None else 0.0

    def _count_forwarded(self) -> None:
        with self._lock:
            self._forwarded += 1


class _ProxyHandler(BaseHTTPRequestHandler):
    """One client connection: parse each request, maybe inject a fault, forward it, relay the answer."""

    owner: FaultProxy
    # HTTP/1.1: keep-alive connections as aiohttp uses them, and ``Expect: 100-continue`` answered.
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        """Quiet: a test's output is no place for an access log."""

    def do_GET(self) -> None:
        """Proxy a GET."""
        self._proxy()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

    def _read_body(self) -> tuple[list[bytes], bool]:
        """The request body as its chunks (one, unless the upload is chunked) and whether it was chunked."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while True:
                size_line = self.rfile.readline()
                size = int(size_line.split(b";", 1)[0].strip(), 16)
                if size == 0:
                    # Trailer fields (rare) end at an empty line; botocore's checksums travel in
                    # the aws-chunked body, not here.
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return chunks, True
                chunks.append(self.rfile.read(size))
                self.rfile.readline()  # the CRLF after the chunk
        length = int(self.headers.get("Content-Length") or 0)
        return [self.rfile.read(length)] if length else [], False

    def _reset(self) -> None:
        """Abort the connection with a TCP RST, as a crashed server or a load balancer does."""
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        except OSError:
            pass

    def _error(self, status: int, code: str, message: str) -> None:
        body = _ERROR_BODY.format(code=code, message=message).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _proxy(self) -> None:
        owner = self.owner
        chunks, chunked = self._read_body()
        key = urlsplit(self.path).path.lstrip("/").partition("/")[2]
        kind = owner._decide(self.command, key)
        if kind == "slowdown":
            self._error(503, "SlowDown", "Please reduce your request rate.")
            return
        if kind == "internal":
            self._error(500, "InternalError", "We encountered an internal error. Please try again.")
            return
        if kind == "reset_before":
            self._reset()
            return
        status, reason, headers, body = self._forward(chunks, chunked)
        latency = owner.latency_s.get(self.command, 0.0)
        if latency and owner._stopping.wait(latency):
            return
        if kind in ("reset_after", "lost_put"):
            self._reset()
            return
        if kind == "delay" and owner._stopping.wait(owner._delay_s()):
            return
        try:
            self.send_response(status, reason)
            for name, value in headers:
                if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(name, value)
            length = next((v for n, v in headers if n.lower() == "content-length"), None)
            # A HEAD's Content-Length is the object's size, not the (empty) body's.
            self.send_header("Content-Length", length if self.command == "HEAD" and length else str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        except OSError:  # the client gave up (a delayed answer): nothing to tell it
            self.close_connection = True

    def _forward(self, chunks: list[bytes], chunked: bool) -> tuple[int, str, list[tuple[str, str]], bytes]:
        """Send the request upstream as it came; return the upstream's status, reason, headers and body."""
        owner = self.owner
        conn = http.client.HTTPConnection(owner.upstream_host, owner.upstream_port, timeout=30)
        try:
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                if name.lower() not in _HOP_HEADERS:
                    conn.putheader(name, value)
            conn.endheaders()
            body: Iterator[bytes] = iter(chunks)
            for chunk in body:
                if chunked:
                    conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                else:
                    conn.send(chunk)
            if chunked:
                conn.send(b"0\r\n\r\n")
            response = conn.getresponse()
            data = response.read()
            owner._count_forwarded()
            return response.status, response.reason, list(response.getheaders()), data
        finally:
            conn.close()


# --------------------------------------------------------------------------- fixtures


@dataclass
class FaultyS3:
    """A fresh bucket reached through the proxy: the root URL, its storage options, and the proxy."""

    url: str
    options: dict[str, Any]
    proxy: FaultProxy
    #: The options that reach moto directly, for checking what was stored without faults.
    direct_options: dict[str, Any]

    def inject(self, seed: int, probability: float, **kwargs: Any) -> FaultSchedule:
        """Start injecting by a new schedule (and reset the counts); returns it."""
        schedule = FaultSchedule(seed, probability, **kwargs)
        self.proxy.set_schedule(schedule)
        return schedule

    def calm(self) -> None:
        """Stop injecting (the counts stay readable until the next schedule)."""
        self.proxy.stop_injecting()


#: Timeouts short enough that a held answer costs a test about a second, and a deadline that
#: bounds a test that goes wrong. botocore makes one try (its back-off waits up to 1 s, then 2 s,
#: real time that would dominate the run): the store's own loop, with short back-offs, retries.
#: Tests of botocore's retries set ``config_kwargs["retries"]`` themselves.
FAST_RETRY_OPTIONS: dict[str, Any] = {
    "config_kwargs": {
        "connect_timeout": 1,
        "read_timeout": 1,
        "retries": {"mode": "standard", "total_max_attempts": 1},
    },
    "plog_deadline_ms": 20_000,
    "plog_retry_backoff_ms": 20,
    "plog_retry_backoff_max_ms": 200,
}


@pytest.fixture(scope="session")
def fault_proxy(s3_endpoint: str) -> Iterator[FaultProxy]:
    """One fault proxy in front of the session's moto server; stopped at session end."""
    proxy = FaultProxy(s3_endpoint).start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def faulty_s3(s3_url: tuple[str, dict[str, Any]], fault_proxy: FaultProxy) -> Iterator[FaultyS3]:
    """A fresh bucket behind the proxy, injecting nothing until the test sets a schedule."""
    url, direct = s3_url
    fault_proxy.set_schedule(None)
    options = {**direct, **FAST_RETRY_OPTIONS, "endpoint_url": fault_proxy.url}
    try:
        yield FaultyS3(url, options, fault_proxy, direct)
    finally:
        fault_proxy.set_schedule(None)
