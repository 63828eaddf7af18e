"""Moving files to and from the control plane: one streamed, size-bounded,
sha256-verified path for workdir bundles, artifacts and downloads.

Every transfer reads or writes ``CHUNK_BYTES`` at a time, so memory stays bounded
by the chunk size whatever the file's size:

* **packing** (:func:`pack_workdir`): a directory is tarred and gzipped into a
  temporary file through a writer that hashes what it writes and stops the moment
  the bundle passes its limit (naming the limit and the biggest files);
* **sending** (:func:`file_chunks`, :func:`afile_chunks`): a file is read in chunks
  for an HTTP body; the sender knows its sha256 and size first
  (:func:`digest_file`) and checks what the control plane says it stored;
* **receiving** (:func:`receive`, :func:`areceive`): chunks are written to a temporary
  file beside the destination, counted against the announced size and hashed; only
  a whole, matching file is renamed into place, so a reader never sees a partial or
  corrupt file (:class:`~gpulayer.errors.TransferError` otherwise).

Progress is a callback, ``progress(done_bytes, total_bytes)`` (``total_bytes`` is
None when unknown), called after each chunk.

The wire stays what ``docs/api.md`` lists: raw bytes in the body of ``POST blobs``
and ``PUT tasks/{id}/artifacts/{name}``, with ``Content-Length`` and the sha256 in
``X-Gpulayer-Sha256``; downloads answer the sha256 in the same header.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import tempfile
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO

from gpulayer import bundle
from gpulayer.errors import TransferError

CHUNK_BYTES = 1024 * 1024
#: The header that carries a body's sha256 (uploads and downloads).
SHA256_HEADER = "X-Gpulayer-Sha256"

#: ``progress(done_bytes, total_bytes)``; ``total_bytes`` None when not known.
Progress = Callable[[int, "int | None"], None]


@dataclass(frozen=True)
class Digest:
    """What a file's content is: its sha256 (hex) and size in bytes."""

    sha256: str
    size: int

    def headers(self) -> dict[str, str]:
        """The request headers announcing this content."""
        return {
            "Content-Type": "application/octet-stream",
            "Content-Length": str(self.size),
            SHA256_HEADER: self.sha256,
        }

    def check(self, sha256: str, size: int, what: str) -> None:
        """Raise :class:`TransferError` unless ``(sha256, size)`` is this content."""
        if sha256 != self.sha256 or size != self.size:
            raise TransferError(
                f"{what} arrived corrupt: got {size} bytes with sha256 {sha256[:12]}…,"
                f" expected {self.size} bytes with sha256 {self.sha256[:12]}…"
            )


# ------------------------------------------------------------------ packing


@dataclass(frozen=True)
class PackedBundle:
    """A workdir packed into a temporary file (removed when the ``with`` block ends)."""

    path: Path
    digest: Digest


@contextlib.contextmanager
def pack_workdir(
    directory: str | os.PathLike[str],
    *,
    max_bytes: int | None = None,
    progress: Progress | None = None,
) -> Iterator[PackedBundle]:
    """Pack ``directory`` into a temporary ``.tar.gz``; yields it with its digest.

    Memory is bounded by the chunk size; the limit (``max_bytes``, else
    ``GPULAYER_MAX_WORKDIR_BYTES``, else 256 MiB) is checked while writing, so a
    directory too large is refused as soon as its bundle passes it.

    Raises
    ------
    ValidationError
        If ``directory`` is not a directory.
    PayloadTooLarge
        If the bundle would be larger than ``max_bytes`` (the message names the
        limit and the biggest files).
    """
    fd, name = tempfile.mkstemp(prefix="gpulayer-bundle-", suffix=".tar.gz")
    path = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            writer = HashingWriter(f, progress)
            bundle.pack_into(directory, writer, max_bytes=max_bytes)
        yield PackedBundle(path, writer.digest())
    finally:
        path.unlink(missing_ok=True)


class HashingWriter:
    """A write-only file object over ``sink`` that hashes and counts what passes
    through it and reports progress."""

    def __init__(self, sink: IO[bytes], progress: Progress | None = None) -> None:
        self._sink = sink
        self._progress = progress
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        """Write ``data``."""
        self._sink.write(data)
        self._hash.update(data)
        self.size += len(data)
        if self._progress is not None:
            self._progress(self.size, None)
        return len(data)

    def flush(self) -> None:
        """Flush the sink."""
        self._sink.flush()

    def digest(self) -> Digest:
        """What was written."""
        return Digest(self._hash.hexdigest(), self.size)


