"""``jobs`` and ``blobs`` routes: submit, list, read, follow, wait, cancel, interrupt,
delete."""

import re
from urllib.parse import quote

from jupyter_server.auth.decorator import allow_unauthenticated

from gpulayer.contracts import (
    TERMINAL_STATES,
    ArtifactList,
    BlobRef,
    EventList,
    Job,
    JobBatch,
    JobEnd,
    JobList,
    JobSpec,
    JobState,
    WaitAny,
)
from gpulayer.errors import NotFound, ValidationError

from ..auth import Principal, requires
from ..control_plane import ControlPlane
from .base import GpulayerAPIHandler

READ = ("viewer", "submitter")
#: The header a client repeats a submit with (docs/adr/0085): printable ASCII.
IDEMPOTENCY_HEADER = "Idempotency-Key"
_KEY = re.compile(r"[\x21-\x7e]{1,200}")


def idempotency_key(handler: GpulayerAPIHandler) -> str | None:
    """The request's ``Idempotency-Key``, or None; 400 when it is malformed."""
    return checked_key(handler.request.headers.get(IDEMPOTENCY_HEADER))


def checked_key(raw: str | None) -> str | None:
    """An ``Idempotency-Key`` as sent (None for none); 400 when it is malformed."""
    if raw is None:
        return None
    if not _KEY.fullmatch(raw):
        raise ValidationError(
            f"{IDEMPOTENCY_HEADER} must be 1 to 200 printable ASCII characters without spaces",
            field=IDEMPOTENCY_HEADER,
        )
    return raw


#: What ``POST jobs`` answers: the whole ``Job`` (``answer=job``, the default), or
#: with ``answer=end`` a ``JobEnd``: how it ended (or stands) and its small result.
ANSWERS = ("job", "end")


def answer_arg(raw: str | None) -> bool:
    """Whether ``answer`` (from the query) asks for a ``JobEnd``; 400 naming the field
    for anything but ``job`` or ``end``."""
    if raw is None or raw == "job":
        return False
    if raw == "end":
        return True
    raise ValidationError(
        f"answer must be one of {', '.join(ANSWERS)}, not {raw[:40]!r}", field="answer"
    )


async def submit_one(
    plane: ControlPlane,
    who: Principal,
    spec: JobSpec,
    key: str | None,
    wait: float = 0.0,
    *,
    end: bool = False,
) -> tuple[Job | JobEnd, bool]:
    """``POST jobs`` for the HTTP route and the channel: the job, stored once per
    ``key``; and whether a repeat found it stored already. With ``wait`` the answer
    waits up to that many seconds for the job to end (a new job is read once, when it
    ended or the wait ran out). With ``end``, its ``JobEnd`` instead of the job."""
    got = await plane.jobs.submit_once([spec], who.name, who, key=key, answer=wait <= 0)
    if got.replayed or wait <= 0:
        if not got.jobs:
            raise NotFound(f"the job {IDEMPOTENCY_HEADER} {key!r} created no longer exists")
        job = got.jobs[0]
        if wait > 0 and job.state not in TERMINAL_STATES:
            job = await plane.jobs.wait(job.id, wait, who) or job
        return (JobEnd.of(job) if end else job), got.replayed
    job_id = got.job_ids[0]
    if end:  # built from the job's records: no Job (its spec, its tasks) made and sent
        ended = await plane.jobs.wait_end(job_id, wait, who)
        return ended or JobEnd.of(await plane.jobs.get(job_id, who)), False
    return await plane.jobs.wait(job_id, wait, who) or await plane.jobs.get(job_id, who), False


class JobsHandler(GpulayerAPIHandler):
    """``POST jobs`` submits; ``GET jobs`` lists."""

    @allow_unauthenticated
    @requires(*READ)
    async def get(self) -> None:
        """List jobs, newest first (``state``, ``owner``, ``limit``); a submitter sees
        only its own, whatever ``owner`` it asks for."""
        state = self.get_query_argument("state", None)
        try:
            st = JobState(state) if state else None
        except ValueError as e:
            raise ValidationError(
                f"unknown state {state!r}; one of {', '.join(s.value for s in JobState)}",
                field="state",
            ) from e
        limit = self.int_arg("limit", 100, 1, 10000)
        owner = self.get_query_argument("owner", None)
        self.reply(JobList(jobs=await self.gl.jobs.recent(st, limit, owner, self.who)))

    @allow_unauthenticated
    @requires("submitter")
    async def post(self) -> None:
        """Submit a ``JobSpec``; 201 with the job and its ``Location``. With ``wait=S``
        the answer waits up to S seconds for the job to end (a quick function call
        then costs one request); with ``answer=end`` it is the job's ``JobEnd``. With
        an ``Idempotency-Key`` a repeat answers the job the first request stored
        (200), a different spec with that key 409."""
        spec = self.parse(JobSpec)
        hold = self.wait_arg()
        end = answer_arg(self.get_query_argument("answer", None))
        key = idempotency_key(self)
        job, replayed = await submit_one(self.gl, self.who, spec, key)
        assert isinstance(job, Job)
        if hold > 0 and job.state not in TERMINAL_STATES:  # ends early if the client leaves
            ended = await self.long_poll(self.gl.jobs.wait(job.id, hold))
            job = ended or job
        answer: Job | JobEnd = JobEnd.of(job) if end else job
        if replayed:
            self.reply(answer)
        else:
            self.created(answer, job.id)


