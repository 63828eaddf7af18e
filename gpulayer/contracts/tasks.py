"""The task hand-off between control plane and worker: assignments, gangs, completion."""

from typing import Annotated, Literal

from pydantic import Field, SecretStr, StringConstraints, field_serializer

from .base import API_VERSION, BASE64_BYTES, INLINE_BYTES, DocumentModel, RequestModel, Sha256
from .environments import TaskEnvironment
from .jobs import JobSpec
from .logs import LogBatch


class Gang(DocumentModel):
    """Where one node of a distributed job stands in its gang: a static rendezvous
    on the rank-0 node (``master_addr:master_port``)."""

    node_rank: int
    nnodes: int
    nproc_per_node: int
    master_addr: str
    master_port: int

    @property
    def world_size(self) -> int:
        """Processes in all."""
        return self.nnodes * self.nproc_per_node


class Assignment(DocumentModel):
    """A task handed to a worker."""

    task_id: str
    job_id: str
    attempt: int
    spec: JobSpec
    gpu_indices: list[int] = []
    gang: Gang | None = Field(default=None, description="distributed jobs: the rendezvous")
    api_token: str | None = Field(
        default=None,
        description="api_access jobs: the task's own token (its owner's, role submitter),"
        " revoked when the task ends",
    )
    owner: str = Field(
        default="",
        description="the job's owner: a worker keeps function runners and session kernels"
        " per owner, never shared",
    )
    done_calls: list[int] = Field(
        default=[],
        description="function tasks: the calls an earlier attempt finished (their outcomes"
        " are kept as result parts); the worker does not make them again",
    )

    secrets: dict[str, SecretStr] = Field(
        default={},
        description="the values of the secrets the job names, by name: for this task's"
        " environment only (repr never shows them)",
    )

    @field_serializer("secrets", when_used="json")
    def _reveal(self, secrets: dict[str, SecretStr]) -> dict[str, str]:
        return {k: v.get_secret_value() for k, v in secrets.items()}

    def secret_env(self) -> dict[str, str]:
        """The secrets as environment variables."""
        return {k: v.get_secret_value() for k, v in self.secrets.items()}


class Acquired(DocumentModel):
    """New assignments and cancel requests for one worker."""

    api_version: str = API_VERSION
    assignments: list[Assignment] = []
    cancel: list[str] = Field(default=[], description="task ids to stop")
    interrupt: list[str] = Field(default=[], description="cell task ids whose kernel gets SIGINT")
    seq: int = Field(
        default=0,
        description="increases with every answer (microseconds of the control plane's clock"
        " when its tasks started); the worker echoes the newest in Heartbeat.acquired_seq",
    )


class TaskCompletion(RequestModel):
    """How a task ended, as the worker saw it (``lost``: the worker gave it up,
    e.g. while shutting down; it is retried like a task of a vanished worker)."""

    model_config = BASE64_BYTES

    state: Literal["succeeded", "failed", "cancelled", "timed_out", "lost"]
    exit_code: int | None = None
    reason: Annotated[str, StringConstraints(max_length=4096)] | None = None
    result: bytes | None = Field(
        default=None, max_length=INLINE_BYTES, description="a function task's outcomes, inline"
    )
    result_blob: Sha256 | None = Field(
        default=None, description="a function task's outcomes, PUT to tasks/{id}/result first"
    )
    retry: bool = Field(default=True, description="false: a failure that retrying cannot change")
    environment: TaskEnvironment | None = Field(
        default=None,
        description="its Python env, when not reported before (a function's cache hit"
        " rides the completion: no extra round trip)",
    )
    logs: LogBatch | None = Field(
        default=None,
        # Left out of the body when there are none, so a control plane that does not
        # know the field still takes every completion that carries no lines.
        exclude_if=lambda v: v is None,
        description="the task's last log lines, not sent before: stored (as a logs"
        " batch would be) before the task's end, in one round trip",
    )


class CreateResultPart(RequestModel):
    """One call's outcome of a function task, shipped as soon as the call finished."""

    model_config = BASE64_BYTES

    index: int = Field(ge=0, description="the call's position in the task's payload")
    outcome: bytes = Field(
        max_length=INLINE_BYTES, description="an ``outcomes`` payload of that one call"
    )


class ResultPartBatch(RequestModel):
    """Calls of one function task that finished since the last batch
    (``POST tasks/{id}/parts``); a part sent twice is kept once."""

    model_config = BASE64_BYTES

    parts: list[CreateResultPart] = Field(max_length=1000)


class ResultPart(DocumentModel):
    """A call's outcome kept apart from its job's result: what an attempt that did not
    deliver a result (its worker died) had finished."""

    model_config = BASE64_BYTES

    index: int
    attempt: int
    outcome: bytes


class ResultPartList(DocumentModel):
    """``GET jobs/{id}/parts``: the kept outcomes of a function job's calls, by index."""

    model_config = BASE64_BYTES

    api_version: str = API_VERSION
    parts: list[ResultPart]
