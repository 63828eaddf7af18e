"""Secrets and ``env`` visibility against a real control plane (issue 19, items 5 and 6).

Tokens of two submitters (``ada``, ``bob``), a viewer (``vera``) and the admin talk
to the real server over HTTP; the worker's side is played by hand (register,
acquire, log batches, completion), so every line the control plane takes in is
known. The integration test (``tests/integration/test_secrets.py``) runs the same
values through real workers.
"""

import json
import sqlite3
import stat
from datetime import UTC, datetime

import pytest

from jupyter_ext.masking import MASK, Masker

from .test_tenants import acquire, join, tenants

VALUE = "hf_Zq8w3LxT9vRk2Pn7Ys4Mb6"
OTHER = "sk-Other-Value-0123456789"


async def set_secret(gl_api, tok: str, name: str, value: str) -> tuple[int, dict]:
    return await gl_api("secrets", name, method="PUT", json_body={"value": value}, token=tok)


def lines(*texts: str, seq: int = 0) -> dict:
    now = datetime.now(UTC).isoformat()
    return {"seq": seq, "lines": [{"stream": "stdout", "ts": now, "text": t} for t in texts]}


async def test_set_list_replace_delete_never_answer_the_value(gl_api, gl_data_dir):
    t = await tenants(gl_api)
    status, made = await set_secret(gl_api, t["ada"], "HF_TOKEN", VALUE)
    assert status == 201, made
    assert made["name"] == "HF_TOKEN" and made["owner"] == "ada"
    assert VALUE not in json.dumps(made)
    key = gl_data_dir / "secrets.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    status, again = await set_secret(gl_api, t["ada"], "HF_TOKEN", OTHER)  # a new value
    assert status == 200 and again["created_at"] == made["created_at"], again
    # listing: names and owners, never a value; a submitter sees its own only
    await set_secret(gl_api, t["bob"], "BOB_KEY", "bob-value-1")
    listed = {who: (await gl_api("secrets", token=t[who]))[1] for who in t}
    assert [s["name"] for s in listed["ada"]["secrets"]] == ["HF_TOKEN"]
    assert [s["name"] for s in listed["bob"]["secrets"]] == ["BOB_KEY"]
    for who in ("admin", "vera"):
        assert {(s["owner"], s["name"]) for s in listed[who]["secrets"]} == {
            ("ada", "HF_TOKEN"),
            ("bob", "BOB_KEY"),
        }
    assert VALUE not in json.dumps(listed) and OTHER not in json.dumps(listed)
    # bob cannot delete ada's, even by naming her; the admin can
    status, _ = await gl_api("secrets", "HF_TOKEN", method="DELETE", token=t["bob"])
    assert status == 404
    params = {"owner": "ada"}
    status, _ = await gl_api("secrets", "HF_TOKEN", method="DELETE", params=params, token=t["bob"])
    assert status == 404
    status, _ = await gl_api("secrets", "HF_TOKEN", method="DELETE", params=params)
    assert status == 204
    assert (await gl_api("secrets", token=t["ada"]))[1]["secrets"] == []
    # nothing in the database file holds a value in clear
    db = (gl_data_dir / "gpulayer.db").read_bytes()
    wal = gl_data_dir / "gpulayer.db-wal"
    for blob in (db, wal.read_bytes() if wal.exists() else b""):
        assert VALUE.encode() not in blob and OTHER.encode() not in blob
        assert b"bob-value-1" not in blob


@pytest.mark.parametrize(
    ("value", "field"),
    [("abc", "value"), ("   \t  ", "value"), ("nul\x00here", "value")],
)
async def test_values_that_cannot_be_masked_or_set_are_400(gl_api, value, field):
    status, err = await set_secret(gl_api, "admin", "TOKEN", value)
    assert status == 400 and err["field"] == field, err
    assert value not in err["message"]  # a refused value is never echoed
    assert (await gl_api("secrets"))[1]["secrets"] == []


