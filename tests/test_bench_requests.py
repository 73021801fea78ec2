"""The request benchmark's billing classifiers, on the request shapes gcsfs, adlfs and s3fs send.

``benchmarks/bench_requests.py`` prices what it counts by these kinds, so a request put in the wrong
kind would misprice a whole table: each shape below is one the clients really send (seen on the
wire in the benchmark's own runs).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from bench_requests import PRICES, classify_azure, classify_gcs, classify_s3  # noqa: E402

GCS = [
    # (method, path, query, body) -> (bucket, kind, where)
    (("GET", "/storage/v1/b/bk/o", "prefix=plog%2Ft%2F&delimiter=%2F", b""), ("bk", "LIST", "list plog/t/")),
    (("GET", "/storage/v1/b/bk/o/plog%2Ft%2F0.arrow", "alt=media", b""), ("bk", "GET", "plog/t/0.arrow")),
    (("GET", "/download/storage/v1/b/bk/o/plog%2Fa", "alt=media", b""), ("bk", "GET", "plog/a")),
    (("GET", "/storage/v1/b/bk/o/plog%2Fa", "", b""), ("bk", "HEAD", "plog/a")),
    (
        ("POST", "/upload/storage/v1/b/bk/o", "uploadType=multipart&ifGenerationMatch=0", b'--x\r\n{"name": "plog/a"}'),
        ("bk", "PUT", "plog/a"),
    ),
    (("PUT", "/upload/storage/v1/b/bk/o", "uploadType=resumable&upload_id=7", b"data"), ("bk", "PUT", "")),
    (("POST", "/storage/v1/b/bk/o/plog%2Fm/compose", "", b""), ("bk", "PUT", "plog/m")),
    (("DELETE", "/storage/v1/b/bk/o/plog%2Fa", "", b""), ("bk", "DELETE", "plog/a")),
]

AZURE = [
    (("PUT", "/devstoreaccount1/ct/plog/a.arrow", "", b""), ("ct", "PUT", "plog/a.arrow")),
    (("PUT", "/devstoreaccount1/ct/plog/a.arrow", "comp=blocklist", b""), ("ct", "PUT", "plog/a.arrow")),
    (
        ("GET", "/devstoreaccount1/ct", "restype=container&comp=list&prefix=plog/t/", b""),
        ("ct", "LIST", "list plog/t/"),
    ),
    (("GET", "/devstoreaccount1/ct/plog/a.arrow", "", b""), ("ct", "GET", "plog/a.arrow")),
    (("HEAD", "/devstoreaccount1/ct/plog/a.arrow", "", b""), ("ct", "HEAD", "plog/a.arrow")),
    (("GET", "/devstoreaccount1/ct/plog/a.arrow", "comp=metadata", b""), ("ct", "HEAD", "plog/a.arrow")),
    (("DELETE", "/devstoreaccount1/ct/plog/a.arrow", "", b""), ("ct", "DELETE", "plog/a.arrow")),
]

S3 = [
    (("GET", "/bk", "list-type=2&prefix=plog%2Ft%2F", b""), ("bk", "LIST", "list plog/t/")),
    (("GET", "/bk/plog/a", "", b""), ("bk", "GET", "plog/a")),
    (("HEAD", "/bk/plog/a", "", b""), ("bk", "HEAD", "plog/a")),
    (("PUT", "/bk/plog/a", "", b""), ("bk", "PUT", "plog/a")),
    (("POST", "/bk", "delete", b""), ("bk", "POST", "")),
]


@pytest.mark.parametrize(("request_", "expected"), GCS)
def test_gcs_kinds(request_: tuple[str, str, str, bytes], expected: tuple[str, str, str]) -> None:
    """GCS JSON API: uploads and compose are Class A writes, listings LIST, media GET, metadata HEAD."""
    assert classify_gcs(*request_) == expected


@pytest.mark.parametrize(("request_", "expected"), AZURE)
def test_azure_kinds(request_: tuple[str, str, str, bytes], expected: tuple[str, str, str]) -> None:
    """Azure Blob REST: every PUT a write, comp=list a listing, a plain GET a read, the rest read-class."""
    assert classify_azure(*request_) == expected


@pytest.mark.parametrize(("request_", "expected"), S3)
def test_s3_kinds(request_: tuple[str, str, str, bytes], expected: tuple[str, str, str]) -> None:
    """S3 path-style, as the moto server's own counter classifies it."""
    assert classify_s3(*request_) == expected


def test_prices_per_thousand() -> None:
    """The list prices, per 1,000 requests, as the docstring states them; DELETE free everywhere."""
    per_1000 = {b: {k: round(v * 1000, 6) for k, v in p.items()} for b, p in PRICES.items()}
    assert per_1000["gcs"] == {"PUT": 0.005, "POST": 0.005, "LIST": 0.005, "GET": 0.0004, "HEAD": 0.0004}
    assert per_1000["azure"] == {"PUT": 0.0065, "POST": 0.0065, "LIST": 0.0065, "GET": 0.0005, "HEAD": 0.0005}
    assert all("DELETE" not in p for p in PRICES.values())
