"""Every route × every role, plus no, expired, revoked and malformed tokens.

``MATRIX`` holds one entry per handler class and verb: the request to send and
the exact status each role gets (roles not listed get 403). Requests without a
usable token get 401 everywhere except ``health``. A route mounted without an
entry fails ``test_every_mounted_route_has_a_matrix_entry``: add the new
handler to ``MATRIX`` (issue-5 routes included) and say who may call it.
"""

import copy
import itertools
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from jupyter_ext import service
from jupyter_ext.api import (
    base,
    health,
    jobs,
    prometheus,
    providers,
    sessions,
    storage,
    tokens,
    training,
)
from jupyter_ext.api import secrets as SE
from jupyter_ext.api import worker_facing as W
from jupyter_ext.api import workers as WK

ROLES = ("admin", "submitter", "viewer", "join", "worker")
UNUSABLE = ("none", "expired", "revoked", "unknown", "malformed")
VERBS = ("get", "post", "put", "delete", "patch")
UNPLACEABLE = {"command": ["true"], "resources": {"gpus": 8}}  # the worker has no GPUs
PLACEABLE = {"command": ["true"], "resources": {"cpus": 0.01, "worker": "mw"}}

_names = itertools.count()


def fresh_name(prefix: str) -> str:
    return f"{prefix}{next(_names)}"


@pytest.fixture
def jp_server_config(jp_server_config):
    """Long leases (the matrix must not race the sweep) and no failed-login limit."""
    cfg = copy.deepcopy(jp_server_config)
    cfg["GpulayerApp"].update(
        {"lease_seconds": 120.0, "heartbeat_seconds": 30.0, "login_failures_allowed": 0}
    )
    return cfg


@dataclass
class Ctx:
    """Real objects the requests refer to, and the token of each principal."""

    api: Callable[..., Awaitable[tuple[int, Any]]]
    auth: dict[str, str] = field(default_factory=dict)  # principal -> Authorization header
    worker_id: str = ""
    job_id: str = ""
    task_id: str = ""
    bundle: str = ""
    session: str = ""

    async def admin(self, *parts, **kw):
        status, body = await self.api(*parts, **kw)
        assert status < 300, (parts, status, body)
        return body

    async def as_(self, who: str, *parts, **kw):
        return await self.api(*parts, headers={"Authorization": self.auth[who]}, **kw)


Fresh = Callable[[Ctx], Awaitable[dict[str, Any]]]
SUBMITTER = "matrix-submitter"  # the submitter token's name: the owner of what it makes


@dataclass
class Case:
    """One verb of one route: how to call it and who gets what."""

    path: Callable[[Ctx, dict[str, Any]], tuple[str, ...]]
    ok: dict[str, int]  # role -> exact status; other roles 403
    body: Callable[[Ctx, dict[str, Any]], Any] = lambda ctx, f: None
    params: dict[str, str] | None = None
    fresh: Fresh | None = None  # per-call objects, for calls that change state
    unusable: dict[str, int] = field(default_factory=dict)  # overrides of 401
    prefix: tuple[str, ...] = ("gpulayer", "api", "v1")  # routes beside the API differ


def _all(status: int) -> dict[str, int]:
    return dict.fromkeys(ROLES, status)


def _read(status: int = 200) -> dict[str, int]:
    return {"admin": status, "viewer": status, "submitter": status}


def _lines() -> dict[str, Any]:
    now = datetime.now(UTC).isoformat()
    return {"seq": 0, "lines": [{"stream": "stdout", "ts": now, "text": "x"}]}


def _points() -> dict[str, Any]:
    now = datetime.now(UTC).isoformat()
    return {"seq": 0, "points": [{"step": 1, "ts": now, "metrics": {"train/loss": 1.0}}]}


def _registration(name: str) -> dict[str, Any]:
    return {"name": name, "hostname": "h-" + name, "cpus": 2, "memory_bytes": 1 << 30,
            "version": "test", "slots": 1000}  # fmt: skip


async def _queued_job(ctx: Ctx) -> dict[str, Any]:
    _, job = await ctx.as_("submitter", "jobs", method="POST", json_body=UNPLACEABLE)
    return {"job_id": job["id"]}


async def _ended_job(ctx: Ctx) -> dict[str, Any]:
    _, job = await ctx.as_("submitter", "jobs", method="POST", json_body=UNPLACEABLE)
    status, _ = await ctx.as_("submitter", "jobs", job["id"], "cancel", method="POST")
    assert status == 200
    return {"job_id": job["id"]}


