"""Downloading a job's artifacts below a local folder, never outside it."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from gpulayer import contracts, errors


class ArtifactSource(Protocol):
    """What a download reads: the job's artifact list and each artifact's bytes
    (a :class:`~gpulayer.client.connection.Connection`)."""

    def artifacts(self, job_id: str) -> list[contracts.Artifact]:
        """The job's artifacts."""
        ...

    def download_artifact(self, job_id: str, name: str) -> bytes:
        """One artifact's content."""
        ...


def download(
    conn: ArtifactSource,
    job_id: str,
    dest_dir: str | os.PathLike[str],
    names: Sequence[str] | None = None,
) -> list[Path]:
    """Download the job's artifacts (or only ``names``) below ``dest_dir``; answers the
    files written, in artifact order (see :meth:`Connection.download`)."""
    root = Path(dest_dir).resolve()
    available = [a.name for a in conn.artifacts(job_id)]
    if names is None:
        wanted = available
    else:
        missing = sorted(set(names) - set(available))
        if missing:
            raise errors.NotFound(f"job {job_id} has no artifact {', '.join(missing)}")
        wanted = list(names)
    targets = [(name, _inside(root, name)) for name in wanted]
    written = []
    for name, target in targets:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(conn.download_artifact(job_id, name))
        written.append(target)
    return written


def _inside(root: Path, name: str) -> Path:
    target = (root / name).resolve()
    if name.startswith("/") or not target.is_relative_to(root) or target == root:
        raise errors.ValidationError(
            f"artifact name {name!r} would be written outside {root}", field="name"
        )
    return target
