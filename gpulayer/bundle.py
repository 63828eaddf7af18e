"""Working-directory bundles: a tar.gz of the user's directory, unpacked as a task's cwd.

The client packs a directory (skipping caches and virtual environments) into a
temporary file through :func:`gpulayer.transfer.pack_workdir` (memory bounded by
a chunk, the size limit checked while writing), uploads it as a blob and puts its
sha256 in the job spec; the worker downloads the blob once and
unpacks it into each task directory with Python's ``data`` extraction filter, which
refuses ``..`` and device files. Only regular files and directories are accepted: a
symlink or hardlink is refused whatever it points at (``pack`` never makes one, and on
Python builds without the 2025 tarfile fixes a link chain longer than PATH_MAX gets past
the ``data`` filter). Absolute paths are refused too, and so is a bundle that would
unpack to too many files or bytes (a decompression bomb), all before anything is
written.
"""

import gzip
import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from gpulayer.errors import PayloadTooLarge, ValidationError

#: Directory names never packed: they are large, machine-specific or secret.
SKIPPED_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".venv",
        "venv",
        "__pycache__",
        "node_modules",
        ".ipynb_checkpoints",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
    }
)

#: The largest packed workdir; a client reads its own from ``GPULAYER_MAX_WORKDIR_BYTES``.
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
#: Limits on what a bundle may unpack to (a decompression bomb stops here);
#: a worker reads its own from ``GPULAYER_MAX_BUNDLE_BYTES`` / ``GPULAYER_MAX_BUNDLE_FILES``.
DEFAULT_MAX_EXTRACTED_BYTES = 4 * 1024 * 1024 * 1024
DEFAULT_MAX_MEMBERS = 100_000


class Sink(Protocol):
    """Where a bundle is written: anything with ``write`` and ``flush``."""

    def write(self, data: bytes, /) -> int:
        """Write ``data``; answers its length."""
        ...

    def flush(self) -> None:
        """Push buffered bytes on."""
        ...


def pack(directory: str | os.PathLike[str], *, max_bytes: int | None = None) -> bytes:
    """Tar and gzip ``directory`` (relative paths, no skipped dirs) into bytes (for
    small directories and tests; a submit packs to a file with
    :func:`gpulayer.transfer.pack_workdir`).

    Raises
    ------
    ValidationError
        If ``directory`` is not a directory.
    PayloadTooLarge
        If the packed bundle is larger than ``max_bytes``.
    """
    buf = io.BytesIO()
    pack_into(directory, buf, max_bytes=max_bytes)
    return buf.getvalue()


