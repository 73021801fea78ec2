"""What plog costs on object storage in requests: counted on the wire, priced at each product's list prices.

    python benchmarks/bench_requests.py [--backend s3|gcs|azure|all] [--quick] [--idle-seconds S] [--no-spark]
                                        [--by-key N] [--only SCENARIO] [--wide-topics N]

Every figure is counted by a small HTTP proxy on 127.0.0.1 in front of an
emulator started here, the same way the tests start it: a moto S3 server
(``tests/fixtures_s3.py``), fake-gcs-server (``tests/fixtures_gcs.py``) or
Azurite (``tests/fixtures_azure.py``, installed into ``.cache/azurite`` with
npm on first use). The proxy is the tests' fault proxy (``tests/fault_proxy.py``)
injecting nothing; it counts one request per HTTP request it forwards, by the
billing kind its method, path and query make it (``classify_s3``,
``classify_gcs``, ``classify_azure``). On S3 the moto server's own count is
checked against the proxy's. Nothing is estimated.

Scenarios (each in its own bucket or container):

* a producer: requests per MiB written, with ``send`` (one record at a time) and ``send_batch``;
* a consumer catching up on a backlog: requests per MiB read, from small appended objects
  and from merged segments;
* an idle consumer (nothing arriving) and an idle group member: requests per second,
  at 1, 8 and 64 partitions; then how long a record sent to the idle consumer's topic
  takes, from the send's acknowledgement, to come out of its poll;
* an idle consumer subscribed by pattern to 500 topics of one partition (``--wide-topics``):
  requests per second (the root change notice, PROTOCOL.md 9.1), and the same latency;
* ``plog serve`` (the Kafka-protocol gateway) as a real process, with ``--storage-option`` flags to
  reach the proxy: requests per MiB a librdkafka producer writes through it (1 KiB records at a steady
  1 MiB/s for 10 s), and per MiB a librdkafka consumer reads back through it from offset 0;
* a plog -> plog Spark pipeline (source, exactly-once sink): requests per micro-batch
  at 8 and 64 partitions (30 micro-batches of 4,000 records, ``maxOffsetsPerTrigger``).

Prices (``PRICES``), list prices for the product's figures, us-east-1 / US East where they vary by region;
DELETE is free on all three:

* S3 Standard (https://aws.amazon.com/s3/pricing/): PUT, COPY, POST and LIST $0.005 per 1,000;
  GET and HEAD $0.0004 per 1,000.
* GCS Standard storage (https://cloud.google.com/storage/pricing, operation charges): Class A
  (object uploads, compose and rewrite, listings) $0.005 per 1,000; Class B (object reads, metadata
  reads) $0.0004 per 1,000.
* Azure Blob Storage, hot tier, LRS (https://azure.microsoft.com/pricing/details/storage/blobs/):
  write operations $0.065 per 10,000, list (and create container) operations $0.065 per 10,000,
  read operations $0.005 per 10,000, all other operations (Get Blob Properties, a HEAD) $0.005 per 10,000.

Producer and consumer rows are priced at a steady 1 MiB/s, idle rows as they are,
pipeline rows at one micro-batch per second.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import logging
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

import numpy as np
import pyarrow as pa
from spark_common import machine  # also puts the project root on sys.path

from tests.fault_proxy import FaultProxy, _ProxyHandler
from tests.fixtures_s3 import AWS_ENV, AWS_ENV_REMOVED, REQUESTS, counting_moto_server, s3_storage_options

if TYPE_CHECKING:
    from segment_format.root import LogRoot

BACKENDS = ("s3", "gcs", "azure")

#: $ per 1,000 requests of each kind. S3 Standard (us-east-1) list prices.
S3_PUT_LIST_PER_1000 = 0.005
S3_GET_HEAD_PER_1000 = 0.0004
#: GCS Standard storage list prices: Class A (uploads, compose/rewrite, listings), Class B (reads, metadata).
GCS_CLASS_A_PER_1000 = 0.005
GCS_CLASS_B_PER_1000 = 0.0004
#: Azure Blob hot LRS list prices ($0.065, $0.065, $0.005 and $0.005 per 10,000).
AZURE_WRITE_PER_1000 = 0.0065
AZURE_LIST_PER_1000 = 0.0065
AZURE_READ_PER_1000 = 0.0005
AZURE_OTHER_PER_1000 = 0.0005

#: $ per request, by backend and the kind this script counts (a kind missing is free: DELETE on all three).
PRICES: dict[str, dict[str, float]] = {
    "s3": {
        "PUT": S3_PUT_LIST_PER_1000 / 1000,
        "POST": S3_PUT_LIST_PER_1000 / 1000,
        "LIST": S3_PUT_LIST_PER_1000 / 1000,
        "GET": S3_GET_HEAD_PER_1000 / 1000,
        "HEAD": S3_GET_HEAD_PER_1000 / 1000,
    },
    "gcs": {
        "PUT": GCS_CLASS_A_PER_1000 / 1000,
        "POST": GCS_CLASS_A_PER_1000 / 1000,
        "LIST": GCS_CLASS_A_PER_1000 / 1000,
        "GET": GCS_CLASS_B_PER_1000 / 1000,
        "HEAD": GCS_CLASS_B_PER_1000 / 1000,
    },
    "azure": {
        "PUT": AZURE_WRITE_PER_1000 / 1000,
        "POST": AZURE_WRITE_PER_1000 / 1000,
        "LIST": AZURE_LIST_PER_1000 / 1000,
        "GET": AZURE_READ_PER_1000 / 1000,
        "HEAD": AZURE_OTHER_PER_1000 / 1000,
    },
}
#: How each backend's kinds are named in its own billing, for the table's footnote.
PRICE_NOTES = {
    "s3": "S3 Standard: PUT/POST/LIST $0.005 and GET/HEAD $0.0004 per 1,000",
    "gcs": "GCS Standard: Class A (PUT, LIST) $0.005 and Class B (GET, HEAD: metadata) $0.0004 per 1,000",
    "azure": "Azure Blob hot LRS: write (PUT) and list $0.0065, read (GET) and other (HEAD) $0.0005 per 1,000",
}
EMULATORS = {"s3": "a moto S3 server", "gcs": "fake-gcs-server", "azure": "Azurite"}
KINDS = ("PUT", "LIST", "GET", "HEAD", "DELETE", "POST")
DAY_S = 86_400

#: Runs of digits and hex ids (topic ids, hashes) in a key: collapsed into ``#`` in a key's shape.
_DIGITS = re.compile(r"[0-9a-f]{8,}|\d+")
#: A GCS JSON API path, before unquoting (an object name's ``/`` is ``%2F`` there, so ``/compose`` stands out).
_GCS_UPLOAD_NAME = re.compile(rb'"name"\s*:\s*"([^"]*)"')
_GCS_PATH = re.compile(
    r"^/(?P<api>upload/|download/)?storage/v1/b/(?P<bucket>[^/]+)(?P<objects>/o(?:/(?P<obj>[^/]+)(?P<verb>/.*)?)?)?$"
)


def classify_s3(method: str, path: str, query: str, body: bytes = b"") -> tuple[str, str, str]:
    """(bucket, kind, key or listed prefix) of an S3 request (path-style), as the moto counter classifies it."""
    bucket, _, key = path.lstrip("/").partition("/")
    params = parse_qs(query)
    if method == "GET" and not key and ("list-type" in params or not query):
        return bucket, "LIST", "list " + params.get("prefix", [""])[0]
    return bucket, method, unquote(key)


def classify_gcs(method: str, path: str, query: str, body: bytes = b"") -> tuple[str, str, str]:
    """(bucket, kind, object name or listed prefix) of a GCS JSON API request (``body``: its first bytes).

    Class A: uploads (``/upload/...``, any method), compose/rewrite/copy, metadata updates, listings
    (``GET .../o``). Class B: media reads (``alt=media``, ``/download/...``) as GET, metadata reads of an
    object or a bucket as HEAD. A batch request (``/batch/storage/v1``) is one POST here; plog's stores
    send deletes one by one, which are free.
    """
    params = parse_qs(query)
    m = _GCS_PATH.match(path)
    if m is None:
        return "", method, path
    bucket, obj = unquote(m["bucket"]), unquote(m["obj"] or "")
    if m["api"] == "upload/":
        # A multipart upload names its object in the JSON part of its body, not in the query.
        named = _GCS_UPLOAD_NAME.search(body)
        return bucket, "PUT", params.get("name", [named[1].decode() if named else obj])[0]
    if method == "DELETE":
        return bucket, "DELETE", obj
    if m["objects"] and not obj:
        return bucket, ("LIST" if method == "GET" else "PUT"), "list " + params.get("prefix", [""])[0]
    if m["verb"] or method in ("POST", "PUT", "PATCH"):
        return bucket, "PUT", obj
    if method == "GET" and (m["api"] == "download/" or params.get("alt") == ["media"]):
        return bucket, "GET", obj
    return bucket, "HEAD", obj  # metadata of an object (or of the bucket): Class B


def classify_azure(method: str, path: str, query: str, body: bytes = b"") -> tuple[str, str, str]:
    """(container, kind, blob name or listed prefix) of an Azure Blob request (``/<account>/<container>/<blob>``).

    Write: every PUT (Put Blob, Put Block, Put Block List, Set Metadata). List: ``comp=list``. Read: Get Blob.
    Other (HEAD here): Get Blob Properties and Metadata, container properties. Delete: free.
    """
    parts = path.lstrip("/").split("/", 2)
    container = unquote(parts[1]) if len(parts) > 1 else ""
    blob = unquote(parts[2]) if len(parts) > 2 else ""
    params = parse_qs(query)
    comp = params.get("comp", [""])[0]
    if method == "GET" and comp == "list":
        return container, "LIST", "list " + params.get("prefix", [""])[0]
    if method == "GET" and blob and not comp:
        return container, "GET", blob
    if method in ("GET", "HEAD"):
        return container, "HEAD", blob
    return container, method, blob


#: (method, path, query, the body's first bytes) -> (bucket, kind, key or listed prefix).
Classifier = Callable[[str, str, str, bytes], tuple[str, str, str]]
CLASSIFIERS: dict[str, Classifier] = {
    "s3": classify_s3,
    "gcs": classify_gcs,
    "azure": classify_azure,
}


class RequestCounts:
    """Requests by bucket and kind, and by key shape (the key with every run of digits as ``#``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()
        self._shapes: Counter[tuple[str, str, str]] = Counter()

    def record(self, bucket: str, kind: str, where: str) -> None:
        """Count one request."""
        shape = _DIGITS.sub("#", where)
        with self._lock:
            self._counts[(bucket, kind)] += 1
            self._shapes[(bucket, kind, shape)] += 1

    def of(self, bucket: str) -> Counter[str]:
        """The counts of one bucket by kind, as of now."""
        with self._lock:
            return Counter({kind: n for (b, kind), n in self._counts.items() if b == bucket})

    def shapes(self, bucket: str) -> Counter[tuple[str, str]]:
        """The counts of one bucket by (kind, key shape), as of now: where the requests went."""
        with self._lock:
            return Counter({(kind, shape): n for (b, kind, shape), n in self._shapes.items() if b == bucket})


class CountingProxy(FaultProxy):
    """The tests' fault proxy, injecting nothing, counting every request it forwards by ``classify``."""

    def __init__(self, upstream: str, classify: Classifier) -> None:
        """Proxy to ``upstream``; call :meth:`start` to listen."""
        super().__init__(upstream)
        self.counts = RequestCounts()
        proxy = self

        class Handler(_ProxyHandler):
            owner = proxy

            def _read_body(self) -> tuple[list[bytes], bool]:
                # The first thing the handler does with a request: count it here, body in hand.
                chunks, chunked = super()._read_body()
                split = urlsplit(self.path)
                head = chunks[0][:4096] if chunks else b""
                proxy.counts.record(*classify(self.command, split.path, split.query, head))
                return chunks, chunked

            # gcsfs updates metadata with PATCH; nothing here should meet a method the proxy cannot forward.
            do_PATCH = do_OPTIONS = _ProxyHandler.do_GET

        self._server.RequestHandlerClass = Handler


class Bench:
    """An emulator behind a counting proxy, a bucket per scenario, and the table rows collected."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        os.environ["NO_PROXY"] = os.environ["no_proxy"] = "127.0.0.1,localhost"
        self._workdir = tempfile.TemporaryDirectory(prefix=f"bench-requests-{backend}-")
        self._process: subprocess.Popen[bytes] | None = None
        self._moto: Any = None
        upstream = self._start_emulator()
        self.proxy = CountingProxy(upstream, CLASSIFIERS[backend]).start()
        self.counts = self.proxy.counts
        self.direct_options = self._options(upstream)
        self.options = self._options(self.proxy.url)
        self.rows: list[tuple[str, str, float, Counter[str], float]] = []
        #: (what the consumer reads: "8" partitions of one topic or "500 topics", ms from acknowledgement
        #: to an idle consumer's poll returning the record, per trial).
        self.latencies: list[tuple[str, list[float]]] = []
        #: Print this many of each scenario's most requested key shapes (0: none).
        self.by_key = 0

    def _start_emulator(self) -> str:
        """Start this backend's emulator as the tests do; its endpoint URL."""
        workdir = Path(self._workdir.name)
        if self.backend == "s3":
            for name, value in AWS_ENV.items():
                os.environ[name] = value
            for name in AWS_ENV_REMOVED:
                os.environ.pop(name, None)
            import moto.server

            logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
            self._moto = counting_moto_server(moto.server)
            self._moto.start()
            host, port = self._moto.get_host_and_port()
            return f"http://{host}:{port}"
        if self.backend == "gcs":
            from tests.fixtures_gcs import start_fake_gcs_server

            self._process, url = start_fake_gcs_server(workdir)
            return url
        from tests.fixtures_azure import start_azurite

        self._process, url = start_azurite(workdir)
        return url

    def _options(self, endpoint: str) -> dict[str, Any]:
        """The fsspec storage options that reach ``endpoint``."""
        if self.backend == "s3":
            return s3_storage_options(endpoint)
        if self.backend == "gcs":
            from tests.fixtures_gcs import gcs_storage_options

            return gcs_storage_options(endpoint)
        from tests.fixtures_azure import azure_storage_options

        return azure_storage_options(endpoint)

    def spark_options(self) -> dict[str, str]:
        """The Spark ``storage.*`` options that reach the proxy."""
        from pyspark_logsource.spark.credentials import spark_storage_options

        options = self.options
        if self.backend == "s3":  # the rest of the S3 options are the tests' client tuning
            options = {k: v for k, v in options.items() if k in ("endpoint_url", "key", "secret")}
        return spark_storage_options(options)

    def bucket(self) -> tuple[str, str]:
        """A fresh bucket (container on Azure), made directly at the emulator; returns (its name, the plog root URL)."""
        name = f"bench-{uuid.uuid4().hex[:12]}"
        if self.backend == "s3":
            import boto3

            admin = boto3.client(
                "s3",
                endpoint_url=self.direct_options["endpoint_url"],
                aws_access_key_id="testing",
                aws_secret_access_key="testing",
                region_name="us-east-1",
            )
            admin.create_bucket(Bucket=name)
            admin.close()
            return name, f"s3://{name}/plog"
        if self.backend == "gcs":
            from gcsfs.core import GCSFileSystem

            GCSFileSystem(**self.direct_options, skip_instance_cache=True).mkdir(name)
            return name, f"gs://{name}/plog"
        from adlfs import AzureBlobFileSystem

        AzureBlobFileSystem(**self.direct_options, skip_instance_cache=True).mkdir(name)
        return name, f"abfs://{name}/plog"

    def count(self, bucket: str, work: Callable[[], float]) -> tuple[Counter[str], float]:
        """Run ``work`` (which returns its unit count) and return the requests it made, and the units."""
        before, shapes_before = self.counts.of(bucket), self.counts.shapes(bucket)
        moto_before = REQUESTS.of(bucket)
        units = work()
        self.print_shapes(self.counts.shapes(bucket) - shapes_before, units)
        spent = self.counts.of(bucket) - before
        if self.backend == "s3":
            # moto counts at its own door: the proxy must have seen exactly what it answered.
            moto = REQUESTS.of(bucket) - moto_before
            if moto != spent:
                print(f"      the proxy counted {dict(spent)}, moto {dict(moto)}", flush=True)
        return spent, units

    def print_shapes(self, shapes: Counter[tuple[str, str]], units: float, note: str = "") -> None:
        """With ``--by-key``: the most requested key shapes, per unit."""
        for (kind, shape), n in shapes.most_common(self.by_key):
            print(f"      {n / max(units, 1e-9):9.2f} {kind:6} {shape}{note}", flush=True)

    def row(self, scenario: str, unit: str, units: float, spent: Counter[str], units_per_day: float) -> None:
        """Record one table row: requests per unit, and $ per day at ``units_per_day``."""
        per = Counter({k: v / units for k, v in spent.items()}) if units else Counter()
        self.rows.append((scenario, unit, units, per, units_per_day))
        total = sum(per.values())
        print(f"  {scenario}: {total:,.2f} requests per {unit}", flush=True)

    def stop(self) -> None:
        """Stop the proxy and the emulator."""
        self.proxy.stop()
        if self._moto is not None:
            self._moto.stop()
        if self._process is not None:
            from tests.fixtures_gcs import stop_process

            stop_process(self._process)
        self._workdir.cleanup()


def values(n: int, size: int, seed: int = 7) -> pa.Array:
    """``n`` random ``size``-byte binary values."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, n * size, dtype=np.uint8).tobytes()
    offsets = np.arange(0, (n + 1) * size, size, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def producer_rows(bench: Bench, mib: float) -> None:
    """Requests per MiB written, with send and with send_batch (8 partitions, 100 B values)."""
    from pyspark_logsource import LogStore, Producer

    n = int(mib * 2**20 / 100)
    vals = values(n, 100)
    for mode in ("send", "send_batch"):
        bucket, url = bench.bucket()
        with LogStore(url, storage_options=bench.options) as store:
            store.create_topic("t", 8)

        def work(mode: str = mode, url: str = url) -> float:
            with Producer(url, storage_options=bench.options, linger_ms=50) as producer:
                if mode == "send":
                    for i, v in enumerate(vals.to_pylist()):
                        producer.send("t", v, key=str(i % 1000).encode())
                else:
                    keys = pa.array([str(i % 1000).encode() for i in range(n)], pa.binary())
                    producer.send_batch("t", pa.table({"key": keys, "value": vals}))
                producer.flush()
            return n * 100 / 2**20

        spent, units = bench.count(bucket, work)
        bench.row(f"producer `{mode}`, 8 partitions, 100 B records", "MiB written", units, spent, DAY_S)


WIDE_PARTITIONS = 64
WIDE_RATE_MIB_S = 10.0


def wide_producer_rows(bench: Bench, tables: int, seconds: float) -> None:
    """Requests per MiB written into 64 partitions, in each storage layout side by side: ``send_batch`` of 1 MB
    tables (10,000 keyed rows), and ``send`` of 1 KiB values paced at 10 MiB/s, every request of the
    producer's process counted (its maintenance passes too), at the default flush settings."""
    from pyspark_logsource import LogStore, Producer

    rows = 10_000
    table_values = values(rows, 100)
    table_keys = pa.array([b"key-%d" % i for i in range(rows)], pa.binary())
    send_values = values(1024, 1024, seed=11).to_pylist()
    for layout in ("partitioned", "shared"):
        bucket, url = bench.bucket()
        with LogStore(url, storage_options=bench.options) as store:
            store.create_topic("batch", WIDE_PARTITIONS, {"storage.layout": layout})
            store.create_topic("send", WIDE_PARTITIONS, {"storage.layout": layout})

        for wait in (True, False):

            def batches(url: str = url, wait: bool = wait) -> float:
                with Producer(url, storage_options=bench.options) as producer:
                    for _ in range(tables):
                        producer.send_batch("batch", pa.table({"key": table_keys, "value": table_values}), wait=wait)
                return tables * rows * 100 / 2**20

            spent, units = bench.count(bucket, batches)
            how = "each waited for" if wait else "pipelined (`wait=False`)"
            bench.row(
                f"`send_batch` of 1 MB tables, {how}, 64 partitions, {layout}", "MiB written", units, spent, DAY_S
            )

        def paced(url: str = url) -> float:
            per_tick = len(send_values)  # 1 MiB of 1 KiB values
            tick_s = 1.0 / WIDE_RATE_MIB_S
            ticks = int(seconds * WIDE_RATE_MIB_S)
            started = time.monotonic()
            with Producer(url, storage_options=bench.options) as producer:
                for tick in range(ticks):
                    for i, value in enumerate(send_values):
                        producer.send("send", value, key=b"k%d" % (tick * per_tick + i))
                    ahead = started + (tick + 1) * tick_s - time.monotonic()
                    if ahead > 0:
                        time.sleep(ahead)
                producer.flush()
            return ticks * per_tick * 1024 / 2**20

        spent, units = bench.count(bucket, paced)
        bench.row(
            f"`send` of 1 KiB values at {WIDE_RATE_MIB_S:g} MiB/s, 64 partitions, {layout}",
            "MiB written",
            units,
            spent,
            DAY_S * WIDE_RATE_MIB_S,
        )


LIFETIME_DAY_MS = 24 * 60 * 60 * 1000


def lifetime_rows(bench: Bench, seconds: float) -> None:
    """What a GiB costs over its whole life, in each storage layout side by side: written at 10 MiB/s into 64
    partitions (``send`` of 1 KiB keyed values, default settings, the producer's own maintenance counted), read
    once by a consumer group (offsets committed), then maintained on the maintainer's clock (moves, merges,
    commit ranges, collection D later, the root collector), retained (7 days) and deleted. Every request of
    every step is counted; what is left of the topic's data at the end is printed."""
    from segment_format.root import LogRoot  # noqa: F811 - at run time, after the emulator's environment

    for layout in ("partitioned", "shared"):
        life = Lifetime(bench, layout, seconds)
        spent, units = bench.count(life.bucket, life.run)
        left = [i.key for i in LogRoot(life.url, bench.direct_options).store.list("") if _is_data(i.key)]
        print(f"    left after the lifetime: {len(left)} data objects", flush=True)
        bench.row(
            f"lifetime of data written at {WIDE_RATE_MIB_S:g} MiB/s into 64 partitions: written, read once by a "
            f"group, maintained, retained, deleted; {layout}",
            "GiB written",
            units,
            spent,
            DAY_S * WIDE_RATE_MIB_S / 1024,
        )


def _is_data(key: str) -> bool:
    return "/log/" in key or key.startswith("shared/") or "/shared/" in key


class Lifetime:
    """One topic's life for :func:`lifetime_rows`, step by step; with ``--by-key``, each step's requests."""

    def __init__(self, bench: Bench, layout: str, seconds: float) -> None:
        from pyspark_logsource import LogStore

        self.bench = bench
        self.seconds = seconds
        self.bucket, self.url = bench.bucket()
        with LogStore(self.url, storage_options=bench.options) as store:
            store.create_topic("life", WIDE_PARTITIONS, {"storage.layout": layout})
        self.mark = bench.counts.shapes(self.bucket)

    def stage(self, name: str) -> None:
        """The step ``name`` just ended: print its requests (with ``--by-key``)."""
        now = self.bench.counts.shapes(self.bucket)
        if self.bench.by_key:
            print(f"    {name}: {sum((now - self.mark).values())} requests", flush=True)
            self.bench.print_shapes(now - self.mark, 1)
        self.mark = now

    def maintain_at(self, root: LogRoot, later_ms: int) -> None:
        """A maintenance pass of the topic and the root collector, as of ``later_ms`` from now, by ``root``'s
        process (one maintainer for every pass, as ``plog maintain --watch`` runs)."""
        from coordinator.collection import collect
        from segment_format.records import now_ms

        root.maintain("life", now=now_ms() + later_ms)
        collect(root.store, now_ms=now_ms() + later_ms)

    def run(self) -> float:
        """Write, read, maintain, retain and delete; GiB written."""
        from pyspark_logsource import Consumer, Producer
        from segment_format.root import LogRoot
        from segment_format.shared.sequence import COMMIT_DEADLINE_MS

        options = self.bench.options
        send_values = values(1024, 1024, seed=13).to_pylist()
        ticks = int(self.seconds * WIDE_RATE_MIB_S)
        started = time.monotonic()
        with Producer(self.url, storage_options=options) as producer:
            for tick in range(ticks):
                for i, value in enumerate(send_values):
                    producer.send("life", value, key=b"k%d" % (tick * len(send_values) + i))
                ahead = started + (tick + 1) / WIDE_RATE_MIB_S - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
        self.stage("written")
        with Consumer(self.url, storage_options=options, group_id="readers", auto_offset_reset="earliest") as reader:
            reader.subscribe(["life"])
            got = 0
            while got < ticks * len(send_values):
                got += sum(len(records) for records in reader.poll(timeout_ms=1000, max_records=50_000).values())
            reader.commit()
        self.stage("read")
        with LogRoot(self.url, options) as root:  # the configuration alone: one GET, not a description
            config = root.topic("life").config
        move_ms, delay_ms = int(config.get("shared.move.ms", 0)), int(config["file.delete.delay.ms"])
        retention_ms = int(config["retention.ms"])
        with LogRoot(self.url, options) as maintainer:
            for later_ms in (
                move_ms + 1,  # runs old enough to move; segments merged
                move_ms + delay_ms + 2,  # what they superseded, D later
                move_ms + COMMIT_DEADLINE_MS + 2 * delay_ms + 3,  # shared objects nobody names any more
                retention_ms + LIFETIME_DAY_MS,  # retention
                retention_ms + LIFETIME_DAY_MS + COMMIT_DEADLINE_MS + 2 * delay_ms,  # and the garbage it left
            ):
                self.maintain_at(maintainer, later_ms)
                self.stage(f"maintained at +{later_ms / 3_600_000:.2f} h")
        return ticks * len(send_values) * 1024 / 2**30


@contextlib.contextmanager
def gateway_process(url: str, options: dict[str, Any]) -> Iterator[str]:
    """``plog serve`` on ``url`` as a real process, its storage options as ``--storage-option`` flags
    (JSON for what is not a string); its bootstrap address. Stopped with SIGINT (a clean deregistration)."""
    from pyspark_logsource.cli.common import storage_option_args
    from tests.gateway_fixtures import free_port, wait_listening

    port = free_port()
    flags = storage_option_args(options)
    project = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [project, os.environ.get("PYTHONPATH")])))
    command = [sys.executable, "-m", "pyspark_logsource.cli", "serve", "--url", url]
    command += ["--listen", f"127.0.0.1:{port}", *flags]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(port, proc=proc)
        yield f"127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


