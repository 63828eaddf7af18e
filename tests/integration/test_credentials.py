"""The credential chain against a real control plane and real workers (issue 15,
findings 1, 5 and 10).

- No credential of the worker's reaches a task: a command, a warm-runner function,
  a fresh-kernel cell, a session kernel and the ranks of a distributed job dump
  their environment, and none of the secrets the test knows shows up; a job that
  tries every value it finds cannot register a worker with any of them.
- A join token registers only new names: a join-token holder cannot take over a
  running worker's name and its tasks; a restarted worker re-attaches with the
  credential kept in its data dir; an admin can forget a worker so that its name
  joins again.
- A task calls gpulayer only when its job asks (``api_access``): as its owner, role
  ``submitter``, with a token that is dead once the task ended.
"""

import json
import signal
import stat
import sys

import httpx
import pytest

import gpulayer as gl
from gpulayer import cli, contracts, errors
from gpulayer.client import Connection, cells
from gpulayer.worker.workspace import PRIVATE_ENV

from ..support import until

PY = sys.executable
API = "gpulayer/api/v1/"


def registration(name: str, hostname: str = "attacker") -> dict[str, object]:
    return {"name": name, "hostname": hostname, "cpus": 1, "memory_bytes": 1 << 30,
            "version": "0"}  # fmt: skip


# What a hostile job does with its environment: print it, then try every value
# that could be a credential as the bearer of a worker registration.
SNOOP = f"""
import json, os, urllib.error, urllib.request
print("ENV " + json.dumps(dict(os.environ)), flush=True)
body = json.dumps({registration("rogue")!r}).encode()
tried = 0
for value in sorted(set(os.environ.values())):
    if len(value) < 16 or any(c.isspace() for c in value):
        continue
    tried += 1
    req = urllib.request.Request(
        os.environ["CP_URL"] + "{API}workers/register", data=body, method="POST",
        headers={{"Authorization": "Bearer " + value, "Content-Type": "application/json"}},
    )
    try:
        urllib.request.urlopen(req, timeout=10)
        print("REGISTERED with", value[:6], flush=True)
    except urllib.error.HTTPError:
        pass
print("TRIED", tried, flush=True)
"""


def env_lines(lines: list[str]) -> list[dict[str, str]]:
    return [json.loads(t.partition("ENV ")[2]) for t in lines if t.startswith("ENV ")]


def assert_clean(env: dict[str, str], secrets: set[str], what: str) -> None:
    assert not PRIVATE_ENV & set(env), (what, PRIVATE_ENV & set(env))
    leaked = [k for k, v in env.items() for s in secrets if s in v]
    assert not leaked, f"{what}: {leaked} hold a credential"


def test_no_credential_reaches_a_command_function_cell_session_or_rank(fresh_cluster):
    c = fresh_cluster(workers=0)
    with c.connection() as admin:
        ada = admin.create_token(contracts.CreateToken(name="ada", role="submitter")).token
        # A worker started from a shell that holds every kind of secret: a client token,
        # Jupyter's own token (the control plane's), and a gpulayer token under any name.
        # (LocalCluster gives its workers GPULAYER_JOIN_TOKEN, as `gpulayer up` does.)
        c.add_worker("leaky", slots=4, env={"GPULAYER_TOKEN": c.admin_token,
                     "JUPYTER_TOKEN": c.jupyter_token, "A_TOKEN_BY_ANY_NAME": ada})  # fmt: skip
        credential = c.data_dir / "workers" / "leaky" / "credential.json"
        until(credential.exists, what="the worker to keep its credential")
        assert stat.S_IMODE(credential.stat().st_mode) == 0o600
        worker_token = json.loads(credential.read_text())["token"]
        secrets = {c.admin_token, c.join_token, c.jupyter_token, ada, worker_token}
        assert all(s.startswith("gl_") for s in secrets - {c.jupyter_token})

        with Connection(c.url, ada) as conn:
            command = gl.submit([PY, "-c", SNOOP], env={"CP_URL": c.url}, connection=conn)
            rank = gl.submit([PY, "-c", SNOOP], env={"CP_URL": c.url}, nproc_per_node=2,
                             launcher="direct", connection=conn)  # fmt: skip
            function_env = gl.remote(lambda: dict(__import__("os").environ), connection=conn).run()
            cell_env = cells.submit(conn, "import os\nenv = dict(os.environ)", pull=["env"])
            cells.ensure_session(conn, "snoop")
            session_env = cells.submit(
                conn, "import os\nenv = dict(os.environ)", session="snoop", pull=["env"]
            )
            got = {"function": function_env, "cell": cell_env.result()["env"],
                   "session": session_env.result()["env"]}  # fmt: skip
            conn.end_session("snoop")
            for name, job, expected in (("command", command, 1), ("rank", rank, 2)):
                lines = job.wait(timeout=90).logs()
                assert job.state == "succeeded", lines
                dumps = env_lines(lines)
                assert len(dumps) == expected, lines
                for i, env in enumerate(dumps):
                    got[f"{name} {i}"] = env
                assert not [t for t in lines if t.startswith("REGISTERED")], lines
                assert all(int(t.split()[1]) > 0 for t in lines if t.startswith("TRIED"))
        for what, env in got.items():
            assert env.get("GPULAYER_JOB_ID"), what  # a real task's environment
            assert_clean(env, secrets, what)
        assert [w.name for w in admin.workers()] == ["leaky"]


