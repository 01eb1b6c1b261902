"""The object layer: the few operations a storage backend must offer, and the local-file backend.

A new backend (S3: :mod:`gpucert.store._s3`) implements only the small :class:`ObjectStore` protocol and
inherits every versioning rule of :mod:`gpucert.store._baselines`. The conditional write compares etags, a
hash of the content on files, so both backends answer the same question (docs/reference/store-layout.md).

Why a lock *and* an atomic rename on files: ``os.replace`` makes each write all-or-nothing, but two writers
could both read etag A and both replace it; the exclusive ``flock`` makes read-compare-replace one step
between writers (readers never take it: the rename already protects them).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable
from urllib.parse import unquote, urlsplit

from ..errors import StoreConflict, StoreNotFound, StoreUnavailable, StoreURIError

__all__ = ["Blob", "FileObjectStore", "ObjectStore", "check_key", "open_object_store", "require_root"]

#: The lock file that serialises conditional writes; hidden, so :meth:`FileObjectStore.list` skips it.
LOCK_NAME = ".gpucert-store.lock"


@dataclass(frozen=True)
class Blob:
    """An object's whole content and the etag that identifies that content."""

    data: bytes
    etag: str


@runtime_checkable
class ObjectStore(Protocol):
    """Whole-object storage under one root; keys are ``/``-separated relative paths.

    Every failure of the backend itself raises :class:`~gpucert.errors.StoreUnavailable`; a key that
    is not a safe relative path raises ``ValueError`` before the backend is touched.
    """

    @property
    def uri(self) -> str:
        """The root, as a URI a user can pass back to ``--store``."""

    def get(self, key: str) -> Blob | None:
        """The object's content and etag, or ``None`` when there is no such object."""

    def put(self, key: str, data: bytes) -> str:
        """Write the object whatever was there (all-or-nothing); return its etag."""

    def put_if(self, key: str, data: bytes, *, if_match: str | None) -> str:
        """Write the object only if its etag is still ``if_match`` (``None``: only if it does not exist);
        raises :class:`~gpucert.errors.StoreConflict`, having written nothing, when the condition fails."""

    def list(self, prefix: str) -> list[str]:
        """Every key that starts with ``prefix`` (a plain string prefix, as in S3), sorted."""

    def exists(self, key: str) -> bool:
        """Whether the object exists."""

    def delete(self, key: str) -> None:
        """Remove the object; a missing object is not an error."""

    def root_exists(self) -> bool:
        """Whether the root itself exists (a folder; an S3 bucket with something under the prefix).

        Raises :class:`~gpucert.store.BucketNotFound` when an S3 store's bucket is missing."""

    def link(self, key: str, *, expires_s: int) -> str:
        """A URL a browser can open to read the object (valid ``expires_s`` seconds where the backend
        signs links); the object need not exist yet."""


def check_key(key: str) -> str:
    """Return ``key`` if it is a safe relative key; raise ``ValueError`` otherwise.

    Keys become file paths on the file backend, so anything that could leave the root (``..``, an
    absolute path) is refused. Parts that start with a dot are refused too: the file backend keeps its
    temp files and its lock there, and an S3 backend that calls this too behaves the same.
    """
    if not isinstance(key, str) or not key:
        raise ValueError(f"a store key must be a non-empty string, not {key!r}")
    if key.startswith("/"):
        raise ValueError(f"store key {key!r} must be relative (no leading '/')")
    if "\\" in key or "\0" in key:
        raise ValueError(f"store key {key!r} contains a backslash or a NUL character")
    for part in key.split("/"):
        if not part:
            raise ValueError(f"store key {key!r} has an empty part")
        if part == "..":
            raise ValueError(f"store key {key!r} must not contain '..'")
        if part.startswith("."):
            raise ValueError(f"store key {key!r} has a part starting with '.', which the store reserves")
    return key


def _check_prefix(prefix: str) -> str:
    # A prefix may be empty or end in "/" (a "folder"); the rest follows the key rules.
    if prefix:
        check_key(prefix.rstrip("/") or "/")
    return prefix


