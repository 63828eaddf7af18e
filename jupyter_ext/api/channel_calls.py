"""The routes the channel carries, answered as their HTTP handlers answer them.

A :class:`~gpulayer.contracts.ChannelCall` names a route (``CLIENT_CALLS`` or
``WORKER_CALLS`` in :mod:`gpulayer.contracts.channel`); :func:`answer` runs it
against the same services, with the roles of the HTTP handler's verb (read from
its ``@requires``, so the two cannot drift apart), the same parsing and limits,
and maps an error onto the same status and ``ErrorBody``. Only adaptation lives
here, as in the handlers.
"""

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote

import pydantic

from gpulayer.contracts import (
    CLIENT_CALLS,
    WORKER_CALLS,
    ChannelAnswer,
    ChannelCall,
    JobBatch,
    JobList,
    JobSpec,
    LogBatch,
    TaskCompletion,
    WaitAny,
)
from gpulayer.errors import GpulayerError, NotFound, PayloadTooLarge

from ..auth import Principal, admit
from ..control_plane import ControlPlane
from . import jobs, sessions, worker_facing
from .base import Limits
from .bodies import decode_json, integer_arg, number_arg
from .errors import error_body, status_of

M = TypeVar("M", bound=pydantic.BaseModel)
Reply = tuple[int, pydantic.BaseModel | None]


@dataclass(frozen=True)
class Ctx:
    """One call being answered: who asks, what, against which control plane."""

    plane: ControlPlane
    who: Principal
    call: ChannelCall
    limits: Limits
    args: dict[str, str]

    def parse(self, model: type[M]) -> M:
        """The call's JSON body as ``model`` (400 naming the field)."""
        return decode_json((self.call.body or "").encode(), model)

    def number(self, name: str, default: float) -> float:
        """A hold from the query, at most ``long_poll_seconds``."""
        raw = self.call.query.get(name)
        return number_arg(raw, name, default, self.limits.long_poll_seconds)

    def integer(self, name: str, default: int, lo: int, hi: int) -> int:
        """An integer query argument in ``[lo, hi]``."""
        return integer_arg(self.call.query.get(name), name, default, lo, hi)


# ----------------------------------------------------------------- client calls


async def _submit(c: Ctx) -> Reply:
    spec = c.parse(JobSpec)
    hold = c.number("wait", 0.0)
    end = jobs.answer_arg(c.call.query.get("answer"))
    key = jobs.checked_key(c.call.idempotency_key)
    job, replayed = await jobs.submit_one(c.plane, c.who, spec, key, hold, end=end)
    return (200 if replayed else 201), job


async def _submit_batch(c: Ctx) -> Reply:
    batch = c.parse(JobBatch)
    key = jobs.checked_key(c.call.idempotency_key)
    got = await c.plane.jobs.submit_once(batch.jobs, c.who.name, c.who, key=key)
    return (200 if got.replayed else 201), JobList(jobs=got.jobs)


async def _wait_any(c: Ctx) -> Reply:
    req = c.parse(WaitAny)
    timeout = min(req.timeout, c.limits.long_poll_seconds)
    ended = await c.plane.jobs.wait_any(req.ids, timeout, c.who)
    return (204, None) if ended is None else (200, JobList(jobs=ended))


async def _job(c: Ctx) -> Reply:
    return 200, await c.plane.jobs.get(c.args["job_id"], c.who)


async def _job_wait(c: Ctx) -> Reply:
    job_id = c.args["job_id"]
    await c.plane.jobs.visible(job_id, c.who)
    ended = await c.plane.jobs.wait(job_id, c.number("timeout", c.limits.long_poll_seconds), c.who)
    return (204, None) if ended is None else (200, ended)


async def _logs(c: Ctx) -> Reply:
    job_id = c.args["job_id"]
    await c.plane.jobs.visible(job_id, c.who)
    offset = c.integer("offset", 0, 0, 2**62)
    limit = c.integer("limit", 1000, 1, 10000)
    attempt = c.integer("attempt", 0, 1, 1_000_000) or None
    wait = c.number("wait", 0.0)
    return 200, await c.plane.jobs.logs(job_id, offset, limit, wait, c.who, attempt)


async def _cancel(c: Ctx) -> Reply:
    return 200, await c.plane.jobs.cancel(c.args["job_id"], by=c.who.name, viewer=c.who)