async def _running_task(ctx: Ctx) -> dict[str, Any]:
    _, job = await ctx.as_("submitter", "jobs", method="POST", json_body=PLACEABLE)
    status, got = await ctx.as_(
        "worker", "workers", ctx.worker_id, "acquire", method="POST", params={"wait": "0"}
    )
    assert status == 200, got
    (a,) = got["assignments"]
    assert a["job_id"] == job["id"]
    return {"task_id": a["task_id"]}


async def _job_with_result(ctx: Ctx) -> dict[str, Any]:
    fn = {"format": 1, "python": "3.11", "payload": "eA=="}
    spec = {"kind": "function", "function": fn, "resources": PLACEABLE["resources"]}
    _, job = await ctx.as_("submitter", "jobs", method="POST", json_body=spec)
    _, got = await ctx.as_(
        "worker", "workers", ctx.worker_id, "acquire", method="POST", params={"wait": "0"}
    )
    (a,) = got["assignments"]
    status, _ = await ctx.as_(
        "worker", "tasks", a["task_id"], "complete", method="POST",
        json_body={"state": "succeeded", "result": "eA=="},
    )  # fmt: skip
    assert status == 200
    return {"job_id": job["id"]}


async def _running_chunk(ctx: Ctx) -> dict[str, Any]:
    """A function task of two calls (a map chunk) running on the matrix's worker."""
    fn = {"format": 1, "python": "3.11", "payload": "eA==", "calls": 2}
    spec = {"kind": "function", "function": fn, "resources": PLACEABLE["resources"]}
    await ctx.as_("submitter", "jobs", method="POST", json_body=spec)
    _, got = await ctx.as_(
        "worker", "workers", ctx.worker_id, "acquire", method="POST", params={"wait": "0"}
    )
    (a,) = got["assignments"]
    return {"task_id": a["task_id"], "job_id": a["job_id"]}


async def _queued_cell(ctx: Ctx) -> dict[str, Any]:
    spec = {"kind": "cell", "cell": {"source": "1"}, "resources": {"gpus": 8}}
    _, job = await ctx.as_("submitter", "jobs", method="POST", json_body=spec)
    return {"job_id": job["id"]}


async def _session(ctx: Ctx) -> dict[str, Any]:
    name = fresh_name("s")
    body = {"name": name, "resources": {"gpus": 8}}  # queued: no worker holds it
    status, got = await ctx.as_("submitter", "sessions", method="POST", json_body=body)
    assert status == 201, got
    return {"session": name}


async def _token(ctx: Ctx) -> dict[str, Any]:
    name = fresh_name("victim")
    await ctx.admin("tokens", method="POST", json_body={"name": name, "role": "viewer"})
    return {"name": name}


async def _worker(ctx: Ctx) -> dict[str, Any]:
    name = fresh_name("w")
    status, _ = await ctx.as_(
        "join", "workers", "register", method="POST", json_body=_registration(name)
    )
    assert status == 200
    return {"worker": name}


async def _name(ctx: Ctx) -> dict[str, Any]:
    return {"name": fresh_name("n")}


async def _secret(ctx: Ctx) -> dict[str, Any]:
    name = fresh_name("SECRET_")
    status, got = await ctx.as_("submitter", "secrets", name, method="PUT",
                                json_body={"value": "matrix-value"})  # fmt: skip
    assert status == 201, got
    return {"secret": name}


JOB = lambda c, f: ("jobs", c.job_id)  # noqa: E731
T, M = tokens, training

