"""Cells: run notebook code in a remote kernel and follow its Jupyter messages.

This is the service behind ``%%gpulayer`` (the magic only parses options and
renders); it imports no IPython, so scripts and benchmarks use it directly::

    run = cells.submit(conn, "print(1)", session="s")
    for msg in run.messages():        # KernelMessage objects, live, in order
        ...
    run.result()                      # the job, or raise the remote error

A cell job's output is its ``iopub`` log lines (docs/adr/0040): each holds the
JSON of a :class:`~gpulayer.contracts.KernelMessage` (long ones span several
lines, joined by :class:`MessageDecoder`), and the last is gpulayer's
``execute_reply``. Following a cell is following its logs: one long poll per
burst of output.
"""

import contextlib
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError as PydanticValidationError

from gpulayer import contracts, errors, variables
from gpulayer.client import specs
from gpulayer.client.connection import LONG_POLL_SECONDS, Connection
from gpulayer.client.jobs import failure_of
from gpulayer.client.pending import POLL_SECONDS, PendingNotes

if TYPE_CHECKING:
    from gpulayer.client.environments import Env

_INTERRUPT_WAIT_SECONDS = 10.0  # after an interrupt, how long the remote KeyboardInterrupt may take
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class MessageDecoder:
    """Joins a job's ``iopub`` lines back into :class:`~gpulayer.contracts.KernelMessage`."""

    def __init__(self) -> None:
        self._parts: list[str] = []

    def feed(self, text: str) -> contracts.KernelMessage | None:
        """The message that ``text`` completes, or None (a fragment, or not a message)."""
        if text.startswith(contracts.FRAGMENT):
            self._parts.append(text[len(contracts.FRAGMENT) :])
            return None
        whole = "".join(self._parts) + text
        self._parts.clear()
        try:
            return contracts.KernelMessage.model_validate_json(whole)
        except PydanticValidationError:
            return None


def plain_text(msg: contracts.KernelMessage) -> str | None:
    """What a terminal shows for a relayed message (None: nothing)."""
    c = msg.content
    if msg.msg_type == "stream":
        return str(c.get("text", "")).rstrip("\n")
    if msg.msg_type in ("display_data", "update_display_data", "execute_result"):
        data = c.get("data") or {}
        if "text/plain" in data:
            return str(data["text/plain"])
        kinds = ", ".join(sorted(data)) or "nothing"
        return f"[{msg.msg_type}: {kinds}]"
    if msg.msg_type == "error":
        return "\n".join(strip_ansi(t) for t in c.get("traceback") or [c.get("evalue", "")])
    return None


def strip_ansi(text: str) -> str:
    """``text`` without terminal colour codes (remote tracebacks carry them)."""
    return _ANSI.sub("", text)


def log_text(line: contracts.LogLine, decoder: MessageDecoder) -> str | None:
    """How ``gpulayer logs`` prints a line: relayed messages as their plain text."""
    if line.stream != contracts.LogStream.iopub:
        return line.text
    msg = decoder.feed(line.text)
    return None if msg is None else plain_text(msg)


# ----------------------------------------------------------------- sessions


def ensure_session(
    conn: Connection,
    name: str,
    *,
    idle_timeout: str | float | None = None,
    api_access: bool = False,
    secrets: Sequence[str] = (),
    environment: "Env | None" = None,
    **resources: Any,
) -> contracts.Session:
    """The session ``name``, started with ``resources`` when it does not exist yet
    (``api_access``: its kernel may call gpulayer, see ``JobSpec.api_access``;
    ``secrets``: the kernel gets them in its environment; ``environment``: the Python
    env its kernel, and so every cell, runs in).

    Raises
    ------
    ValidationError
        When the session runs already without one of ``secrets`` (a kernel's
        environment is set when it starts).
    """
    try:
        return _with_secrets(conn.session(name), secrets)
    except errors.NotFound:
        pass
    specs.check(resources, specs.RESOURCE_OPTIONS, "a session")
    req = specs.validated(
        contracts.CreateSession,
        name=name,
        resources=specs.resources(resources),
        idle_timeout=idle_timeout,
        api_access=api_access,
        secrets=list(secrets),
        environment=None if environment is None else environment.spec(conn),
    )
    try:
        return conn.create_session(req)
    except errors.Conflict:  # someone started it in between
        return _with_secrets(conn.session(name), secrets)