@pytest.mark.parametrize("name", ["1ABC", "HAS-DASH", "GPULAYER_TOKEN", "a" * 129])
async def test_names_that_cannot_be_environment_variables_are_400(gl_api, name):
    status, err = await set_secret(gl_api, "admin", name, VALUE)
    assert status == 400 and err["field"] == "name", err


async def test_a_job_naming_a_missing_secret_is_400_naming_it_and_stores_nothing(gl_api):
    t = await tenants(gl_api)
    await set_secret(gl_api, t["bob"], "HF_TOKEN", VALUE)  # bob's is not ada's
    body = {"command": ["true"], "secrets": ["HF_TOKEN"]}
    status, err = await gl_api("jobs", method="POST", json_body=body, token=t["ada"])
    assert status == 400 and err["field"] == "secrets", err
    assert "'HF_TOKEN'" in err["message"] and "gpulayer secret set HF_TOKEN" in err["message"]
    both = {"command": ["true"], "secrets": ["HF_TOKEN"], "env": {"HF_TOKEN": "x"}}
    status, err = await gl_api("jobs", method="POST", json_body=both, token=t["bob"])
    assert status == 400 and "both in 'env' and in 'secrets'" in err["message"], err
    session = {"name": "s", "secrets": ["NOPE"], "resources": {"gpus": 8}}
    status, err = await gl_api("sessions", method="POST", json_body=session, token=t["bob"])
    assert status == 400 and err["field"] == "secrets", err
    assert (await gl_api("jobs"))[1]["jobs"] == []
    status, job = await gl_api("jobs", method="POST", json_body=body, token=t["bob"])
    assert status == 201 and job["spec"]["secrets"] == ["HF_TOKEN"], job
    assert VALUE not in json.dumps(job)


async def test_an_admin_share_lets_another_owner_use_a_secret_until_unshared(gl_api):
    t = await tenants(gl_api)
    await set_secret(gl_api, t["ada"], "TEAM_KEY", VALUE)
    body = {"command": ["true"], "secrets": ["TEAM_KEY"], "resources": {"gpus": 8}}
    assert (await gl_api("jobs", method="POST", json_body=body, token=t["bob"]))[0] == 400
    share = ("secrets", "TEAM_KEY", "shares", "bob")
    status, _ = await gl_api(*share, method="PUT", params={"owner": "ada"}, token=t["ada"])
    assert status == 403  # only an admin shares
    status, shared = await gl_api(*share, method="PUT", params={"owner": "ada"})
    assert status == 200 and shared["shared_with"] == ["bob"], shared
    listed = (await gl_api("secrets", token=t["bob"]))[1]["secrets"]
    assert [(s["owner"], s["name"]) for s in listed] == [("ada", "TEAM_KEY")]
    assert (await gl_api("jobs", method="POST", json_body=body, token=t["bob"]))[0] == 201
    status, _ = await gl_api(*share, method="DELETE", params={"owner": "ada"})
    assert status == 204
    assert (await gl_api("jobs", method="POST", json_body=body, token=t["bob"]))[0] == 400
    assert (await gl_api("secrets", token=t["bob"]))[1]["secrets"] == []


