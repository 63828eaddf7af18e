"""Jobs: :func:`submit` and the :class:`Job` handle it returns, which users hold on to."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, Self, Unpack, overload

from gpulayer import contracts, errors, transfer
from gpulayer.client import pending, specs
from gpulayer.client.connection import Connection
from gpulayer.client.default import current_connection
from gpulayer.client.logs import stored_lines, with_attempt_marks
from gpulayer.notebook.progress import ProgressOption, transfer_progress


class Job:
    """A handle on a submitted job.

    ``state`` is the last state seen; ``status`` asks the control plane again.

    Examples
    --------
    >>> job = gl.submit("nvidia-smi", gpus=1)
    >>> job.wait().state
    'succeeded'
    >>> print("\\n".join(job.logs()))
    """

    def __init__(self, conn: Connection, info: contracts.Job) -> None:
        self.connection = conn
        self.info = info

    @property
    def id(self) -> str:
        """The job id."""
        return self.info.id

    @property
    def name(self) -> str:
        """The job's name, or its id when it has none."""
        return self.info.name

    @property
    def state(self) -> contracts.JobState:
        """The state last seen (no request; see :attr:`status`)."""
        return self.info.state

    @property
    def status(self) -> str:
        """The current state, fetched from the control plane."""
        return str(self.refresh().state)

    @property
    def exit_code(self) -> int | None:
        """The exit code of the last attempt, once it ended."""
        return self.info.exit_code

    @property
    def artifacts(self) -> list[contracts.Artifact]:
        """The files the job kept."""
        return self.connection.artifacts(self.id)

    def refresh(self) -> Self:
        """Fetch the job again; returns self."""
        self.info = self.connection.job(self.id)
        return self

    def wait(self, timeout: float | None = None, raise_on_failure: bool = False) -> Self:
        """Block until the job ends; returns self.

        Parameters
        ----------
        timeout
            Seconds to wait at most (None: no limit).
        raise_on_failure
            Raise :class:`~gpulayer.errors.JobFailed` unless the job succeeded.

        While the job is queued, why it waits is said on stderr (``[gpulayer] job
        ID cannot start: ...`` at once when no worker could ever run it, else after
        about two seconds, and again when the reason changes).

        Raises
        ------
        TimeoutError
            If the job has not ended within ``timeout`` (the message says why).
        JobFailed
            With ``raise_on_failure``, when it failed, timed out, was lost or cancelled.
        """
        self.info = pending.wait_explained(self.connection, self.info, timeout)
        if raise_on_failure and self.info.state != contracts.JobState.succeeded:
            raise self.failure()
        return self

    def failure(self) -> errors.JobFailed:
        """The :class:`~gpulayer.errors.JobFailed` describing how the job ended."""
        return failure_of(self.info)

    @overload
    def logs(self, follow: Literal[False] = False, *, attempt: int | None = None) -> list[str]: ...
    @overload
    def logs(
        self, follow: Literal[True], *, attempt: int | None = None
    ) -> Iterator[contracts.LogLine]: ...
    def logs(
        self, follow: bool = False, *, attempt: int | None = None
    ) -> list[str] | Iterator[contracts.LogLine]:
        """The job's output.

        Parameters
        ----------
        follow
            Follow the output until the job ends (riding through control-plane
            restarts).
        attempt
            Only the lines of this attempt (1 is the first). Without it every
            attempt's lines come in order, a marker line before each retry's
            (``── attempt 2 on local-2 (attempt 1 lost: ...)``).

        Returns
        -------
        list of str or iterator of LogLine
            Without ``follow``, the text of every line stored so far. With
            ``follow``, an iterator of :class:`~gpulayer.contracts.LogLine` that
            yields lines as they arrive and ends when the job has ended.
        """
        conn = self.connection
        if follow:
            lines: Iterator[contracts.LogLine] = conn.follow_logs(self.id, attempt=attempt)
        else:
            lines = stored_lines(conn, self.id, attempt=attempt)
        if attempt is None:
            lines = with_attempt_marks(conn, self.id, lines)
        return lines if follow else [line.text for line in lines]

    def metrics(self, after: int = 0) -> list[contracts.StoredMetricPoint]:
        """The training metric points stored so far (``{"train/loss": ...}`` per
        log point of a :class:`gpulayer.pytorch.Trainer` run), oldest first, from
        after point ``after`` on (its ``seq``)."""
        points: list[contracts.StoredMetricPoint] = []
        while True:
            page = self.connection.training_metrics(self.id, after)
            points.extend(page.points)
            if not page.points:
                return points
            after = page.next_after

    def cancel(self) -> Self:
        """Ask the control plane to cancel the job; returns self."""
        self.info = self.connection.cancel(self.id)
        return self

    def delete(self) -> None:
        """Delete the finished job on the control plane, with its logs, metrics and
        artifacts (raises ``Conflict`` while it is queued or running)."""
        self.connection.delete_job(self.id)

    def download(
        self,
        dest: str | os.PathLike[str] = ".",
        names: Sequence[str] | None = None,
        *,
        progress: ProgressOption = None,
    ) -> list[Path]:
        """Download the job's artifacts (or only ``names``) below ``dest``, each checked
        against its sha256.

        ``progress``: a bar of the bytes over all of them where someone watches (a
        notebook or a terminal) by default; ``True`` always, ``False`` never, or a
        ``progress(done_bytes, total_bytes)`` callback of your own."""
        with transfer_progress(progress, f"downloading job {self.id}'s artifacts") as shown:
            return self.connection.download(self.id, dest, names, progress=shown)

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict[str, Any]:
        """A live :class:`~gpulayer.notebook.widgets.JobMonitor` in a notebook, a summary
        elsewhere."""
        from gpulayer.notebook import render  # IPython only where a display asks for it

        return render.job_bundle(self, include, exclude)

    def __repr__(self) -> str:
        short = self.id if len(self.id) <= 8 else self.id[:6] + "…"
        parts = [f"<Job {short}", str(self.info.state)]
        if self.info.exit_code is not None:
            parts.append(f"exit={self.info.exit_code}")
        if self.info.worker_name:
            parts.append(f"worker={self.info.worker_name}")
        return " ".join(parts) + ">"


