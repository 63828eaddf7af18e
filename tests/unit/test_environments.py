"""Environments without a cluster: the wire model, pip's configuration for uv, the
requirements file, and the env cache's installers and eviction (real installs of a
wheel the test builds, no network: ``--no-index``)."""

import asyncio
import os
import subprocess
import sys

import pytest

import gpulayer as gl
from gpulayer import contracts as c
from gpulayer import errors
from gpulayer.worker.environments import EnvCache, index_args, pip_index_options

from ..integration.test_environments import make_wheel

#: The worker's environment with pip's configuration saying: no index (no network).
OFFLINE = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": ""}


def test_equal_envs_have_equal_digests_whatever_the_spelling_or_order():
    a = c.EnvSpec(pip=["Six >= 1.0", "idna"])
    b = c.EnvSpec(pip=["idna", "six>=1.0", "six>=1.0"])
    assert a.pip == ["six>=1.0", "idna"] and b.pip == ["idna", "six>=1.0"]
    assert a.digest == b.digest
    assert c.EnvSpec(pip=["six"], isolated=True).digest != c.EnvSpec(pip=["six"]).digest


@pytest.mark.parametrize(
    ("pip", "says"),
    [(["six =="], "is not a requirement"), (["--index-url=x"], "installer option"),
     (["six\nidna"], "control")],
)  # fmt: skip
def test_a_bad_requirement_names_the_field(pip, says):
    with pytest.raises(errors.ValidationError) as e:
        gl.Env(pip)
    assert e.value.field == "environment.pip.0" and says in str(e.value)


def test_pip_configuration_reaches_uv_and_the_job_wins_over_it(tmp_path):
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nindex-url = https://mirror/simple\nfind-links = /opt/w1\n")
    got = pip_index_options({"PIP_CONFIG_FILE": str(conf), "HOME": str(tmp_path),
                             "PIP_EXTRA_INDEX_URL": "https://extra/simple"})  # fmt: skip
    assert got["index_url"] == ["https://mirror/simple"]
    assert got["find_links"] == ["/opt/w1"] and got["extra_index_urls"] == ["https://extra/simple"]
    plain = index_args(c.EnvSpec(pip=["six"]), got, None)
    assert plain[:2] == ["--index-url", "https://mirror/simple"]
    own = index_args(c.EnvSpec(pip=["six"], index_url="https://own/simple", find_links=["/w2"]),
                     got, None)  # fmt: skip
    assert own[:2] == ["--index-url", "https://own/simple"] and "https://mirror/simple" not in own
    assert own.count("--find-links") == 2


def test_a_requirements_file_with_options_and_includes(tmp_path):
    (tmp_path / "base.txt").write_text("idna>=3  # comment\n")
    (tmp_path / "req.txt").write_text(
        "# top\n-r base.txt\nsix==1.17.0\n--find-links /opt/wheels\n-i https://x/simple\n"
    )
    env = gl.Env(requirements=tmp_path / "req.txt")
    spec = env.spec()
    assert spec.pip == ["idna>=3", "six==1.17.0"]
    assert spec.find_links == ["/opt/wheels"] and spec.index_url == "https://x/simple"
    (tmp_path / "bad.txt").write_text("-e .\n")
    with pytest.raises(errors.ValidationError, match=r"bad.txt:1"):
        gl.Env(requirements=tmp_path / "bad.txt")