def test_a_join_token_cannot_take_over_a_running_worker(fresh_cluster):
    c = fresh_cluster(workers=1, slots=1)
    join = {"Authorization": f"Bearer {c.join_token}"}
    with c.connection() as conn:
        (w,) = conn.workers()
        job = gl.submit([PY, "-c", "import time; print('working', flush=True); time.sleep(120)"],
                        connection=conn)  # fmt: skip
        until(lambda: conn.job(job.id).state == "running", what="the job to run")
        task_id = conn.job(job.id).tasks[-1].id

        # The attack of finding 5: re-register as local-1 with the join token, from
        # "the same host" (a hostname is only what the worker says it is)...
        attack = registration("local-1", hostname=w.hostname)
        resp = httpx.post(c.url + API + "workers/register", json=attack, headers=join)
        assert resp.status_code == 409 and resp.json()["field"] == "name", resp.text
        assert "gpulayer workers forget local-1" in resp.json()["message"]
        # ...or as the worker itself, or act for its task.
        resp = httpx.post(c.url + API + f"workers/{w.id}/register", json=attack, headers=join)
        assert resp.status_code == 403, resp.text
        for method, path, body in (
            ("POST", f"tasks/{task_id}/complete", {"state": "succeeded", "exit_code": 0}),
            ("PUT", f"tasks/{task_id}/artifacts/stolen.txt", None),
        ):
            resp = httpx.request(method, c.url + API + path, json=body, headers=join)
            assert resp.status_code == 403, (path, resp.text)

        # Nothing changed hands: the worker still holds its id and runs the task.
        (after,) = conn.workers()
        assert (after.id, after.hostname, after.running_tasks) == (w.id, w.hostname, [task_id])
        assert conn.job(job.id).state == "running" and conn.artifacts(job.id) == []
        conn.cancel(job.id)
        assert gl.Job(conn, conn.job(job.id)).wait(timeout=60).state == "cancelled"