#: handler class -> verb -> Case. Add new routes here.
MATRIX: dict[type, dict[str, Case]] = {
    health.HealthHandler: {
        "get": Case(lambda c, f: ("health",), _all(200),
                    unusable={"none": 200, "malformed": 200}),
    },
    jobs.JobsHandler: {
        "get": Case(lambda c, f: ("jobs",), _read()),
        "post": Case(lambda c, f: ("jobs",), {"admin": 201, "submitter": 201},
                     body=lambda c, f: UNPLACEABLE),
    },
    jobs.JobBatchHandler: {
        "post": Case(lambda c, f: ("jobs", "batch"), {"admin": 201, "submitter": 201},
                     body=lambda c, f: {"jobs": [UNPLACEABLE, UNPLACEABLE]}),
    },
    jobs.JobsWaitHandler: {
        "post": Case(lambda c, f: ("jobs", "wait"), _read(204),
                     body=lambda c, f: {"ids": [c.job_id], "timeout": 0}),
    },
    jobs.JobResultHandler: {
        "get": Case(lambda c, f: ("jobs", f["job_id"], "result"), _read(), fresh=_job_with_result),
    },
    jobs.JobHandler: {
        "get": Case(JOB, _read()),
        "delete": Case(lambda c, f: ("jobs", f["job_id"]), {"admin": 204, "submitter": 204},
                       fresh=_ended_job),
    },
    storage.GcHandler: {
        "post": Case(lambda c, f: ("gc",), {"admin": 200}, body=lambda c, f: {}),
    },
    jobs.JobWaitHandler: {
        "get": Case(lambda c, f: (*JOB(c, f), "wait"), _read(204), params={"timeout": "0"}),
    },
    jobs.JobCancelHandler: {
        "post": Case(lambda c, f: ("jobs", f["job_id"], "cancel"),
                     {"admin": 200, "submitter": 200}, fresh=_queued_job),
    },
    jobs.JobInterruptHandler: {
        "post": Case(lambda c, f: ("jobs", f["job_id"], "interrupt"),
                     {"admin": 200, "submitter": 200}, fresh=_queued_cell),
    },
    sessions.SessionsHandler: {
        "get": Case(lambda c, f: ("sessions",), _read()),
        "post": Case(lambda c, f: ("sessions",), {"admin": 201, "submitter": 201},
                     body=lambda c, f: {"name": f["name"], "resources": {"gpus": 8}}, fresh=_name),
    },
    sessions.SessionHandler: {  # names are per owner: others name the submitter's
        "get": Case(lambda c, f: ("sessions", c.session), _read(), params={"owner": SUBMITTER}),
        "delete": Case(lambda c, f: ("sessions", f["session"]), {"admin": 204, "submitter": 204},
                       params={"owner": SUBMITTER}, fresh=_session),
    },
    jobs.JobEventsHandler: {"get": Case(lambda c, f: (*JOB(c, f), "events"), _read())},
    jobs.JobLogsHandler: {"get": Case(lambda c, f: (*JOB(c, f), "logs"), _read())},
    jobs.JobArtifactsHandler: {"get": Case(lambda c, f: (*JOB(c, f), "artifacts"), _read())},
    jobs.JobArtifactHandler: {
        "get": Case(lambda c, f: (*JOB(c, f), "artifacts", "out.txt"), _read()),
    },
    jobs.BlobsHandler: {
        "post": Case(lambda c, f: ("blobs",), {"admin": 201, "submitter": 201},
                     body=lambda c, f: b"blob bytes"),
    },
    WK.WorkersHandler: {"get": Case(lambda c, f: ("workers",), _read())},
    jobs.JobPlacementHandler: {"get": Case(lambda c, f: (*JOB(c, f), "placement"), _read())},
    WK.WorkerDrainHandler: {
        "post": Case(lambda c, f: ("workers", f["worker"], "drain"), {"admin": 200},
                     fresh=_worker),
    },
    WK.WorkerTelemetryHandler: {
        "get": Case(lambda c, f: ("workers", "mw", "telemetry"), _read()),
    },
    W.RegisterHandler: {
        "post": Case(lambda c, f: ("workers", "register"), {"admin": 200, "join": 200},
                     body=lambda c, f: _registration(f["name"]), fresh=_name),
    },
    W.ReregisterHandler: {
        # the matrix's own worker, listing its running task so that it keeps running
        "post": Case(lambda c, f: ("workers", c.worker_id, "register"),
                     {"admin": 200, "worker": 200},
                     body=lambda c, f: {**_registration("mw"), "running_tasks": [c.task_id]}),
    },
    WK.WorkerHandler: {
        "delete": Case(lambda c, f: ("workers", f["worker"]), {"admin": 204}, fresh=_worker),
    },
    W.HeartbeatHandler: {
        "post": Case(lambda c, f: ("workers", c.worker_id, "heartbeat"),
                     {"admin": 200, "worker": 200},
                     body=lambda c, f: {"running_tasks": [c.task_id]}),
    },
    W.AcquireHandler: {
        "post": Case(lambda c, f: ("workers", c.worker_id, "acquire"),
                     {"admin": 204, "worker": 204}, params={"wait": "0"}),
    },
    M.JobMetricsHandler: {"get": Case(lambda c, f: (*JOB(c, f), "metrics"), _read())},
    M.TaskMetricsHandler: {
        "post": Case(lambda c, f: ("tasks", c.task_id, "metrics"), {"admin": 200, "worker": 200},
                     body=lambda c, f: _points()),
    },
    W.TaskLogsHandler: {
        "post": Case(lambda c, f: ("tasks", c.task_id, "logs"), {"admin": 200, "worker": 200},
                     body=lambda c, f: _lines()),
    },
    W.TaskArtifactHandler: {
        "put": Case(lambda c, f: ("tasks", c.task_id, "artifacts", "more.txt"),
                    {"admin": 201, "worker": 201}, body=lambda c, f: b"data"),
    },
    W.TaskResultHandler: {
        "put": Case(lambda c, f: ("tasks", c.task_id, "result"), {"admin": 201, "worker": 201},
                    body=lambda c, f: b"outcomes"),
    },
    W.TaskCompleteHandler: {
        "post": Case(lambda c, f: ("tasks", f["task_id"], "complete"),
                     {"admin": 200, "worker": 200},
                     body=lambda c, f: {"state": "succeeded", "exit_code": 0},
                     fresh=_running_task),
    },
    W.TaskPartsHandler: {
        "post": Case(lambda c, f: ("tasks", f["task_id"], "parts"), {"admin": 204, "worker": 204},
                     body=lambda c, f: {"parts": [{"index": 1, "outcome": "eA=="}]},
                     fresh=_running_chunk),
    },
    jobs.JobPartsHandler: {"get": Case(lambda c, f: (*JOB(c, f), "parts"), _read())},
    W.BlobHandler: {
        "get": Case(lambda c, f: ("blobs", c.bundle), {"admin": 200, "worker": 200}),
    },
    W.TaskEnvironmentHandler: {
        "post": Case(lambda c, f: ("tasks", c.task_id, "environment"),
                     {"admin": 200, "worker": 200},
                     body=lambda c, f: {"phase": "preparing", "key": "ab" * 16,
                                        "started_at": "2026-01-01T00:00:00Z"}),
    },
    jobs.JobPlacementHandler: {"get": Case(lambda c, f: (*JOB(c, f), "placement"), _read())},
    WK.WorkerDrainHandler: {
        # `resume` on the matrix's own worker: it must keep taking the matrix's tasks.
        "post": Case(lambda c, f: ("workers", "mw", "resume"), {"admin": 200}),
    },
    WK.WorkerTelemetryHandler: {
        "get": Case(lambda c, f: ("workers", "mw", "telemetry"), _read()),
    },
    T.TokensHandler: {
        "get": Case(lambda c, f: ("tokens",), {"admin": 200}),
        "post": Case(lambda c, f: ("tokens",), {"admin": 201},
                     body=lambda c, f: {"name": f["name"], "role": "viewer"}, fresh=_name),
    },
    T.TokenHandler: {
        "delete": Case(lambda c, f: ("tokens", f["name"]), {"admin": 204}, fresh=_token),
    },
    SE.SecretsHandler: {"get": Case(lambda c, f: ("secrets",), _read())},
    SE.SecretHandler: {
        "put": Case(lambda c, f: ("secrets", f["name"].upper()), {"admin": 201, "submitter": 201},
                    body=lambda c, f: {"value": "matrix-value"}, fresh=_name),
        "delete": Case(lambda c, f: ("secrets", f["secret"]), {"admin": 204, "submitter": 204},
                       params={"owner": SUBMITTER}, fresh=_secret),
    },
    SE.SecretShareHandler: {
        "put": Case(lambda c, f: ("secrets", f["secret"], "shares", "someone"), {"admin": 200},
                    params={"owner": SUBMITTER}, fresh=_secret),
        "delete": Case(lambda c, f: ("secrets", f["secret"], "shares", "someone"),
                       {"admin": 204}, params={"owner": SUBMITTER}, fresh=_secret),
    },
    providers.ProvidersHandler: {"get": Case(lambda c, f: ("providers",), _read())},
    providers.InstancesHandler: {"get": Case(lambda c, f: ("instances",), _read())},
    providers.InstanceTerminateHandler: {  # no such instance: past the role check, a 404
        "post": Case(lambda c, f: ("instances", "0000beef", "terminate"), {"admin": 404}),
    },
    prometheus.MetricsHandler: {
        "get": Case(lambda c, f: ("metrics",), {"admin": 200, "viewer": 200},
                    prefix=("gpulayer",)),
    },
}  # fmt: skip


