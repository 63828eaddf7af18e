"""Content-addressed blob directory: artifacts and source bundles stored once by sha256.

Layout: ``<root>/<sha[:2]>/<sha>``. A blob is written to ``<root>/tmp`` first and
renamed into place, so a reader never sees a half-written file and two uploads of
the same content end as one file. File work runs in a thread (``asyncio.to_thread``)
so handlers never block the event loop.
"""

import asyncio
import hashlib
import os
import re
import tempfile
from pathlib import Path

from .data_dir import private_dir

_SHA256 = re.compile(r"[0-9a-f]{64}")


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
        """Store ``data``; returns ``(sha256, size)``."""
        return await asyncio.to_thread(self._put, data)

    def _put(self, data: bytes) -> tuple[str, int]:
        sha = hashlib.sha256(data).hexdigest()
        final = self.path(sha)
        if not final.is_file():
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
        return sha, len(data)

    async def read(self, sha256: str) -> bytes:
        """A blob's bytes."""
        return await asyncio.to_thread(self.path(sha256).read_bytes)
