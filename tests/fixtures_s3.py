"""S3 fixtures: one real moto S3 server per test session, and a fresh bucket per test.

The server is moto's HTTP server (``ThreadedMotoServer``) bound to 127.0.0.1,
not the in-process ``mock_aws`` patch, so requests go through s3fs, aiobotocore
and HTTP exactly as they would against AWS, and child processes can reach it.
Dummy credentials are set for the session so nothing ever talks to real AWS.
"""

from __future__ import annotations

import os
import re
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs

import pytest

#: What the session's environment gets while the server runs.
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SECURITY_TOKEN": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    # Never consult instance metadata or a developer's real profile.
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}
#: Variables that could point clients elsewhere; removed for the session.
AWS_ENV_REMOVED = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


#: Runs of digits and hex ids (topic ids, hashes) in a key: collapsed into ``#`` in a key's shape.
_DIGITS = re.compile(r"[0-9a-f]{8,}|\d+")


class RequestCounter:
    """Every request the moto server answered, by bucket and by S3's billing kind (PUT, LIST, GET, HEAD, ...).

    The server counts at its own door, so the figures are what S3 would bill,
    not what a client believes it sent (retries included).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()
        #: (bucket, kind, key shape) -> count; the shape is the key with every run of digits as ``#``.
        self._shapes: Counter[tuple[str, str, str]] = Counter()

    def record(self, method: str, path: str, query: str) -> None:
        """Count one request from its WSGI method, path and query string."""
        bucket, _, key = path.lstrip("/").partition("/")
        if method == "GET":
            kind = "GET" if key else ("LIST" if "list-type" in parse_qs(query) or not query else "GET")
        else:
            kind = method
        where = "list " + parse_qs(query).get("prefix", [""])[0] if kind == "LIST" else key
        shape = _DIGITS.sub("#", where)
        with self._lock:
            self._counts[(bucket, kind)] += 1
            self._shapes[(bucket, kind, shape)] += 1

    def shapes(self, bucket: str) -> Counter[tuple[str, str]]:
        """The counts of one bucket by (kind, key shape), as of now: where the requests went."""
        with self._lock:
            return Counter({(kind, shape): n for (b, kind, shape), n in self._shapes.items() if b == bucket})

    def of(self, bucket: str) -> Counter[str]:
        """The counts of one bucket by kind, as of now."""
        with self._lock:
            return Counter({kind: n for (b, kind), n in self._counts.items() if b == bucket})


#: The session server's counter (the server is shared, so tests read their own bucket's counts).
REQUESTS = RequestCounter()


def counting_moto_server(server_mod: Any) -> Any:
    """A ``ThreadedMotoServer`` on 127.0.0.1 and a free port, whose object writes are serialised.

    moto checks ``If-None-Match: *`` and then stores the object as two steps,
    in a multi-threaded server, so two racing conditional PUTs could in
    principle both succeed, which real S3 never allows. Running write requests
    (anything but GET/HEAD) one at a time restores S3's atomicity without
    helping a client: an exists-then-put client still races, because its check
    and its write are separate requests. Reads stay concurrent. If moto's
    internals moved, the plain server is used.
    """
    base = server_mod.ThreadedMotoServer
    try:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server
    except ImportError:  # pragma: no cover - depends on the installed moto
        return base(ip_address="127.0.0.1", port=0, verbose=False)

    class SerialisedWritesMotoServer(base):  # type: ignore[misc, valid-type]
        def _server_entry(self) -> None:
            app = DomainDispatcherApplication(create_backend_app)
            write_lock = threading.Lock()

            def serialised(environ: dict[str, Any], start_response: Any) -> Any:
                method, path = str(environ.get("REQUEST_METHOD")), str(environ.get("PATH_INFO", ""))
                REQUESTS.record(method, path, str(environ.get("QUERY_STRING", "")))
                if environ.get("REQUEST_METHOD") in ("GET", "HEAD"):
                    return app(environ, start_response)
                with write_lock:
                    return list(app(environ, start_response))

            self._server = make_server(
                self._ip_address, self._port, serialised, True, request_handler=MotoRequestHandler
            )
            self._server_ready_event.set()
            self._server.serve_forever()

    if not callable(getattr(base, "_server_entry", None)):  # pragma: no cover
        return base(ip_address="127.0.0.1", port=0, verbose=False)
    return SerialisedWritesMotoServer(ip_address="127.0.0.1", port=0, verbose=False)


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """Start a moto S3 server on 127.0.0.1 (free port) for the session; yield its URL.

    The server thread is stopped, and the environment restored, at session end.
    """
    server_mod = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    with pytest.MonkeyPatch.context() as mp:
        for name, value in AWS_ENV.items():
            mp.setenv(name, value)
        for name in AWS_ENV_REMOVED:
            mp.delenv(name, raising=False)
        # A proxy configured in the environment must not intercept loopback requests.
        no_proxy = ",".join(filter(None, [os.environ.get("NO_PROXY", ""), "127.0.0.1", "localhost"]))
        mp.setenv("NO_PROXY", no_proxy)
        mp.setenv("no_proxy", no_proxy)

        server = counting_moto_server(server_mod)
        server.start()
        try:
            host, port = server.get_host_and_port()
            yield f"http://{host}:{port}"
        finally:
            server.stop()


def s3_storage_options(endpoint: str) -> dict[str, Any]:
    """The s3fs options that point at the moto server with the dummy credentials."""
    return {
        "endpoint_url": endpoint,
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"region_name": "us-east-1"},
    }


@pytest.fixture(scope="session")
def s3_admin_client(s3_endpoint: str) -> Iterator[Any]:
    """A boto3 S3 client on the moto server, for creating and removing test buckets."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    yield client
    client.close()


@pytest.fixture
def s3_url(s3_endpoint: str, s3_admin_client: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """Create a fresh bucket on the moto server; yield ``("s3://<bucket>/plog", storage_options)``.

    The bucket is emptied and removed afterwards.
    """
    bucket = f"plog-test-{uuid.uuid4().hex[:16]}"
    client = s3_admin_client
    client.create_bucket(Bucket=bucket)
    try:
        yield f"s3://{bucket}/plog", s3_storage_options(s3_endpoint)
    finally:
        paginator = client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=bucket):
            objects = [{"Key": obj["Key"]} for obj in page.get("Contents", [])]
            if objects:
                client.delete_objects(Bucket=bucket, Delete={"Objects": objects, "Quiet": True})
        client.delete_bucket(Bucket=bucket)
