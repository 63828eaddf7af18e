"""Working-directory bundles: a tar.gz of the user's directory, unpacked as a task's cwd.

The client packs a directory (skipping caches and virtual environments), uploads it
as a blob and puts its sha256 in the job spec; the worker downloads the blob once and
unpacks it into each task directory with Python's ``data`` extraction filter, which
refuses ``..`` and device files. Only regular files and directories are accepted: a
symlink or hardlink is refused whatever it points at (``pack`` never makes one, and on
Python builds without the 2025 tarfile fixes a link chain longer than PATH_MAX gets past
the ``data`` filter). Absolute paths are refused too, and so is a bundle that would
unpack to too many files or bytes (a decompression bomb), all before anything is
written.
"""

import io
import os
import tarfile
from pathlib import Path

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

DEFAULT_MAX_BYTES = 256 * 1024 * 1024
#: Limits on what a bundle may unpack to (a decompression bomb stops here);
#: a worker reads its own from ``GPULAYER_MAX_BUNDLE_BYTES`` / ``GPULAYER_MAX_BUNDLE_FILES``.
DEFAULT_MAX_EXTRACTED_BYTES = 4 * 1024 * 1024 * 1024
DEFAULT_MAX_MEMBERS = 100_000


def pack(directory: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """Tar and gzip ``directory`` (relative paths, no skipped dirs) into bytes.

    Raises
    ------
    ValidationError
        If ``directory`` is not a directory.
    PayloadTooLarge
        If the packed bundle is larger than ``max_bytes``.
    """
    root = Path(directory)
    if not root.is_dir():
        raise ValidationError(f"workdir {str(root)!r} is not a directory", field="workdir")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
            for fname in sorted(filenames):
                path = Path(dirpath, fname)
                if path.is_symlink() or not path.is_file():
                    continue
                tar.add(path, arcname=str(path.relative_to(root)), recursive=False)
                if buf.tell() > max_bytes:
                    raise PayloadTooLarge(
                        f"workdir {str(root)!r} packs to more than {max_bytes} bytes;"
                        " move data out of it or raise the limit",
                        field="workdir",
                    )
    return buf.getvalue()


def unpack(
    data: bytes,
    destination: str | os.PathLike[str],
    *,
    max_bytes: int | None = None,
    max_members: int | None = None,
) -> None:
    """Safely extract a bundle into ``destination``.

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
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
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
