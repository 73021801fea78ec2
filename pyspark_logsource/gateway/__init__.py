"""``plog serve``: a stateless Kafka-protocol gateway in front of a plog root (PROTOCOL.md 11.9).

Any Kafka client (librdkafka, the Java client, kafka-python, ...) produces to
and consumes from plog topics through it. The gateway keeps no state of its
own: what it writes goes to the root through the protocol's conditional
creates, so any number of gateways serve one root and killing one loses nothing.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from .config import GatewayConfig
from .handlers import all_apis
from .server import Gateway

__all__ = ["Gateway", "GatewayConfig", "run_gateway", "running_gateway"]


def run_gateway(config: GatewayConfig, metrics_port: int | None = None) -> None:
    """Serve until interrupted (``plog serve``); with ``metrics_port``, its metrics on 127.0.0.1 there."""

    async def main() -> None:
        gateway = Gateway(config, all_apis())
        endpoint = None
        if metrics_port is not None:
            from pyspark_logsource.client.openmetrics import serve_registry

            from .stats import gateway_metrics

            endpoint = serve_registry({"gateway": lambda: gateway_metrics(gateway)}, metrics_port)
        try:
            await gateway.serve_forever()
        finally:
            await gateway.close()
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
