"""An OpenMetrics (Prometheus) endpoint for any process that keeps metrics under Kafka-style names.

A :class:`SnapshotCollector` turns a ``metrics()`` dict (``record-send-rate``, ``plog-store-get-total``, ...)
into Prometheus families when scraped: a name ending in ``-total`` becomes a counter, anything else a
gauge, named ``plog_<prefix>_<name with _ for -, without its plog- prefix>``
(``plog_producer_record_send_rate``, ``plog_producer_record_send_total``, ``plog_producer_store_get_total``),
with the HELP line :mod:`~pyspark_logsource.client.metric_help` gives. A value that is a dict is one sample per
key, labelled: ``records-lag`` by ``topic`` and ``partition`` (its keys are ``topic-partition``), others by the
label :data:`LABELS` names. Nothing is computed between scrapes: a scrape costs one ``metrics()`` call.

:func:`serve_metrics` serves a producer's or consumer's metrics; ``plog serve --metrics-port`` and
``plog maintain --watch --metrics-port`` serve theirs with :func:`serve_registry`. Every endpoint binds
127.0.0.1 unless told otherwise: metrics name topics and groups, which are not for everyone.
``prometheus_client`` is the extra ``metrics`` (``pip install plog[metrics]``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from pyspark_logsource.client.metric_help import metric_help
from segment_format.errors import InvalidConfigError

__all__ = ["LABELS", "MetricsServer", "SnapshotCollector", "serve_metrics", "serve_registry"]

#: The labels of dict-valued metrics: key -> label names (a key ``a-b`` splits into two labels at its last ``-``).
LABELS: dict[str, tuple[str, ...]] = {
    "records-lag": ("topic", "partition"),
    "plog-requests-by-api-total": ("api",),
}


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:  # an optional dependency: say which
        raise InvalidConfigError(
            "metrics endpoints need prometheus_client: pip install 'plog[metrics]' (or prometheus-client)"
        ) from exc
    return prometheus_client


class SnapshotCollector:
    """A Prometheus collector of ``source()``'s dict, read at each scrape (see the module docstring)."""

    def __init__(self, prefix: str, source: Callable[[], Mapping[str, Any]]) -> None:
        self.prefix = prefix
        self.source = source

    def describe(self) -> list[Any]:
        """Nothing up front: the names are known only from a snapshot (so registering does not call ``source``)."""
        return []

    def collect(self) -> Iterator[Any]:
        """One family per metric of the current snapshot."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        for name, value in self.source().items():
            counter = name.endswith("-total")
            bare = name.removeprefix("plog-")  # every family is plog_<prefix>_...: plog's own need no second plog
            base = f"plog_{self.prefix}_{(bare[: -len('-total')] if counter else bare).replace('-', '_')}"
            labels = LABELS.get(name, ("key",)) if isinstance(value, Mapping) else ()
            text = metric_help(name, self.prefix)
            family = (
                CounterMetricFamily(base, text, labels=labels)
                if counter
                else GaugeMetricFamily(base, text, labels=labels)
            )
            if isinstance(value, Mapping):
                for key, item in sorted(value.items()):
                    parts = str(key).rsplit("-", len(labels) - 1) if len(labels) > 1 else [str(key)]
                    if len(parts) == len(labels):
                        family.add_metric(parts, float(item))
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                family.add_metric([], float(value))
            else:
                continue
            yield family


class MetricsServer:
    """An endpoint serving a registry over HTTP in a daemon thread; ``close`` stops it."""

    def __init__(self, server: Any, thread: Any) -> None:
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        """The port it listens on (the one the system chose for port 0)."""
        return int(self._server.server_address[1])

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def serve_registry(
    collectors: Mapping[str, Callable[[], Mapping[str, Any]]], port: int, host: str = "127.0.0.1"
) -> MetricsServer:
    """Serve a registry of ``{prefix: metrics source}`` on ``host:port`` (0: any free port) until closed."""
    prometheus_client = _prometheus()
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port < 65536:
        raise InvalidConfigError(f"metrics port must be an int in 0..65535, got {port!r}")
    registry = prometheus_client.CollectorRegistry()
    for prefix, source in collectors.items():
        registry.register(SnapshotCollector(prefix, source))
    try:
        server, thread = prometheus_client.start_http_server(port, addr=host, registry=registry)
    except OSError as exc:  # the port is taken, or the address is not this machine's
        raise InvalidConfigError(f"cannot serve metrics on {host}:{port}: {exc}") from exc
    return MetricsServer(server, thread)


def serve_metrics(client: Any, port: int, host: str = "127.0.0.1") -> MetricsServer:
    """Serve a ``Producer``'s or ``Consumer``'s ``metrics()`` on ``host:port`` (``plog_producer_*`` or
    ``plog_consumer_*``); returns the server, whose ``close()`` stops it."""
    kind = type(client).__name__.lower()
    if not callable(getattr(client, "metrics", None)):
        raise InvalidConfigError(f"serve_metrics needs a Producer or Consumer, got {type(client).__name__}")
    return serve_registry({kind: client.metrics}, port, host)