class JobBatchHandler(GpulayerAPIHandler):
    """``POST jobs/batch``: several jobs in one request."""

    @allow_unauthenticated
    @requires("submitter")
    async def post(self) -> None:
        """Submit every spec of a ``JobBatch`` (all or none); 201 with the jobs. One
        ``Idempotency-Key`` covers the whole batch: a repeat answers its jobs (200)."""
        batch = self.parse(JobBatch)
        key = idempotency_key(self)
        got = await self.gl.jobs.submit_once(batch.jobs, self.who.name, self.who, key=key)
        self.reply(JobList(jobs=got.jobs), 200 if got.replayed else 201)


class JobsWaitHandler(GpulayerAPIHandler):
    """``POST jobs/wait``: long poll until any of several jobs ends."""

    @allow_unauthenticated
    @requires(*READ)
    async def post(self) -> None:
        """200 with the jobs that ended (small results included), or 204."""
        req = self.parse(WaitAny)
        timeout = min(req.timeout, self.limits.long_poll_seconds)
        jobs = await self.long_poll(self.gl.jobs.wait_any(req.ids, timeout, self.who))
        self.reply_or_204(None if jobs is None else JobList(jobs=jobs))


class JobHandler(GpulayerAPIHandler):
    """``GET jobs/{id}``; ``DELETE jobs/{id}``."""

    @allow_unauthenticated
    @requires(*READ)
    async def get(self, job_id: str) -> None:
        """One job with tasks and pending reasons."""
        self.reply(await self.gl.jobs.get(job_id, self.who))

    @allow_unauthenticated
    @requires("submitter")
    async def delete(self, job_id: str) -> None:
        """Delete a finished job (its owner or an admin) with its logs, metrics,
        artifacts and the blobs no other job names; 204, or 409 while it is active."""
        await self.gl.retention.delete(job_id, self.who)
        self.no_content()


class JobResultHandler(GpulayerAPIHandler):
    """``GET jobs/{id}/result``: a function job's pickled outcomes."""

    @allow_unauthenticated
    @requires(*READ)
    async def get(self, job_id: str) -> None:
        """The result bytes (unpickle them only if you trust the job's code)."""
        self.send_bytes(await self.gl.jobs.result(job_id, self.who))


class JobPartsHandler(GpulayerAPIHandler):
    """``GET jobs/{id}/parts``: outcomes of a function job's calls kept apart from its
    result (calls an attempt finished before its worker died)."""

    @allow_unauthenticated
    @requires(*READ)
    async def get(self, job_id: str) -> None:
        """The kept outcomes, by call index."""
        self.reply(await self.gl.jobs.parts(job_id, self.who))


class JobWaitHandler(GpulayerAPIHandler):
    """``GET jobs/{id}/wait?timeout=S``: long poll until the job ends."""

    @allow_unauthenticated
    @requires(*READ)
    async def get(self, job_id: str) -> None:
        """200 with the ended job, or 204 when the hold ran out."""
        await self.gl.jobs.visible(job_id, self.who)
        timeout = self.wait_arg("timeout", self.limits.long_poll_seconds)
        self.reply_or_204(await self.long_poll(self.gl.jobs.wait(job_id, timeout, self.who)))


class JobCancelHandler(GpulayerAPIHandler):
    """``POST jobs/{id}/cancel``."""

    @allow_unauthenticated
    @requires("submitter")
    async def post(self, job_id: str) -> None:
        """Cancel; 409 when the job already ended."""
        self.reply(await self.gl.jobs.cancel(job_id, by=self.who.name, viewer=self.who))


class JobInterruptHandler(GpulayerAPIHandler):
    """``POST jobs/{id}/interrupt``: SIGINT a cell's kernel (the notebook's stop button)."""

    @allow_unauthenticated
    @requires("submitter")
    async def post(self, job_id: str) -> None:
        """Interrupt; a cell not started yet is cancelled, 409 once it ended."""
        self.reply(await self.gl.jobs.interrupt(job_id, self.who.name, self.who))