def _prepare(cache: EnvCache, spec: c.EnvSpec):
    lines: list[str] = []
    reports: list[c.TaskEnvironment] = []

    async def report(r: c.TaskEnvironment) -> None:
        reports.append(r)

    prepared = asyncio.run(cache.prepare(spec, lines.append, report))
    return prepared, lines, reports


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_each_installer_builds_an_isolated_env_and_records_exact_versions(tmp_path, installer):
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "glunitdemo", "2.0", "two")
    cache = EnvCache(tmp_path / "envs", installer=installer, base_env=OFFLINE)
    spec = c.EnvSpec(pip=["glunitdemo"], find_links=[str(wheels)], isolated=True)
    prepared, lines, reports = _prepare(cache, spec)
    assert [r.phase for r in reports] == ["preparing", "ready"]
    assert reports[-1].packages == ["glunitdemo==2.0"]
    assert any(f"building with {installer}" in line for line in lines)
    python = prepared.ref.python
    code = (
        "import glunitdemo, importlib.util as u; print(glunitdemo.VALUE, u.find_spec('pydantic'))"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True).stdout.split()
    assert out == ["two", "None"]  # its own package; not the worker's pydantic
    prepared.hold.release()
    again, lines, reports = _prepare(cache, spec)
    assert [r.phase for r in reports] == ["ready"] and reports[0].cached and not lines
    again.hold.release()


def test_eviction_takes_the_least_recently_used_env_that_nothing_holds(tmp_path):
    wheels = tmp_path / "wheels"
    for v in ("1.0", "2.0", "3.0"):
        make_wheel(wheels, "glevict", v, v)
    cache = EnvCache(tmp_path / "envs", max_bytes=1, base_env=OFFLINE)

    def spec(v: str) -> c.EnvSpec:
        return c.EnvSpec(pip=[f"glevict=={v}"], find_links=[str(wheels)], isolated=True)

    held, _, _ = _prepare(cache, spec("1.0"))  # in use: never evicted
    free, _, _ = _prepare(cache, spec("2.0"))
    free.hold.release()
    last, _, _ = _prepare(cache, spec("3.0"))  # over the cap: 2.0 goes, 1.0 stays
    keys = {e.key for e in cache.listing()}
    assert keys == {held.ref.key, last.ref.key}
    assert {e.key: e.in_use for e in cache.listing()} == {held.ref.key: 1, last.ref.key: 1}
    held.hold.release()
    last.hold.release()


def test_a_cache_folder_others_may_write_is_refused(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    loose.chmod(0o777)
    cache = EnvCache(loose)
    with pytest.raises(errors.ConfigError, match="--env-cache"):
        _prepare(cache, c.EnvSpec(pip=["six"]))


def test_the_env_python_is_checked_before_a_function_is_sent():
    from gpulayer.functions.checks import check_python

    spec = c.JobSpec(kind="function", environment={"python": "3.1"},
                     function={"format": 1, "python": "3.11", "payload": b"x"})  # fmt: skip
    with pytest.raises(errors.PayloadError) as e:
        check_python(None, spec)  # type: ignore[arg-type]
    assert e.value.field == "environment.python"
    assert sys.version_info >= (3, 11)


def test_gpulayer_job_shows_the_phase_with_its_time_and_then_the_exact_versions():
    from datetime import UTC, datetime, timedelta

    from gpulayer.cli.jobs import environment_lines

    asked = c.EnvSpec(pip=["six"])
    began = datetime.now(UTC) - timedelta(seconds=12)
    assert environment_lines(asked, None)[1] == "state:     not prepared yet"
    preparing = c.TaskEnvironment(phase="preparing", key="ab" * 16, started_at=began)
    line = environment_lines(asked, preparing)[1]
    assert line.startswith("state:     preparing environment (12") and line.endswith("s)")
    ready = preparing.model_copy(update={
        "phase": "ready", "ended_at": began + timedelta(seconds=1.5), "python": "3.11",
        "packages": ["glx==1.0"], "from_worker": ["six==1.17.0"],
    })  # fmt: skip
    lines = environment_lines(asked, ready)
    assert "ready (built in 1.5s), Python 3.11" in lines[1]
    assert lines[2:] == ["  glx==1.0", "  six==1.17.0 (the worker's)"]
    failed = preparing.model_copy(update={"phase": "failed", "error": "error: no six"})
    assert environment_lines(asked, failed)[1] == "state:     failed: error: no six"
