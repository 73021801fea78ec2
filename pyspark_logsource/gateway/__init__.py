"""``plog serve``: a stateless Kafka-protocol gateway in front of a plog root (PROTOCOL.md 11.9).

Any Kafka client (librdkafka, the Java client, kafka-python, ...) produces to
and consumes from plog topics through it. The gateway keeps no state of its
own: what it writes goes to the root through the protocol's conditional
creates, so any number of gateways serve one root and killing one loses nothing.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .config import GatewayConfig
from .errors import ListenError
from .handlers import all_apis
from .server import DRAIN_TIMEOUT_S, Gateway

__all__ = ["Gateway", "GatewayConfig", "ListenError", "run_gateway", "running_gateway"]


def run_gateway(
    config: GatewayConfig,
    metrics_port: int | None = None,
    on_ready: Callable[[Gateway, tuple[str, int] | None], None] | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT (``plog serve``); with ``metrics_port``, its metrics on 127.0.0.1 there.

    The listener is bound before anything is registered in the root, so a bind that fails leaves the root as it
    was and raises :class:`ListenError`. ``on_ready(gateway, metrics address)`` is called once the listener and
    the metrics endpoint are up (with the real ports when 0 was asked for). Either signal drains the requests
    already read (up to ``DRAIN_TIMEOUT_S``), deregisters, and returns.
    """

    async def main() -> None:
        gateway = Gateway(config, all_apis())
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        endpoint = None
        try:
            await gateway.start()
            address = None
            if metrics_port is not None:
                from pyspark_logsource.client.openmetrics import serve_registry

                from .stats import gateway_metrics

                endpoint = serve_registry({"gateway": lambda: gateway_metrics(gateway)}, metrics_port)
                address = ("127.0.0.1", endpoint.port)
            if on_ready is not None:
                on_ready(gateway, address)
            await stop.wait()
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
            await gateway.close(drain_s=DRAIN_TIMEOUT_S)
            if endpoint is not None:
                endpoint.close()

    asyncio.run(main())


@contextmanager
def running_gateway(config: GatewayConfig) -> Iterator[Gateway]:
    """A gateway serving in a background thread for the duration of the block (tests, notebooks)."""
    gateway = Gateway(config, all_apis())
    loop = asyncio.new_event_loop()
    started = threading.Event()
    failure: list[BaseException] = []

    def serve() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(gateway.start())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            failure.append(exc)
            started.set()
            return
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, name="plog-gateway-loop", daemon=True)
    thread.start()
    started.wait()
    if failure:
        raise failure[0]
    try:
        yield gateway
    finally:
        asyncio.run_coroutine_threadsafe(gateway.close(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