# ------------------------------------------------------------------ sending


def digest_file(path: str | os.PathLike[str]) -> Digest:
    """A file's sha256 and size, read a chunk at a time (blocking)."""
    with open(path, "rb") as f:
        return digest_fileobj(f)


def digest_fileobj(f: BinaryIO) -> Digest:
    """An open file's sha256 and size, from its start, a chunk at a time (blocking)."""
    f.seek(0)
    h, size = hashlib.sha256(), 0
    while chunk := f.read(CHUNK_BYTES):
        h.update(chunk)
        size += len(chunk)
    return Digest(h.hexdigest(), size)


def file_chunks(
    path: str | os.PathLike[str], *, total: int | None = None, progress: Progress | None = None
) -> Iterator[bytes]:
    """A file's bytes, a chunk at a time (an HTTP body for a sync client)."""
    done = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            done += len(chunk)
            yield chunk
            if progress is not None:
                progress(done, total)


async def afile_chunks(
    path: str | os.PathLike[str], *, total: int | None = None, progress: Progress | None = None
) -> AsyncIterator[bytes]:
    """:func:`file_chunks` for an async client (file reads run in a thread)."""
    done = 0
    f = await asyncio.to_thread(open, path, "rb")
    try:
        while chunk := await asyncio.to_thread(f.read, CHUNK_BYTES):
            done += len(chunk)
            yield chunk
            if progress is not None:
                progress(done, total)
    finally:
        f.close()


# ---------------------------------------------------------------- receiving


class _Receiver:
    """Writes chunks to a temporary file beside ``dest``, bounded and hashed."""

    def __init__(
        self,
        dest: Path,
        expected: Digest | None,
        max_bytes: int | None,
        progress: Progress | None,
        what: str,
    ) -> None:
        self.dest = dest
        self.expected = expected
        self.limit = expected.size if expected is not None else max_bytes
        self.progress = progress
        self.what = what
        self.hash = hashlib.sha256()
        self.size = 0
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
        self.tmp = Path(name)
        self.file: IO[bytes] = os.fdopen(fd, "wb")

    def add(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.limit is not None and self.size > self.limit:
            raise TransferError(f"{self.what} is larger than the {self.limit} bytes announced")
        self.hash.update(chunk)
        self.file.write(chunk)
        if self.progress is not None:
            self.progress(self.size, None if self.expected is None else self.expected.size)

    def finish(self) -> Digest:
        self.file.close()
        got = Digest(self.hash.hexdigest(), self.size)
        if self.expected is not None:
            self.expected.check(got.sha256, got.size, self.what)
        os.replace(self.tmp, self.dest)
        return got

    def abort(self) -> None:
        self.file.close()
        self.tmp.unlink(missing_ok=True)


def receive(
    chunks: Iterable[bytes],
    dest: str | os.PathLike[str],
    *,
    expected: Digest | None = None,
    max_bytes: int | None = None,
    progress: Progress | None = None,
    what: str = "download",
) -> Digest:
    """Write ``chunks`` to ``dest`` atomically; answers what was written.

    The bytes go to a temporary file beside ``dest``, renamed into place only when
    whole: no more than ``expected.size`` (or ``max_bytes``) bytes, and with
    ``expected``'s sha256 and size. Nothing is left behind otherwise.

    Raises
    ------
    TransferError
        If the content is larger than allowed, or not the expected content.
    """
    rx = _Receiver(Path(dest), expected, max_bytes, progress, what)
    try:
        for chunk in chunks:
            rx.add(chunk)
        return rx.finish()
    except BaseException:
        rx.abort()
        raise


async def areceive(
    chunks: AsyncIterable[bytes],
    dest: str | os.PathLike[str],
    *,
    expected: Digest | None = None,
    max_bytes: int | None = None,
    progress: Progress | None = None,
    what: str = "download",
) -> Digest:
    """:func:`receive` for an async source (file work runs in a thread)."""
    rx = await asyncio.to_thread(_Receiver, Path(dest), expected, max_bytes, progress, what)
    try:
        async for chunk in chunks:
            await asyncio.to_thread(rx.add, chunk)
        return await asyncio.to_thread(rx.finish)
    except BaseException:
        await asyncio.to_thread(rx.abort)
        raise
