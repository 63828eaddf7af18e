"""The control plane's data dir: only its owner may read it, whatever the umask.

It holds the database (every job's ``env`` in clear text), the bootstrap tokens,
blobs, logs and the TLS key, so every folder under it is 0700 and every file
0600 (docs/security.md). At start the control plane makes the folder its owner's
alone (:func:`private_dir`: nothing inside is within others' reach from then on);
:func:`secure` runs once it is up: it takes group and other bits off anything an
older version or a loose umask left behind. Folders made later go through
:func:`private_dir`; files are created 0600 where they are written
(``os.open(..., 0o600)``, ``mkstemp``).

The folder rules themselves are ``gpulayer/private.py``'s, shared with the client
and the worker (a stdlib-only module, like ``gpulayer/paths.py``: ADR 0095).
"""

import os
import stat

from gpulayer.private import DIR_MODE, FILE_MODE, private_dir

__all__ = ["DIR_MODE", "FILE_MODE", "private_dir", "secure"]


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
            except FileNotFoundError:  # removed since (the walk runs beside the server)
                continue
            changed += 1
    return changed