def failure_of(info: contracts.Job | contracts.JobEnd) -> errors.JobFailed:
    """The :class:`~gpulayer.errors.JobFailed` describing how a job ended."""
    code = "" if info.exit_code is None else f" (exit {info.exit_code})"
    reason = f": {info.reason}" if info.reason else ""
    return errors.JobFailed(
        f"job {info.id} {info.state}{code}{reason}",
        job_id=info.id,
        state=str(info.state),
        reason=info.reason,
        exit_code=info.exit_code,
        worker=info.worker_name,
    )


def submit(
    command: str | Sequence[str],
    *,
    workdir: str | os.PathLike[str] | None = None,
    connection: Connection | None = None,
    progress: ProgressOption = None,
    **options: Unpack[specs.JobOptions],
) -> Job:
    """Submit a command to run on a worker (or, with ``nodes``/``nproc_per_node``,
    a distributed job: one task per node, started together by torchrun).

    Parameters
    ----------
    command
        A string runs with ``/bin/sh -c``; a sequence is an argv run without a shell.
    gpus, cpus, memory
        What one task needs (default 0 GPUs, 1 CPU); ``memory`` like ``"8GiB"`` or
        a number of bytes.
    gpu_memory, gpu_model, accelerator, min_compute_capability, gpu_memory_kind
        What each reserved GPU must be: ``"40GiB"``, a name pattern like
        ``"A100|H100"``, ``"cuda"``/``"rocm"``/``"mps"``/``"cpu"``, ``"8.0"``,
        ``"dedicated"``/``"unified"``.
    selector, worker
        Worker labels that must match, or one worker by name.
    profile
        A shorthand such as ``"pytorch-cuda"`` (see ``contracts.PROFILES``);
        explicit options win over it.
    timeout
        Seconds or a string like ``"10m"``; the job is ``timed_out`` after it.
    queue_timeout
        The longest wait for a worker (``"10m"``); a job still queued then ends
        ``timed_out``, its ``reason`` saying why it waited (default: no limit).
    retries
        Extra attempts after a failure or a lost worker (default 0).
    name, labels, priority
        How the job is listed and ordered (default priority 0).
    env
        Extra environment variables for the process (their values are shown only to
        you and admins).
    secrets
        Names of your secrets (``gpulayer secret set NAME``) the process gets as
        environment variables of those names; their values never appear in a read,
        and printed ones show as ``***`` in the log (``docs/secrets.md``).
    pip, requirements, environment
        The job's Python environment (docs/environments.md): requirements, a
        requirements file, or a reusable :class:`gpulayer.Env` (the two first add to
        it). Built on the worker with uv, cached, layered on the worker's packages
        unless ``Env(isolated=True)``.
    workdir
        A local directory packed, uploaded and unpacked as the task's cwd. It is
        packed into a temporary file (memory bounded) and refused, naming its
        biggest files, as soon as the bundle passes 256 MiB
        (``GPULAYER_MAX_WORKDIR_BYTES``).
    progress
        With ``workdir``: a bar while it is packed and one while it is uploaded,
        where someone watches (a notebook or a terminal) by default; ``True``
        always, ``False`` never, or a ``progress(done_bytes, total_bytes)`` callback
        of your own, told while it is packed (``total_bytes`` None) and uploaded.
    nodes, nproc_per_node, launcher
        A distributed job: ``nodes`` tasks on distinct workers (the resources are
        per node), placed all at once, each running ``nproc_per_node`` processes
        with a static rendezvous on node 0; ``launcher`` ``"torchrun"`` (default)
        or ``"direct"`` (gpulayer starts the ranks itself). See docs/distributed.md.
    connection
        Defaults to :func:`~gpulayer.client.default.current_connection`.

    Notes
    -----
    The options are those of :mod:`gpulayer.client.specs` (the ``Resources`` and
    ``JobSpec`` fields).

    Returns
    -------
    Job
        The handle, state ``queued``.

    Raises
    ------
    ValidationError
        Before anything is sent, when an option is malformed; ``field`` names it.
    TypeError
        For an unknown option, or a ``command`` that is neither a string nor a
        sequence of strings.

    Examples
    --------
    >>> job = gl.submit(["python", "train.py"], gpus=1, timeout="2h", workdir=".")
    """
    if not isinstance(command, str) and (
        not isinstance(command, Sequence) or isinstance(command, bytes | bytearray)
    ):
        raise TypeError(
            "gl.submit takes the command as a string (run with /bin/sh -c) or a list of"
            f' strings (an argv, e.g. ["python", "train.py"]), not a {type(command).__name__};'
            " to run a Python function remotely use @gl.remote"
        )
    specs.check(options, _SUBMIT_OPTIONS, "gl.submit")
    program = {"shell": command} if isinstance(command, str) else {"command": list(command)}
    spec = specs.job_spec(options, **program)
    conn = connection if connection is not None else current_connection()
    spec = specs.with_environment(spec, options, conn)
    if workdir is not None:
        ref = _upload_workdir(conn, workdir, progress)
        spec = spec.model_copy(update={"bundle": ref.sha256})
    return Job(conn, conn.submit(spec))


def _upload_workdir(
    conn: Connection, workdir: str | os.PathLike[str], progress: ProgressOption
) -> contracts.BlobRef:
    """Pack ``workdir`` and upload it, each step with its own bar (see :func:`submit`)."""
    where = os.fspath(workdir)
    with contextlib.ExitStack() as keep:  # the packed file lives until it is sent
        with transfer_progress(progress, f"packing {where}") as packing:
            packed = keep.enter_context(transfer.pack_workdir(workdir, progress=packing))
        with transfer_progress(progress, f"uploading {where}") as sending:
            return conn.upload_file(packed.path, packed.digest, progress=sending)


_SUBMIT_OPTIONS = (
    *specs.RESOURCE_OPTIONS, *specs.JOB_OPTIONS, *specs.GANG_OPTIONS, *specs.ENV_OPTIONS,
)  # fmt: skip
