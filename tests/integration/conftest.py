"""Fixtures that run the real thing: a control plane subprocess and `gpulayer join` workers.

The control plane starts exactly as `gpulayer up` starts it (``LocalCluster``), on a
free port under a base URL that needs escaping; workers are real ``gpulayer join``
processes. Tests talk to it with the public client, as a user would.
"""

import time
from collections.abc import Callable, Iterator

import pytest

from gpulayer.client import Connection
from gpulayer.cluster import LocalCluster

FAST = {"heartbeat_seconds": 0.5, "lease_seconds": 4.0}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[LocalCluster]:
    """One control plane with one 2-slot worker that has two simulated GPUs."""
    c = LocalCluster(
        tmp_path_factory.mktemp("cluster"),
        workers=1,
        slots=2,
        simulated_gpus="2xA100-80GB",
        base_url="/a%40b/",
        **FAST,
    )
    with c:
        yield c


@pytest.fixture
def conn(cluster) -> Iterator[Connection]:
    """An admin connection to the module's cluster."""
    with cluster.connection() as c:
        yield c


@pytest.fixture
def fresh_cluster(tmp_path) -> Iterator[Callable[..., LocalCluster]]:
    """A factory for a private cluster (for tests that restart or kill things)."""
    made: list[LocalCluster] = []

    def make(**kw) -> LocalCluster:
        c = LocalCluster(tmp_path / f"c{len(made)}", **{**FAST, **kw})
        made.append(c)
        return c.start()

    yield make
    for c in made:
        c.stop()


def until(check: Callable[[], object], timeout: float = 20.0, what: str = "condition"):
    """Poll ``check`` until it returns something truthy, or fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)