def test_a_restarted_worker_reattaches_and_a_forgotten_name_joins_again(fresh_cluster, capsys):
    c = fresh_cluster(workers=1, slots=1)
    credential = c.data_dir / "workers" / "local-1" / "credential.json"
    with c.connection() as conn:
        (first,) = conn.workers()
        until(credential.exists, what="the worker to keep its credential")
        assert json.loads(credential.read_text())["worker_id"] == first.id

        # A restart (even a SIGKILL) with the same data dir: the same worker again.
        c.stop_worker("local-1", signal.SIGKILL)
        c.add_worker("local-1", slots=1)
        (again,) = conn.workers()
        assert again.id == first.id and again.state == "ready"
        assert gl.submit(["true"], connection=conn).wait(timeout=60).state == "succeeded"

        # Forgotten by an admin: its token is dead, and its agent joins again as a new
        # worker (what a reinstalled machine does), under a new id.
        assert cli.main(["workers", "forget", "local-1"], connection=c.connection()) == 0
        assert "worker local-1 forgotten" in capsys.readouterr().out
        back = until(
            lambda: [w for w in conn.workers() if w.name == "local-1" and w.state == "ready"],
            timeout=30, what="the forgotten worker to join again",
        )  # fmt: skip
        assert back[0].id != first.id
        kept = lambda: json.loads(credential.read_text())["worker_id"] == back[0].id  # noqa: E731
        until(kept, what="the agent to keep its new credential")
        assert stat.S_IMODE(credential.stat().st_mode) == 0o600
        with pytest.raises(errors.NotFound):
            conn.forget_worker("no-such-worker")

        # A local worker whose folder lost its credential (or predates credentials):
        # LocalCluster (`gpulayer up`) forgets the registration it cannot reclaim.
        c.stop_worker("local-1")
        credential.unlink()
        c.add_worker("local-1", slots=1)
        (fresh,) = conn.workers()
        assert fresh.id != back[0].id and fresh.state == "ready"


NESTED = """
import os
import gpulayer as gl
from gpulayer import errors
print("TOKEN", os.environ["GPULAYER_TOKEN"], flush=True)
conn = gl.connect()
inner = gl.submit(["true"], connection=conn).wait(timeout=60)
print("INNER", inner.state, conn.job(inner.id).owner, flush=True)
print("OWNERS", ",".join(sorted({j.owner for j in conn.jobs()})), flush=True)
try:
    conn.tokens()
    print("TOKENS allowed")
except errors.Forbidden:
    print("TOKENS forbidden")
"""


def field(lines: list[str], key: str) -> str:
    (value,) = [t.partition(" ")[2] for t in lines if t.startswith(key + " ")]
    return value


def test_a_job_calls_gpulayer_only_with_api_access_as_its_owner(fresh_cluster):
    c = fresh_cluster(workers=1, slots=3)
    with c.connection() as admin:
        ada = admin.create_token(contracts.CreateToken(name="ada", role="submitter")).token
        gl.submit(["true"], connection=admin).wait(timeout=60)  # a job ada must not see
        with Connection(c.url, ada) as conn:
            job = gl.submit([PY, "-c", NESTED], api_access=True, connection=conn)
            info = job.wait(timeout=120)
            lines = job.logs()
            assert info.state == "succeeded", (info.reason, lines)
            assert field(lines, "INNER") == "succeeded ada"
            assert field(lines, "OWNERS") == "ada"  # only its owner's jobs
            assert field(lines, "TOKENS") == "forbidden"
            # Once the task ended, its token is dead.
            with Connection(c.url, field(lines, "TOKEN")) as dead, pytest.raises(errors.AuthError):
                dead.jobs()
            without = gl.submit([PY, "-c", "import os; print(os.environ.get('GPULAYER_TOKEN'))"],
                                connection=conn).wait(timeout=60)  # fmt: skip
            assert without.logs()[-1] == "None"

            # A session's kernel holds a token for as long as the session runs.
            session = cells.ensure_session(conn, "driver", api_access=True)
            src = "import os\ntok = os.environ['GPULAYER_TOKEN']"
            tok = cells.submit(conn, src, session="driver", pull=["tok"]).result()["tok"]
            with Connection(c.url, tok) as kernel:
                assert {j.owner for j in kernel.jobs()} == {"ada"}
                conn.end_session("driver")
                until(lambda: conn.job(session.job_id).state.terminal, what="the session to end")
                with pytest.raises(errors.AuthError):
                    kernel.jobs()

        # An admin's job never gets admin rights.
        mine = gl.submit([PY, "-c", NESTED], api_access=True, connection=admin).wait(timeout=120)
        lines = mine.logs()
        assert mine.state == "succeeded", lines
        assert field(lines, "TOKENS") == "forbidden" and field(lines, "OWNERS") == "admin"
        task_tokens = [t for t in admin.tokens() if t.task_id is not None]
        assert sorted((t.name, t.role, t.state) for t in task_tokens) == [
            ("ada", "submitter", "revoked"),
            ("ada", "submitter", "revoked"),  # the session's
            ("admin", "submitter", "revoked"),
        ]
