"""Job environments end to end (docs/environments.md): real uv installs on real workers.

Two ``gpulayer join`` workers share one env cache (as two agents on one machine
do). The packages are a wheel each test module builds itself (shipped via
``find_links`` or uploaded as a local package) and ``six`` from the package
registry. Whether an env was built or reused is read from the job's log and its
``environment`` report, never from timings.
"""

import base64
import hashlib
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

import httpx
import pytest

import gpulayer as gl
from gpulayer import cli, errors
from gpulayer.client import cells
from gpulayer.cluster import LocalCluster

from ..support import until
from .conftest import FAST

BUILDING = "building with"


def make_wheel(folder: Path, name: str, version: str, value: str) -> Path:
    """A pure-Python wheel of module ``name`` whose ``VALUE`` is ``value``."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VALUE = {value!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = "\n".join(record) + "\n"
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return wheel


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("wheels")
    make_wheel(folder, "glenvdemo", "0.1.0", "demo-0.1")
    return folder


@pytest.fixture(scope="module")
def env_cluster(tmp_path_factory):
    """Two 2-slot workers sharing one env cache, reachable by the task user."""
    cache = Path(tempfile.mkdtemp(prefix="gl-envs-test-"))
    c = LocalCluster(
        tmp_path_factory.mktemp("envs"), workers=2, slots=2,
        env={"GPULAYER_ENV_CACHE": str(cache)}, **FAST,
    )  # fmt: skip
    with c:
        yield c
    shutil.rmtree(cache, ignore_errors=True)


@pytest.fixture
def conn(env_cluster):
    with env_cluster.connection() as c:
        yield c


def demo_env(wheels: Path, **more) -> gl.Env:
    return gl.Env(["glenvdemo==0.1.0"], find_links=[str(wheels)], **more)


def probe(*modules: str) -> list[str]:
    """A command that prints, per module, where it was imported from (or ``missing``)."""
    code = (
        "import importlib.util as u\n"
        f"for m in {list(modules)!r}:\n"
        "    s = u.find_spec(m)\n"
        "    print(m, 'missing' if s is None else 'found')\n"
        "import sys; print('prefix', sys.prefix)"
    )
    return ["python", "-c", code]


def built(job) -> bool:
    return any(BUILDING in line for line in job.logs())


def test_an_env_is_built_once_then_a_cache_hit_layered_on_the_worker(
    env_cluster, conn, wheels, capsys
):
    cmd = ["python", "-c", "import glenvdemo, pydantic; print('value', glenvdemo.VALUE)"]
    first = gl.submit(cmd, environment=demo_env(wheels), connection=conn).wait(timeout=120)
    assert first.state == "succeeded", (first.info.reason, first.logs())
    assert "value demo-0.1" in first.logs()  # its own package, and the worker's pydantic
    assert built(first)
    info = conn.job(first.id)
    assert info.environment is not None and info.environment.phase == "ready"
    assert info.environment.packages == ["glenvdemo==0.1.0"] and not info.environment.cached

    again = gl.submit(cmd, pip=["glenvdemo==0.1.0"], environment=gl.Env(find_links=[str(wheels)]),
                      connection=conn).wait(timeout=60)  # fmt: skip
    assert again.state == "succeeded" and "value demo-0.1" in again.logs()
    assert not built(again)  # the same env, asked for another way: no second build
    assert conn.job(again.id).environment.cached

    # What a person sees: the exact versions on the job, the env on the workers.
    assert cli.main(["job", first.id], connection=env_cluster.connection()) == 0
    out = capsys.readouterr().out
    assert "environment:" in out and "glenvdemo==0.1.0" in out and "ready (built in" in out
    # Workers list their envs in each heartbeat: the next one after the build says it.
    key = info.environment.key
    until(lambda: any(e.key == key for w in conn.workers() for e in w.envs), 30,
          "a heartbeat listing the env")  # fmt: skip
    assert cli.main(["workers"], connection=env_cluster.connection()) == 0
    assert key[:12] in capsys.readouterr().out


def test_two_jobs_asking_for_a_new_env_at_once_share_one_build(conn, wheels):
    env = demo_env(wheels, python=f"{sys.version_info.major}.{sys.version_info.minor}")
    jobs = [
        gl.submit(
            ["python", "-c", "import glenvdemo"],
            environment=env,
            connection=conn,
            worker=f"local-{i}",
        )
        for i in (1, 2)
    ]
    for job in jobs:
        assert job.wait(timeout=120).state == "succeeded", job.logs()
    assert sum(built(job) for job in jobs) == 1, [job.logs() for job in jobs]


def test_isolated_hides_the_workers_packages_and_installs_from_the_registry(conn):
    env = gl.Env(["six"], isolated=True)
    job = gl.submit(probe("six", "pydantic"), environment=env, connection=conn).wait(timeout=180)
    assert job.state == "succeeded", (job.info.reason, job.logs())
    lines = job.logs()
    assert "six found" in lines and "pydantic missing" in lines
    packages = conn.job(job.id).environment.packages
    assert any(p.startswith("six==") for p in packages)


def test_a_broken_requirement_fails_the_job_with_the_installers_message(conn, wheels):
    job = gl.submit(["true"], environment=demo_env(wheels).merged(["glenvdemo-absent-zz==1.0"]),
                    connection=conn).wait(timeout=120)  # fmt: skip
    info = conn.job(job.id)
    assert info.state == "failed" and info.attempts == 1
    assert info.reason.startswith("environment not built:")
    assert "glenvdemo-absent-zz" in info.reason and "Traceback" not in info.reason
    assert info.environment.phase == "failed" and "glenvdemo-absent-zz" in info.environment.error


def test_a_malformed_requirement_is_a_400_naming_the_field(env_cluster, conn):
    with pytest.raises(errors.ValidationError) as e:
        gl.submit(["true"], pip=["six =="], connection=conn)
    assert e.value.field == "environment.pip.0"
    body = {"command": ["true"], "environment": {"pip": ["--index-url=http://x"]}}
    resp = httpx.post(f"{env_cluster.url}gpulayer/api/v1/jobs", json=body,
                      headers={"Authorization": f"Bearer {env_cluster.admin_token}"})  # fmt: skip
    assert resp.status_code == 400 and resp.json()["field"] == "environment.pip.0"


def test_a_function_runs_in_its_env_and_a_local_package_is_shipped(conn, tmp_path):
    wheel = make_wheel(tmp_path / "local", "glenvlocal", "1.0", "shipped")

    @gl.remote(environment=gl.Env(local_packages=[wheel]), connection=conn)
    def value() -> str:
        import glenvlocal

        return str(glenvlocal.VALUE)

    assert value.run() == "shipped"
    assert value.run() == "shipped"  # the warm runner of that env
    wrong = value.options(environment=gl.Env(python="3.1"))
    with pytest.raises(errors.PayloadError, match="Python version mismatch"):
        wrong.run()


def test_a_session_keeps_its_env_across_cells(conn, wheels):
    cells.ensure_session(conn, "envs", environment=demo_env(wheels))
    try:
        first = cells.submit(conn, "import glenvdemo\nx = glenvdemo.VALUE", session="envs")
        first.result()
        second = cells.submit(conn, "import sys\nprint(x, sys.prefix)", session="envs")
        second.result()
        out = "\n".join(second.wait() and gl.Job(conn, second.info).logs())
        assert "demo-0.1" in out
    finally:
        conn.end_session("envs")


def test_a_gang_uses_one_env_on_every_node(conn, wheels):
    cmd = ["python", "-c", "import glenvdemo, os; print('node', os.environ['NODE_RANK'],"
           " glenvdemo.VALUE)"]  # fmt: skip
    env = demo_env(wheels).merged(["six"])
    job = gl.submit(cmd, nodes=2, launcher="direct", environment=env, connection=conn)
    assert job.wait(timeout=180).state == "succeeded", (job.info.reason, job.logs())
    info = conn.job(job.id)
    assert {t.environment.key for t in info.tasks} == {info.environment.key}
    assert sum(BUILDING in line for line in job.logs()) <= 1  # one build, shared


def test_a_rerun_with_the_recorded_pins(env_cluster, conn, wheels, capsys):
    job = gl.submit(probe("glenvdemo"), environment=demo_env(wheels).merged(["six"]),
                    connection=conn).wait(timeout=180)  # fmt: skip
    assert job.state == "succeeded", job.logs()
    pinned = gl.Env.from_job(job)
    assert "glenvdemo==0.1.0" in pinned.pip and any(p.startswith("six==") for p in pinned.pip)
    rerun = gl.submit(probe("glenvdemo"), environment=pinned, connection=conn).wait(timeout=180)
    assert rerun.state == "succeeded" and "glenvdemo found" in rerun.logs()
    assert sorted(conn.job(rerun.id).environment.packages) == sorted(
        conn.job(job.id).environment.packages
    )
    base = ["--url", env_cluster.url, "--token", env_cluster.admin_token]
    assert cli.main(["submit", *base, "--env-from", job.id, "--", *probe("glenvdemo")]) == 0
    again = conn.job(capsys.readouterr().out.strip())
    assert again.spec.environment.pip == pinned.spec().pip
