"""What each metric means: the HELP line of every OpenMetrics family plog serves, and docs/metrics.md's words.

Names are Kafka's where Kafka has the metric (``record-send-rate``, ``outgoing-byte-rate``, ...) and start with
``plog-`` where the metric is plog's own (``plog-store-get-total``, ...). Rates and averages are over Kafka's
sampled windows (two of 30 s): they read low for the first 30 s of a client's life, as Kafka's do.
"""

from __future__ import annotations

#: Said of every rate and average: how it is measured, and why it reads low at first.
WINDOWED = " (over Kafka's sampled windows, 2 x 30 s: reads low for the first 30 s)"

METRIC_HELP: dict[str, str] = {
    # producer
    "record-send-rate": "records sent per second" + WINDOWED,
    "record-send-total": "records sent",
    "outgoing-byte-rate": "bytes of record batches written per second" + WINDOWED,
    "outgoing-byte-total": "bytes of record batches written",
    "request-rate": "produce requests (appends: one object each) per second" + WINDOWED,
    "request-total": "produce requests (appends: one object each)",
    "request-latency-avg": "milliseconds an append took, on average" + WINDOWED,
    "request-latency-max": "milliseconds the slowest append took" + WINDOWED,
    "record-error-rate": "records whose send failed, per second" + WINDOWED,
    "record-error-total": "records whose send failed",
    "batch-size-avg": "bytes per stored batch, on average" + WINDOWED,
    "batch-size-max": "bytes of the largest stored batch" + WINDOWED,
    "records-per-request-avg": "records per append (producer) or per fetch (consumer), on average" + WINDOWED,
    "produce-throttle-time-avg": "milliseconds sends waited for the producer's quotas, on average" + WINDOWED,
    "produce-throttle-time-max": "milliseconds of the longest wait for the producer's quotas" + WINDOWED,
    "buffer-total-bytes": "bytes the producer may buffer (buffer_memory)",
    "buffer-available-bytes": "bytes of buffer_memory not holding unsent records",
    "plog-queued-bytes": "bytes of records sent and not yet written",
    "plog-open-buffers": "buffers open for more records (one per topic being sent to)",
    "plog-buffers-in-flight": "sealed buffers being written",
    # consumer
    "records-consumed-rate": "records returned per second" + WINDOWED,
    "records-consumed-total": "records returned",
    "bytes-consumed-rate": "bytes of record batches returned per second" + WINDOWED,
    "bytes-consumed-total": "bytes of record batches returned",
    "fetch-rate": "fetch rounds per second" + WINDOWED,
    "fetch-total": "fetch rounds",
    "fetch-latency-avg": "milliseconds a fetch round took, on average" + WINDOWED,
    "fetch-latency-max": "milliseconds the slowest fetch round took" + WINDOWED,
    "fetch-size-avg": "bytes a fetch round returned, on average" + WINDOWED,
    "fetch-size-max": "bytes the largest fetch round returned" + WINDOWED,
    "fetch-throttle-time-avg": "milliseconds fetches waited for the consumer's quotas, on average" + WINDOWED,
    "fetch-throttle-time-max": "milliseconds of the longest wait for the consumer's quotas" + WINDOWED,
    "records-lag": "records between a partition's log end and the consumer's position, after its last read",
    "records-lag-max": "the largest records-lag of the assigned partitions now (0 once caught up)",
    # gateway
    "plog-requests-by-api-total": "Kafka requests answered, by API",
    "incoming-byte-total": "bytes of Kafka requests received",
    "connection-creation-total": "client connections accepted",
    "connection-count": "client connections open now",
    "plog-objects-written-total": "objects the gateway created for produced records (shared objects and segments)",
    "plog-notices-written-total": "change notices the gateway wrote after its flushes",
    # plog maintain
    "plog-passes-total": "maintenance passes run",
    "plog-last-pass-seconds": "seconds the last maintenance pass took",
    # every process: its store
    "plog-store-get-total": "GET requests to the store (whole and ranged reads)",
    "plog-store-put-total": "PUT requests to the store (creates and replaces)",
    "plog-store-list-total": "LIST requests to the store",
    "plog-store-head-total": "HEAD requests to the store",
    "plog-store-delete-total": "DELETE requests to the store",
    "plog-store-requests-total": "requests to the store, of every kind",
    "plog-store-errors-total": "store requests that failed",
    "plog-store-retries-total": "store requests retried after an error",
    "plog-store-cost-usd-total": "the store requests' price in US dollars at S3's list prices "
    "(PUT and LIST $0.005, GET and HEAD $0.0004 per 1,000, DELETE free)",
}


#: Where one name means another thing in another process (a gateway's requests are Kafka's, not appends).
METRIC_HELP_BY_KIND: dict[tuple[str, str], str] = {
    ("gateway", "request-total"): "Kafka requests answered",
    ("gateway", "outgoing-byte-total"): "bytes of Kafka responses sent",
}


def metric_help(name: str, kind: str = "") -> str:
    """The HELP line of metric ``name`` of a ``kind`` process (``producer``, ``gateway``, ...); a maintenance
    pass's counts (``plog-<what>-total``) say what they count."""
    found = METRIC_HELP_BY_KIND.get((kind, name)) or METRIC_HELP.get(name)
    if found is not None:
        return found
    if name.startswith("plog-") and name.endswith("-total"):
        return "maintenance passes' count of " + name[len("plog-") : -len("-total")].replace("-", " ")
    return name.replace("-", " ")
