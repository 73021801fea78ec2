"""The object-store backend on any fsspec filesystem with an atomic create-if-absent (S3, GCS, Azure Blob)."""

from __future__ import annotations

import contextlib
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from segment_format.errors import InvalidConfigError, ObjectNotFoundError, StorageError
from segment_format.stores.base import ObjectInfo, Store
from segment_format.stores.conditional_create import (
    AZURE_CREATE_ID_METADATA,
    AZURE_PROTOCOLS,
    COMPARE_SUFFIX_BYTES,
    CREATE_ID_METADATA,
    GCS_PROTOCOLS,
    S3_PROTOCOLS,
    azure_create,
    azure_metadata,
    default_create_kwargs,
    is_already_exists,
    is_not_found,
    protocols,
)
from segment_format.stores.keys import check_key, check_prefix, check_range
from segment_format.stores.retrying import (
    BACKOFF_MAX_OPTION,
    BACKOFF_OPTION,
    DEADLINE_OPTION,
    TRANSIENT_CODES,
    RetryPolicy,
    TransientError,
    is_transient,
    service_error,
)

_T = TypeVar("_T")

#: Plain lists (inside the store class, ``list`` names its method).
_Infos = list[ObjectInfo]


class FsspecStore(Store):
    """A store on any fsspec filesystem with an atomic create-if-absent (S3, GCS, Azure Blob).

    ``put_if_absent`` is the object store's conditional create (for s3fs,
    ``pipe_file(path, data, mode="create")``, a PutObject with
    ``If-None-Match: *``); a taken key (``412 PreconditionFailed``) returns
    ``False``. Listings always go to the server: the filesystem's listings
    cache is bypassed, so list-after-write holds across processes.

    **Retries** (PROTOCOL.md 2, *Retries and lost answers*). Every operation
    is retried after a transient failure (throttling, a 5xx answer, a reset
    or cut connection, a timed-out answer: :func:`~segment_format.stores.
    retrying.is_transient`) with exponential back-off and full jitter, within
    a deadline for the whole operation; past it, a ``StorageError`` names the
    operation, the key and the last failure. Answers (a missing object, a
    refused conditional create, a denied request) are never retried. The
    storage options that :func:`~segment_format.stores.open_store` takes out
    for this (all in milliseconds, positive integers):

    * ``plog_deadline_ms`` (default 60000): the bound on one operation, all
      tries and back-offs included (Kafka's ``delivery.timeout.ms`` is 120 s
      for a whole delivery, which may take several operations);
    * ``plog_retry_backoff_ms`` (default 100): the first back-off's upper
      bound, doubled after each try (Kafka's ``retry.backoff.ms``);
    * ``plog_retry_backoff_max_ms`` (default 2000): the cap of one back-off.

    On S3 this loop is the only one: ``open_store`` sets botocore to one try
    per request unless ``config_kwargs["retries"]`` is given, and s3fs's own
    retry loop to one try (its ``retries`` attribute), so that no try is sent
    without the deadline being checked first; ``connect_timeout`` and
    ``read_timeout`` (s3fs: 5 s and 15 s) bound each request, so an operation
    overruns its deadline by at most one request's timeouts. A caller's
    bound (:meth:`deadline`) is checked before every try of a create, the
    first included: past it nothing is sent. Requests made while settling an operation (a
    refused create's check) share its deadline.

    A conditional create whose answer was lost (the PUT took effect, the
    connection broke) is retried like any other request, and the retry is
    refused with 412 because the object is there: our own. Retries happen
    below this class too, where it cannot see them (botocore's; aiohttp
    resends an idempotent request once when a kept-alive connection breaks),
    so every refusal is checked (PROTOCOL.md 2). On S3, GCS and Azure Blob
    each create carries a random create id as user metadata
    (``x-amz-meta-plog-create-id``, ``x-goog-meta-plog-create-id``,
    ``x-ms-meta-plog_create_id``), and a refused create asks for the object's
    metadata (one request): the object is this call's iff the id is its own.
    Other filesystems (or explicit ``create_kwargs``) compare the stored bytes
    with those sent, which is exact when the bytes are unique to the writer.
    A create that succeeds costs nothing more.

    **GCS**: a create is one upload request with ``ifGenerationMatch=0``,
    whatever the object's size (:data:`GCS_ONE_REQUEST_BYTES`). **Azure
    Blob**: ``upload_blob(overwrite=False)``, ``If-None-Match: *`` on the Put
    Blob or on the Put Block List that commits a blob sent in blocks.
    """

    billed_per_request = True

    def __init__(
        self,
        fs: Any,
        root: str,
        url: str,
        *,
        create_kwargs: Mapping[str, Any] | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        """Wrap ``fs`` with keys below ``root`` (a path in ``fs``'s own form, e.g. ``bucket/plog``).

        ``create_kwargs`` are the ``fs.pipe_file`` keyword arguments that make
        a write an atomic create-if-absent; they default to the known ones for
        S3, GCS and Azure. Any other filesystem gives ``InvalidConfigError``
        unless they are given, because an exists-then-write would break the
        protocol's only atomicity guarantee. ``retry`` bounds and spaces the
        retries of every operation (default: :class:`RetryPolicy`'s defaults).
        """
        self.fs = fs
        self.url = url
        self.retry = retry if retry is not None else RetryPolicy()
        self._rng = random.Random()
        #: Tries repeated after transient failures, for metrics (``CountingStore.retries``); += under the GIL
        #: may miss one when threads retry at once, which a count for operators can afford.
        self.retries = 0
        #: The deadline (monotonic s) of the operation this thread is retrying, if any: a request made
        #: while settling it (a refused create's check) shares it rather than starting a deadline of its own.
        self._operation = threading.local()
        self.root = str(fs._strip_protocol(root)).rstrip("/")
        if not self.root:
            raise InvalidConfigError(f"storage URL {url!r} needs a bucket or container: e.g. s3://bucket/plog")
        kwargs = dict(create_kwargs) if create_kwargs is not None else default_create_kwargs(fs)
        if kwargs is None:
            raise InvalidConfigError(
                f"storage URL {url!r}: filesystem {type(fs).__name__} (protocol "
                f"{sorted(protocols(fs))}) has no known atomic create-if-absent; "
                "plog needs one (supported: s3, gs/gcs, abfs/az; on gs/gcs a gcsfs whose pipe_file takes "
                "mode='create')"
            )
        self._create_kwargs: dict[str, Any] = kwargs
        self._s3 = bool(protocols(fs) & S3_PROTOCOLS) and callable(getattr(fs, "_call_s3", None))
        self._gcs = bool(protocols(fs) & GCS_PROTOCOLS) and create_kwargs is None
        # adlfs's pipe_file sets the blob's metadata itself, so a create with a create id goes to its
        # blob client directly (the same upload_blob call, with the id added).
        self._azure = (
            bool(protocols(fs) & AZURE_PROTOCOLS)
            and create_kwargs is None
            and getattr(fs, "service_client", None) is not None
        )
        # Where the root is on S3: its bucket, and the prefix of its keys there ("" or ends with "/").
        self._bucket, _, below = self.root.partition("/")
        self._below = below + "/" if below else ""

    def _path(self, key: str) -> str:
        check_key(key)
        return f"{self.root}/{key}"

    def _retrying(self, what: str, key: str, fn: Callable[[], _T]) -> _T:
        """``fn()`` until it returns, retrying transient failures within the deadline.

        A failure that is not transient propagates as it is; the last transient
        one past the deadline becomes a ``StorageError`` naming ``what``, ``key``,
        the tries made and the option that sets the deadline.
        """
        policy = self.retry
        started = time.monotonic()
        outer: float | None = getattr(self._operation, "deadline", None)
        # An enclosing operation's (or caller's, :meth:`deadline`) bound holds if it comes first.
        deadline = started + policy.deadline_s if outer is None else min(outer, started + policy.deadline_s)
        self._operation.deadline = deadline
        attempt = 0
        try:
            while True:
                try:
                    return fn()
                except Exception as e:
                    if isinstance(e, StorageError) or not is_transient(e):
                        raise
                    pause = policy.delay(attempt, self._rng)
                    if time.monotonic() + pause >= deadline:
                        raise self._gave_up(what, key, attempt, started, e) from e
                    time.sleep(pause)
                    attempt += 1
                    self.retries += 1
        finally:
            self._operation.deadline = outer

    @contextlib.contextmanager
    def deadline(self, at_monotonic: float) -> Iterator[None]:
        """Inside the block, this thread's operations retry no try after ``at_monotonic`` (see :class:`Store`)."""
        outer: float | None = getattr(self._operation, "deadline", None)
        outer_send_by: float | None = getattr(self._operation, "send_by", None)
        self._operation.deadline = at_monotonic if outer is None else min(outer, at_monotonic)
        self._operation.send_by = at_monotonic if outer_send_by is None else min(outer_send_by, at_monotonic)
        try:
            yield
        finally:
            self._operation.deadline = outer
            self._operation.send_by = outer_send_by

    def _gave_up(self, what: str, key: str, attempt: int, started: float, e: Exception) -> StorageError:
        """The error an operation ends with when its deadline has passed."""
        policy = self.retry
        elapsed = time.monotonic() - started
        return StorageError(
            f"{what} {key!r} at {self.url!r} failed: gave up after {attempt + 1} tries in "
            f"{elapsed:.1f} s (deadline {policy.deadline_s:g} s, storage option "
            f"{DEADLINE_OPTION!r}; back-off {BACKOFF_OPTION!r}, {BACKOFF_MAX_OPTION!r}); "
            f"last failure: {type(e).__name__}: {e}"
        )

    def _call(self, what: str, key: str, fn: Callable[[], Any]) -> Any:
        """A backend call, retried; an absent object gives ``ObjectNotFoundError``, a failure ``StorageError``."""
        try:
            return self._retrying(what, key, fn)
        except StorageError:
            raise
        except Exception as e:
            if is_not_found(e):
                raise ObjectNotFoundError(key) from e
            raise StorageError(f"{what} {key!r} at {self.url!r} failed: {type(e).__name__}: {e}") from e

    def get(self, key: str) -> bytes:
        """Return the whole object; ``ObjectNotFoundError`` if absent."""
        path = self._path(key)
        # s3fs's cat_file asks for the size first (a HEAD, and a LIST after a 404) to decide on
        # a chunked download; one GET is the whole answer for objects of plog's sizes.
        kwargs = {"max_concurrency": 1} if self._s3 else {}
        return bytes(self._call("reading object", key, lambda: self.fs.cat_file(path, **kwargs)))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Return bytes ``[start, end)``, clipped to the object's size.

        An HTTP range past the end is "unsatisfiable" and an empty one is
        malformed (the server then sends the whole object), so both cases are
        answered from the object's size instead.
        """
        check_range(key, start, end)
        path = self._path(key)
        if start == end:
            self.size(key)  # raises ObjectNotFoundError if absent
            return b""
        what = f"reading bytes [{start}, {end}) of object"
        try:
            # Keywords matter: s3fs's cat_file takes version_id as its second positional argument.
            return bytes(self._retrying(what, key, lambda: self.fs.cat_file(path, start=start, end=end)))
        except StorageError:
            raise
        except Exception as e:
            if is_not_found(e):
                raise ObjectNotFoundError(key) from e
            size = self.size(key)  # ObjectNotFoundError if it vanished meanwhile
            if start >= size:
                return b""
            raise StorageError(f"{what} {key!r} at {self.url!r} failed: {type(e).__name__}: {e}") from e

    def put_if_absent(self, key: str, data: bytes, *, durable: bool = True) -> bool:
        """Create the object with the store's conditional create; ``False`` if the key is taken.

        Object stores are durable on acknowledgement, so ``durable`` changes
        nothing. A refusal is checked, since a try whose answer was lost may
        have created the object: on S3 by the create id it carries, elsewhere
        by its bytes (see the class docstring).
        """
        path = self._path(key)
        payload = bytes(data)
        kwargs = dict(self._create_kwargs)
        create_id = uuid.uuid4().hex
        if self._s3:
            kwargs["Metadata"] = {CREATE_ID_METADATA: create_id}
        elif self._gcs:
            kwargs["metadata"] = {CREATE_ID_METADATA: create_id}

        def attempt() -> bool:
            send_by: float | None = getattr(self._operation, "send_by", None)
            if send_by is not None and time.monotonic() >= send_by:
                # Not even a first try: the knowledge this create rests on is too old (PROTOCOL.md 8, 2, assumption A4).
                raise StorageError(
                    f"creating object {key!r} at {self.url!r}: not sent, its caller's bound has passed "
                    "(an append's knowledge of the log end is older than writer.max.staleness.ms)"
                )
            try:
                if self._azure:
                    azure_create(self.fs, path, payload, create_id)
                else:
                    self.fs.pipe_file(path, payload, **kwargs)
                return True
            except Exception as e:
                if not is_already_exists(e):
                    raise
            finally:
                self._invalidate(path)
            # Refused. An earlier try may have created the object and lost the answer: ours,
            # botocore's, or one nobody above aiohttp sees (it resends an idempotent request once
            # when a kept-alive connection breaks). So every refusal is checked, outside the
            # handler: a failure of the check must not carry the refusal as its context.
            return self._is_own(key, create_id, payload)

        try:
            return self._retrying("creating object", key, attempt)
        except StorageError:
            raise
        except Exception as e:
            raise StorageError(f"creating object {key!r} at {self.url!r} failed: {type(e).__name__}: {e}") from e

    def _is_own(self, key: str, create_id: str, payload: bytes) -> bool:
        """Whether the object at ``key`` is this call's own create, whose answer was lost.

        On S3, GCS and Azure Blob one metadata request (HEAD, an object GET,
        Get Blob Properties): the object's create id (user metadata) is
        ``create_id``. Elsewhere the object holds exactly ``payload``: its last
        :data:`COMPARE_SUFFIX_BYTES` and size first (a segment ends with its
        index, which names its append), the rest only when both match.
        """
        try:
            if self._s3:
                head = self._call("inspecting object", key, lambda: self._head(self._path(key)))
                return bool(head["metadata"].get(CREATE_ID_METADATA) == create_id)
            if self._gcs:
                path = self._path(key)
                self._invalidate(path)
                info = self._call("inspecting object", key, lambda: self.fs.info(path))
                return bool((info.get("metadata") or {}).get(CREATE_ID_METADATA) == create_id)
            if self._azure:
                metadata = self._call("inspecting object", key, lambda: azure_metadata(self.fs, self._path(key)))
                return bool(metadata.get(AZURE_CREATE_ID_METADATA) == create_id)
            tail, size = self.get_suffix(key, COMPARE_SUFFIX_BYTES)
        except ObjectNotFoundError:
            return False  # taken when refused, gone since: not ours to claim either way
        start = size - len(tail)
        if size != len(payload) or tail != payload[start:]:
            return False
        return start == 0 or self.get_range(key, 0, start) == payload[:start]

    def replace(self, key: str, data: bytes) -> None:
        """Make the object hold ``data``: one unconditional PUT (object stores replace whole objects atomically)."""
        path = self._path(key)
        payload = bytes(data)
        try:
            self._call("replacing object", key, lambda: self.fs.pipe_file(path, payload))
        finally:
            self._invalidate(path)

    def _invalidate(self, path: str) -> None:
        # A cache we cannot clear is not our failure.
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(path)

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object under ``prefix``, recursively, sorted by key, straight from the server."""
        if self._s3:
            # ListObjectsV2 pages and nothing else: s3fs's ``find`` follows an empty listing with
            # an ``info`` of the prefix itself (a HEAD and a LIST of ``<prefix>/``), two more billed
            # requests for every empty prefix; plog never stores an object at a prefix's own name.
            return list(self.list_after(prefix, ""))
        check_prefix(prefix)
        top = f"{self.root}/{prefix}".rstrip("/")
        self._invalidate(top)
        want = f"{self.root}/{prefix}"

        def find() -> Any:
            try:
                return self.fs.find(top, detail=True)
            except FileNotFoundError:
                self._require_bucket()  # an absent prefix lists empty; an absent bucket is a failure
                return {}

        found = self._call("listing prefix", prefix, find)
        if isinstance(found, list):
            # adlfs answers a path that is itself a blob (or nothing) with a list of names. A
            # listing prefix ends with "/", so no object at the prefix's own name belongs to it.
            found = {}
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

    def _require_bucket(self) -> None:
        """Raise ``StorageError`` if the root's bucket or container does not exist."""
        if not self.fs.exists(self._bucket):
            raise StorageError(f"bucket or container {self._bucket!r} of {self.url!r} does not exist") from None

    def _s3_key(self, key: str) -> str:
        """The S3 object key of ``key`` in the root's bucket (checked like every key)."""
        return self._path(key)[len(self._bucket) + 1 :]

    def _s3_call(self, operation: str, **params: Any) -> Any:
        """One S3 API call on the root's bucket through s3fs's client (its credentials and retries)."""
        from fsspec.asyn import sync

        return sync(self.fs.loop, self.fs._call_s3, operation, self.fs.kwargs, Bucket=self._bucket, **params)

    def list_after(self, prefix: str, start_after: str) -> Sequence[ObjectInfo]:
        """``list(prefix)`` from the first key after ``start_after``: on S3 the server skips the rest."""
        if not self._s3:
            return super().list_after(prefix, start_after)
        check_prefix(prefix)
        cut = len(self._below)

        def pages() -> Sequence[ObjectInfo]:
            out: _Infos = []
            params: dict[str, Any] = {"Prefix": self._below + prefix}
            if start_after > prefix:
                params["StartAfter"] = self._below + start_after
            while True:
                page = self._s3_call("list_objects_v2", **params)
                for item in page.get("Contents", []):
                    key = str(item["Key"])[cut:]
                    if key > start_after and not key.endswith("/"):
                        out.append(ObjectInfo(key, int(item.get("Size") or 0)))
                if not page.get("IsTruncated"):
                    return out
                params["ContinuationToken"] = page["NextContinuationToken"]

        def run() -> Sequence[ObjectInfo]:
            try:
                return pages()
            except FileNotFoundError:
                self._require_bucket()  # an absent prefix lists empty; an absent bucket is a failure
                return []

        return sorted(self._call("listing prefix", prefix, run), key=lambda info: info.key)

    def delete_many(self, keys: Sequence[str]) -> None:
        """Delete ``keys``: on S3 one DeleteObjects request per 1,000 keys, else one by one."""
        if not self._s3:
            super().delete_many(keys)
            return
        paths = [self._path(key) for key in keys]
        try:
            for i in range(0, len(keys), 1000):
                objects = [{"Key": self._s3_key(key)} for key in keys[i : i + 1000]]
                body: dict[str, Any] = {"Objects": objects, "Quiet": True}

                def batch(body: dict[str, Any] = body) -> Any:
                    out = self._s3_call("delete_objects", Delete=body)
                    # Keys S3 could not delete for now are deleted by doing the batch again.
                    busy = [e for e in out.get("Errors", []) if e.get("Code") in TRANSIENT_CODES]
                    if busy:
                        raise TransientError(f"{len(busy)} keys not deleted yet, e.g. {busy[0]}")
                    return out

                out = self._call("deleting objects", keys[i], batch)
                errors = [e for e in out.get("Errors", []) if e.get("Code") != "NoSuchKey"]
                if errors:
                    raise StorageError(f"deleting objects at {self.url!r} failed: {errors[:3]}")
        finally:
            for path in paths:
                self._invalidate(path)

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
                result = self._head(path) if self._s3 else self.fs.info(path)
            except FileNotFoundError:
                return None
            return result if result.get("type") == "file" else None

        result: dict[str, Any] | None = self._call("inspecting object", key, info)
        return result

    def _head(self, path: str) -> dict[str, Any]:
        """One HEAD request for an object (S3).

        s3fs's ``info`` follows a 404 with a LIST of ``<key>/`` to find a
        "directory"; plog keys are never directories, so that LIST is a second
        billed request per probe for nothing. A 404 raises FileNotFoundError.
        """
        out = self._s3_call("head_object", Key=path[len(self._bucket) + 1 :])
        return {"name": path, "size": out["ContentLength"], "type": "file", "metadata": out.get("Metadata", {})}

    def get_suffix(self, key: str, length: int) -> tuple[bytes, int]:
        """The last ``length`` bytes and the object's size; on S3 one GET with a suffix range.

        ``Range: bytes=-N`` returns the last N bytes (the whole object when it
        is shorter) and a ``Content-Range`` that gives the object's size, so a
        probe of an absent object costs one request (a 404), as a HEAD did,
        and a probe of a present one one request instead of a HEAD and a GET.
        Other filesystems take the default: the size, then the range.
        """
        if not self._s3 or length <= 0:
            return super().get_suffix(key, length)
        from fsspec.asyn import sync

        async def suffix() -> tuple[bytes, str | None]:
            resp = await self.fs._call_s3(
                "get_object",
                self.fs.kwargs,
                Bucket=self._bucket,
                Key=self._s3_key(key),
                Range=f"bytes=-{length}",
            )
            try:
                return await resp["Body"].read(), resp.get("ContentRange")
            finally:
                resp["Body"].close()

        what = f"reading the last {length} bytes of object"
        try:
            data, content_range = self._retrying(what, key, lambda: sync(self.fs.loop, suffix))
        except StorageError:
            raise
        except Exception as e:
            if is_not_found(e):
                raise ObjectNotFoundError(key) from e
            code, status = service_error(e)
            # An empty object has no satisfiable suffix range (416): answer from its size. Other
            # failures (throttling, the network, past the retries) are reported with no extra request.
            if (status == 416 or code == "InvalidRange") and self.size(key) == 0:
                return b"", 0
            raise StorageError(f"{what} {key!r} at {self.url!r} failed: {type(e).__name__}: {e}") from e
        data = bytes(data)
        # "bytes a-b/size"; a server that ignored the range sent the whole object with no Content-Range.
        size = int(content_range.rsplit("/", 1)[1]) if content_range else len(data)
        if len(data) > length:
            data = data[len(data) - length :]
        return data, size

    def exists(self, key: str) -> bool:
        """Whether the object exists now (asks the server)."""
        return self._info(key) is not None

    def size(self, key: str) -> int:
        """The object's size from its metadata; ``ObjectNotFoundError`` if absent."""
        info = self._info(key)
        if info is None:
            raise ObjectNotFoundError(key)
        return int(info.get("size") or 0)
