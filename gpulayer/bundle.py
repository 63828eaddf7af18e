"""Working-directory bundles: a tar.gz of the user's directory, unpacked as a task's cwd.

The client packs a directory (skipping caches and virtual environments), uploads it
as a blob and puts its sha256 in the job spec; the worker downloads the blob once and
unpacks it into each task directory with Python's ``data`` extraction filter, which
refuses absolute paths, ``..``, links that leave the directory and device files.
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


def unpack(data: bytes, destination: str | os.PathLike[str]) -> None:
    """Safely extract a bundle into ``destination``.

    Raises
    ------
    ValidationError
        If the archive is not a tar.gz or a member would escape ``destination``.
    """
    dest = Path(destination)
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
            tar.extractall(dest, filter="data")
    except (tarfile.TarError, OSError, EOFError) as e:
        raise ValidationError(f"bad source bundle: {e}", field="bundle") from e
