"""Downloading a job's artifacts below a local folder, never outside it.

Each file is streamed to disk a chunk at a time, checked against the sha256 and
size the artifact list gives, and renamed into place only when whole
(:mod:`gpulayer.transfer`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from gpulayer import contracts, errors, transfer


class ArtifactSource(Protocol):
    """What a download reads: the job's artifact list and each artifact's bytes
    (a :class:`~gpulayer.client.connection.Connection`)."""

    def artifacts(self, job_id: str) -> list[contracts.Artifact]:
        """The job's artifacts."""
        ...

    def download_artifact_to(
        self,
        job_id: str,
        name: str,
        dest: str | os.PathLike[str],
        *,
        expected: transfer.Digest | None = None,
        progress: transfer.Progress | None = None,
    ) -> transfer.Digest:
        """One artifact's content, streamed into ``dest`` and checked."""
        ...


def download(
    conn: ArtifactSource,
    job_id: str,
    dest_dir: str | os.PathLike[str],
    names: Sequence[str] | None = None,
    *,
    progress: transfer.Progress | None = None,
) -> list[Path]:
    """Download the job's artifacts (or only ``names``) below ``dest_dir``; answers the
    files written, in artifact order (see :meth:`Connection.download`).
    ``progress(done_bytes, total_bytes)`` counts over all of them."""
    root = Path(dest_dir).resolve()
    available = {a.name: a for a in conn.artifacts(job_id)}
    if names is None:
        wanted = list(available)
    else:
        missing = sorted(set(names) - set(available))
        if missing:
            raise errors.NotFound(f"job {job_id} has no artifact {', '.join(missing)}")
        wanted = list(names)
    targets = [(available[name], _inside(root, name)) for name in wanted]
    total = sum(art.size for art, _ in targets)
    written, before = [], 0
    for art, target in targets:
        step = None
        if progress is not None:
            step = functools.partial(_overall, progress, before, total)
        conn.download_artifact_to(
            job_id, art.name, target, expected=transfer.Digest(art.sha256, art.size), progress=step
        )
        before += art.size
        written.append(target)
    return written


def _overall(progress: transfer.Progress, before: int, total: int, done: int, _: object) -> None:
    progress(before + done, total)


def _inside(root: Path, name: str) -> Path:
    target = (root / name).resolve()
    if name.startswith("/") or not target.is_relative_to(root) or target == root:
        raise errors.ValidationError(
            f"artifact name {name!r} would be written outside {root}", field="name"
        )
    return target
