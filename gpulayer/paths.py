"""Where gpulayer keeps its files on this machine: one data dir, one config dir.

:func:`data_dir` is the one default for the control plane's folder (database, blobs,
token files, logs), whichever server hosts it: ``gpulayer up`` and ``jupyter lab``
both use ``<Jupyter data dir>/gpulayer`` (``~/.local/share/jupyter/gpulayer`` on
Linux), moved by ``$GPULAYER_DATA_DIR`` or Jupyter's own ``$JUPYTER_DATA_DIR``.
:func:`config_dir` holds the client's connection file, in the platform's config
folder (``~/.config/gpulayer`` on Linux). Why these two: ``docs/adr/0095-one-data-dir.md``.

:func:`prepare_data_dir` readies the folder before a control plane opens it: it
moves the folder older versions of ``gpulayer up`` used (``~/.local/share/gpulayer``)
into place, and keeps the folder private (0700). :func:`lock_data_dir` lets one
control plane at a time use it.

Both sides import this module (``gpulayer up`` and the ``jupyter_ext`` control
plane); it imports nothing from gpulayer.
"""

import logging
import os
import shutil
import stat
from pathlib import Path
from typing import TextIO

from gpulayer.private import open_private

log = logging.getLogger(__name__)

DATA_DIR_ENV = "GPULAYER_DATA_DIR"
#: Held (``flock``) by the control plane that uses the folder, with its pid inside.
LOCK_FILE = "control-plane.lock"
#: The connection file's folder when ``$GPULAYER_CONFIG`` does not name the file.
APP_NAME = "gpulayer"


def data_dir() -> Path:
    """The control plane's folder: ``$GPULAYER_DATA_DIR``, else ``<Jupyter data
    dir>/gpulayer`` (Jupyter's ``jupyter_data_dir()``: ``$JUPYTER_DATA_DIR``, else
    ``~/.local/share/jupyter`` on Linux, ``~/Library/Jupyter`` on macOS,
    ``%APPDATA%\\jupyter`` on Windows)."""
    explicit = os.environ.get(DATA_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser()
    from jupyter_core.paths import jupyter_data_dir

    return Path(jupyter_data_dir()) / APP_NAME


def config_dir() -> Path:
    """The client's config folder: the platform's user config dir
    (``$XDG_CONFIG_HOME/gpulayer``, ``~/.config/gpulayer`` on Linux;
    ``~/Library/Application Support/gpulayer`` on macOS; ``%LOCALAPPDATA%\\gpulayer``
    on Windows)."""
    from platformdirs import user_config_dir

    return Path(user_config_dir(APP_NAME, appauthor=False))


def legacy_data_dir() -> Path:
    """Where ``gpulayer up`` kept its data before :func:`data_dir`:
    ``$XDG_DATA_HOME/gpulayer``, else ``~/.local/share/gpulayer``."""
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base).expanduser() / APP_NAME


def prepare_data_dir(path: Path) -> list[str]:
    """Ready ``path`` for a control plane; returns notes for the person starting it.

    When ``path`` is the default (:func:`data_dir`) and does not hold anything yet,
    a folder left at :func:`legacy_data_dir` by an older ``gpulayer up`` is moved
    there (with nothing below it left readable by group or others), and a link at the
    old place points to the new one, so scripts that read
    ``~/.local/share/gpulayer/admin.token`` keep working. When both hold data, the old
    one is left alone and a note says so. ``$GPULAYER_DATA_DIR`` or another folder moves
    nothing. The folder is created, or kept, 0700.
    """
    path = path.expanduser()
    notes: list[str] = []
    legacy = legacy_data_dir()
    default = not os.environ.get(DATA_DIR_ENV) and _same(path, data_dir())
    if default and not _same(path, legacy) and _holds_data(legacy):
        if legacy.is_symlink():
            pass  # moved before: the link points here
        elif _holds_data(path):
            notes.append(
                f"{legacy} (an older gpulayer's data) is left as it is: {path} is in use"
                f" (start with --data-dir {legacy} to use it instead)"
            )
        else:
            _move(legacy, path)
            _make_private_below(path)  # it may come from a version that was less strict
            notes.append(f"moved the gpulayer data from {legacy} to {path}")
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)  # nobody else can reach anything below it
    return notes


class DataDirInUse(RuntimeError):
    """Another control plane holds the data dir: two would both schedule from one
    database."""


def lock_data_dir(path: Path) -> TextIO:
    """Hold ``<path>/control-plane.lock`` for as long as the answer stays open (the
    lock goes with the process, however it ends).

    Raises
    ------
    DataDirInUse
        When another process holds it; the message names its pid and the way out.
    """
    import fcntl

    # Created 0600, as everything in the data dir (the start would tighten it, and say so).
    handle = os.fdopen(
        open_private(path / LOCK_FILE, os.O_RDWR | os.O_APPEND), "a+", encoding="utf-8"
    )
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise DataDirInUse(
            f"another gpulayer control plane ({holder}) uses {path}: stop it, or give"
            " this one its own folder (gpulayer up --data-dir DIR, c.GpulayerApp.data_dir)"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}\n")
    handle.flush()
    return handle


def note_port(lock: TextIO, port: int) -> None:
    """Add to the held lock file (:func:`lock_data_dir`) the port its control plane
    now listens on: ``gpulayer up`` learns from it that the server on the port is the
    one it started (only this user can write the file) without reading the kernel's
    socket table."""
    lock.write(f"port {port}\n")
    lock.flush()


def lock_holder(path: Path) -> tuple[int | None, int | None]:
    """The pid and port the lock file of data dir ``path`` names (None for a line
    it lacks: no control plane yet, or one that does not listen yet)."""
    try:
        text = (path / LOCK_FILE).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None, None
    found: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key in ("pid", "port") and value.strip().isdigit():
            found[key] = int(value)
    return found.get("pid"), found.get("port")


def _same(a: Path, b: Path) -> bool:
    return a.expanduser().resolve() == b.expanduser().resolve()


def _holds_data(path: Path) -> bool:
    try:
        return path.is_dir() and any(path.iterdir())
    except OSError:
        return False


def _move(source: Path, target: Path) -> None:
    """``source`` to ``target`` (a rename, or a copy across file systems), then a link."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        target.rmdir()  # empty: checked by the caller
    shutil.move(str(source), str(target))
    try:
        source.symlink_to(target, target_is_directory=True)
    except OSError as e:  # a link is a convenience; the data is in place without it
        log.warning("could not link %s to %s: %s", source, target, e)


def _make_private_below(root: Path) -> None:
    """No entry below ``root`` with group or other permission bits (a token 0600 stays
    0600, a job's executable artifact keeps its owner's x bit)."""
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            entry = Path(folder, name)
            mode = entry.lstat().st_mode
            if stat.S_ISLNK(mode) or not mode & 0o077:
                continue
            entry.chmod(stat.S_IMODE(mode) & 0o700)
