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

import contextlib
import inspect
import os
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from segment_format.errors import InvalidConfigError, ObjectNotFoundError, StorageError
from segment_format.storage import ObjectInfo, Store

__all__ = ["FsspecStore", "LocalStore", "MemoryStore", "TEMP_PREFIX", "open_store"]

#: Name prefix of the temporary files :class:`LocalStore` writes before linking
#: them into place. Listings skip them; :meth:`LocalStore.cleanup_temp_files`
#: removes the ones a killed writer left behind.
TEMP_PREFIX = ".tmp-"


def _check_key(key: str) -> list[str]:
    """Split a key into its segments, refusing keys the storage model forbids."""
    if not isinstance(key, str) or not key:
        raise StorageError(f"invalid object key {key!r}: must be a non-empty string")
    parts = key.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise StorageError(f"invalid object key {key!r}: empty, '.' or '..' segment")
        if part.startswith(TEMP_PREFIX):
            raise StorageError(f"invalid object key {key!r}: segments may not start with {TEMP_PREFIX!r}")
    return parts


def _check_prefix(prefix: str) -> None:
    """Refuse a listing prefix that is neither ``""`` nor a ``/``-terminated key."""
    if prefix == "":
        return
    if not prefix.endswith("/"):
        raise StorageError(f"invalid list prefix {prefix!r}: must be '' or end with '/'")
    _check_key(prefix[:-1])


def _check_range(key: str, start: int, end: int) -> None:
    """Refuse a byte range outside ``0 <= start <= end``."""
    if start < 0 or end < start:
        raise StorageError(f"invalid byte range [{start}, {end}) for object {key!r}")


# --------------------------------------------------------------------------- local


