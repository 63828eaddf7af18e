"""Who owns the jobs of Jupyter users: one owner per server for token logins, the
identity provider's name when it knows people (JupyterHub).

Every ``jp_fetch`` call is a new connection without cookies, as two processes that
``gl.connect(lab_url, token=<jupyter token>)`` are; the Jupyter user here has the
``submitter`` role, so it sees only the jobs of its own owner.
"""

import copy
import json

import pytest
from jupyter_server.auth.identity import IdentityProvider, User

from jupyter_ext.service import ANONYMOUS_OWNER_FILE

JOB = {"command": ["true"], "resources": {"gpus": 8}}  # stays queued: there is no worker


class HubLikeIdentityProvider(IdentityProvider):
    """Names people as JupyterHub's provider does (from the hub; a header here), and
    treats them as token-authenticated, as the hub's API tokens are."""

    async def get_user(self, handler):  # type: ignore[override]
        name = handler.request.headers.get("X-Hub-User")
        if not name:
            return None
        handler._token_authenticated = True
        return User(username=name, name=name.title())


@pytest.fixture
def gl_kept_owner() -> str | None:
    """What ``<data_dir>/jupyter-owner`` holds before the server starts (None: no file)."""
    return None


@pytest.fixture
def gl_identity_provider() -> type | None:
    """The server's identity provider class (None: jupyter_server's token login)."""
    return None


@pytest.fixture
def jp_server_config(jp_server_config, gl_data_dir, gl_kept_owner, gl_identity_provider):
    """The Jupyter user is a submitter; the data dir may hold an owner already."""
    config = copy.deepcopy(jp_server_config)
    config["GpulayerApp"]["jupyter_user_role"] = "submitter"
    if gl_identity_provider is not None:
        config["ServerApp"]["identity_provider_class"] = gl_identity_provider
    if gl_kept_owner is not None:
        gl_data_dir.mkdir(parents=True, exist_ok=True)
        (gl_data_dir / ANONYMOUS_OWNER_FILE).write_text(gl_kept_owner + "\n")
    return config


async def as_jupyter(jp_fetch, *parts, method="GET", body=None, headers=None):
    """A request on a new connection, authenticated the way Jupyter authenticates it."""
    resp = await jp_fetch(
        "gpulayer", "api", "v1", *parts, method=method, raise_error=False,
        body=None if body is None and method == "GET" else json.dumps(body or {}),
        **({"headers": headers} if headers else {}),
    )  # fmt: skip
    return resp.code, json.loads(resp.body) if resp.body else None


async def test_token_logins_share_one_owner_kept_in_the_data_dir(jp_fetch, gl_data_dir, gl_api):
    status, job = await as_jupyter(jp_fetch, "jobs", method="POST", body=JOB)
    assert status == 201, job
    kept = (gl_data_dir / ANONYMOUS_OWNER_FILE).read_text().strip()
    assert kept.startswith("jupyter:") and job["owner"] == kept
    assert (gl_data_dir / ANONYMOUS_OWNER_FILE).stat().st_mode & 0o777 == 0o600
    # a second connection is the same owner: it lists, reads and cancels the job
    status, page = await as_jupyter(jp_fetch, "jobs")
    assert status == 200 and [j["id"] for j in page["jobs"]] == [job["id"]]
    assert (await as_jupyter(jp_fetch, "jobs", job["id"]))[0] == 200
    status, done = await as_jupyter(jp_fetch, "jobs", job["id"], "cancel", method="POST")
    assert status == 200 and done["state"] == "cancelled"
    # a gpulayer token is another owner, and does not see it
    _, made = await gl_api("tokens", method="POST", json_body={"name": "ada", "role": "submitter"})
    assert (await gl_api("jobs", job["id"], token=made["token"]))[0] == 404


@pytest.mark.parametrize("gl_kept_owner", ["jupyter:lab-of-ada"])
async def test_the_kept_owner_survives_a_restart(jp_fetch, gl_data_dir, gl_kept_owner):
    status, job = await as_jupyter(jp_fetch, "jobs", method="POST", body=JOB)
    assert status == 201 and job["owner"] == gl_kept_owner
    assert (gl_data_dir / ANONYMOUS_OWNER_FILE).read_text().strip() == gl_kept_owner


@pytest.mark.parametrize("gl_identity_provider", [HubLikeIdentityProvider])
async def test_users_an_identity_provider_names_own_their_jobs_by_that_name(jp_fetch):
    ada, bob = {"X-Hub-User": "ada"}, {"X-Hub-User": "bob"}
    status, job = await as_jupyter(jp_fetch, "jobs", method="POST", body=JOB, headers=ada)
    assert status == 201 and job["owner"] == "ada", job
    status, page = await as_jupyter(jp_fetch, "jobs", headers=ada)
    assert [j["id"] for j in page["jobs"]] == [job["id"]]
    status, _ = await as_jupyter(jp_fetch, "jobs", job["id"], headers=bob)
    assert status == 404
    status, page = await as_jupyter(jp_fetch, "jobs", headers=bob)
    assert page["jobs"] == []
