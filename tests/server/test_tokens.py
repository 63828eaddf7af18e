"""Tokens and roles through the real server: minting, listing, revocation (also of
open long polls), expiry, single-use join tokens, submitter isolation, the
failed-login limit and the XSRF rule for browser requests."""

import asyncio
import copy
import json

import pytest

from gpulayer.errors import RateLimited
from jupyter_ext.auth import LoginLimiter

from ..support import until_long_polls

UNPLACEABLE = {"command": ["true"], "resources": {"gpus": 8}}


@pytest.fixture
def jp_server_config(jp_server_config):
    """Long holds (a poll that ends early ended for a reason) and a low login limit."""
    cfg = copy.deepcopy(jp_server_config)
    cfg["GpulayerApp"].update({"long_poll_seconds": 30.0, "login_failures_allowed": 3})
    return cfg


def registration(name):
    return {"name": name, "hostname": "h", "cpus": 1, "memory_bytes": 1, "version": "t"}


async def mint(gl_api, name, role, **kw):
    status, body = await gl_api(
        "tokens", method="POST", json_body={"name": name, "role": role, **kw}
    )
    assert status == 201, body
    return body


def services(jp_serverapp):
    return jp_serverapp.web_app.settings["gpulayer"].running.plane


async def test_tokens_are_minted_once_listed_without_secrets_and_revoked(gl_api):
    made = await mint(gl_api, "ada", "submitter", expires="30d")
    assert made["token"].startswith("gl_") and len(made["token"]) == 46
    assert made["role"] == "submitter" and made["state"] == "active" and made["expires_at"]
    status, err = await gl_api("tokens", method="POST", json_body={"name": "ada", "role": "viewer"})
    assert status == 409 and err["field"] == "name"
    status, page = await gl_api("tokens")
    assert status == 200
    text = json.dumps(page)
    assert made["token"] not in text and "hash" not in text
    assert {t["name"]: t["state"] for t in page["tokens"]}["ada"] == "active"
    assert (await gl_api("jobs", token=made["token"]))[0] == 200
    assert (await gl_api("tokens", "ada", method="DELETE"))[0] == 204
    status, err = await gl_api("jobs", token=made["token"])
    assert status == 401 and "revoked" in err["message"]
    assert (await gl_api("tokens", "ada", method="DELETE"))[0] == 404
    # the name is free again once the old token is revoked
    await mint(gl_api, "ada", "viewer")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "w", "role": "worker"}, "role"),
        ({"name": "s", "role": "submitter", "single_use": True}, "body"),
        ({"name": "e", "role": "viewer", "expires": "soon"}, "expires"),
        ({"name": "bad/name", "role": "viewer"}, "name"),
        ({"name": "x", "role": "viewer", "secret": "mine"}, "secret"),
    ],
)
async def test_bad_token_requests_are_400_naming_the_field(gl_api, body, field):
    status, err = await gl_api("tokens", method="POST", json_body=body)
    assert status == 400 and err["field"] == field, err
    names = {t["name"] for t in (await gl_api("tokens"))[1]["tokens"]}
    assert names == {"admin", "join"}


async def test_single_use_join_token_registers_once(gl_api):
    made = await mint(gl_api, "once", "join", single_use=True, expires="1h")
    args = ("workers", "register")
    ok = await gl_api(*args, method="POST", json_body=registration("a"), token=made["token"])
    assert ok[0] == 200
    status, err = await gl_api(
        *args, method="POST", json_body=registration("b"), token=made["token"]
    )
    assert status == 401 and "already used" in err["message"]
    states = {t["name"]: t["state"] for t in (await gl_api("tokens"))[1]["tokens"]}
    assert states["once"] == "used" and states["worker:a"] == "active"


async def test_submitter_sees_and_touches_only_its_own_jobs(gl_api):
    a = (await mint(gl_api, "alice", "submitter"))["token"]
    b = (await mint(gl_api, "bob", "submitter"))["token"]
    _, job = await gl_api("jobs", method="POST", json_body=UNPLACEABLE, token=a)
    assert job["owner"] == "alice"
    _, mine = await gl_api("jobs", method="POST", json_body=UNPLACEABLE, token=b)
    _, page = await gl_api("jobs", token=b)
    assert [j["id"] for j in page["jobs"]] == [mine["id"]]
    jid = job["id"]
    for parts, method in [
        (("jobs", jid), "GET"),
        (("jobs", jid, "wait"), "GET"),
        (("jobs", jid, "events"), "GET"),
        (("jobs", jid, "logs"), "GET"),
        (("jobs", jid, "artifacts"), "GET"),
        (("jobs", jid, "artifacts", "out.txt"), "GET"),
        (("jobs", jid, "cancel"), "POST"),
    ]:
        status, err = await gl_api(*parts, method=method, token=b, params={"timeout": "0"})
        assert status == 404 and err["code"] == "not_found", (parts, status, err)
        assert "alice" not in err["message"]
    _, still = await gl_api("jobs", jid, token=a)
    assert still["state"] == "queued"
    _, everything = await gl_api("jobs")  # admin sees both
    assert {j["owner"] for j in everything["jobs"]} == {"alice", "bob"}
    viewer = (await mint(gl_api, "vic", "viewer"))["token"]
    assert (await gl_api("jobs", jid, token=viewer))[0] == 200
    assert (await gl_api("jobs", jid, "cancel", method="POST", token=viewer))[0] == 403


