"""Content-addressed blob directory: artifacts and source bundles stored once by sha256.

Layout: ``<root>/<sha[:2]>/<sha>``. A blob is written to ``<root>/tmp`` first and
renamed into place, so a reader never sees a half-written file and two uploads of
the same content end as one file. File work runs in a thread (``asyncio.to_thread``)
so handlers never block the event loop. An upload arrives as a :class:`BlobUpload`:
its chunks go straight to a temporary file while their sha256 is computed, so a
512 MiB artifact never sits in the control plane's memory (docs/adr/0076).

A write that fails because the disk is full or read-only raises
:class:`~gpulayer.errors.StorageFull` / :class:`~gpulayer.errors.StorageError`
(507 / 503 naming the cause), and leaves nothing behind. Blobs are deleted only
by garbage collection (``retention.py``): one that no job references any more,
and that was not stored or stored again within a grace period (a re-upload
refreshes its time, so a bundle uploaded for a submit in flight is kept).
"""

import asyncio
import contextlib
import hashlib
import os
import re
import tempfile
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from gpulayer.errors import GpulayerError, PayloadTooLarge, ValidationError, storage_error

from .data_dir import private_dir

_SHA256 = re.compile(r"[0-9a-f]{64}")
_PREFIX = re.compile(r"[0-9a-f]{2}")
CHUNK_BYTES = 1024 * 1024


@dataclass(frozen=True)
class BlobEntry:
    """A stored blob as the file system sees it."""

    sha256: str
    size: int
    mtime: float


class BlobStore:
    """Blobs on local disk, named by their sha256."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        private_dir(self.root / "tmp")

    def path(self, sha256: str) -> Path:
        """Where a blob lives (whether or not it exists); refuses non-hash names."""
        if not _SHA256.fullmatch(sha256):
            raise ValueError(f"{sha256!r} is not a sha256 hex digest")
        return self.root / sha256[:2] / sha256

    def exists(self, sha256: str) -> bool:
        """True when the blob is stored."""
        return bool(_SHA256.fullmatch(sha256)) and self.path(sha256).is_file()

    async def put(self, data: bytes) -> tuple[str, int]:
        """Store ``data``; returns ``(sha256, size)``.

        Raises
        ------
        StorageFull, StorageError
            When the disk is full, over quota, read-only or failing.
        """
        return await asyncio.to_thread(self._put, data)

    def _put(self, data: bytes) -> tuple[str, int]:
        sha = hashlib.sha256(data).hexdigest()
        final = self.path(sha)
        try:
            if final.is_file():
                os.utime(final)  # stored again: young again for the collector
                return sha, len(data)
            if not final.parent.is_dir():
                private_dir(final.parent)
            fd, tmp = tempfile.mkstemp(dir=self.root / "tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, final)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as e:
            mapped = storage_error(e, self.root)
            if mapped is None:
                raise
            raise mapped from e
        return sha, len(data)

    async def read(self, sha256: str) -> bytes:
        """A blob's bytes."""
        return await asyncio.to_thread(self.path(sha256).read_bytes)

    async def chunks(self, sha256: str, chunk_bytes: int = CHUNK_BYTES) -> AsyncIterator[bytes]:
        """A blob's bytes, ``chunk_bytes`` at a time (memory bounded by the chunk)."""
        with await asyncio.to_thread(self.path(sha256).open, "rb") as f:
            while chunk := await asyncio.to_thread(f.read, chunk_bytes):
                yield chunk

    # ------------------------------------------------------ garbage collection

    def entries(self, among: Iterable[str] | None = None) -> list[BlobEntry]:
        """Every stored blob, or those ``among`` these hashes (blocking: call it in a
        thread)."""
        found = []
        if among is not None:
            for sha in among:
                try:
                    st = self.path(sha).stat()
                except (FileNotFoundError, ValueError):
                    continue
                found.append(BlobEntry(sha, st.st_size, st.st_mtime))
            return found
        for prefix in os.scandir(self.root):
            if not (prefix.is_dir() and _PREFIX.fullmatch(prefix.name)):
                continue
            for entry in os.scandir(prefix.path):
                if _SHA256.fullmatch(entry.name) and entry.is_file():
                    st = entry.stat()
                    found.append(BlobEntry(entry.name, st.st_size, st.st_mtime))
        return found

    def total_bytes(self) -> int:
        """Bytes the stored blobs take (blocking)."""
        return sum(e.size for e in self.entries())

    def delete(self, sha256: str) -> int:
        """Remove a blob; answers the bytes freed (0 when it was not there; blocking)."""
        path = self.path(sha256)
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            return 0
        return size

    def clean_tmp(self, older_than_seconds: float) -> int:
        """Remove half-written uploads left by a crash (older than the given age);
        answers the bytes freed (blocking)."""
        freed, cutoff = 0, time.time() - older_than_seconds
        for entry in os.scandir(self.root / "tmp"):
            st = entry.stat()
            if entry.is_file() and st.st_mtime < cutoff:
                Path(entry.path).unlink(missing_ok=True)
                freed += st.st_size
        return freed

    def upload(self, max_bytes: int, expected_sha256: str | None = None) -> "BlobUpload":
        """Receive a blob in chunks (see :class:`BlobUpload`)."""
        return BlobUpload(self, max_bytes, expected_sha256)


