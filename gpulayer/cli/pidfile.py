"""Which ``gpulayer up`` runs for a data dir: the record it keeps there while it runs.

``gpulayer up`` writes ``<data_dir>/up.json`` (its PID, the process's start time
and the URL) once its cluster is up, and removes it when it stops;
``gpulayer down`` signals exactly that process, and ``gpulayer up`` refuses to
start a second one on the same data dir. The start time guards against a PID
the system has since given to another process: a record whose process is gone,
or is someone else now, counts as no record.
"""

import contextlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

FILENAME = "up.json"


@dataclass(frozen=True)
class UpRecord:
    """A running ``gpulayer up``."""

    pid: int
    started: float  # the process's start time (psutil's create_time)
    url: str


def write(data_dir: Path, url: str) -> UpRecord:
    """Record this process as the ``gpulayer up`` of ``data_dir`` (file mode 0600)."""
    rec = UpRecord(os.getpid(), psutil.Process().create_time(), url)
    path = data_dir / FILENAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(asdict(rec), f)
    return rec


def remove(data_dir: Path) -> None:
    """Remove the record, if it is this process's."""
    rec = read(data_dir)
    if rec is not None and rec.pid == os.getpid():
        with contextlib.suppress(FileNotFoundError):
            (data_dir / FILENAME).unlink()


def read(data_dir: Path) -> UpRecord | None:
    """The record kept in ``data_dir`` (None when there is none or it is unreadable)."""
    try:
        raw = json.loads((data_dir / FILENAME).read_text(encoding="utf-8"))
        return UpRecord(int(raw["pid"]), float(raw["started"]), str(raw["url"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def running(data_dir: Path) -> UpRecord | None:
    """The ``gpulayer up`` of ``data_dir`` if its process still runs (same PID and
    start time), else None."""
    rec = read(data_dir)
    if rec is None or not alive(rec):
        return None
    return rec


def alive(rec: UpRecord) -> bool:
    """Whether the process of ``rec`` still runs (and is not a PID reused since)."""
    try:
        proc = psutil.Process(rec.pid)
        same = abs(float(proc.create_time()) - rec.started) < 1.0
        return same and bool(proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False