def _with_secrets(session: contracts.Session, secrets: Sequence[str]) -> contracts.Session:
    """``session`` if its kernel has every one of ``secrets``."""
    if missing := [n for n in secrets if n not in session.secrets]:
        raise errors.ValidationError(
            f"session {session.name!r} runs without secret {missing[0]}; its kernel's"
            f" environment was set when it started: end it (%gpulayer end {session.name})"
            " and start it again with --secret",
            field="secrets",
        )
    return session


# -------------------------------------------------------------------- cells


def cell_spec(
    conn: Connection,
    source: str,
    *,
    session: str | None = None,
    push: Mapping[str, Any] | None = None,
    pull: Sequence[str] = (),
    timeout: str | float | None = None,
    name: str | None = None,
    api_access: bool = False,
    queue_timeout: str | float | None = None,
    secrets: Sequence[str] = (),
    environment: "Env | None" = None,
    **resources: Any,
) -> contracts.JobSpec:
    """The job of one cell; pushed variables go inline when small, else as a blob
    (``api_access``: a cell in a fresh kernel may call gpulayer; in a session, the
    session's own ``api_access`` decides).

    Raises
    ------
    PayloadError
        If a pushed variable cannot be pickled (the message names it).
    ValidationError
        For a malformed option.
    """
    cell: dict[str, Any] = {"source": source, "session": session, "pull": list(pull)}
    if push:
        data = variables.pack(push, list(push), where="here")
        if len(data) <= contracts.INLINE_BYTES:
            cell["push"] = data
        else:
            cell["push_blob"] = conn.upload_blob(data).sha256
    specs.check(resources, specs.RESOURCE_OPTIONS, "a cell")
    return specs.validated(
        contracts.JobSpec,
        kind="cell",
        name=name,
        cell=cell,
        timeout=timeout,
        queue_timeout=queue_timeout,
        api_access=api_access,
        # In a session the kernel has the session's secrets (ensure_session checks).
        secrets=list(secrets) if session is None else [],
        resources=specs.resources(resources) if session is None else {},
        environment=None if environment is None else environment.spec(conn),
    )


def submit(conn: Connection, source: str, **options: Any) -> "RemoteCell":
    """Submit a cell (see :func:`cell_spec` for the options); answers its :class:`RemoteCell`."""
    return RemoteCell(conn, conn.submit(cell_spec(conn, source, **options)))


