"""Fixtures of the chaos suite: clusters to break, and a ledger folder for the jobs."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer.cluster import LocalCluster

from .harness import Ledger

#: Short timings, so a lost worker costs seconds (docs/faults.md scales with them).
HEARTBEAT_SECONDS = 0.5
LEASE_SECONDS = 4.0


@pytest.fixture(scope="module")
def plane(tmp_path_factory) -> Iterator[LocalCluster]:
    """A control plane without workers: each test starts (and breaks) its own."""
    with LocalCluster(
        tmp_path_factory.mktemp("chaos"), workers=0,
        heartbeat_seconds=HEARTBEAT_SECONDS, lease_seconds=LEASE_SECONDS,
    ) as c:  # fmt: skip
        yield c


@pytest.fixture
def workers(plane: LocalCluster) -> Iterator[list[str]]:
    """Names of the workers a test adds to :func:`plane`; stopped after it."""
    names: list[str] = []
    yield names
    with plane.connection() as conn:
        for name in names:
            if name in plane.workers:
                plane.stop_worker(name)
            conn.forget_worker(name)  # so the next test's jobs never wait on it


@pytest.fixture
def ledger(gl_shared_dir: Path) -> Ledger:
    return Ledger(gl_shared_dir)
