"""Run the example notebooks (``pytest --nbval-lax notebooks/``) against a live cluster.

nbval starts a notebook's kernel when the notebook's first cell is set up, before
any fixture runs, so the cluster starts in a ``pytest_runtest_setup`` hook that runs
first: a control plane and one local worker (two simulated GPUs) under a temporary
directory, with ``GPULAYER_URL`` and ``GPULAYER_TOKEN`` exported for the kernels
(``%load_ext gpulayer`` and ``gl.connect()`` find them there), and
``GPULAYER_EXAMPLES_TINY=1`` so that the training examples run on tiny settings.
It stops when the session ends.
"""

import os
import tempfile
from pathlib import Path

import pytest

_cluster = None
_tmp: tempfile.TemporaryDirectory | None = None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Start the cluster before the first notebook's kernel starts."""
    global _cluster, _tmp
    if _cluster is not None:
        return
    from gpulayer.cli.cluster import LocalCluster

    _tmp = tempfile.TemporaryDirectory(prefix="gpulayer-notebooks-")
    _cluster = LocalCluster(Path(_tmp.name), workers=1, slots=4, simulated_gpus="2xA100-80GB",
                            heartbeat_seconds=0.5, lease_seconds=5.0).start()  # fmt: skip
    os.environ.update(
        GPULAYER_URL=_cluster.url,
        GPULAYER_TOKEN=_cluster.admin_token,
        GPULAYER_CONFIG=str(Path(_tmp.name) / "no-saved-connection.json"),
        GPULAYER_EXAMPLES_TINY="1",  # the training examples take a few steps, not minutes
    )


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop the cluster (by PID) and remove its directory."""
    global _cluster, _tmp
    if _cluster is not None:
        _cluster.stop()
        _cluster = None
    if _tmp is not None:
        _tmp.cleanup()
        _tmp = None
