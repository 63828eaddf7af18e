"""Content-addressed blob directory: artifacts and source bundles stored once by sha256.

Layout: ``<root>/<sha[:2]>/<sha>``. A blob is written to ``<root>/tmp`` first and
renamed into place, so a reader never sees a half-written file and two uploads of
the same content end as one file. File work runs in a thread (``asyncio.to_thread``)
so handlers never block the event loop.

A write that fails because the disk is full or read-only raises
:class:`~gpulayer.errors.StorageFull` / :class:`~gpulayer.errors.StorageError`
(507 / 503 naming the cause), and leaves nothing behind. Blobs are deleted only
by garbage collection (``retention.py``): one that no job references any more,
and that was not stored or stored again within a grace period (a re-upload
refreshes its time, so a bundle uploaded for a submit in flight is kept).
"""

import asyncio
import hashlib
import os
import re
import tempfile
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path

from gpulayer.errors import storage_error

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
        (self.root / "tmp").mkdir(parents=True, exist_ok=True)

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
            final.parent.mkdir(parents=True, exist_ok=True)
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
