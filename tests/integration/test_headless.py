"""``python -m jupyter_ext`` (what `gpulayer up` starts) serves the control plane
without a Jupyter server (ADR 0157): it still reads ``c.GpulayerApp.*`` from
Jupyter's config files under the command line, keeps a Jupyter server's guard
against DNS rebinding, and serves nothing but gpulayer."""

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpulayer import contracts
from gpulayer.cluster import LocalCluster

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    """A Jupyter config dir whose server config caps request bodies at 4 KiB."""
    folder = tmp_path / "jupyter-config"
    folder.mkdir()
    body = {"GpulayerApp": {"max_body_bytes": 4096}, "ServerApp": {"open_browser": False}}
    (folder / "jupyter_server_config.json").write_text(json.dumps(body))
    return folder


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as client:
        yield client


def submit_status(http: httpx.Client, cluster: LocalCluster, env_bytes: int) -> int:
    """The status of a submit whose body holds ``env_bytes`` of environment."""
    spec = {"kind": "command", "command": ["true"], "env": {"PAD": "x" * env_bytes}}
    url = cluster.url + contracts.API_PREFIX.lstrip("/") + "/jobs"
    auth = {"Authorization": f"Bearer {cluster.admin_token}"}
    return http.post(url, json=spec, headers=auth).status_code


def test_it_reads_the_jupyter_config_files_and_the_command_line_wins(
    tmp_path: Path, config_dir: Path, http: httpx.Client
) -> None:
    env = {"JUPYTER_CONFIG_DIR": str(config_dir)}
    with LocalCluster(tmp_path / "a", workers=0, env=env) as from_file:
        assert submit_status(http, from_file, 8000) == 413
        assert submit_status(http, from_file, 100) == 201
    wider = ["--GpulayerApp.max_body_bytes=65536"]
    with LocalCluster(tmp_path / "b", workers=0, env=env, server_args=wider) as from_cli:
        assert submit_status(http, from_cli, 8000) == 201


def test_it_refuses_a_host_name_that_is_not_local_and_serves_only_gpulayer(
    tmp_path: Path, http: httpx.Client
) -> None:
    with LocalCluster(tmp_path, workers=0) as cluster:
        health = cluster.url + contracts.API_PREFIX.lstrip("/") + "/health"
        assert http.get(health).status_code == 200
        # A page of another site whose name now resolves to 127.0.0.1 (DNS rebinding)
        rebound = http.get(health, headers={"Host": f"attacker.example:{cluster.port}"})
        assert rebound.status_code == 403
        assert http.get(health, headers={"Host": f"localhost:{cluster.port}"}).status_code == 200
        # Jupyter's own API is not there: `jupyter lab` is the Jupyter server
        auth = {"Authorization": f"token {cluster.jupyter_token}"}
        assert http.get(cluster.url + "api/kernels", headers=auth).status_code == 404


@pytest.mark.parametrize(
    ("option", "said"),
    [
        ("--GpulayerApp.jupyter_user_role=boss", "jupyter_user_role must be one of"),
        ("--GpulayerApp.max_body_bytes=lots", "'max_body_bytes' trait"),
        ("--ServerApp.port=eighty", "'port' trait"),
        ("--ServerApp.certfile=/nonexistent/cert.pem", "cannot serve TLS with /nonexistent"),
    ],
)
def test_a_bad_option_stops_it_with_one_line(tmp_path: Path, option: str, said: str) -> None:
    argv = [sys.executable, "-m", "jupyter_ext", f"--GpulayerApp.data_dir={tmp_path}", option]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.split("] ", 1)[1].startswith("gpulayer: ") and said in line
    assert not (tmp_path / "gpulayer.db").exists()  # nothing was started
