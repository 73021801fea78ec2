"""What a gateway counts for its operators: requests by API, bytes in and out, connections, objects written.

The server counts on its event loop (one thread), so the counters are plain ints; ``snapshot`` reads
them from the metrics endpoint's thread, where a count one request behind is fine. The objects and
notices the produce batcher wrote, and the requests of the gateway's store, are read from where they
are kept (``ProduceBatcher.objects_written``, the root's ``CountingStore``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from pyspark_logsource.client.metrics import store_metrics

__all__ = ["GatewayStats", "gateway_metrics"]


class GatewayStats:
    """The server's counters (see the module docstring)."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self.bytes_in = 0
        self.bytes_out = 0
        self.connections_total = 0
        self.connections_open = 0

    def request(self, api: str, frame_bytes: int) -> None:
        """A request of ``api`` arrived in a frame of ``frame_bytes`` (its size prefix included)."""
        self.requests[api] += 1
        self.bytes_in += frame_bytes

    def response(self, nbytes: int) -> None:
        """A response of ``nbytes`` was made."""
        self.bytes_out += nbytes

    def opened(self) -> None:
        """A client connected."""
        self.connections_total += 1
        self.connections_open += 1

    def closed(self) -> None:
        """A client's connection ended."""
        self.connections_open -= 1


def gateway_metrics(gateway: Any) -> dict[str, Any]:
    """A ``Gateway``'s metrics by name (``plog serve --metrics-port`` serves them as ``plog_gateway_*``).

    ``gateway`` is typed loosely because the server imports this module: naming its class here would be
    an import circle, even for type checking only."""
    stats = gateway.stats
    produce = gateway.services.get("produce")
    requests = dict(stats.requests)
    return {
        "request-total": sum(requests.values()),
        "plog-requests-by-api-total": requests,
        "incoming-byte-total": stats.bytes_in,
        "outgoing-byte-total": stats.bytes_out,
        "connection-creation-total": stats.connections_total,
        "connection-count": stats.connections_open,
        "plog-objects-written-total": getattr(produce, "objects_written", 0),
        "plog-notices-written-total": getattr(produce, "notices_written", 0),
        **store_metrics(gateway.store),
    }