def _mounted() -> list[tuple[str, type]]:
    """Every route the app mounts: the API's and those beside it."""
    return service.routes() + service.outer_routes()


def _verbs(handler: type) -> list[str]:
    return [v for v in VERBS if getattr(handler, v) is not getattr(base.APIHandler, v)]


def test_every_mounted_route_has_a_matrix_entry():
    for path, handler in _mounted():
        entry = MATRIX.get(handler)
        assert entry is not None, f"route {path!r} ({handler.__name__}) has no MATRIX entry"
        assert sorted(entry) == sorted(_verbs(handler)), (
            f"{handler.__name__}: MATRIX covers {sorted(entry)}, the handler has"
            f" {sorted(_verbs(handler))}"
        )
        for verb in _verbs(handler):
            roles = getattr(getattr(handler, verb), "__gpulayer_roles__", None)
            if handler is not health.HealthHandler:
                assert roles is not None, f"{handler.__name__}.{verb} has no @requires"
                expected = {r for r, s in entry[verb].ok.items() if s != 403}
                assert roles == expected, (handler.__name__, verb, roles, expected)


async def _setup(gl_api, admin_token: str) -> Ctx:
    ctx = Ctx(api=gl_api)

    async def token(role: str, name: str | None = None, **kw) -> str:
        body = {"name": name or fresh_name(role), "role": role, **kw}
        return (await ctx.admin("tokens", method="POST", json_body=body))["token"]

    bootstrap = (await ctx.admin("tokens"))["tokens"]
    assert {t["name"] for t in bootstrap} == {"admin", "join"}
    ctx.auth = {
        "admin": "Bearer " + admin_token,
        "submitter": "Bearer " + await token("submitter", SUBMITTER),
        "viewer": "Bearer " + await token("viewer"),
        "join": "Bearer " + await token("join"),
        "none": "",
        "unknown": "Bearer gl_" + "A" * 43,
        "malformed": "Bearer not-a-gpulayer-token",
    }
    ctx.auth["revoked"] = "Bearer " + await token("viewer", "to-revoke")
    await ctx.admin("tokens", "to-revoke", method="DELETE")
    expiring = await token("viewer", expires="1ms")
    ctx.auth["expired"] = "Bearer " + expiring
    status, reg = await ctx.as_("join", "workers", "register", method="POST",
                                json_body=_registration("mw"))  # fmt: skip
    assert status == 200, reg
    ctx.worker_id = reg["worker_id"]
    ctx.auth["worker"] = "Bearer " + reg["token"]
    _, ref = await ctx.as_("submitter", "blobs", method="POST", body=b"bundle bytes")
    ctx.bundle = ref["sha256"]
    _, job = await ctx.as_(
        "submitter", "jobs", method="POST", json_body={**PLACEABLE, "bundle": ctx.bundle}
    )
    ctx.job_id = job["id"]
    _, got = await ctx.as_(
        "worker", "workers", ctx.worker_id, "acquire", method="POST", params={"wait": "0"}
    )
    ctx.task_id = got["assignments"][0]["task_id"]
    ctx.session = (await _session(ctx))["session"]
    status, _ = await ctx.as_(
        "worker", "tasks", ctx.task_id, "artifacts", "out.txt", method="PUT", body=b"result"
    )
    assert status == 201
    # the expired token: wait (by deadline, not a sleep) until the store calls it expired
    for _ in range(1000):
        if (await ctx.as_("expired", "health"))[0] == 401:
            break
    else:
        raise AssertionError("the 1 ms token never expired")
    return ctx


