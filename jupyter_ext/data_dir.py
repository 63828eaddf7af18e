"""The control plane's data dir: only its owner may read it, whatever the umask.

It holds the database (every job's ``env`` in clear text), the bootstrap tokens,
blobs, logs and the TLS key, so every folder under it is 0700 and every file
0600 (docs/security.md). :func:`secure` runs at start: it makes the folder and
takes group and other bits off anything an older version or a loose umask left
behind. Folders made later go through :func:`private_dir`; files are created
0600 where they are written (``os.open(..., 0o600)``, ``mkstemp``).

``gpulayer/private.py`` holds the same few lines for the client and the worker
(the control plane imports nothing of theirs).
"""

import os
import stat
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: str | os.PathLike[str]) -> Path:
    """Make ``path`` (and missing parents) 0700, tightening an existing one."""
    path = Path(path).absolute()
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for p in reversed(missing):
        try:
            p.mkdir(mode=DIR_MODE)
        except FileExistsError:  # made meanwhile
            continue
        p.chmod(DIR_MODE)  # mkdir's mode passes through the umask
    # Ours, not a folder (or a link) someone made in advance, e.g. in /tmp.
    st, link = path.stat(), path.lstat()
    me = os.geteuid()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != me or link.st_uid != me:
        raise PermissionError(f"{path} is not this user's folder: its files would not be private")
    path.chmod(DIR_MODE)
    return path


def secure(root: str | os.PathLike[str]) -> int:
    """Make ``root`` private and take group/other bits off everything under it
    (links left alone); returns how many entries were tightened (blocking)."""
    private_dir(root)
    changed = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:  # removed while we walked
                continue
            if stat.S_ISLNK(st.st_mode) or not st.st_mode & 0o077:
                continue
            try:
                os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)
            except PermissionError:  # another user's (e.g. a worker's task folder)
                continue
            changed += 1
    return changed