class BlobUpload:
    """A blob being received: chunks are written to a temporary file under
    ``<root>/tmp`` and hashed as they arrive; :meth:`commit` moves the file into
    place under its sha256, :meth:`discard` (always safe to call) removes it.

    Parameters
    ----------
    store
        The blob store it lands in.
    max_bytes
        Largest blob taken (:class:`PayloadTooLarge` beyond it).
    expected_sha256
        The sha256 the uploader announced; a different content is refused.
    """

    def __init__(self, store: BlobStore, max_bytes: int, expected_sha256: str | None) -> None:
        self._store = store
        self.max_bytes = max_bytes
        self.expected_sha256 = expected_sha256
        self.size = 0
        self._hash = hashlib.sha256()
        self._file: BinaryIO | None = None
        self._tmp: Path | None = None
        self._done = False
        self._failed: BaseException | None = None  # a write that failed; commit raises it

    async def write(self, chunk: bytes) -> None:
        """Append a chunk; past ``max_bytes`` the data is dropped and :meth:`commit`
        refuses the blob."""
        self.size += len(chunk)
        if self.size <= self.max_bytes and not self._done:
            await asyncio.to_thread(self._write, chunk)

    def _write(self, chunk: bytes) -> None:
        if self._failed is not None:
            return
        try:
            self._append(chunk)
        except OSError as e:  # e.g. a full disk: answered once the body is in (commit)
            self._failed = _mapped(e, self._store.root)
            self._close_and_remove()

    def _append(self, chunk: bytes) -> None:
        if self._done:  # discarded while this chunk waited for a thread
            return
        if self._file is None:
            fd, tmp = tempfile.mkstemp(dir=self._store.root / "tmp", suffix=".upload")
            self._file, self._tmp = os.fdopen(fd, "wb"), Path(tmp)
        self._hash.update(chunk)
        self._file.write(chunk)

    async def commit(self) -> tuple[str, int]:
        """Store the blob; returns ``(sha256, size)``.

        Raises
        ------
        PayloadTooLarge
            Over ``max_bytes``.
        ValidationError
            When the content's sha256 is not the announced one (field ``sha256``).
        """
        if self._done:
            raise RuntimeError("this upload was already committed or discarded")
        if self._failed is not None:
            self.discard()
            raise self._failed
        if self.size > self.max_bytes:
            self.discard()
            raise PayloadTooLarge(
                f"the upload is {self.size} bytes; at most {self.max_bytes} are taken"
            )
        try:
            return await asyncio.to_thread(self._commit)
        except OSError as e:
            raise _mapped(e, self._store.root) from e
        finally:
            self.discard()

    def _commit(self) -> tuple[str, int]:
        if self._file is None:
            self._append(b"")
        assert self._file is not None and self._tmp is not None
        self._file.close()
        sha = self._hash.hexdigest()
        if self.expected_sha256 is not None and sha != self.expected_sha256:
            raise ValidationError(
                f"the upload's sha256 is {sha}, not the announced {self.expected_sha256}",
                field="sha256",
            )
        final = self._store.path(sha)
        if not final.is_file():
            if not final.parent.is_dir():
                private_dir(final.parent)
            os.replace(self._tmp, final)
        return sha, self.size

    def discard(self) -> None:
        """Forget the upload and remove its temporary file (if it is still there)."""
        self._done = True
        self._close_and_remove()

    def _close_and_remove(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):  # a full disk fails the last flush too
                self._file.close()
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)


def _mapped(e: OSError, where: Path) -> OSError | GpulayerError:
    """A failed write of the blob store as the 507/503 it stands for (the error
    itself when it is not about the storage)."""
    return storage_error(e, where) or e
