"""Temporary files of the local backend (PROTOCOL.md 3): ``.tmp-<uuid>`` left by writers killed mid-write."""

from __future__ import annotations

from segment_format.root import TEMP_FILE_MAX_AGE_S

from .base import CollectionContext, NamespaceCollector


class TempFilesCollector(NamespaceCollector):
    """``.tmp-*`` files older than an hour, on backends that have them (the local disk); no request."""

    namespace = "temp-files"
    every = 36

    def collect(self, context: CollectionContext) -> int:
        """The backend's own cleanup, if it has one (object stores create objects whole and have none)."""
        cleanup = getattr(context.raw_store, "cleanup_temp_files", None)
        return int(cleanup(TEMP_FILE_MAX_AGE_S)) if cleanup is not None else 0