class RemoteCell:
    """A submitted cell: follow its messages, interrupt it, get its outcome."""

    def __init__(self, conn: Connection, info: contracts.Job) -> None:
        self.connection = conn
        self.info = info
        self.reply: dict[str, Any] | None = None  # the kernel's execute_reply, once seen
        self.error: contracts.KernelMessage | None = None
        self.offset = 0
        self._decoder = MessageDecoder()
        self._interrupted = False
        self._interrupted_at = 0.0
        self._started = False  # placed or printing: holds may be long

    @property
    def id(self) -> str:
        """The cell's job id."""
        return self.info.id

    def messages(
        self, on_line: Callable[[contracts.LogLine], None] | None = None
    ) -> Iterator[contracts.KernelMessage]:
        """Yield the cell's relayed messages as they arrive, until its reply (or its end).

        ``on_line`` gets the job's other lines (gpulayer's own ``system`` lines).
        It rides through a control-plane restart from its offset (no message
        twice, none missed). Calling it again after an interruption goes on where
        it stopped; after :meth:`interrupt` it follows a few seconds more, so the
        remote ``KeyboardInterrupt`` shows.
        """
        notes = PendingNotes()
        self._explain(self.info, notes, on_line)  # unsatisfiable: said before any wait
        while self.reply is None:
            page = self.connection.logs(self.id, self.offset, wait=self._hold(), retry=True)
            for line in page.lines:
                if line.offset < self.offset:
                    continue
                self.offset = line.offset + 1
                self._started = True
                if line.stream != contracts.LogStream.iopub:
                    if on_line is not None:
                        on_line(line)
                    continue
                msg = self._decoder.feed(line.text)
                if msg is None:
                    continue
                if msg.msg_type == "execute_reply":
                    self.reply = msg.content
                    break
                if msg.msg_type == "error":
                    self.error = msg
                yield msg
            self.offset = max(self.offset, page.next_offset)
            if page.complete:
                break
            if self._interrupted and time.monotonic() > self._interrupted_at + (
                _INTERRUPT_WAIT_SECONDS
            ):
                break
            if not self._started and not page.lines:
                self._explain(self.connection.job(self.id, retry=True), notes, on_line)

    def _hold(self) -> float:
        # Short holds until the cell starts, so why it waits is said within ~2 s.
        return LONG_POLL_SECONDS if self._started and not self._interrupted else POLL_SECONDS

    def _explain(
        self,
        info: contracts.Job,
        notes: PendingNotes,
        on_line: Callable[[contracts.LogLine], None] | None,
    ) -> None:
        """Say why the cell waits (a session starting, GPUs busy, no such GPU), when
        there is something new to say; note when it is no longer queued."""
        if info.state != contracts.JobState.queued:
            self._started = True
        text = notes.note(info)
        if text is not None and on_line is not None:
            on_line(
                contracts.LogLine(
                    offset=-1, stream=contracts.LogStream.system, ts=info.updated_at,
                    text=text, rank=None,
                )
            )  # fmt: skip

    @property
    def interrupted(self) -> bool:
        """Whether :meth:`interrupt` was called."""
        return self._interrupted

    def interrupt(self) -> None:
        """Interrupt the remote cell; a second call cancels it and raises KeyboardInterrupt."""
        if self._interrupted:
            with _ended_ok():
                self.connection.cancel(self.id)
            raise KeyboardInterrupt
        self._interrupted = True
        self._interrupted_at = time.monotonic()
        with _ended_ok():
            self.connection.interrupt(self.id)

    def wait(self) -> contracts.Job:
        """The job once it ended."""
        self.info = self.connection.wait(self.id)
        return self.info

    def result(self) -> dict[str, Any]:
        """The pulled variables (``{}`` without ``pull``), once the cell succeeded.

        Raises
        ------
        RemoteError
            The cell raised: carries the remote traceback, the worker and the job.
        JobFailed
            It timed out, was cancelled or lost, or its kernel died.
        """
        ok = self.reply is not None and self.reply.get("status") == "ok"
        if ok and (not self.info.spec.cell or not self.info.spec.cell.pull):
            return {}
        info = self.wait()
        if self.error is not None and info.state != contracts.JobState.succeeded:
            raise remote_error(self.error, info)
        if info.state != contracts.JobState.succeeded:
            raise failure_of(info)
        data = info.result
        if data is None and info.result_size:
            data = self.connection.result(info.id)
        return variables.unpack(data) if data else {}


def remote_error(msg: contracts.KernelMessage, info: contracts.Job) -> errors.RemoteError:
    """The local exception for a relayed ``error``: the remote traceback, marked
    with the job and worker (IPython shows it as the cell's error)."""
    c = msg.content
    return errors.RemoteError(
        str(c.get("evalue", "")),
        remote_type=str(c.get("ename", "Error")),
        remote_traceback="\n".join(c.get("traceback") or []),
        job_id=info.id,
        worker=info.worker_name,
    )


def _ended_ok() -> contextlib.suppress:
    """Ignore 'it already ended' around an interrupt or cancel."""
    return contextlib.suppress(errors.InvalidTransition)
