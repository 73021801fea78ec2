"""The storage backends: a local directory, process-wide memory, and fsspec object stores.

Every class here implements :class:`~segment_format.storage.Store`, and
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

from typing import Any

from segment_format.errors import InvalidConfigError
from segment_format.storage import Store
from segment_format.stores.fsspec_store import FsspecStore
from segment_format.stores.keys import TEMP_PREFIX
from segment_format.stores.local import LocalStore
from segment_format.stores.memory import MemoryStore

__all__ = ["TEMP_PREFIX", "FsspecStore", "LocalStore", "MemoryStore", "open_store"]


def open_store(url: str, storage_options: dict[str, Any] | None = None) -> Store:
    """Open the store a URL names.

    * a plain path, ``file://path`` or ``local://path`` -> :class:`LocalStore`
      (the directory is created if absent);
    * ``memory://name`` -> :class:`MemoryStore` (shared by name within the process);
    * any other URL -> :class:`FsspecStore` on ``fsspec.url_to_fs(url, **storage_options)``,
      with the listings cache turned off.

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

    # Every list/exists must hit the server (list-after-write across processes).
    options["use_listings_cache"] = False
    try:
        fs, root = fsspec.url_to_fs(url, **options)
    except ImportError as e:
        raise InvalidConfigError(f"storage URL {url!r}: backend package missing: {e}") from e
    except ValueError as e:
        raise InvalidConfigError(f"storage URL {url!r}: {e}") from e
    except Exception as e:
        raise InvalidConfigError(f"storage URL {url!r}: cannot open filesystem: {type(e).__name__}: {e}") from e
    return FsspecStore(fs, root, url)
