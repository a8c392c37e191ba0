"""`file://PATH`: a directory, local or shared (NFS, Lustre); the origin server's layout.

Layout: `PATH/objects/<key>` for objects, `PATH/manifest` for the manifest. Every write
goes to a temp file in the target directory, is fsynced, then linked or renamed into
place, so readers never see a partial object.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import suppress
from pathlib import Path
from typing import BinaryIO

from .base import Store
from .config import StoreConfig
from .errors import Conflict, NotFound
from .keys import validate_key

# What reading a key that is not a file raises (absent, a directory, under a file).
MISSING = (FileNotFoundError, IsADirectoryError, NotADirectoryError)
OBJECTS_DIR = "objects"
MANIFEST_NAME = "manifest"


class AtomicFile:
    """A file whose bytes appear at `path` all at once on `commit()`, or never.

    With `overwrite=False`, `commit()` links the file into place and raises
    FileExistsError if `path` exists; otherwise it atomically replaces `path`.
    `abort()` (or an exception inside a `with` block) leaves nothing behind.
    """

    def __init__(self, path: Path, *, overwrite: bool):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, self._tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.",
                                         suffix=".tmp")
        self._file: BinaryIO = os.fdopen(fd, "wb")
        self.path, self.overwrite = path, overwrite

    def write(self, data: bytes) -> None:
        """Append `data` to the pending file."""
        self._file.write(data)

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

    def __init__(self, root: str | os.PathLike, config: StoreConfig | None = None):
        super().__init__(config)
        self.root = Path(root)
        self.objects = self.root / OBJECTS_DIR
        self.manifest_path = self.root / MANIFEST_NAME

    @classmethod
    def from_url(cls, url: str, config: StoreConfig | None = None) -> "FileStore":
        """Open `file:///abs/path` (or `file://relative/path`)."""
        return cls(url.partition("://")[2], config)

    def path_of(self, key: str) -> Path:
        """The file that holds `key` (the key is validated first)."""
        return self.objects / validate_key(key)

    def _put(self, key: str, data: bytes) -> None:
        path = self.path_of(key)
        try:
            with AtomicFile(path, overwrite=False) as f:
                f.write(data)
        except (FileExistsError, NotADirectoryError):
            if not path.is_file() or path.read_bytes() != data:
                raise Conflict(
                    f"cannot write {key!r}: it exists with other bytes (objects are "
                    f"immutable: use a new key), or it collides with another key used as "
                    f"a directory (as 'a' and 'a/b' do)") from None

    def _get(self, key: str) -> bytes:
        try:
            return self.path_of(key).read_bytes()
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

    def _put_manifest(self, data: bytes) -> None:
        with AtomicFile(self.manifest_path, overwrite=True) as f:
            f.write(data)

    def _get_manifest(self) -> bytes | None:
        try:
            return self.manifest_path.read_bytes()
        except FileNotFoundError:
            return None
