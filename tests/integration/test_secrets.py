"""Secrets through a real control plane and real workers (issue 19, items 5 and 6).

A command, the ranks of a gang, a warm-runner function and a session kernel read
a secret: what they print proves the value arrived (its sha256), and the value
itself, printed whole and cut across two lines, shows masked. The value is then
searched for, and never found, in every answer the test can reach as its owner, another submitter, a
viewer and the admin (job, jobs, events, logs, explain, secrets, workers, health,
Prometheus), in ``gpulayer logs``, in the control plane's and the worker's log
files, and in the SQLite database and its WAL.
"""

import hashlib
import json

import httpx
import pytest

import gpulayer as gl
from gpulayer import cli, contracts, errors
from gpulayer.client import Connection, cells
from gpulayer.client.logs import stored_lines

VALUE = "hf_Zq8w3LxT9vRk2Pn7Ys4Mb6Integration"
DIGEST = hashlib.sha256(VALUE.encode()).hexdigest()
HALF = len(VALUE) // 2
PRINT = (
    "import hashlib, os\n"
    "v = os.environ['HF_TOKEN']\n"
    "print('sha', hashlib.sha256(v.encode()).hexdigest(), flush=True)\n"
    "print('whole', v, flush=True)\n"
    f"print('cut', v[:{HALF}], flush=True)\n"
    f"print(v[{HALF}:], 'rest', flush=True)\n"
)


def texts(conn: Connection, job_id: str) -> list[str]:
    decoder = cells.MessageDecoder()
    return [t for ln in stored_lines(conn, job_id) if (t := cells.log_text(ln, decoder))]


def proves_and_masks(lines: list[str]) -> None:
    joined = "\n".join(lines)
    assert f"sha {DIGEST}" in joined, lines  # the value arrived
    assert "whole ***" in joined and "cut ***" in joined and "*** rest" in joined, lines


@pytest.mark.timeout(300)
def test_a_secret_reaches_only_its_task_and_never_shows(fresh_cluster, capsys):
    c = fresh_cluster(workers=1, slots=2)
    with c.connection() as admin:
        toks = {
            n: admin.create_token(contracts.CreateToken(name=n, role=r)).token
            for n, r in (("ada", "submitter"), ("bob", "submitter"), ("vera", "viewer"))
        }
    conns = {n: Connection(c.url, t) for n, t in toks.items()} | {"admin": c.connection()}
    ada, bob = conns["ada"], conns["bob"]
    try:
        ada.set_secret("HF_TOKEN", VALUE)
        # another owner can neither list nor use it
        assert bob.secrets() == []
        with pytest.raises(errors.ValidationError, match="no secret named 'HF_TOKEN'") as e:
            gl.submit("true", secrets=["HF_TOKEN"], connection=bob)
        assert e.value.field == "secrets"
        assert bob.jobs() == []

        command = gl.submit(["python", "-c", PRINT], secrets=["HF_TOKEN"],
                            env={"PLAIN": "ada-only-env-value"}, connection=ada)  # fmt: skip

        def call() -> str:
            import hashlib
            import os

            value = os.environ["HF_TOKEN"]
            print("whole", value, flush=True)
            return hashlib.sha256(value.encode()).hexdigest()

        gang = gl.submit(["python", "-c", PRINT], secrets=["HF_TOKEN"], nproc_per_node=2,
                         launcher="direct", connection=ada)  # fmt: skip
        fn = gl.remote(call, secrets=["HF_TOKEN"], connection=ada)
        assert fn.run() == DIGEST
        cells.ensure_session(ada, "s", secrets=["HF_TOKEN"])
        cell = cells.submit(ada, PRINT, session="s")
        assert command.wait(timeout=120).state == "succeeded", command.logs()
        proves_and_masks(texts(ada, command.id))
        assert gang.wait(timeout=120).state == "succeeded", gang.logs()
        ranks = texts(ada, gang.id)
        proves_and_masks(ranks)
        assert sum(f"sha {DIGEST}" in t for t in ranks) == 2, ranks  # every rank got it
        cell.result()
        proves_and_masks(texts(ada, cell.id))
        fn_job = next(j for j in ada.jobs() if j.spec.kind == "function")
        assert "whole ***" in texts(ada, fn_job.id)
        with pytest.raises(errors.ValidationError, match="runs without secret OTHER"):
            cells.ensure_session(ada, "s", secrets=["OTHER"])
        ada.end_session("s")

        # an admin share lets bob's job use it
        conns["admin"].share_secret("HF_TOKEN", "bob", owner="ada")
        shared = gl.submit(["python", "-c", PRINT], secrets=["HF_TOKEN"], connection=bob)
        assert shared.wait(timeout=120).state == "succeeded"
        proves_and_masks(texts(bob, shared.id))

        # `gpulayer logs` shows it masked
        assert cli.main(["logs", command.id], connection=Connection(c.url, toks["ada"])) == 0
        printed = capsys.readouterr().out
        assert "whole ***" in printed and VALUE[:HALF] not in printed

        # env values: the owner and the admin see them, a viewer only the keys
        assert ada.job(command.id).spec.env == {"PLAIN": "ada-only-env-value"}
        assert conns["admin"].job(command.id).spec.env == {"PLAIN": "ada-only-env-value"}
        assert conns["vera"].job(command.id).spec.env == {"PLAIN": "***"}
        listed = [j.spec.env for j in conns["vera"].jobs() if j.id == command.id]
        assert listed == [{"PLAIN": "***"}]

        everywhere = [printed]
        for who, conn in conns.items():
            everywhere += [m.model_dump_json() for m in conn.jobs()]
            everywhere.append(json.dumps([s.model_dump(mode="json") for s in conn.secrets()]))
            everywhere.append(conn.health().model_dump_json())
            if who != "bob":
                everywhere.append(json.dumps([w.model_dump(mode="json") for w in conn.workers()]))
            for job in conn.jobs():
                everywhere += [conn.job(job.id).model_dump_json(),
                               json.dumps([e.model_dump(mode="json") for e in conn.events(job.id)]),
                               conn.placement(job.id).model_dump_json()]  # fmt: skip
                everywhere += [ln.model_dump_json() for ln in stored_lines(conn, job.id)]
            if who in ("admin", "vera"):
                auth = {"Authorization": f"Bearer {toks.get(who, c.admin_token)}"}
                resp = httpx.get(c.url + "gpulayer/metrics", headers=auth)
                assert resp.status_code == 200
                everywhere.append(resp.text)
        found = "\n".join(everywhere)
        assert "sha " + DIGEST in found  # the search did reach the jobs' output
        files = [c.log_path(), c.log_path("local-1"), c.data_dir / "gpulayer.db",
                 c.data_dir / "gpulayer.db-wal"]  # fmt: skip
        stored = b"".join(p.read_bytes() for p in files if p.exists())
        for part in (VALUE, VALUE[:HALF], VALUE[HALF:]):
            assert part not in found, part
            assert part.encode() not in stored, part
        assert "ada-only-env-value" not in "\n".join(
            conns["vera"].job(j.id).model_dump_json() for j in conns["vera"].jobs()
        )
    finally:
        for conn in conns.values():
            conn.close()
