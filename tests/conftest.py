"""Shared fixtures: pytest-jupyter's server fixtures with gpulayer enabled.

``jp_serverapp`` is a real Jupyter server with the ``jupyter_ext`` extension, its
data (SQLite file, blobs, bootstrap tokens) under the test's ``tmp_path``.
"""

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = ["pytest_jupyter.jupyter_server"]


@pytest.fixture
def gl_data_dir(tmp_path: Path) -> Path:
    """The control plane's data directory for this test."""
    return tmp_path / "gpulayer-data"


@pytest.fixture
def gl_shared_dir() -> Iterator[Path]:
    """A folder that jobs may read and write (mode 0777, in the system temp dir).

    Jobs of a worker that runs as root run as the unprivileged task user
    (``gpulayer-task``), which cannot enter ``tmp_path`` (``/tmp/pytest-of-root`` is
    0700): a test whose job leaves a file for the test, or reads one the test wrote,
    uses this folder instead.
    """
    path = Path(tempfile.mkdtemp(prefix="gl-shared-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def jp_server_config(gl_data_dir: Path) -> dict:
    """Enable gpulayer with its data under tmp_path and short timings."""
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_ext": True}},
        "GpulayerApp": {
            "data_dir": str(gl_data_dir),
            "long_poll_seconds": 2.0,
            "heartbeat_seconds": 0.5,
            "lease_seconds": 3.0,
            "sweep_seconds": 0.2,
            "max_body_bytes": 64 * 1024,
            "max_blob_bytes": 1024 * 1024,
        },
    }


@pytest.fixture
def jp_serverapp(jp_serverapp, jp_asyncio_loop):
    """pytest-jupyter's server, with extension start hooks run as a real server runs them.

    (``ServerApp.start_ioloop`` would call them; the fixture never starts the loop itself.)
    """
    jp_asyncio_loop.run_until_complete(jp_serverapp.extension_manager.start_all_extensions())
    return jp_serverapp


def _read_token(data_dir: Path, which: str) -> str:
    return (data_dir / f"{which}.token").read_text().strip()


@pytest.fixture
def gl_api(jp_fetch, gl_data_dir):
    """``await gl_api("jobs", method="POST", json_body={...}, token=...)`` -> (status, body).

    ``token`` is ``"admin"`` (default) or ``"join"`` for the bootstrap tokens, or a
    literal token; ``prefix`` the path before ``parts`` (the API's by default). Never
    raises on 4xx/5xx; bodies that are not JSON come back as bytes. The first call
    waits (through the health route) until the extension has started and written
    its token files.
    """
    started = False

    async def call(
        *parts,
        method="GET",
        json_body=None,
        body=None,
        token="admin",
        params=None,
        headers=None,
        prefix=("gpulayer", "api", "v1"),
        **kw,
    ):
        nonlocal started
        if not started:
            await jp_fetch("gpulayer", "api", "v1", "health")
            started = True
        if token in ("admin", "join"):
            token = _read_token(gl_data_dir, token)
        hdrs = {"Authorization": f"Bearer {token}", **(headers or {})}
        if json_body is not None:
            body = json.dumps(json_body)
        if body is None and method in ("POST", "PUT"):
            body = b""
        resp = await jp_fetch(
            *prefix,
            *parts,
            method=method,
            body=body,
            headers=hdrs,
            params=params,
            raise_error=False,
            **kw,
        )
        raw = resp.body
        ctype = resp.headers.get("Content-Type", "")
        data = json.loads(raw) if raw and ctype.startswith("application/json") else raw
        return resp.code, data

    return call