async def test_the_value_goes_only_to_the_task_and_is_masked_in_what_it_reports(
    gl_api, gl_data_dir
):
    t = await tenants(gl_api)
    await set_secret(gl_api, t["ada"], "HF_TOKEN", VALUE)
    reg = await join(gl_api)
    body = {"command": ["true"], "secrets": ["HF_TOKEN"], "env": {"PLAIN": "visible-to-ada"}}
    status, job = await gl_api("jobs", method="POST", json_body=body, token=t["ada"])
    assert status == 201, job
    status, got = await gl_api("workers", reg["worker_id"], "acquire", method="POST",
                               params={"wait": "0"}, token=reg["token"])  # fmt: skip
    assert status == 200
    (a,) = got["assignments"]
    assert a["secrets"] == {"HF_TOKEN": VALUE}  # only here, to the worker running it
    task = a["task_id"]
    # a rotation now does not change what this task got, and both values are masked
    await set_secret(gl_api, t["ada"], "HF_TOKEN", OTHER)
    half = len(VALUE) // 2
    batch = lines(
        f"token={VALUE}",
        f"json {json.dumps({'t': VALUE})}",
        f"cut across lines: {VALUE[:half]}",
        f"{VALUE[half:]} <- rest",
        f"the new one {OTHER} is masked too",
    )
    status, ack = await gl_api("tasks", task, "logs", method="POST", json_body=batch,
                               token=reg["token"])  # fmt: skip
    assert status == 200 and ack["next_seq"] == 5, ack
    done = {"state": "failed", "exit_code": 1, "reason": f"RuntimeError: bad token {VALUE}"}
    status, _ = await gl_api("tasks", task, "complete", method="POST", json_body=done,
                             token=reg["token"])  # fmt: skip
    assert status == 200
    seen = []
    for who in t:
        for parts in [("jobs", job["id"]), ("jobs",), ("jobs", job["id"], "events"),
                      ("jobs", job["id"], "logs"), ("jobs", job["id"], "placement"),
                      ("secrets",), ("workers",), ("health",)]:  # fmt: skip
            status, answer = await gl_api(*parts, token=t[who])
            seen.append(json.dumps(answer) if status == 200 else "")
    status, metrics = await gl_api("metrics", prefix=("gpulayer",))
    assert status == 200
    seen.append(metrics.decode() if isinstance(metrics, bytes) else json.dumps(metrics))
    everything = "\n".join(seen)
    for value in (VALUE, OTHER):
        assert value not in everything
        assert value[:half] not in everything and value[half:] not in everything
    _, page = await gl_api("jobs", job["id"], "logs", token=t["ada"])
    assert [ln["text"] for ln in page["lines"]] == [
        f"token={MASK}",
        f'json {{"t": "{MASK}"}}',
        f"cut across lines: {MASK}",
        f"{MASK} <- rest",
        f"the new one {MASK} is masked too",
    ]
    _, ended = await gl_api("jobs", job["id"], token=t["ada"])
    assert ended["reason"] == f"RuntimeError: bad token {MASK}", ended
    db = (gl_data_dir / "gpulayer.db").read_bytes() + _wal(gl_data_dir)
    assert VALUE.encode() not in db and OTHER.encode() not in db


def _wal(data_dir) -> bytes:
    wal = data_dir / "gpulayer.db-wal"
    return wal.read_bytes() if wal.exists() else b""


async def test_a_deleted_secret_starts_the_task_without_it_and_says_so(gl_api):
    t = await tenants(gl_api)
    await set_secret(gl_api, t["ada"], "GONE", VALUE)
    reg = await join(gl_api)
    body = {"command": ["true"], "secrets": ["GONE"], "resources": {"worker": "box"}}
    status, job = await gl_api("jobs", method="POST", json_body=body, token=t["ada"])
    assert status == 201
    await gl_api("secrets", "GONE", method="DELETE", token=t["ada"])
    tasks = await acquire(gl_api, reg)
    assert job["id"] in tasks
    _, page = await gl_api("jobs", job["id"], "logs", token=t["ada"])
    assert [ln["text"] for ln in page["lines"]] == [
        "gpulayer: secret GONE no longer exists; this task starts without it"
    ]


