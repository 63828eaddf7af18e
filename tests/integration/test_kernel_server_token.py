"""A gpulayer kernel's relay opened with the Jupyter server's own token (docs/kernels.md).

A kernel provisioner inside the Jupyter server that runs the control plane has no
gpulayer token: it uses that server's URL and Jupyter token, which the control
plane takes as the Jupyter user on its REST routes and on the relay's client end
(the browser test, ``labextension/ui-tests/test_kernels.py``, runs the whole path).
Here the relay's handshake alone, against a real control plane subprocess.
"""

import asyncio
from collections.abc import Iterator

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from gpulayer import contracts
from gpulayer.client import Connection
from gpulayer.cluster import LocalCluster

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A control plane without workers (kernels stay queued)."""
    with LocalCluster(tmp_path_factory.mktemp("plane"), workers=0) as cluster:
        yield cluster


def relay_url(cluster: LocalCluster, job_id: str) -> str:
    path = contracts.KERNEL_CHANNEL_PATH.format(job_id=job_id)
    return cluster.url.replace("http", "ws", 1) + "gpulayer/api/v1/" + path


def kernel_job(conn: Connection) -> str:
    spec = {"kind": "session", "name": "k", "session": {"name": "k", "relay": True}}
    return conn.submit(contracts.JobSpec.model_validate(spec)).id


async def handshake(url: str, authorization: str) -> int:
    """101 when the relay opened, else the refusal's status."""
    try:
        async with connect(url, additional_headers={"Authorization": authorization}):
            return 101
    except InvalidStatus as e:
        return e.response.status_code


def test_the_jupyter_token_opens_the_jupyter_users_kernel_relay(plane: LocalCluster) -> None:
    with Connection(plane.url, plane.jupyter_token, insecure=True) as as_jupyter:
        job_id = kernel_job(as_jupyter)  # the Jupyter user's kernel, waiting for a worker
    url = relay_url(plane, job_id)
    assert asyncio.run(handshake(url, f"token {plane.jupyter_token}")) == 101
    assert asyncio.run(handshake(url, f"Bearer {plane.jupyter_token}")) == 101
    # a wrong token is refused as without one; the admin's token is another owner
    assert asyncio.run(handshake(url, "token not-the-jupyter-token")) == 401
    assert asyncio.run(handshake(url, f"Bearer {plane.admin_token}")) == 404