def _fsync_dir(path: str) -> None:
    """fsync a directory so that a name created in it survives a crash (no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. Windows cannot open directories; nothing to do there
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class LocalStore(Store):
    """A store in a local (or locally mounted) directory; keys map to files below ``root``.

    ``put_if_absent`` writes a ``.tmp-<uuid>`` file next to the target, then
    hard-links it to the final name, so the object appears whole or not at all
    and of concurrent writers exactly one wins. The directory's filesystem must
    support hard links.
    """

    def __init__(self, root: str) -> None:
        """Open the store rooted at the directory ``root`` (created if absent)."""
        self.root = os.path.abspath(root)
        self.url = self.root
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as e:
            raise StorageError(f"cannot create store directory {self.root!r}: {e}") from e
        if not os.path.isdir(self.root):
            raise StorageError(f"store root {self.root!r} is not a directory")

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *_check_key(key))

    def get(self, key: str) -> bytes:
        """Return the whole object; ``ObjectNotFoundError`` if absent."""
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                return f.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFoundError(key) from None
        except OSError as e:
            raise StorageError(f"cannot read object {key!r}: {e}") from e

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Return bytes ``[start, end)``, clipped to the object's size."""
        _check_range(key, start, end)
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                if start == end:
                    return b""
                f.seek(start)
                return f.read(end - start)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFoundError(key) from None
        except OSError as e:
            raise StorageError(f"cannot read object {key!r}: {e}") from e

    def _makedirs(self, path: str) -> list[str]:
        """Create ``path`` and missing parents; return the directories this call created, top first."""
        missing: list[str] = []
        p = path
        while not os.path.isdir(p):
            missing.append(p)
            parent = os.path.dirname(p)
            if parent == p:
                break
            p = parent
        os.makedirs(path, exist_ok=True)
        return list(reversed(missing))

    def put_if_absent(self, key: str, data: bytes, *, durable: bool = True) -> bool:
        """Create the object unless the key exists, via temp file + ``os.link``."""
        final = self._path(key)
        parent = os.path.dirname(final)
        tmp = os.path.join(parent, f"{TEMP_PREFIX}{uuid.uuid4().hex}")
        try:
            created_dirs = self._makedirs(parent)
            with open(tmp, "xb") as f:
                f.write(data)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
            try:
                os.link(tmp, final)
            except FileExistsError:
                if os.path.isdir(final):
                    raise StorageError(
                        f"cannot create object {key!r}: a directory of that name holds other objects"
                    ) from None
                return False
            if durable:
                _fsync_dir(parent)
                # New directories are only durable once their own parents are synced.
                for d in created_dirs:
                    _fsync_dir(os.path.dirname(d))
            return True
        except (NotADirectoryError, IsADirectoryError) as e:
            raise StorageError(f"cannot create object {key!r}: a path segment is taken: {e}") from e
        except OSError as e:
            raise StorageError(f"cannot create object {key!r} in {self.root!r}: {e}") from e
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            except OSError:  # pragma: no cover - the leftover is removed by cleanup_temp_files
                pass

    def _walk(self, top: str, *, temp: bool) -> Iterator[os.DirEntry[str]]:
        """Yield the file entries below ``top``: only temp files if ``temp``, else only objects."""
        stack = [top]
        while stack:
            d = stack.pop()
            try:
                it = os.scandir(d)
            except (FileNotFoundError, NotADirectoryError):
                continue
            with it:
                for entry in it:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                            continue
                        is_file = entry.is_file()
                    except OSError:
                        continue
                    if is_file and entry.name.startswith(TEMP_PREFIX) == temp:
                        yield entry

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object under ``prefix``, recursively, sorted by key; temp files are skipped."""
        _check_prefix(prefix)
        top = os.path.join(self.root, *prefix.split("/")[:-1]) if prefix else self.root
        out: list[ObjectInfo] = []
        cut = len(self.root) + 1
        for entry in self._walk(top, temp=False):
            try:
                size = entry.stat().st_size
            except FileNotFoundError:  # deleted while we were listing
                continue
            except OSError as e:
                raise StorageError(f"cannot stat {entry.path!r} while listing {prefix!r}: {e}") from e
            key = entry.path[cut:]
            if os.sep != "/":
                key = key.replace(os.sep, "/")
            out.append(ObjectInfo(key, size))
        out.sort(key=lambda info: info.key)
        return out

    def delete(self, key: str) -> None:
        """Delete the object; an absent key is not an error."""
        try:
            os.unlink(self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            pass
        except (IsADirectoryError, PermissionError) as e:
            # A key that is only a "directory" is not an object (macOS says EPERM).
            if not os.path.isdir(self._path(key)):
                raise StorageError(f"cannot delete object {key!r}: {e}") from e
        except OSError as e:
            raise StorageError(f"cannot delete object {key!r}: {e}") from e

    def exists(self, key: str) -> bool:
        """Whether the object exists now."""
        return os.path.isfile(self._path(key))

    def size(self, key: str) -> int:
        """The object's size from ``stat``; ``ObjectNotFoundError`` if absent."""
        path = self._path(key)
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFoundError(key) from None
        except OSError as e:
            raise StorageError(f"cannot stat object {key!r}: {e}") from e
        if not stat.S_ISREG(st.st_mode):
            raise ObjectNotFoundError(key)
        return st.st_size

    def cleanup_temp_files(self, older_than_s: float) -> int:
        """Remove ``.tmp-*`` files older than ``older_than_s`` seconds; return how many.

        They are left by writers killed between writing and linking. Pick an age
        well above the longest write, or a live writer's file may be removed
        (its ``put_if_absent`` then fails with ``StorageError``; nothing is corrupted).
        """
        cutoff = time.time() - older_than_s
        removed = 0
        for entry in self._walk(self.root, temp=True):
            try:
                if entry.stat(follow_symlinks=False).st_mtime <= cutoff:
                    os.unlink(entry.path)
                    removed += 1
            except FileNotFoundError:
                continue
            except OSError as e:
                raise StorageError(f"cannot remove temporary file {entry.path!r}: {e}") from e
        return removed


# -------------------------------------------------------------------------- memory

