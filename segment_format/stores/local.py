"""The local-directory backend: ``put_if_absent`` is a hard link of a fully written temporary file."""

from __future__ import annotations

import contextlib
import os
import stat
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import BinaryIO

import pyarrow as pa

from segment_format.errors import ObjectNotFoundError, StorageError
from segment_format.stores.base import BytesLike, ObjectInfo, Store
from segment_format.stores.keys import TEMP_PREFIX, check_key, check_prefix, check_range


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
        return os.path.join(self.root, *check_key(key))

    @contextlib.contextmanager
    def _reading(self, key: str) -> Iterator[BinaryIO]:
        """The object's file, open for reading; a missing object (or a directory) is
        ``ObjectNotFoundError``, any other failure to open or read it ``StorageError``."""
        try:
            with open(self._path(key), "rb") as f:
                yield f
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFoundError(key) from None
        except OSError as e:
            raise StorageError(f"cannot read object {key!r}: {e}") from e

    def get(self, key: str) -> bytes:
        """Return the whole object; ``ObjectNotFoundError`` if absent."""
        with self._reading(key) as f:
            return f.read()

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Return bytes ``[start, end)``, clipped to the object's size."""
        check_range(key, start, end)
        with self._reading(key) as f:
            if start == end:
                return b""
            f.seek(start)
            return f.read(end - start)

    def get_range_buffer(self, key: str, start: int, end: int) -> pa.Buffer:
        """Bytes ``[start, end)``, clipped to the object's size, read into a buffer of Arrow's memory pool
        (see :meth:`Store.get_range_buffer`); through :meth:`get_range` in a subclass that overrides it."""
        if type(self).get_range is not LocalStore.get_range:
            return super().get_range_buffer(key, start, end)
        check_range(key, start, end)
        with self._reading(key) as f:
            length = max(0, min(end, os.fstat(f.fileno()).st_size) - start)
            buffer = pa.allocate_buffer(length)
            f.seek(start)
            got = f.readinto(memoryview(buffer))  # type: ignore[attr-defined]  # a buffered file fills it to EOF
        if got != length:  # objects never change, so the file cannot have shrunk since its size was read
            raise StorageError(f"cannot read object {key!r}: {got} of {length} bytes came back")
        return buffer

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
        return self._create(key, (data,), durable)

    def put_if_absent_parts(self, key: str, parts: Iterable[BytesLike], *, durable: bool = True) -> bool:
        """Create the object from ``parts``, each written to the temp file as soon as it is produced."""
        return self._create(key, parts, durable)

    def _create(self, key: str, parts: Iterable[BytesLike], durable: bool) -> bool:
        """Write ``parts`` to a temp file, then ``os.link`` it to the key: created whole, or not at all."""
        final = self._path(key)
        parent = os.path.dirname(final)
        tmp = os.path.join(parent, f"{TEMP_PREFIX}{uuid.uuid4().hex}")
        try:
            created_dirs = self._makedirs(parent)
            with open(tmp, "xb") as f:
                _write_parts(f, parts)
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
        except _PartFailed as e:  # the parts' producer failed, not the disk: its own error, unchanged
            raise e.error from None
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

    def replace(self, key: str, data: bytes) -> None:
        """Make the object hold ``data``: a temporary file renamed over the key (``rename(2)`` is atomic)."""
        final = self._path(key)
        parent = os.path.dirname(final)
        tmp = os.path.join(parent, f"{TEMP_PREFIX}{uuid.uuid4().hex}")
        try:
            self._makedirs(parent)
            with open(tmp, "xb") as f:
                f.write(data)
            if os.path.isdir(final):
                raise StorageError(f"cannot replace object {key!r}: a directory of that name holds other objects")
            os.replace(tmp, final)
        except (NotADirectoryError, IsADirectoryError) as e:
            raise StorageError(f"cannot replace object {key!r}: a path segment is taken: {e}") from e
        except OSError as e:
            raise StorageError(f"cannot replace object {key!r} in {self.root!r}: {e}") from e
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

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
        check_prefix(prefix)
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


class _PartFailed(Exception):
    """An exception raised while producing a part to write: it is the caller's, never a storage error."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _write_parts(file: BinaryIO, parts: Iterable[BytesLike]) -> None:
    """Write each part as it comes; a failure to produce one is told apart from a failure to write it."""
    iterator = iter(parts)
    while True:
        try:
            part = next(iterator)
        except StopIteration:
            return
        except Exception as exc:  # noqa: BLE001 - re-raised unchanged by the create
            raise _PartFailed(exc) from exc
        file.write(part)