#: The gateway rows' records: 1 KiB values, produced at a steady 1 MiB/s (the rate the $ column prices).
GATEWAY_VALUE_BYTES = 1024
#: (MiB/s, partitions) of the gateway's produce rows; the consumer row reads the first back.
GATEWAY_GRID = [(1, 6), (10, 6), (1, 64), (10, 64)]


def gateway_rows(bench: Bench, seconds: float) -> None:
    """Requests per MiB produced through one ``plog serve`` process by librdkafka (1 KiB records at a steady
    rate for ``seconds``, linger.ms 5, acks=all, idempotent), at each (rate, partitions) of :data:`GATEWAY_GRID`
    and the gateway's default flush interval; per MiB a librdkafka consumer then reads the first back from
    offset 0 through it; and per second with an idle producer and consumer connected. Everything the gateway
    does while counted is in the row: its registration heartbeats, change notices, tail reads."""
    import confluent_kafka

    from pyspark_logsource import LogStore

    bucket, url = bench.bucket()
    with LogStore(url, storage_options=bench.options) as store:
        for rate, partitions in GATEWAY_GRID:
            store.create_topic(f"t{rate}x{partitions}", partitions)
    quiet = {"log_level": 0, "logger": lambda *a: None}
    value = os.urandom(GATEWAY_VALUE_BYTES // 2) * 2
    with gateway_process(url, bench.options) as bootstrap:
        producer = confluent_kafka.Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all", "enable.idempotence": True, **quiet}
        )
        for rate, partitions in GATEWAY_GRID:
            topic = f"t{rate}x{partitions}"
            for p in range(partitions):  # warm-up: metadata, the producer id, every partition's producer state
                producer.produce(topic, b"warm-up", partition=p)
            if producer.flush(60):
                raise RuntimeError("the gateway's warm-up produce did not complete")
            per_s = rate * 2**20 // GATEWAY_VALUE_BYTES
            n = int(seconds * per_s)

            def produce(topic: str = topic, n: int = n, per_s: int = per_s) -> float:
                start = time.monotonic()
                for i in range(n):
                    # A steady rate: each record waits for its moment (sleeping in 10 ms steps).
                    delay = start + i / per_s - time.monotonic()
                    if delay > 0.01:
                        time.sleep(delay)
                    while True:
                        try:
                            producer.produce(topic, value)
                            break
                        except BufferError:
                            producer.poll(0.001)
                    producer.poll(0)
                if producer.flush(120):
                    raise RuntimeError("records produced through the gateway were not delivered")
                return n * GATEWAY_VALUE_BYTES / 2**20

            spent, units = bench.count(bucket, produce)
            name = f"gateway: librdkafka producer, 1 KiB records at {rate} MiB/s, {partitions} partitions"
            bench.row(name, "MiB written", units, spent, DAY_S)

        first_rate, first_partitions = GATEWAY_GRID[0]
        first = f"t{first_rate}x{first_partitions}"
        expected = int(seconds * first_rate * 2**20 // GATEWAY_VALUE_BYTES) + first_partitions
        consumer = confluent_kafka.Consumer(
            {"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False, **quiet}
        )

        def fetch() -> float:
            consumer.assign([confluent_kafka.TopicPartition(first, p, 0) for p in range(first_partitions)])
            got, deadline = 0, time.monotonic() + 300
            while got < expected:
                got += sum(1 for m in consumer.consume(10_000, timeout=1.0) if m.error() is None)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {got} of {expected} records read through the gateway")
            return (expected - first_partitions) * GATEWAY_VALUE_BYTES / 2**20

        try:
            spent, units = bench.count(bucket, fetch)
            bench.row(
                f"gateway: librdkafka consumer catching up, {first_partitions} partitions",
                "MiB read",
                units,
                spent,
                DAY_S,
            )

            def idle() -> float:  # the consumer waits at the end (long polls), the producer stays connected
                until = time.monotonic() + seconds
                while time.monotonic() < until:
                    consumer.consume(100, timeout=0.5)
                    producer.poll(0)
                return seconds

            spent, units = bench.count(bucket, idle)
            bench.row("gateway with an idle producer and an idle consumer connected", "second", units, spent, DAY_S)
        finally:
            consumer.close()


def catch_up(url: str, options: dict[str, Any], topic: str, partitions: int, n: int) -> float:
    """Read every partition of ``topic`` from the start to its end, checking ``n`` records came; MiB read."""
    from pyspark_logsource import Consumer, TopicPartition

    consumer = Consumer(url, storage_options=options, auto_offset_reset="earliest")
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        table = consumer.read_to_end()
    finally:
        consumer.close()
    assert table.num_rows == n, (table.num_rows, n)
    return n * 210 / 2**20


def consumer_row(bench: Bench, mib: float) -> None:
    """Requests per MiB read by a consumer catching up on a backlog written as many small appends, on a shared
    and on a partitioned topic (a shared topic's writer merges each tier of sixteen small commits it completes)."""
    from pyspark_logsource import LogStore, Producer

    n = int(mib * 2**20 / 210)
    vals = values(n, 210)
    for layout in ("shared", "partitioned"):
        bucket, url = bench.bucket()
        with LogStore(url, storage_options=bench.options) as store:
            store.create_topic("t", 8, {"storage.layout": layout})
        with Producer(url, storage_options=bench.options) as producer:
            step = max(1, n // 200)  # about 200 appends, as in issue #11's measurement
            for lo in range(0, n, step):
                producer.send_batch("t", pa.table({"value": vals[lo : lo + step]}))

        spent, units = bench.count(bucket, lambda url=url: catch_up(url, bench.options, "t", 8, n))
        bench.row(f"consumer catching up, 8 partitions, ~200 appends, {layout}", "MiB read", units, spent, DAY_S)


def merged_consumer_row(bench: Bench, segment_mib: int) -> None:
    """Requests per MiB read by a consumer catching up on merged segments of ``segment_mib`` (issue #11: at
    most 1 GET per 4 MiB). 17 appends of a 16th of a segment each: 16 merged into one segment, and the tail."""
    from pyspark_logsource import LogStore, Producer
    from segment_format.root import LogRoot

    bucket, url = bench.bucket()
    segment_bytes = segment_mib * 2**20
    with LogStore(url, storage_options=bench.options) as store:
        # Merged by the explicit pass below, not by the producer as it writes.
        store.create_topic("m", 1, {"auto.maintenance.enable": False, "segment.bytes": segment_bytes})
    per_append = segment_bytes // 16 // 210
    n = 17 * per_append
    vals = values(n, 210)
    with Producer(url, storage_options=bench.options) as producer:
        for lo in range(0, n, per_append):
            producer.send_batch("m", pa.table({"value": vals[lo : lo + per_append]}))
    root = LogRoot(url, bench.options)
    try:
        root.maintain("m")
        merged = [ref.size for ref in root.partition("m", 0).view().segments if ref.generation > 0]
    finally:
        root.close()
    assert len(merged) == 1, merged

    spent, units = bench.count(bucket, lambda: catch_up(url, bench.options, "m", 1, n))
    name = f"consumer catching up on a merged segment of {merged[0] / 2**20:.0f} MiB and its tail"
    bench.row(name, "MiB read", units, spent, DAY_S)


def idle_rows(bench: Bench, seconds: float, partition_counts: list[int]) -> None:
    """Requests per second of an idle consumer and an idle group member, by partition count."""
    from pyspark_logsource import Consumer, LogStore

    for partitions in partition_counts:
        for group in (None, "g"):
            bucket, url = bench.bucket()
            with LogStore(url, storage_options=bench.options) as store:
                store.create_topic("t", partitions)
            consumer = Consumer(url, storage_options=bench.options, group_id=group, auto_offset_reset="latest")
            consumer.subscribe(["t"])
            # Settle first (joining a group, first positions), then count a steady idle stretch.
            settle = time.monotonic() + 5
            while time.monotonic() < settle:
                consumer.poll(timeout_ms=500)

            def work(consumer: Any = consumer) -> float:
                start = time.monotonic()
                while time.monotonic() - start < seconds:
                    consumer.poll(timeout_ms=500)
                return time.monotonic() - start

            spent, units = bench.count(bucket, work)
            if group is None:
                bench.latencies.append((f"{partitions}", visibility_ms(url, bench.options, consumer, partitions)))
            consumer.close()
            who = "idle group member" if group else "idle consumer"
            bench.row(f"{who}, {partitions} partitions", "second", units, spent, DAY_S)


def wide_idle_row(bench: Bench, seconds: float, topics: int) -> None:
    """Requests per second of an idle consumer subscribed by pattern to ``topics`` topics of one partition each:
    one GET of the root change notice per second, whatever ``topics`` (PROTOCOL.md 9.1)."""
    from pyspark_logsource import Consumer, LogStore

    bucket, url = bench.bucket()
    names = [f"w-{i:04d}" for i in range(topics)]
    with LogStore(url, storage_options=bench.options) as store:
        for name in names:
            store.create_topic(name, 1)
    consumer = Consumer(url, storage_options=bench.options, auto_offset_reset="latest")
    consumer.subscribe(pattern=r"w-\d+")
    # Settle: every partition found empty and waiting on a notice (each topic's notice read once).
    waiting = consumer._fetcher.waiting
    settle = time.monotonic() + 600
    while (waiting is None or len(waiting.parked) < topics) and time.monotonic() < settle:
        consumer.poll(timeout_ms=500)

    def work() -> float:
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            consumer.poll(timeout_ms=500)
        return time.monotonic() - start

    spent, units = bench.count(bucket, work)
    bench.latencies.append((f"{topics} topics × 1", visibility_ms(url, bench.options, consumer, 1, topics=names)))
    consumer.close()
    bench.row(f"idle consumer, pattern over {topics} topics", "second", units, spent, DAY_S)


def visibility_ms(
    url: str,
    options: dict[str, Any],
    consumer: Any,
    partitions: int,
    trials: int = 7,
    topics: Sequence[str] = ("t",),
) -> list[float]:
    """Milliseconds from a send's acknowledgement until an idle consumer's poll returns the record."""
    from pyspark_logsource import Producer

    out = []
    with Producer(url, storage_options=options, linger_ms=0) as producer:
        for i in range(trials):
            time.sleep((0.37 * (i + 1)) % 1.0)  # acknowledgements land at different moments of the notice interval
            topic = topics[(i * 37) % len(topics)]  # a different topic each trial, when there are several
            producer.send(topic, b"ping-%d" % i, partition=i % partitions).get(timeout=30)
            acked = time.monotonic()
            while not consumer.poll(timeout_ms=50):
                if time.monotonic() - acked > 30:
                    raise RuntimeError("an idle consumer did not see a new record within 30 s")
            out.append((time.monotonic() - acked) * 1000)
    return out


#: Micro-batches of a pipeline run counted apart as its start (the steady-state row leaves them out).
WARMUP_BATCHES = 5


def pipeline_rows(bench: Bench, partition_counts: list[int], batches: int, per_batch: int) -> None:
    """Requests per micro-batch of a plog -> plog Spark pipeline (source + exactly-once sink)."""
    from spark_common import local_spark

    from pyspark_logsource import LogStore, Producer

    spark = local_spark("bench-requests")
    storage = bench.spark_options()
    try:
        for partitions, layout in [(p, layout) for p in partition_counts for layout in ("partitioned", "shared")]:
            bucket, url = bench.bucket()
            with LogStore(url, storage_options=bench.options) as store:
                store.create_topic("a", partitions, {"storage.layout": layout})
                store.create_topic("b", partitions, {"storage.layout": layout})
            n = batches * per_batch
            with Producer(url, storage_options=bench.options) as producer:
                keys = pa.array([f"k{i % 997}".encode() for i in range(n)], pa.binary())
                producer.send_batch("a", pa.table({"key": keys, "value": values(n, 100)}))
            checkpoint = f"/tmp/bench-requests-{uuid.uuid4().hex}"

            warm: dict[str, Any] = {}

            def work(
                url: str = url, checkpoint: str = checkpoint, bucket: str = bucket, warm: dict[str, Any] = warm
            ) -> float:
                source = (
                    spark.readStream.format("plog")
                    .options(**storage)
                    .option("subscribe", "a")
                    .option("startingOffsets", "earliest")
                    .option("maxOffsetsPerTrigger", str(per_batch))
                    .load(url)
                )
                query = (
                    source.selectExpr("key", "value")
                    .writeStream.format("plog")
                    .options(**storage)
                    .option("topic", "b")
                    .option("checkpointLocation", checkpoint)
                    .trigger(availableNow=True)
                    .start(url)
                )
                # The counts once the first WARMUP_BATCHES micro-batches are done: what follows is the
                # steady state, without the query's start (every partition listed, Python workers
                # opening the root). The next micro-batch may have begun: a request or two of it
                # then counts as warm-up, which only lowers the steady figure by as much.
                while query.isActive and not warm:
                    progress = query.lastProgress
                    if progress is not None and progress["batchId"] >= WARMUP_BATCHES - 1:
                        warm.update(counts=bench.counts.of(bucket), shapes=bench.counts.shapes(bucket))
                        warm["batches"] = sum(p["numInputRows"] > 0 for p in query.recentProgress)
                    time.sleep(0.005)
                query.awaitTermination()
                done = [p for p in query.recentProgress if p["numInputRows"] > 0]
                return float(len(done))

            spent, units = bench.count(bucket, work)
            name = f"Spark plog -> plog, {partitions} partitions, {layout}, {per_batch:,} records per micro-batch"
            bench.row(name, "micro-batch", units, spent, DAY_S)
            if warm:
                steady_units = units - warm["batches"]
                steady = bench.counts.of(bucket) - warm["counts"]
                bench.print_shapes(bench.counts.shapes(bucket) - warm["shapes"], steady_units, "  (steady)")
                bench.row(f"{name}, after the first {WARMUP_BATCHES}", "micro-batch", steady_units, steady, DAY_S)
    finally:
        spark.stop()


#: The Spark sink rows: tasks of a job or micro-batch, and the partitions of the topic they write.
SINK_TASKS = 16
SINK_PARTITIONS = 64


def sink_rows(bench: Bench, records: int, batches: int) -> None:
    """Requests of the Spark sink alone: a ``df.write`` job of ``SINK_TASKS`` tasks (``records`` keyed records of
    ~100 bytes) into ``SINK_PARTITIONS`` partitions, on a shared and a partitioned topic; then a consumer
    reading the shared job back (GETs per task object); then a streaming query from Spark's rate source (no
    store request of its own) writing micro-batches of 16 tasks, ``batches`` of them counted after the first."""
    from spark_common import local_spark

    from pyspark_logsource import LogStore

    spark = local_spark("bench-requests-sink")
    storage = bench.spark_options()
    try:
        for layout in ("shared", "partitioned"):
            bucket, url = bench.bucket()
            with LogStore(url, storage_options=bench.options) as store:
                store.create_topic("wide", SINK_PARTITIONS, {"storage.layout": layout})
            frame = spark.range(0, records, 1, SINK_TASKS).selectExpr(
                "cast(id as string) as key", "concat(cast(id as string), repeat('x', 90)) as value"
            )

            def job(url: str = url, frame: Any = frame) -> float:
                frame.write.format("plog").options(**storage).option("topic", "wide").mode("append").save(url)
                return 1.0

            spent, units = bench.count(bucket, job)
            name = f"Spark df.write, {SINK_TASKS} tasks into {SINK_PARTITIONS} partitions, {layout}, {records:,} rows"
            bench.row(name, "job", units, spent, DAY_S / 10)
            if layout == "shared":
                spent, _mib = bench.count(
                    bucket, lambda url=url: catch_up(url, bench.options, "wide", SINK_PARTITIONS, records)
                )
                bench.row("  its consumer, reading the job back", "task object", SINK_TASKS, spent, 0)
        for layout in ("shared", "partitioned"):
            bucket, url = bench.bucket()
            with LogStore(url, storage_options=bench.options) as store:
                store.create_topic("wide", SINK_PARTITIONS, {"storage.layout": layout})
            checkpoint = f"/tmp/bench-requests-sink-{uuid.uuid4().hex}"
            source = (
                spark.readStream.format("rate")
                .option("rowsPerSecond", str(records // 20))
                .option("numPartitions", str(SINK_TASKS))
                .load()
                .selectExpr("cast(value as string) as key", "concat(cast(value as string), repeat('x', 90)) as value")
            )
            query = (
                source.writeStream.format("plog")
                .options(**storage)
                .option("topic", "wide")
                .option("checkpointLocation", checkpoint)
                .trigger(processingTime="2 seconds")
                .start(url)
            )
            try:
                while query.isActive and (query.lastProgress or {}).get("batchId", -1) < 1:
                    time.sleep(0.05)
                first = query.lastProgress["batchId"]
                before = bench.counts.of(bucket)
                while query.isActive and query.lastProgress["batchId"] < first + batches:
                    time.sleep(0.01)
                spent = bench.counts.of(bucket) - before
                done = [p for p in query.recentProgress if first < p["batchId"] <= first + batches]
                rows = statistics.mean(p["numInputRows"] for p in done) if done else 0
            finally:
                query.stop()
            name = (
                f"Spark micro-batch, {SINK_TASKS} tasks into {SINK_PARTITIONS} partitions, {layout}, "
                f"~{rows:,.0f} records each"
            )
            bench.row(name, "micro-batch", batches, spent, DAY_S / 2)
    finally:
        spark.stop()


def render(bench: Bench, started: dt.datetime) -> str:
    """The Markdown table of every row."""
    lines = [
        f"Requests on {bench.backend}, counted by a proxy in front of {EMULATORS[bench.backend]} on 127.0.0.1, "
        f"{started:%Y-%m-%d}; {machine()}.",
        "",
        "| scenario | per | requests | PUT | LIST | GET | HEAD | DELETE | $ per day |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for scenario, unit, _units, per, units_per_day in bench.rows:
        dollars = sum(PRICES[bench.backend].get(k, 0.0) * v for k, v in per.items()) * units_per_day
        cells = " | ".join(f"{per.get(k, 0):,.2f}" for k in KINDS[:5])
        lines.append(f"| {scenario} | {unit} | {sum(per.values()):,.2f} | {cells} | ${dollars:,.2f} |")
    if bench.latencies:
        lines += [
            "",
            "| idle consumer, partitions (or topics × partitions) | new record visible after (ms): median | max "
            "| trials |",
            "|---:|---:|---:|---:|",
        ]
        for partitions, ms in bench.latencies:
            lines.append(f"| {partitions} | {statistics.median(ms):,.0f} | {max(ms):,.0f} | {len(ms)} |")
    lines.append("")
    lines.append(
        "$ per day: producer and consumer rows at 1 MiB/s, idle rows per idle day, pipeline rows at one "
        f"micro-batch per second; {PRICE_NOTES[bench.backend]}; DELETE free."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the scenarios and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and 1, 8 partitions only (a smoke run)")
    parser.add_argument("--idle-seconds", type=float, default=10.0, help="how long each idle scenario is counted")
    parser.add_argument("--no-spark", action="store_true", help="skip the Spark pipeline rows")
    parser.add_argument(
        "--wide-topics",
        type=int,
        default=500,
        metavar="N",
        help="topics of the idle pattern consumer's row (default 500; 50 with --quick; 0: skip the row)",
    )
    parser.add_argument(
        "--by-key", type=int, default=0, metavar="N", help="print each scenario's N most requested key shapes"
    )
    parser.add_argument(
        "--only",
        choices=("producer", "wide-producer", "lifetime", "consumer", "idle", "wide", "spark", "sink", "gateway"),
        action="append",
        help="run only these scenarios (repeatable; default: all; wide: only idle's many-topic row; "
        "wide-producer: only the 64-partition producer rows; sink: only the Spark sink's rows of spark)",
    )
    parser.add_argument(
        "--backend",
        choices=(*BACKENDS, "all"),
        default="s3",
        help="the object store to count against, through its emulator (default: s3; all: each in turn)",
    )
    args = parser.parse_args(argv)
    only = set(args.only or ("producer", "lifetime", "consumer", "idle", "spark", "gateway"))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    tables = []
    for backend in BACKENDS if args.backend == "all" else (args.backend,):
        print(f"== {backend}", flush=True)
        tables.append(run_backend(backend, args, only))
    for table in tables:
        print()
        print(table)
    return 0


def run_backend(backend: str, args: argparse.Namespace, only: set[str]) -> str:
    """Run the chosen scenarios against one backend; its Markdown table."""
    started = dt.datetime.now(dt.timezone.utc)
    bench = Bench(backend)
    bench.by_key = args.by_key
    try:
        if "producer" in only:
            print("producers", flush=True)
            producer_rows(bench, 0.25 if args.quick else 4.0)
        if "producer" in only or "wide-producer" in only:
            print("producers, 64 partitions", flush=True)
            wide_producer_rows(bench, 4 if args.quick else 16, 2.0 if args.quick else 8.0)
        if "consumer" in only:
            print("consumer", flush=True)
            consumer_row(bench, 1.0 if args.quick else 16.0)
            merged_consumer_row(bench, 4 if args.quick else 64)
        if "lifetime" in only:
            print("lifetime", flush=True)
            lifetime_rows(bench, 10.0 if args.quick else 1024 / WIDE_RATE_MIB_S)  # a GiB, the full run
        if "gateway" in only:
            print("gateway", flush=True)
            gateway_rows(bench, 3.0 if args.quick else 10.0)
        if "idle" in only:
            print("idle", flush=True)
            idle_rows(bench, 3.0 if args.quick else args.idle_seconds, [1, 8] if args.quick else [1, 8, 64])
        if ("idle" in only or "wide" in only) and args.wide_topics:
            print("idle, many topics", flush=True)
            wide_idle_row(bench, 3.0 if args.quick else args.idle_seconds, 50 if args.quick else args.wide_topics)
        if ("spark" in only or "sink" in only) and not args.no_spark:
            print("spark sink", flush=True)
            sink_rows(bench, 16_000 if args.quick else 160_000, 3 if args.quick else 10)
        if "spark" in only and not args.no_spark:
            print("spark", flush=True)
            pipeline_rows(bench, [8] if args.quick else [8, 64], 5 if args.quick else 30, 4_000)
    finally:
        bench.stop()
    return render(bench, started)


if __name__ == "__main__":
    sys.exit(main())