async def _interrupt(c: Ctx) -> Reply:
    return 200, await c.plane.jobs.interrupt(c.args["job_id"], c.who.name, c.who)


async def _session(c: Ctx) -> Reply:
    owner = c.call.query.get("owner")
    return 200, await c.plane.session_service.get(c.args["name"], c.who, owner)


# ----------------------------------------------------------------- worker calls


async def _task_logs(c: Ctx) -> Reply:
    batch = c.parse(LogBatch)
    most = c.limits.max_log_batch_lines
    if len(batch.lines) > most:
        raise PayloadTooLarge(f"a log batch holds at most {most} lines", field="lines")
    return 200, await c.plane.tasks.append_logs(c.who, c.args["task_id"], batch)


async def _task_complete(c: Ctx) -> Reply:
    done = c.parse(TaskCompletion)
    return 200, await c.plane.tasks.complete(c.who, c.args["task_id"], done)


# ------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Route:
    """One route the channel carries."""

    method: str
    pattern: re.Pattern[str]
    roles: frozenset[str]
    run: Callable[[Ctx], Awaitable[Reply]]


def _roles(verb: Callable[..., Any]) -> frozenset[str]:
    roles: frozenset[str] = getattr(verb, "__gpulayer_roles__")  # noqa: B009  # set by @requires
    return roles


_RUN: dict[tuple[str, str], tuple[Callable[[Ctx], Awaitable[Reply]], Callable[..., Any]]] = {
    ("POST", r"jobs"): (_submit, jobs.JobsHandler.post),
    ("POST", r"jobs/batch"): (_submit_batch, jobs.JobBatchHandler.post),
    ("POST", r"jobs/wait"): (_wait_any, jobs.JobsWaitHandler.post),
    ("GET", r"jobs/(?P<job_id>[^/]+)"): (_job, jobs.JobHandler.get),
    ("GET", r"jobs/(?P<job_id>[^/]+)/wait"): (_job_wait, jobs.JobWaitHandler.get),
    ("GET", r"jobs/(?P<job_id>[^/]+)/logs"): (_logs, jobs.JobLogsHandler.get),
    ("POST", r"jobs/(?P<job_id>[^/]+)/cancel"): (_cancel, jobs.JobCancelHandler.post),
    ("POST", r"jobs/(?P<job_id>[^/]+)/interrupt"): (_interrupt, jobs.JobInterruptHandler.post),
    ("GET", r"sessions/(?P<name>[^/]+)"): (_session, sessions.SessionHandler.get),
    ("POST", r"tasks/(?P<task_id>[^/]+)/logs"): (
        _task_logs,
        worker_facing.TaskLogsHandler.post,
    ),
    ("POST", r"tasks/(?P<task_id>[^/]+)/complete"): (
        _task_complete,
        worker_facing.TaskCompleteHandler.post,
    ),
}


def _table(calls: tuple[tuple[str, str], ...]) -> list[Route]:
    return [
        Route(method, re.compile(path), _roles(_RUN[method, path][1]), _RUN[method, path][0])
        for method, path in calls
    ]


#: What a client's channel answers, and what a worker's.
CLIENT_ROUTES = _table(CLIENT_CALLS)
WORKER_ROUTES = _table(WORKER_CALLS)


async def answer(
    routes: list[Route], plane: ControlPlane, who: Principal, call: ChannelCall, limits: Limits
) -> ChannelAnswer:
    """Run ``call`` as its HTTP route would; every failure becomes its status and
    ``ErrorBody`` (never an exception: one bad call never ends the channel)."""
    try:
        status, model = await _run(routes, plane, who, call, limits)
    except GpulayerError as e:
        return ChannelAnswer(
            id=call.id, status=status_of(e), body=error_body(e, 0, "").model_dump_json()
        )
    return ChannelAnswer(id=call.id, status=status, body=model.model_dump_json() if model else "")


async def _run(
    routes: list[Route], plane: ControlPlane, who: Principal, call: ChannelCall, limits: Limits
) -> Reply:
    for route in routes:
        if route.method == call.method and (m := route.pattern.fullmatch(call.path)):
            admit(who, route.roles, call.method, call.path)
            args = {k: unquote(v) for k, v in m.groupdict().items()}
            return await route.run(Ctx(plane, who, call, limits, args))
    raise NotFound(f"the channel does not carry {call.method} {call.path}; use HTTP")
