"""How each object store spells an atomic create-if-absent, and how a create recognises its own object.

``FsspecStore.put_if_absent`` (PROTOCOL.md 2) needs one conditional request per create: S3's
``If-None-Match: *``, GCS's ``ifGenerationMatch=0``, Azure Blob's ``If-None-Match: *``. fsspec's generic
``pipe_file(mode="create")`` is exists-then-write, which is not atomic, so a backend not known here is refused.
A refused create reads back the create id it wrote into the object's user metadata to tell a lost answer to
its own create from another writer's object.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from segment_format.stores.retrying import error_chain, service_error

#: How ``pipe_file`` is asked for an atomic create on each known protocol.
#: A backend not listed here has no known atomic create-if-absent; fsspec's
#: generic ``pipe_file(mode="create")`` is exists-then-write, which is not atomic.
S3_PROTOCOLS = frozenset({"s3", "s3a"})
#: How much of a refused create's object is read first to tell whether it is the caller's own
#: (backends without the create id).
COMPARE_SUFFIX_BYTES = 64 * 1024
#: The user metadata (``x-amz-meta-plog-create-id`` on S3, ``x-goog-meta-plog-create-id`` on GCS) by which
#: a create recognises its own object.
CREATE_ID_METADATA = "plog-create-id"
#: The same on Azure Blob, whose metadata names must be C# identifiers (``x-ms-meta-plog_create_id``).
AZURE_CREATE_ID_METADATA = "plog_create_id"
GCS_PROTOCOLS = frozenset({"gs", "gcs"})
#: The size from which gcsfs's ``pipe_file`` would switch to a resumable upload (its ``chunksize``;
#: gcsfs's own default is 50 MiB). plog sets it past any object it writes, so that a create on GCS is
#: always one multipart upload request carrying ``ifGenerationMatch=0``: GCS honours the condition on
#: a resumable upload too, but fake-gcs-server before 1.55 ignores it there, so merged segments near
#: ``segment.bytes`` were unprotected on the emulator. A segment is held in memory whole either way,
#: so one request streams nothing less than a resumable upload would.
GCS_ONE_REQUEST_BYTES = 2**40
AZURE_PROTOCOLS = frozenset({"abfs", "abfss", "az"})


def protocols(fs: Any) -> set[str]:
    proto = getattr(fs, "protocol", ())
    return {proto} if isinstance(proto, str) else set(proto)


def default_create_kwargs(fs: Any) -> dict[str, Any] | None:
    """The ``pipe_file`` keyword arguments that make it an atomic create-if-absent, if known."""
    protos = protocols(fs)
    if protos & S3_PROTOCOLS:
        # s3fs: PutObject / CompleteMultipartUpload with If-None-Match: *.
        return {"mode": "create"}
    if protos & GCS_PROTOCOLS:
        # gcsfs: an upload with ifGenerationMatch=0, always in one request (see GCS_ONE_REQUEST_BYTES).
        # A gcsfs whose pipe_file takes no ``mode`` has no conditional create: none is known then.
        if not {"mode", "chunksize"} <= set(_parameters(fs)):
            return None
        return {"mode": "create", "chunksize": GCS_ONE_REQUEST_BYTES}
    if protos & AZURE_PROTOCOLS:
        # adlfs: upload_blob(overwrite=False), i.e. If-None-Match: *. Newer
        # versions may take fsspec's ``mode`` instead; follow the signature.
        return {"overwrite": False} if "overwrite" in _parameters(fs) else {"mode": "create"}
    return None


def _parameters(fs: Any) -> Mapping[str, Any]:
    """The parameters of ``fs``'s ``_pipe_file`` (async filesystems) or ``pipe_file``; empty if unknown."""
    try:
        return inspect.signature(getattr(fs, "_pipe_file", None) or fs.pipe_file).parameters
    except (TypeError, ValueError):
        return {}


def is_already_exists(exc: BaseException) -> bool:
    """Whether a failed conditional create failed because the key is taken."""
    for e in error_chain(exc):
        if isinstance(e, FileExistsError):
            return True
        name = type(e).__name__
        if name == "ResourceExistsError":  # azure.core.exceptions
            return True
        if name == "HttpError" and getattr(e, "code", None) == 412:  # gcsfs
            return True
    code, status = service_error(exc)
    return code == "PreconditionFailed" or status == 412


def is_not_found(exc: BaseException) -> bool:
    return any(isinstance(e, FileNotFoundError) for e in error_chain(exc))


def _azure_blob(fs: Any, path: str, call: Callable[[Any], Any]) -> Any:
    """``await call(blob_client)`` for the blob at ``path``, on adlfs's loop and service client."""
    from fsspec.asyn import sync

    container, blob, _ = fs.split_path(path)

    async def run() -> Any:
        async with fs.service_client.get_blob_client(container=container, blob=blob) as client:
            return await call(client)

    return sync(fs.loop, run)


def azure_create(fs: Any, path: str, payload: bytes, create_id: str) -> None:
    """adlfs's ``pipe_file(overwrite=False)`` with the create id in the blob's metadata.

    ``upload_blob(overwrite=False)`` sends ``If-None-Match: *`` on the Put Blob, or
    on the Put Block List that commits a blob uploaded in blocks: atomic either way.
    ``is_directory`` is what adlfs itself stores, by which it tells files from folders.
    """
    metadata = {"is_directory": "false", AZURE_CREATE_ID_METADATA: create_id}
    concurrency = getattr(fs, "max_concurrency", None) or 1
    _azure_blob(
        fs,
        path,
        lambda client: client.upload_blob(payload, overwrite=False, metadata=metadata, max_concurrency=concurrency),
    )


def azure_metadata(fs: Any, path: str) -> dict[str, str]:
    """The blob's user metadata (one Get Blob Properties); FileNotFoundError if it is absent."""

    async def props(client: Any) -> dict[str, str]:
        try:
            return dict((await client.get_blob_properties()).metadata or {})
        except Exception as e:
            if type(e).__name__ == "ResourceNotFoundError":  # azure.core.exceptions
                raise FileNotFoundError(path) from e
            raise

    result: dict[str, str] = _azure_blob(fs, path, props)
    return result