def _etag(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


class FileObjectStore:
    """Objects as files under ``root``; the embedded default and the test bed.

    The root directory is created on the first write, not on open, so reading never leaves an empty
    directory behind.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root).absolute()

    @property
    def uri(self) -> str:
        return self.root.as_uri()

    def __repr__(self) -> str:
        return f"FileObjectStore({str(self.root)!r})"

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key).split("/"))

    def get(self, key: str) -> Blob | None:
        path = self._path(key)
        try:
            data = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            # As in S3, a "folder" or a path through a file is simply not an object.
            return None
        except OSError as exc:
            raise StoreUnavailable(f"cannot read {path}: {exc}") from exc
        return Blob(data, _etag(data))

    def exists(self, key: str) -> bool:
        path = self._path(key)
        try:
            return path.is_file()
        except OSError as exc:
            raise StoreUnavailable(f"cannot look up {path}: {exc}") from exc

    def root_exists(self) -> bool:
        try:
            return self.root.is_dir()
        except OSError as exc:
            raise StoreUnavailable(f"cannot look up {self.root}: {exc}") from exc

    def link(self, key: str, *, expires_s: int) -> str:
        # A file URI never expires; expires_s only matters to backends that sign links.
        return self._path(key).as_uri()

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink(missing_ok=True)
        except (IsADirectoryError, NotADirectoryError):
            return  # a "folder", or a path through a file: not an object, so nothing to delete
        except OSError as exc:
            raise StoreUnavailable(f"cannot delete {path}: {exc}") from exc
        _fsync_dir(path.parent)
        # As in S3, a "folder" lives only as long as something is in it; rmdir refuses a non-empty one,
        # so a folder another writer is filling stays (and _write_atomically retries if it loses it).
        folder = path.parent
        while folder != self.root and self.root in folder.parents:
            try:
                folder.rmdir()
            except OSError:
                break
            folder = folder.parent

    def put(self, key: str, data: bytes) -> str:
        path = self._path(key)
        try:
            self._write_atomically(path, data)
        except OSError as exc:
            raise StoreUnavailable(f"cannot write {path}: {exc}") from exc
        return _etag(data)

    def put_if(self, key: str, data: bytes, *, if_match: str | None) -> str:
        path = self._path(key)
        try:
            with self._locked():
                current = self.get(key)
                if if_match is None and current is not None:
                    raise StoreConflict(f"{path} already exists (etag {current.etag})")
                if if_match is not None and (current is None or current.etag != if_match):
                    found = "is gone" if current is None else f"has etag {current.etag}"
                    raise StoreConflict(f"{path} changed: expected etag {if_match}, but it {found}")
                self._write_atomically(path, data)
        except OSError as exc:
            raise StoreUnavailable(f"cannot write {path}: {exc}") from exc
        return _etag(data)

    def list(self, prefix: str) -> list[str]:
        _check_prefix(prefix)
        # Walk only the deepest directory the prefix names, not the whole root.
        folder, _, _ = prefix.rpartition("/")
        base = self.root.joinpath(*folder.split("/")) if folder else self.root
        keys: list[str] = []
        try:
            for dirpath, dirnames, filenames in os.walk(base, onerror=_raise):
                # Hidden entries are the store's own temp files and lock, never objects.
                dirnames[:] = [d for d in dirnames if not d.startswith(".")]
                rel = Path(dirpath).relative_to(self.root).as_posix()
                for name in filenames:
                    if name.startswith("."):
                        continue
                    key = name if rel == "." else f"{rel}/{name}"
                    if key.startswith(prefix):
                        keys.append(key)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise StoreUnavailable(f"cannot list {base}: {exc}") from exc
        return sorted(keys)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        # A fresh descriptor per call: flock excludes other open file descriptions, so this serialises
        # threads of one process as well as processes.
        fd = os.open(self.root / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the last descriptor releases the lock

    @staticmethod
    def _write_atomically(path: Path, data: bytes) -> None:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        for attempt in range(3):
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                # O_EXCL: never write through a file (or link) someone else left under the same name.
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
                break
            except FileNotFoundError:
                # delete() removed the folder, empty, between the mkdir and the open: make it again.
                if attempt == 2:
                    raise
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                # The data must be on disk before the rename makes it visible, or a power cut could
                # leave a complete-looking name over empty blocks.
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    # Makes the rename itself durable; some file systems cannot open a directory, which only costs
    # durability on a crash, not atomicity.
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _raise(exc: OSError) -> None:
    raise exc


def require_root(objects: ObjectStore) -> None:
    """Return if the store's root exists; raise :class:`~gpucert.store.StoreNotFound` naming it otherwise
    (read as an empty store, a typo in ``--store`` would silently drop every baseline)."""
    if not objects.root_exists():
        raise StoreNotFound(
            f"no store at {objects.uri}: its root does not exist (reading never creates one); check the "
            "URI, or create the store with a command that writes it (gpucert baseline build, gpucert certify)"
        )


def open_object_store(uri: str, *, create: bool = True) -> ObjectStore:
    """The object layer for a store root URI: ``file:///abs/path`` or a local path, or ``s3://bucket/prefix``.

    With ``create=False`` (readers) the root must already exist (:func:`require_root`). Raises
    :class:`~gpucert.store.StoreURIError` naming a URI that cannot be opened, and
    :class:`~gpucert.store.StoreNotFound` for a missing root with ``create=False``.
    """
    if not uri or not uri.strip():
        raise StoreURIError("the store URI is empty; give a file:// URI, a local path or an s3:// URI")
    try:
        parts = urlsplit(uri)
        parts.port  # noqa: B018 - parsing the port is what raises for "host:abc"
    except ValueError as exc:
        raise StoreURIError(f"cannot open store {uri!r}: not a valid URI ({exc})") from None
    scheme = parts.scheme.lower()
    objects: ObjectStore
    if scheme == "s3":
        # Imported here so that a file store never pays for importing boto3; credentials from boto3's chain.
        from ._s3 import S3ObjectStore

        objects = S3ObjectStore.from_uri(uri)
    elif scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise StoreURIError(
                f"cannot open store {uri!r}: a file URI names a local absolute path, "
                "as in file:///srv/gpucert (three slashes)"
            )
        if not parts.path:
            raise StoreURIError(f"cannot open store {uri!r}: the file URI has no path")
        if parts.query or parts.fragment:
            raise StoreURIError(f"cannot open store {uri!r}: a file store URI takes no ?query or #fragment")
        objects = FileObjectStore(Path(unquote(parts.path)))
    elif not scheme or "://" not in uri:
        # A plain path (relative or absolute); "C:" style drive letters are not a concern on Linux.
        objects = FileObjectStore(Path(uri).expanduser())
    else:
        raise StoreURIError(f"cannot open store {uri!r}: unknown scheme {scheme!r} (use file://, s3:// or a path)")
    if not create:
        require_root(objects)
    return objects