async def test_env_values_are_shown_only_to_their_owner_and_admins(gl_api):
    t = await tenants(gl_api)
    body = {"command": ["true"], "env": {"DB_URL": "postgres://ada:pw@db"},
            "resources": {"gpus": 8}}  # fmt: skip
    status, job = await gl_api("jobs", method="POST", json_body=body, token=t["ada"])
    assert status == 201 and job["spec"]["env"] == body["env"]
    reads = [("jobs", job["id"]), ("jobs",)]
    for who, expected in (("ada", body["env"]), ("admin", body["env"]),
                          ("vera", {"DB_URL": "***"})):  # fmt: skip
        _, one = await gl_api(*reads[0], token=t[who])
        _, listed = await gl_api(*reads[1], token=t[who])
        assert one["spec"]["env"] == expected, who
        assert [j["spec"]["env"] for j in listed["jobs"]] == [expected], who
    status, _ = await gl_api("jobs", job["id"], token=t["bob"])
    assert status == 404  # another submitter does not see the job at all
    # the long polls answer the same way: cancel it, then wait as the viewer
    await gl_api("jobs", job["id"], "cancel", method="POST", token=t["ada"])
    _, waited = await gl_api("jobs", job["id"], "wait", params={"timeout": "0"},
                             token=t["vera"])  # fmt: skip
    assert waited["spec"]["env"] == {"DB_URL": "***"}
    _, many = await gl_api("jobs", "wait", method="POST", token=t["vera"],
                           json_body={"ids": [job["id"]], "timeout": 0})  # fmt: skip
    assert [j["spec"]["env"] for j in many["jobs"]] == [{"DB_URL": "***"}]


def test_masking_rules():
    m = Masker([VALUE, "-----BEGIN KEY-----\nQUJDREVGR0g=\nab\n-----END KEY-----"])
    assert m.mask(f"a {VALUE} b {VALUE}") == f"a {MASK} b {MASK}"
    # each line of a multi-line value, wherever it shows; lines under 4 chars stay
    assert m.mask("QUJDREVGR0g=") == MASK
    assert m.mask("-----END KEY----- ab") == f"{MASK} ab"
    # a cut leaves at most 3 characters of a side visible
    assert m.mask(f"x {VALUE[:3]}") == f"x {VALUE[:3]}"
    assert m.mask(f"x {VALUE[:4]}") == f"x {MASK}"
    assert m.mask(f"{VALUE[-4:]} y") == f"{MASK} y"
    # a cell message in fragments (each but the last starts with '~')
    assert m.mask(f'~{{"text": "{VALUE[:9]}') == f'~{{"text": "{MASK}'
    assert m.mask(f'~{VALUE[9:]}"}}') == f'~{MASK}"}}'
    assert m.mask("nothing here") == "nothing here"
    assert not Masker([]) and Masker([]).mask(VALUE) == VALUE


async def test_a_sealed_value_copied_to_another_owners_row_does_not_open(gl_api, gl_data_dir):
    t = await tenants(gl_api)
    await set_secret(gl_api, t["ada"], "HF_TOKEN", VALUE)
    await set_secret(gl_api, t["bob"], "HF_TOKEN", OTHER)
    # someone who can write the database, but not read the key, moves ada's value to bob
    with sqlite3.connect(gl_data_dir / "gpulayer.db") as db:
        db.execute(
            "UPDATE secrets SET sealed = (SELECT sealed FROM secrets WHERE owner = 'ada')"
            " WHERE owner = 'bob'"
        )
    reg = await join(gl_api)
    body = {"command": ["true"], "secrets": ["HF_TOKEN"]}
    status, job = await gl_api("jobs", method="POST", token=t["bob"], json_body=body)
    assert status == 201
    status, got = await gl_api("workers", reg["worker_id"], "acquire", method="POST",
                               params={"wait": "0"}, token=reg["token"])  # fmt: skip
    assert status == 200  # the worker is not stalled by it
    (a,) = got["assignments"]
    assert a["secrets"] == {}
    _, page = await gl_api("jobs", job["id"], "logs", token=t["bob"])
    (line,) = [ln["text"] for ln in page["lines"]]
    assert "secret 'HF_TOKEN' of 'bob' does not open with" in line, line
    assert VALUE not in line and OTHER not in line