_MEMORY_LOCK = threading.Lock()
_MEMORY_STORES: dict[str, dict[str, bytes]] = {}


class MemoryStore(Store):
    """A process-wide in-memory store: every ``MemoryStore`` with the same name shares its objects.

    Useful for tests and notebooks; nothing survives the process, and other
    processes do not see it.
    """

    def __init__(self, name: str) -> None:
        """Open (creating if new) the in-memory namespace called ``name``."""
        if not name:
            raise InvalidConfigError("memory store needs a name: memory://<name>")
        self.name = name
        self.url = f"memory://{name}"
        with _MEMORY_LOCK:
            self._objects = _MEMORY_STORES.setdefault(name, {})

    def get(self, key: str) -> bytes:
        """Return the whole object; ``ObjectNotFoundError`` if absent."""
        _check_key(key)
        with _MEMORY_LOCK:
            try:
                return self._objects[key]
            except KeyError:
                raise ObjectNotFoundError(key) from None

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Return bytes ``[start, end)``, clipped to the object's size."""
        _check_range(key, start, end)
        return self.get(key)[start:end]

    def put_if_absent(self, key: str, data: bytes, *, durable: bool = True) -> bool:
        """Create the object unless the key exists (``durable`` is meaningless here)."""
        _check_key(key)
        payload = bytes(data)
        with _MEMORY_LOCK:
            if key in self._objects:
                return False
            self._objects[key] = payload
            return True

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object under ``prefix``, sorted by key."""
        _check_prefix(prefix)
        with _MEMORY_LOCK:
            items = [(k, len(v)) for k, v in self._objects.items() if k.startswith(prefix)]
        return [ObjectInfo(k, n) for k, n in sorted(items)]

    def delete(self, key: str) -> None:
        """Delete the object; an absent key is not an error."""
        _check_key(key)
        with _MEMORY_LOCK:
            self._objects.pop(key, None)

    def exists(self, key: str) -> bool:
        """Whether the object exists now."""
        _check_key(key)
        with _MEMORY_LOCK:
            return key in self._objects

    def size(self, key: str) -> int:
        """The object's size; ``ObjectNotFoundError`` if absent."""
        return len(self.get(key))

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under ``prefix`` in one locked step; returns how many."""
        _check_prefix(prefix)
        with _MEMORY_LOCK:
            doomed = [k for k in self._objects if k.startswith(prefix)]
            for k in doomed:
                del self._objects[k]
        return len(doomed)


# -------------------------------------------------------------------------- fsspec

#: How ``pipe_file`` is asked for an atomic create on each known protocol.
#: A backend not listed here has no known atomic create-if-absent; fsspec's
#: generic ``pipe_file(mode="create")`` is exists-then-write, which is not atomic.
_S3_PROTOCOLS = frozenset({"s3", "s3a"})
_GCS_PROTOCOLS = frozenset({"gs", "gcs"})
_AZURE_PROTOCOLS = frozenset({"abfs", "abfss", "az"})

#: Tries of a conditional PUT that S3 answered with 409 ConditionalRequestConflict.
_CONFLICT_RETRIES = 5


def _protocols(fs: Any) -> set[str]:
    proto = getattr(fs, "protocol", ())
    return {proto} if isinstance(proto, str) else set(proto)


def _default_create_kwargs(fs: Any) -> dict[str, Any] | None:
    """The ``pipe_file`` keyword arguments that make it an atomic create-if-absent, if known."""
    protos = _protocols(fs)
    if protos & (_S3_PROTOCOLS | _GCS_PROTOCOLS):
        # s3fs: PutObject / CompleteMultipartUpload with If-None-Match: *;
        # gcsfs: upload with ifGenerationMatch=0.
        return {"mode": "create"}
    if protos & _AZURE_PROTOCOLS:
        # adlfs: upload_blob(overwrite=False), i.e. If-None-Match: *. Newer
        # versions may take fsspec's ``mode`` instead; follow the signature.
        params: Mapping[str, Any]
        try:
            params = inspect.signature(fs.pipe_file).parameters
        except (TypeError, ValueError):
            params = {}
        return {"overwrite": False} if "overwrite" in params else {"mode": "create"}
    return None


def _error_chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _error_code(exc: BaseException) -> tuple[str, int | None]:
    """The service error code and HTTP status behind an exception, if it wraps a boto ``ClientError``."""
    for e in _error_chain(exc):
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            code = str(response.get("Error", {}).get("Code", ""))
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            return code, status if isinstance(status, int) else None
    return "", None


def _is_already_exists(exc: BaseException) -> bool:
    """Whether a failed conditional create failed because the key is taken."""
    for e in _error_chain(exc):
        if isinstance(e, FileExistsError):
            return True
        name = type(e).__name__
        if name == "ResourceExistsError":  # azure.core.exceptions
            return True
        if name == "HttpError" and getattr(e, "code", None) == 412:  # gcsfs
            return True
    code, status = _error_code(exc)
    return code == "PreconditionFailed" or status == 412


def _is_not_found(exc: BaseException) -> bool:
    return any(isinstance(e, FileNotFoundError) for e in _error_chain(exc))


def _is_conflict(exc: BaseException) -> bool:
    code, _ = _error_code(exc)
    return code == "ConditionalRequestConflict"


class FsspecStore(Store):
    """A store on any fsspec filesystem with an atomic create-if-absent (S3, GCS, Azure Blob).

    ``put_if_absent`` is the object store's conditional create (for s3fs,
    ``pipe_file(path, data, mode="create")``, a PutObject with
    ``If-None-Match: *``); a taken key (``412 PreconditionFailed``) returns
    ``False``. Listings always go to the server: the filesystem's listings
    cache is bypassed, so list-after-write holds across processes.
    """

    def __init__(
        self,
        fs: Any,
        root: str,
        url: str,
        *,
        create_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        """Wrap ``fs`` with keys below ``root`` (a path in ``fs``'s own form, e.g. ``bucket/plog``).

        ``create_kwargs`` are the ``fs.pipe_file`` keyword arguments that make
        a write an atomic create-if-absent; they default to the known ones for
        S3, GCS and Azure. Any other filesystem gives ``InvalidConfigError``
        unless they are given, because an exists-then-write would break the
        protocol's only atomicity guarantee.
        """
        self.fs = fs
        self.url = url
        self.root = str(fs._strip_protocol(root)).rstrip("/")
        if not self.root:
            raise InvalidConfigError(f"storage URL {url!r} needs a bucket or container: e.g. s3://bucket/plog")
        kwargs = dict(create_kwargs) if create_kwargs is not None else _default_create_kwargs(fs)
        if kwargs is None:
            raise InvalidConfigError(
                f"storage URL {url!r}: filesystem {type(fs).__name__} (protocol "
                f"{sorted(_protocols(fs))}) has no known atomic create-if-absent; "
                "plog needs one (supported: s3, gs/gcs, abfs/az)"
            )
        self._create_kwargs: dict[str, Any] = kwargs

    def _path(self, key: str) -> str:
        _check_key(key)
        return f"{self.root}/{key}"

    def _call(self, what: str, key: str, fn: Callable[[], Any]) -> Any:
        """Run a backend call; a missing object gives ``ObjectNotFoundError``, a failure ``StorageError``."""
        try:
            return fn()
        except StorageError:
            raise
        except Exception as e:
            if _is_not_found(e):
                raise ObjectNotFoundError(key) from e
            raise StorageError(f"{what} {key!r} at {self.url!r} failed: {type(e).__name__}: {e}") from e

    def get(self, key: str) -> bytes:
        """Return the whole object; ``ObjectNotFoundError`` if absent."""
        path = self._path(key)
        return bytes(self._call("reading object", key, lambda: self.fs.cat_file(path)))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Return bytes ``[start, end)``, clipped to the object's size.

        An HTTP range past the end is "unsatisfiable" and an empty one is
        malformed (the server then sends the whole object), so both cases are
        answered from the object's size instead.
        """
        _check_range(key, start, end)
        path = self._path(key)
        if start == end:
            self.size(key)  # raises ObjectNotFoundError if absent
            return b""
        try:
            # Keywords matter: s3fs's cat_file takes version_id as its second positional argument.
            return bytes(self.fs.cat_file(path, start=start, end=end))
        except Exception as e:
            if _is_not_found(e):
                raise ObjectNotFoundError(key) from e
            size = self.size(key)  # ObjectNotFoundError if it vanished meanwhile
            if start >= size:
                return b""
            raise StorageError(
                f"reading bytes [{start}, {end}) of object {key!r} at {self.url!r} failed: {type(e).__name__}: {e}"
            ) from e

    def put_if_absent(self, key: str, data: bytes, *, durable: bool = True) -> bool:
        """Create the object with the store's conditional create; ``False`` if the key is taken.

        Object stores are durable on acknowledgement, so ``durable`` changes nothing.
        """
        path = self._path(key)
        payload = bytes(data)
        for attempt in range(_CONFLICT_RETRIES):
            try:
                self.fs.pipe_file(path, payload, **self._create_kwargs)
                return True
            except Exception as e:
                if _is_already_exists(e):
                    return False
                if _is_conflict(e) and attempt + 1 < _CONFLICT_RETRIES:
                    # S3 answers 409 when a conditional write races another
                    # request on the key; retrying the conditional PUT is safe.
                    time.sleep(0.05 * 2**attempt)
                    continue
                raise StorageError(f"creating object {key!r} at {self.url!r} failed: {type(e).__name__}: {e}") from e
            finally:
                self._invalidate(path)
        raise AssertionError("unreachable")  # pragma: no cover

    def _invalidate(self, path: str) -> None:
        # A cache we cannot clear is not our failure.
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(path)

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object under ``prefix``, recursively, sorted by key, straight from the server."""
        _check_prefix(prefix)
        top = f"{self.root}/{prefix}".rstrip("/")
        self._invalidate(top)
        want = f"{self.root}/{prefix}"

        def find() -> Any:
            try:
                return self.fs.find(top, detail=True)
            except FileNotFoundError:
                # An absent prefix lists empty; an absent bucket is a failure.
                bucket = self.root.split("/", 1)[0]
                if not self.fs.exists(bucket):
                    raise StorageError(f"bucket or container {bucket!r} of {self.url!r} does not exist") from None
                return {}

        found = self._call("listing prefix", prefix, find)
        cut = len(self.root) + 1
        out = []
        for name, info in found.items():
            name = str(name)
            if not name.startswith(want) or name.endswith("/"):
                continue
            if info.get("type", "file") != "file":
                continue
            out.append(ObjectInfo(name[cut:], int(info.get("size") or 0)))
        out.sort(key=lambda info: info.key)
        return out

    def delete(self, key: str) -> None:
        """Delete the object; an absent key is not an error."""
        path = self._path(key)

        def rm() -> None:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(path)

        try:
            self._call("deleting object", key, rm)
        finally:
            self._invalidate(path)

    def _info(self, key: str) -> dict[str, Any] | None:
        path = self._path(key)
        self._invalidate(path)

        def info() -> dict[str, Any] | None:
            try:
                result = self.fs.info(path)
            except FileNotFoundError:
                return None
            return result if result.get("type") == "file" else None

        result: dict[str, Any] | None = self._call("inspecting object", key, info)
        return result

    def exists(self, key: str) -> bool:
        """Whether the object exists now (asks the server)."""
        return self._info(key) is not None

    def size(self, key: str) -> int:
        """The object's size from its metadata; ``ObjectNotFoundError`` if absent."""
        info = self._info(key)
        if info is None:
            raise ObjectNotFoundError(key)
        return int(info.get("size") or 0)


# ---------------------------------------------------------------------- open_store


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
