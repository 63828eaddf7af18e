"""Content-addressed blob directory: artifacts and source bundles stored once by sha256.

Layout: ``<root>/<sha[:2]>/<sha>``. A blob is written to ``<root>/tmp`` first and
renamed into place, so a reader never sees a half-written file and two uploads of
the same content end as one file. File work runs in a thread (``asyncio.to_thread``)
so handlers never block the event loop. An upload arrives as a :class:`BlobUpload`:
its chunks go straight to a temporary file while their sha256 is computed, so a
512 MiB artifact never sits in the control plane's memory (docs/adr/0076).
"""

import asyncio
import hashlib
import os
import re
import tempfile
from pathlib import Path
from typing import BinaryIO

from gpulayer.errors import PayloadTooLarge, ValidationError

_SHA256 = re.compile(r"[0-9a-f]{64}")


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
        """Store ``data``; returns ``(sha256, size)``."""
        return await asyncio.to_thread(self._put, data)

    def _put(self, data: bytes) -> tuple[str, int]:
        sha = hashlib.sha256(data).hexdigest()
        final = self.path(sha)
        if not final.is_file():
            final.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.root / "tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, final)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        return sha, len(data)

    async def read(self, sha256: str) -> bytes:
        """A blob's bytes."""
        return await asyncio.to_thread(self.path(sha256).read_bytes)

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

    async def write(self, chunk: bytes) -> None:
        """Append a chunk; past ``max_bytes`` the data is dropped and :meth:`commit`
        refuses the blob."""
        self.size += len(chunk)
        if self.size <= self.max_bytes and not self._done:
            await asyncio.to_thread(self._write, chunk)

    def _write(self, chunk: bytes) -> None:
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
        if self.size > self.max_bytes:
            self.discard()
            raise PayloadTooLarge(
                f"the upload is {self.size} bytes; at most {self.max_bytes} are taken"
            )
        try:
            return await asyncio.to_thread(self._commit)
        finally:
            self.discard()

    def _commit(self) -> tuple[str, int]:
        if self._file is None:
            self._write(b"")
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
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self._tmp, final)
        return sha, self.size

    def discard(self) -> None:
        """Forget the upload and remove its temporary file (if it is still there)."""
        self._done = True
        if self._file is not None:
            self._file.close()
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)
