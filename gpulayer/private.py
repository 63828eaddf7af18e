"""Files and folders only their owner may read, whatever the umask.

The data dirs of ``gpulayer up`` and ``gpulayer join`` hold tokens, job
environments in clear text, logs and blobs: every folder under them is 0700
and every file 0600 (docs/security.md). New ones are made that way from the
start (never world-readable between ``open`` and ``chmod``); :func:`tighten`
fixes a tree that an older version, or a loose umask, left readable.

The control plane has its own copy of these few lines
(``jupyter_ext/data_dir.py``): it imports nothing of the client side.
"""

import os
import stat
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: str | os.PathLike[str]) -> Path:
    """Make ``path`` a folder only its owner can enter (missing parents are made
    0700 too); an existing one is tightened to 0700. Returns it."""
    path = Path(path).absolute()
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for p in reversed(missing):
        try:
            p.mkdir(mode=DIR_MODE)
        except FileExistsError:  # made meanwhile (another process)
            continue
        p.chmod(DIR_MODE)  # mkdir's mode passes through the umask
    # Ours, not a folder (or a link) someone made in advance, e.g. in /tmp.
    st, link = path.stat(), path.lstat()
    me = os.geteuid()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != me or link.st_uid != me:
        raise PermissionError(f"{path} is not this user's folder: its files would not be private")
    path.chmod(DIR_MODE)
    return path


def open_private(path: str | os.PathLike[str], flags: int) -> int:
    """``os.open`` that creates the file 0600 and tightens an existing one."""
    fd = os.open(path, flags | os.O_CREAT, FILE_MODE)
    os.fchmod(fd, FILE_MODE)
    return fd


def write_private(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` whole to a file only its owner may read (replaced atomically)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    fd = open_private(tmp, os.O_WRONLY | os.O_TRUNC)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def tighten(root: str | os.PathLike[str]) -> int:
    """Take group and other bits off every folder and file under ``root`` (``root``
    included; links are left alone). Returns how many were changed."""
    changed = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [".", *dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:  # removed while we walked
                continue
            if stat.S_ISLNK(st.st_mode) or not st.st_mode & 0o077:
                continue
            try:
                os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)
            except PermissionError:  # another user's
                continue
            except FileNotFoundError:  # removed since (the walk runs beside a server)
                continue
            changed += 1
    return changed
