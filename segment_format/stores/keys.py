"""What every backend refuses: keys, list prefixes and byte ranges outside the storage model (PROTOCOL.md 2-3)."""

from __future__ import annotations

from segment_format.errors import StorageError

#: Name prefix of the temporary files :class:`LocalStore` writes before linking
#: them into place. Listings skip them; :meth:`LocalStore.cleanup_temp_files`
#: removes the ones a killed writer left behind.
TEMP_PREFIX = ".tmp-"


def check_key(key: str) -> list[str]:
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


def check_prefix(prefix: str) -> None:
    """Refuse a listing prefix that is neither ``""`` nor a ``/``-terminated key."""
    if prefix == "":
        return
    if not prefix.endswith("/"):
        raise StorageError(f"invalid list prefix {prefix!r}: must be '' or end with '/'")
    check_key(prefix[:-1])


def check_range(key: str, start: int, end: int) -> None:
    """Refuse a byte range outside ``0 <= start <= end``."""
    if start < 0 or end < start:
        raise StorageError(f"invalid byte range [{start}, {end}) for object {key!r}")