async def test_revoking_a_token_ends_its_open_long_poll_with_401(gl_api, jp_serverapp):
    sub = (await mint(gl_api, "sub", "submitter"))["token"]
    _, job = await gl_api("jobs", method="POST", json_body=UNPLACEABLE, token=sub)
    wait = asyncio.ensure_future(gl_api("jobs", job["id"], "wait", token=sub))
    logs = asyncio.ensure_future(
        gl_api("jobs", job["id"], "logs", params={"wait": "30"}, token=sub)
    )
    await until_long_polls(jp_serverapp, 2)
    assert (await gl_api("tokens", "sub", method="DELETE"))[0] == 204
    for poll in (wait, logs):
        status, err = await asyncio.wait_for(poll, 10)
        assert status == 401 and "revoked" in err["message"]


async def test_a_worker_token_revoked_mid_acquire_gets_401(gl_api, jp_serverapp):
    _, reg = await gl_api("workers", "register", method="POST", json_body=registration("rw"),
                          token="join")  # fmt: skip
    acquire = asyncio.ensure_future(
        gl_api("workers", reg["worker_id"], "acquire", method="POST", token=reg["token"])
    )
    await until_long_polls(jp_serverapp)
    assert (await gl_api("tokens", "worker:rw", method="DELETE"))[0] == 204
    status, err = await asyncio.wait_for(acquire, 10)
    assert status == 401 and err["code"] == "unauthenticated"


async def test_a_token_that_expires_during_a_long_poll_ends_it(gl_api, jp_serverapp):
    short = (await mint(gl_api, "short", "viewer", expires="0.3s"))["token"]
    _, job = await gl_api("jobs", method="POST", json_body=UNPLACEABLE)
    status, err = await asyncio.wait_for(gl_api("jobs", job["id"], "wait", token=short), 10)
    assert status in (401,) and "expired" in err["message"]


async def test_failed_logins_are_rate_limited_per_address(gl_api):
    for _ in range(3):
        status, err = await gl_api("jobs", token="gl_" + "x" * 43)
        assert status == 401
    status, err = await gl_api("jobs", token="gl_" + "x" * 43)
    assert status == 429 and err["code"] == "rate_limited"
    assert "too many failed logins" in err["message"]
    # a valid token from the same address is always served (a shared NAT address,
    # the local worker's heartbeats)
    assert (await gl_api("jobs"))[0] == 200
    assert (await gl_api("jobs", token="gl_" + "x" * 43))[0] == 429


def test_login_limiter_window_with_an_injected_clock():
    now = [1000.0]
    lim = LoginLimiter(failures=2, window_seconds=60, clock=lambda: now[0], max_addresses=2)
    lim.failed("10.0.0.1")
    lim.check("10.0.0.1")
    lim.failed("10.0.0.1")
    with pytest.raises(RateLimited) as info:
        lim.check("10.0.0.1")
    assert info.value.retry_after_seconds == 60
    lim.check("10.0.0.2")  # other addresses are not affected
    now[0] += 30
    with pytest.raises(RateLimited):
        lim.check("10.0.0.1")
    now[0] += 30.5
    lim.check("10.0.0.1")  # the first failures left the window
    lim.failed("a")
    lim.failed("b")  # only the two most recent addresses are remembered
    assert "10.0.0.1" not in lim._seen
    LoginLimiter(failures=0).check("anyone")


async def test_cookie_post_without_xsrf_is_refused_but_no_credentials_is_401(
    jp_fetch, jp_serverapp, gl_api
):
    await gl_api("health")
    token = jp_serverapp.identity_provider.token
    resp = await jp_fetch("api", "status", params={"token": token})
    cookies = [v.split(";")[0] for v in resp.headers.get_list("Set-Cookie")]
    assert cookies, "Jupyter set no login cookie"
    cookie = "; ".join(cookies)
    body = json.dumps(UNPLACEABLE)
    no_xsrf = await jp_fetch("gpulayer", "api", "v1", "jobs", method="POST", body=body,
                             headers={"Authorization": "", "Cookie": cookie},
                             raise_error=False)  # fmt: skip
    assert no_xsrf.code == 403 and b"_xsrf" in no_xsrf.body
    nothing = await jp_fetch("gpulayer", "api", "v1", "jobs", method="POST", body=body,
                             headers={"Authorization": ""}, raise_error=False)  # fmt: skip
    assert nothing.code == 401
    assert (await gl_api("jobs"))[1]["jobs"] == []