async def test_route_role_matrix(gl_api, gl_data_dir):
    ctx = await _setup(gl_api, (gl_data_dir / "admin.token").read_text().strip())
    failures = []
    for path, handler in _mounted():
        assert handler in MATRIX, f"add {handler.__name__} ({path}) to MATRIX"
        for verb, case in MATRIX[handler].items():
            for who in ROLES + UNUSABLE:
                expected = (
                    case.ok.get(who, 403)
                    if who in ROLES
                    else case.unusable.get(who, 401)
                )  # fmt: skip
                f = await case.fresh(ctx) if case.fresh else {}
                body = case.body(ctx, f)
                kw: dict[str, Any] = {"method": verb.upper(), "params": case.params,
                                      "prefix": case.prefix}  # fmt: skip
                if isinstance(body, bytes):
                    kw["body"] = body
                elif body is not None:
                    kw["body"] = json.dumps(body)
                status, answer = await ctx.as_(who, *case.path(ctx, f), **kw)
                if status != expected:
                    detail = answer if isinstance(answer, dict) else "..."
                    failures.append(f"{verb.upper()} {path} as {who}: {status}, not {expected}"
                                    f" ({detail})")  # fmt: skip
                elif status >= 400 and case.ok.get(who) != status:  # refused, not a 404 asked for
                    assert isinstance(answer, dict), (path, who, answer)
                    assert answer["code"] in ("unauthenticated", "forbidden"), answer
    assert not failures, "\n".join(failures)
