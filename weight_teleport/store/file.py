"""`file://PATH`: a directory, local or shared (NFS, Lustre); the origin server's layout.

Layout: `PATH/objects/<key>` for objects, `PATH/manifest` for the manifest. Every write
goes to a temp file in the target directory, is fsynced, then linked or renamed into
place, so readers never see a partial object. Manifest writes hold a POSIX record lock
on `PATH/.manifest.lock` (fcntl, honoured across processes and over NFS) while they
compare and replace, so conditional writes are atomic; the origin server takes it too.
"""

from __future__ import annotations

import errno
import fcntl
import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO

from .base import UNCONDITIONAL, IfMatch, Store, too_large
from .config import StoreConfig
from .errors import AuthError, Conflict, NotFound, StoreError, StoreFull
from .keys import check_manifest_etag, validate_key

# What reading a key that is not a file raises (absent, a directory, under a file).
MISSING = (FileNotFoundError, IsADirectoryError, NotADirectoryError)
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
OBJECTS_DIR = "objects"
MANIFEST_NAME = "manifest"
LOCK_NAME = ".manifest.lock"


class AtomicFile:
    """A file whose bytes appear at `path` all at once on `commit()`, or never.

    With `overwrite=False`, `commit()` links the file into place and raises
    FileExistsError if `path` exists; otherwise it atomically replaces `path`.
    `abort()` (or an exception inside a `with` block) leaves nothing behind.
    """

    def __init__(self, path: Path, *, overwrite: bool):
        path.parent.mkdir(parents=True, exist_ok=True)
        # The name is cut so that the temp name stays within a file name's 255 bytes.
        fd, self._tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:200]}.", suffix=".tmp")
        self._file: BinaryIO = os.fdopen(fd, "wb")
        self.path, self.overwrite = path, overwrite

    def write(self, data: bytes) -> None:
        """Append `data` to the pending file."""
        self._file.write(data)

    def fileno(self) -> int:
        """The pending file's descriptor, for positional writes (`os.pwrite`); a file
        written this way takes no `write()` calls. Valid until `commit()` or `abort()`."""
        return self._file.fileno()

    def commit(self) -> None:
        """Make the file durable and move it into place."""
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            if self.overwrite:
                os.replace(self._tmp, self.path)
            else:
                os.link(self._tmp, self.path)
            _fsync_dir(self.path.parent)
        finally:
            self.abort()

    def abort(self) -> None:
        """Drop the pending file (a no-op after `commit()`)."""
        self._file.close()
        with suppress(FileNotFoundError):
            os.unlink(self._tmp)

    def __enter__(self) -> "AtomicFile":
        return self

    def __exit__(self, exc_type: type | None, *exc: object) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileStore(Store):
    """A store in a directory; objects are written once, the manifest is replaced."""

    parallel_ranges = True

    def __init__(self, root: str | os.PathLike, config: StoreConfig | None = None):
        super().__init__(config)
        self.root = Path(root)
        self.objects = self.root / OBJECTS_DIR
        self.manifest_path = self.root / MANIFEST_NAME

    @classmethod
    def from_url(cls, url: str, config: StoreConfig | None = None) -> "FileStore":
        """Open `file:///abs/path` (`file://localhost/abs/path`), or `file://./rel/path`
        under the current directory. Anything else after `file://` would name a host
        (`file://tmp/store`, one slash short): refused, never read as a relative path."""
        rest = url.partition("://")[2]
        if rest.startswith("localhost/"):
            rest = rest[len("localhost") :]
        if not rest.startswith(("/", "./", "../")) and rest not in (".", ".."):
            host = rest.partition("/")[0]
            raise StoreError(
                f"{url!r} names the host {host!r}, which a file store cannot "
                f"reach: an absolute path takes three slashes (file:///{rest}), "
                f"a path under the current directory starts with ./ "
                f"(file://./{rest})"
            )
        return cls(rest, config)

    def path_of(self, key: str) -> Path:
        """The file that holds `key` (the key is validated first)."""
        return self.objects / validate_key(key)

    def _put(self, key: str, data: bytes) -> None:
        path = self.path_of(key)
        try:
            with self._space_checked(), AtomicFile(path, overwrite=False) as f:
                f.write(data)
        except (FileExistsError, NotADirectoryError):
            if not path.is_file() or path.read_bytes() != data:
                raise Conflict(
                    f"cannot write {key!r}: it exists with other bytes (objects are "
                    f"immutable: use a new key), or it collides with another key used as "
                    f"a directory (as 'a' and 'a/b' do)"
                ) from None

    def _get(self, key: str) -> bytes:
        try:
            return self.path_of(key).read_bytes()
        except MISSING:
            raise NotFound(f"no object {key!r} under {self.objects}") from None

    def _get_at_most(self, key: str, max_bytes: int) -> bytes:
        try:
            with open(self.path_of(key), "rb") as f:
                if os.fstat(f.fileno()).st_size > max_bytes:
                    raise too_large(key, max_bytes)
                return f.read(max_bytes + 1)  # the base refuses it if it grew meanwhile
        except MISSING:
            raise NotFound(f"no object {key!r} under {self.objects}") from None

    def _get_range(self, key: str, start: int, end: int) -> bytes:
        try:
            with open(self.path_of(key), "rb") as f:
                f.seek(start)
                return f.read(end - start)
        except MISSING:
            raise NotFound(f"no object {key!r} under {self.objects}") from None

    def _list(self, prefix: str) -> list[str]:
        top = self.objects / prefix.rpartition("/")[0]
        keys = []
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            rel = Path(dirpath).relative_to(self.objects).as_posix()
            for name in filenames:
                key = name if rel == "." else f"{rel}/{name}"
                if not name.startswith(".") and key.startswith(prefix):
                    keys.append(key)
        return keys

    def _delete(self, key: str) -> None:
        try:
            os.unlink(self.path_of(key))
        except MISSING:
            raise NotFound(f"no object {key!r} under {self.objects}") from None

    def _put_manifest(self, data: bytes, if_match: IfMatch = UNCONDITIONAL) -> None:
        with self._space_checked():
            out = AtomicFile(self.manifest_path, overwrite=True)
            try:
                out.write(data)
                self.commit_manifest(out, if_match)
            finally:
                out.abort()

    def commit_manifest(self, out: AtomicFile, if_match: IfMatch = UNCONDITIONAL) -> None:
        """Move `out` (a pending manifest) into place under the manifest lock, if the
        current manifest is the one `if_match` names (else ManifestChanged)."""
        with self.manifest_lock():
            if if_match is not UNCONDITIONAL:
                check_manifest_etag(self._get_manifest(), if_match)
            out.commit()

    @contextmanager
    def manifest_lock(self) -> Iterator[None]:
        """Hold the lock that every manifest write of this directory takes: a thread
        lock (POSIX record locks exclude other processes only), then the file lock."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / LOCK_NAME
        with _thread_lock(path):
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # releases the file lock

    def _get_manifest(self) -> bytes | None:
        try:
            with open(self.manifest_path, "rb") as f:
                return f.read(self.config.max_manifest_bytes + 1)  # the base refuses more
        except FileNotFoundError:
            return None

    def _check_write(self) -> None:
        """Create the directory if needed and write (then remove) a temp file in it."""
        try:
            with self._space_checked():
                self.root.mkdir(parents=True, exist_ok=True)
                fd, probe = tempfile.mkstemp(dir=self.root, prefix=".write-check.")
                os.close(fd)
                os.unlink(probe)
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise
            raise AuthError(
                f"cannot write to {self.root}: {exc.strerror}; give this "
                f"process write access to the directory or pick another "
                f"store"
            ) from None

    def _space_checked(self):
        return _no_space_is_store_full(self.root)


_THREAD_LOCKS: dict[str, threading.Lock] = {}
_THREAD_LOCKS_LOCK = threading.Lock()


def _thread_lock(path: Path) -> threading.Lock:
    with _THREAD_LOCKS_LOCK:
        return _THREAD_LOCKS.setdefault(os.path.realpath(path), threading.Lock())


@contextmanager
def _no_space_is_store_full(root: Path) -> Iterator[None]:
    """Turn a full disk or quota (ENOSPC, EDQUOT) into StoreFull."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in NO_SPACE:
            raise
        raise StoreFull(
            f"no space left under {root} ({exc.strerror}): free space or lower RetentionConfig.keep_anchors"
        ) from None
