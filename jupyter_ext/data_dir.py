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

from gpulayer.private import DIR_MODE, FILE_MODE, private_dir, tighten

__all__ = ["DIR_MODE", "FILE_MODE", "private_dir", "secure"]


def secure(root: str | os.PathLike[str]) -> int:
    """Make ``root`` private and take group/other bits off everything under it
    (links and other users' entries left alone); returns how many entries were
    tightened (blocking)."""
    private_dir(root)
    return tighten(root)
