"""The storage backends: a local directory, process-wide memory, and fsspec object stores.

Every class here implements :class:`~segment_format.stores.base.Store`, and
``tests/test_storage_conformance.py`` runs one suite against all of them.
:func:`open_store` picks the backend from a URL:

* a plain path or ``file://...`` (or ``local://...``) -> :class:`LocalStore`;
* ``memory://name`` -> :class:`MemoryStore`;
* anything else (``s3://``, ``gs://``, ``abfs://``...) -> :class:`FsspecStore`.

The one atomic primitive the protocol needs is ``put_if_absent``. On a local
disk it is a hard link of a fully written temporary file (``link(2)`` fails
with ``EEXIST`` if the name is taken, and the name appears pointing at complete
bytes or not at all). On object stores it is the store's conditional create:
``If-None-Match: *`` on S3, ``ifGenerationMatch=0`` on GCS, ``If-None-Match: *``
(``overwrite=False``) on Azure Blob.
"""

from __future__ import annotations

import os
from typing import Any

from segment_format.errors import InvalidConfigError
from segment_format.stores.base import Store
from segment_format.stores.credentials import scrub
from segment_format.stores.fsspec_store import FsspecStore
from segment_format.stores.keys import TEMP_PREFIX
from segment_format.stores.local import LocalStore
from segment_format.stores.memory import MemoryStore
from segment_format.stores.retrying import RetryPolicy

__all__ = ["TEMP_PREFIX", "FsspecStore", "LocalStore", "MemoryStore", "open_store"]


def open_store(url: str, storage_options: dict[str, Any] | None = None) -> Store:
    """Open the store a URL names.

    * a plain path, ``file://path`` or ``local://path`` -> :class:`LocalStore`
      (the directory is created if absent);
    * ``memory://name`` -> :class:`MemoryStore` (shared by name within the process);
    * any other URL -> :class:`FsspecStore` on ``fsspec.url_to_fs(url, **storage_options)``,
      with the listings cache turned off. The options ``plog_deadline_ms``,
      ``plog_retry_backoff_ms`` and ``plog_retry_backoff_max_ms`` are plog's
      own (the retries of :class:`FsspecStore`) and are not passed on; on S3,
      botocore makes one try per request unless ``config_kwargs["retries"]`` says
      otherwise: FsspecStore's loop does the retrying (see ``FsspecStore``). On GCS
      with a plain-HTTP endpoint (an emulator: ``endpoint_url`` or
      ``STORAGE_EMULATOR_HOST`` ``http://...``) the filesystem is gcsfs's JSON-API
      class (see :func:`_gcs_json_filesystem`).

    Raises :class:`InvalidConfigError` naming the URL for an unknown protocol,
    a missing backend package, or a backend without atomic create-if-absent.
    """
    if not isinstance(url, str) or not url:
        raise InvalidConfigError(f"storage URL must be a non-empty string, got {url!r}")
    options = dict(storage_options or {})
    scheme, sep, rest = url.partition("://")
    if not sep:
        return LocalStore(url)
    scheme = scheme.lower()
    if scheme in ("file", "local"):
        if not rest:
            raise InvalidConfigError(f"storage URL {url!r} has no path")
        return LocalStore(rest)
    if scheme == "memory":
        name = rest.strip("/")
        if not name:
            raise InvalidConfigError(f"storage URL {url!r} needs a name: memory://<name>")
        return MemoryStore(name)

    import fsspec  # imported lazily: local and memory stores do not need it

    retry = RetryPolicy.pop_options(options)  # plog's own options: the filesystem would refuse them
    # Every list/exists must hit the server (list-after-write across processes).
    options["use_listings_cache"] = False
    s3 = scheme in ("s3", "s3a")
    if s3:
        _s3_retry_defaults(options)
    try:
        if scheme in ("gs", "gcs") and _gcs_plain_http(options):
            fs, root = _gcs_json_filesystem(url, options)
        else:
            fs, root = fsspec.url_to_fs(url, **options)
    except Exception as e:
        if isinstance(e, ImportError):
            message = f"storage URL {url!r}: backend package missing: {e}"
        elif isinstance(e, ValueError):
            message = f"storage URL {url!r}: {e}"
        else:
            message = f"storage URL {url!r}: cannot open filesystem: {type(e).__name__}: {e}"
        raise _open_error(message, options, e)  # noqa: B904 - _open_error chains the cause, or hides it
    if s3 and isinstance(getattr(fs, "retries", None), int):
        # s3fs's own loop (a class attribute, not an option): one try, FsspecStore retries.
        fs.retries = 1
    return FsspecStore(fs, root, url, retry=retry)


