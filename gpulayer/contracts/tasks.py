"""The task hand-off between control plane and worker: assignments, gangs, completion."""

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from .base import API_VERSION, BASE64_BYTES, INLINE_BYTES, DocumentModel, RequestModel, Sha256
from .environments import TaskEnvironment
from .jobs import JobSpec


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