class JobEventsHandler(GpulayerAPIHandler):
    """``GET jobs/{id}/events``."""

    @allow_unauthenticated
    @requires(*READ)
    async def get(self, job_id: str) -> None:
        """Every state change, oldest first."""
        self.reply(EventList(events=await self.gl.jobs.events(job_id, self.who)))


class JobLogsHandler(GpulayerAPIHandler):
    """``GET jobs/{id}/logs?offset=&limit=&wait=&attempt=``."""

    @allow_unauthenticated
    @requires(*READ)
    async def get(self, job_id: str) -> None:
        """Lines from ``offset``; with ``wait`` a long poll for the next ones; with
        ``attempt`` only that attempt's lines (offsets stay the job's)."""
        await self.gl.jobs.visible(job_id, self.who)
        offset = self.int_arg("offset", 0, 0, 2**62)
        limit = self.int_arg("limit", 1000, 1, 10000)
        wait = self.wait_arg()
        attempt = self.int_arg("attempt", 0, 1, 1_000_000) or None
        page = await self.long_poll(
            self.gl.jobs.logs(job_id, offset, limit, wait, self.who, attempt)
        )
        if page is not None:
            self.reply(page)


class JobArtifactsHandler(GpulayerAPIHandler):
    """``GET jobs/{id}/artifacts``."""

    @allow_unauthenticated
    @requires(*READ)
    async def get(self, job_id: str) -> None:
        """The job's artifacts."""
        self.reply(ArtifactList(artifacts=await self.gl.jobs.artifacts(job_id, self.who)))


class JobArtifactHandler(GpulayerAPIHandler):
    """``GET jobs/{id}/artifacts/{name}``: the file's bytes."""

    @allow_unauthenticated
    @requires(*READ)
    async def get(self, job_id: str, name: str) -> None:
        """Send the artifact as a download, a chunk at a time (memory bounded by the
        chunk), with its size and sha256 in the headers."""
        art = await self.gl.jobs.artifact(job_id, name, self.who)
        filename = quote(name.rsplit("/", 1)[-1])
        self.set_header("Content-Disposition", f"attachment; filename*=UTF-8''{filename}")
        self.set_header("X-Gpulayer-Sha256", art.sha256)
        self.set_header("Content-Type", "application/octet-stream")
        self.set_header("Content-Length", str(art.size))
        async for chunk in self.gl.blobs.chunks(art.sha256):
            self.write(chunk)
            await self.flush()
        self.finish()


class JobPlacementHandler(GpulayerAPIHandler):
    """``GET jobs/{id}/placement``: where it runs, or per worker why it waits."""

    @allow_unauthenticated
    @requires(*READ)
    async def get(self, job_id: str) -> None:
        """Answer ``Placement``."""
        self.reply(await self.gl.jobs.placement(job_id, self.who))


class BlobsHandler(GpulayerAPIHandler):
    """``POST blobs``: upload bytes (a source bundle); answers its sha256."""

    upload = True

    @property
    def max_body_bytes(self) -> int:
        """Blobs may be as large as an artifact."""
        return self.limits.max_blob_bytes

    @allow_unauthenticated
    @requires("submitter")
    async def post(self) -> None:
        """Store the body by content."""
        sha, size = await self.uploaded.commit()
        await self.gl.jobs.uploaded(sha, self.who)
        self.created(BlobRef(sha256=sha, size=size), sha)


_ID = r"(?P<{}>[^/]+)"
JOB = _ID.format("job_id")

ROUTES: list[tuple[str, type[GpulayerAPIHandler]]] = [
    (r"jobs", JobsHandler),
    (r"jobs/batch", JobBatchHandler),
    (r"jobs/wait", JobsWaitHandler),
    (rf"jobs/{JOB}", JobHandler),
    (rf"jobs/{JOB}/result", JobResultHandler),
    (rf"jobs/{JOB}/parts", JobPartsHandler),
    (rf"jobs/{JOB}/wait", JobWaitHandler),
    (rf"jobs/{JOB}/cancel", JobCancelHandler),
    (rf"jobs/{JOB}/interrupt", JobInterruptHandler),
    (rf"jobs/{JOB}/events", JobEventsHandler),
    (rf"jobs/{JOB}/logs", JobLogsHandler),
    (rf"jobs/{JOB}/artifacts", JobArtifactsHandler),
    (rf"jobs/{JOB}/artifacts/(?P<name>.+)", JobArtifactHandler),
    (rf"jobs/{JOB}/placement", JobPlacementHandler),
    (r"blobs", BlobsHandler),
]