def _open_error(message: str, options: dict[str, Any], cause: BaseException) -> InvalidConfigError:
    """The error of a filesystem that would not open, with no credential of ``options`` in it.

    A backend's constructor may quote what it was given (a malformed connection string, say): such a
    value is hidden, and the backend's exception is then not chained either, since a traceback would
    print it whole. Otherwise the cause stays chained, for debugging.
    """
    safe = scrub(message, options)
    error = InvalidConfigError(safe)
    quiet = safe == message and scrub(repr(cause), options) == repr(cause)
    error.__cause__ = cause if quiet else None  # also suppresses the implicit context of the except block
    return error


def _s3_retry_defaults(options: dict[str, Any]) -> None:
    """One botocore try per request (``standard`` mode, ``total_max_attempts`` 1), unless
    ``config_kwargs["retries"]`` is given.

    Retrying is FsspecStore's, whose loop checks its deadline before every try:
    a conditional create must not be sent once the knowledge it rests on is
    older than W (PROTOCOL.md 8, 2, assumption A4), and botocore's own tries (its default
    ``legacy`` mode makes 5; ``standard`` 3, after up to 1 s and 2 s more) would
    be sent after that deadline without anyone checking it, each signed afresh.
    s3fs wraps every call in a loop of its own (5 tries, and a second such loop
    around reads); ``open_store`` sets it to one try for the same reason.
    """
    config = options.get("config_kwargs")
    config = dict(config) if isinstance(config, dict) else {}
    config.setdefault("retries", {"mode": "standard", "total_max_attempts": 1})
    options["config_kwargs"] = config


def _gcs_plain_http(options: dict[str, Any]) -> bool:
    """Whether gcsfs would talk to a plain-HTTP endpoint (an emulator such as fake-gcs-server).

    gcsfs takes ``endpoint_url`` first, else ``STORAGE_EMULATOR_HOST`` (a bare
    ``host:port`` there means ``http://``); neither means Google's HTTPS endpoint.
    """
    endpoint = options.get("endpoint_url") or os.environ.get("STORAGE_EMULATOR_HOST", "")
    endpoint = str(endpoint)
    if endpoint in ("", "default"):
        return False
    return endpoint.startswith("http://") or "://" not in endpoint


def _gcs_json_filesystem(url: str, options: dict[str, Any]) -> tuple[Any, str]:
    """gcsfs's JSON-API filesystem (``gcsfs.core.GCSFileSystem``) on ``url``, and the root path in it.

    Newer gcsfs registers, for ``gs://``, a subclass that first asks each bucket's
    type (zonal or hierarchical) over gRPC with TLS, unless the environment has
    ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` when gcsfs is first imported. A
    plain-HTTP endpoint cannot answer a TLS handshake, so every such probe
    retries for 60 s before falling back to the JSON API: every plog call would
    stall for a minute. plog uses the JSON API only (objects, listings,
    conditional creates), so it takes the JSON-API class directly there.
    """
    from gcsfs.core import GCSFileSystem

    kwargs = {**GCSFileSystem._get_kwargs_from_urls(url), **options}
    fs = GCSFileSystem(**kwargs)
    return fs, str(GCSFileSystem._strip_protocol(url))
