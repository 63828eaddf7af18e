"""Fixtures that run the real thing: a control plane subprocess and `gpulayer join` workers.

The control plane starts exactly as `gpulayer up` starts it (``LocalCluster``), on a
free port under a base URL that needs escaping; workers are real ``gpulayer join``
processes. Tests talk to it with the public client, as a user would.
"""

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

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


# ----------------------------------------- notebooks run by nbclient in a real kernel


def notebook(*sources: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    return nb


def kernel_env(cluster, tmp_path: Path) -> dict[str, str]:
    """What the local kernel sees: the cluster in GPULAYER_URL/TOKEN, no saved config."""
    return {**os.environ, "GPULAYER_URL": cluster.url, "GPULAYER_TOKEN": cluster.admin_token,
            "GPULAYER_CONFIG": str(tmp_path / "absent.json")}  # fmt: skip


def run(nb, env, during=None):
    """Execute every cell (errors kept as outputs); ``during(client, index)`` runs in a
    thread alongside each cell."""
    client = NotebookClient(nb, kernel_name="python3", allow_errors=True, timeout=90)
    with client.setup_kernel(env=env):
        for i, cell in enumerate(nb.cells):
            helper = None
            if during is not None:
                helper = threading.Thread(target=during, args=(client, i), daemon=True)
                helper.start()
            client.execute_cell(cell, i)
            if helper is not None:
                helper.join(30)
    return nb


def outputs(cell, kind):
    return [o for o in cell.outputs if o.output_type == kind]


def stdout(cell) -> str:
    return "".join(o.text for o in outputs(cell, "stream") if o.name == "stdout")