def pack_into(
    directory: str | os.PathLike[str], sink: Sink, *, max_bytes: int | None = None
) -> None:
    """Tar and gzip ``directory`` into the writable ``sink``, a block at a time.

    The limit (``max_bytes``, else ``GPULAYER_MAX_WORKDIR_BYTES``, else
    :data:`DEFAULT_MAX_BYTES`) is enforced as the bundle is written: the write that
    passes it stops the packing at once, whatever is left to read.

    Raises
    ------
    ValidationError
        If ``directory`` is not a directory.
    PayloadTooLarge
        If the bundle would be larger than the limit; the one-line message names
        the limit and the biggest files.
    """
    limit = _limit(max_bytes, "GPULAYER_MAX_WORKDIR_BYTES", DEFAULT_MAX_BYTES)
    root = Path(directory)
    if not root.is_dir():
        raise ValidationError(f"workdir {str(root)!r} is not a directory", field="workdir")
    files = list(_files(root))

    def too_large() -> PayloadTooLarge:
        biggest = sorted(files, key=lambda f: -f[2])[:3]
        names = ", ".join(f"{name} ({_human(size)})" for name, _, size in biggest)
        return PayloadTooLarge(
            f"workdir {str(root)!r} packs to more than {_human(limit)}, the limit;"
            f" biggest files: {names}; move large data out of it"
            " or raise GPULAYER_MAX_WORKDIR_BYTES",
            field="workdir",
        )

    out = _Bounded(sink, limit, too_large)
    # mtime=0: the same files pack to the same bytes, so a bundle is stored once.
    with (
        gzip.GzipFile(fileobj=out, mode="wb", compresslevel=6, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w") as tar,
    ):
        for name, path, _ in files:
            tar.add(path, arcname=name, recursive=False)


def _files(root: Path) -> list[tuple[str, Path, int]]:
    """``(name, path, size)`` of every regular file to pack, in packing order."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
        for fname in sorted(filenames):
            path = Path(dirpath, fname)
            if path.is_symlink() or not path.is_file():
                continue
            found.append((str(path.relative_to(root)), path, path.stat().st_size))
    return found


class _Bounded:
    """Passes writes to ``sink`` until they would pass ``limit`` bytes, then raises
    ``error()`` once and drops every later write (so closing the gzip and tar
    layers above it after the refusal writes nothing)."""

    def __init__(self, sink: Sink, limit: int, error: Callable[[], Exception]) -> None:
        self._sink = sink
        self._limit = limit
        self._error = error
        self._size = 0
        self._over = False

    def write(self, data: bytes) -> int:
        if self._over:
            return len(data)
        self._size += len(data)
        if self._size > self._limit:
            self._over = True
            raise self._error()
        return self._sink.write(data)

    def flush(self) -> None:
        if not self._over:
            self._sink.flush()

    def tell(self) -> int:
        return self._size


def _human(n: int) -> str:
    size = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} bytes"  # pragma: no cover


def unpack(
    data: bytes | Path,
    destination: str | os.PathLike[str],
    *,
    max_bytes: int | None = None,
    max_members: int | None = None,
) -> None:
    """Safely extract a bundle (bytes, or a file read a block at a time) into ``destination``.

    Every member is checked before anything is written: only regular files and
    directories (no symlinks, hardlinks, devices or FIFOs), Python's ``data``
    filter (no absolute paths, no ``..``), at most ``max_members`` members, and at most
    ``max_bytes`` bytes once unpacked. Defaults come from the environment
    (``GPULAYER_MAX_BUNDLE_BYTES``, ``GPULAYER_MAX_BUNDLE_FILES``), else
    :data:`DEFAULT_MAX_EXTRACTED_BYTES` and :data:`DEFAULT_MAX_MEMBERS`.

    Raises
    ------
    ValidationError
        If the archive is not a tar(.gz) or a member is unsafe.
    PayloadTooLarge
        If it would unpack to more members or bytes than allowed.
    """
    max_bytes = _limit(max_bytes, "GPULAYER_MAX_BUNDLE_BYTES", DEFAULT_MAX_EXTRACTED_BYTES)
    max_members = _limit(max_members, "GPULAYER_MAX_BUNDLE_FILES", DEFAULT_MAX_MEMBERS)
    dest = Path(destination)
    dest.mkdir(parents=True, exist_ok=True)
    try:
        source = {"name": data} if isinstance(data, Path) else {"fileobj": io.BytesIO(data)}
        with tarfile.open(**source, mode="r:*") as tar:
            members, total = [], 0
            for member in tar:  # headers only; file data is skipped, not written
                if member.name.startswith(("/", "\\")) or os.path.isabs(member.name):
                    # the data filter would strip the slash; a bundle never has one
                    raise ValidationError(
                        f"unsafe source bundle: {member.name!r} is an absolute path",
                        field="bundle",
                    )
                if not (member.isreg() or member.isdir()):
                    raise ValidationError(
                        f"unsafe source bundle: {member.name!r} is a {_kind(member)};"
                        " a bundle holds only regular files and directories",
                        field="bundle",
                    )
                members.append(tarfile.data_filter(member, str(dest)))
                total += member.size
                if len(members) > max_members:
                    raise PayloadTooLarge(
                        f"source bundle has more than {max_members} files", field="bundle"
                    )
                if total > max_bytes:
                    raise PayloadTooLarge(
                        f"source bundle unpacks to more than {max_bytes} bytes", field="bundle"
                    )
            tar.extractall(dest, members=members, filter="data")
    except tarfile.FilterError as e:
        raise ValidationError(f"unsafe source bundle: {e}", field="bundle") from e
    except (tarfile.TarError, OSError, EOFError) as e:
        raise ValidationError(f"bad source bundle: {e}", field="bundle") from e


def _kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return "symlink"
    if member.islnk():
        return "hardlink"
    if member.isdev():
        return "device or FIFO"
    return "special member"


def _limit(value: int | None, env: str, default: int) -> int:
    if value is not None:
        return value
    raw = os.environ.get(env)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError as e:
        raise ValidationError(f"{env}={raw!r} is not a whole number of bytes or files") from e
