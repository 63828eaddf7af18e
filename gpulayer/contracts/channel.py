"""The live channel: frames of the WebSocket between a client or worker and the
control plane (docs/channel.md, docs/adr/0111).

The channel carries the REST protocol of ``docs/api.md``, not a second one: a
:class:`ChannelCall` names a route's method and path with its query, its
``Idempotency-Key`` and its JSON body, and the :class:`ChannelAnswer` with the
same ``id`` carries the status and JSON body the HTTP route would have answered
(an ``ErrorBody`` for an error). Calls on one channel run side by side; a call
that waits (a job wait, a log follow, a submit with ``wait``) is answered the
moment there is something, over the open socket: that is the push. The control
plane also pushes, unasked, a :class:`ChannelPush` to a worker: its assignments,
cancels and interrupts (an ``Acquired``), the moment placement stores them.

Every frame is one JSON text message.
"""

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from .base import DocumentModel, RequestModel
from .tasks import Acquired

#: The client's channel, relative to the API prefix (a bearer token of any role).
CLIENT_CHANNEL_PATH = "channel"
#: A worker's channel, relative to the API prefix (its own worker token).
WORKER_CHANNEL_PATH = "workers/{worker_id}/channel"

#: A gpulayer kernel's relay (docs/kernels.md, docs/adr/0125): the Jupyter server's
#: end, relative to the API prefix (a bearer token of the kernel job's owner) ...
KERNEL_CHANNEL_PATH = "kernels/{job_id}/channel"
#: ... and the worker's end (its own worker token; the kernel's task runs there).
WORKER_KERNEL_CHANNEL_PATH = "workers/{worker_id}/kernels/{job_id}/channel"
#: The text frame the control plane sends a kernel's client once the worker's end is
#: attached: from now on frames reach the kernel.
KERNEL_READY = "ready"

#: Close code of a kernel relay: the kernel's job ended (shut down, cancelled, idle).
CLOSE_KERNEL_ENDED = 4200
#: Close code of a kernel relay: the kernel died (or its worker was lost).
CLOSE_KERNEL_DIED = 4500
#: Close code of a kernel relay: another client attached to the kernel.
CLOSE_REPLACED = 4409

#: Close code: the channel's token was revoked or expired (the HTTP routes answer 401).
CLOSE_UNAUTHORIZED = 4401
#: Close code: the peer fell behind (too much unsent); it reconnects and resumes from
#: its offsets (log offsets, ``Acquired.seq``, idempotency keys), nothing is lost.
CLOSE_RESYNC = 4408
#: Close code: the control plane is stopping.
CLOSE_GOING_AWAY = 1001

#: Whether a client or worker opens the channel: ``auto`` (a WebSocket, else HTTP long
#: polls) or ``http`` (long polls only); set by this environment variable, or
#: ``Connection(channel=...)`` and ``gpulayer join --channel``.
CHANNEL_MODES = ("auto", "http")
CHANNEL_ENV = "GPULAYER_CHANNEL"

Method = Literal["GET", "POST"]
_Path = Annotated[str, StringConstraints(min_length=1, max_length=1024)]


class ChannelCall(RequestModel):
    """One request over the channel: a route of ``docs/api.md`` (those the channel
    carries are listed in docs/channel.md), answered by a :class:`ChannelAnswer`."""

    type: Literal["call"] = "call"
    id: int = Field(ge=0, description="chosen by the caller; its answer carries it back")
    method: Method
    path: _Path = Field(description="relative to the API prefix, e.g. jobs/abc/wait")
    query: dict[str, str] = Field(default={}, max_length=16)
    idempotency_key: str | None = Field(default=None, max_length=200)
    body: str | None = Field(default=None, description="the route's JSON body, as text")


class ChannelAnswer(DocumentModel):
    """The answer to the :class:`ChannelCall` with the same ``id``."""

    type: Literal["answer"] = "answer"
    id: int
    status: int = Field(description="the status the HTTP route would answer (204: none)")
    body: str = Field(default="", description="its JSON body (an ErrorBody on an error)")


class ChannelPush(DocumentModel):
    """Sent unasked: a worker's new assignments, cancels and interrupts."""

    type: Literal["push"] = "push"
    acquired: Acquired


#: The routes a client's channel carries: ``(method, path pattern)`` relative to the
#: API prefix, matched whole. Every other route (uploads, downloads, admin) stays
#: HTTP. Both sides read this one list.
CLIENT_CALLS: tuple[tuple[Method, str], ...] = (
    ("POST", r"jobs"),
    ("POST", r"jobs/batch"),
    ("POST", r"jobs/wait"),
    ("GET", r"jobs/(?P<job_id>[^/]+)"),
    ("GET", r"jobs/(?P<job_id>[^/]+)/wait"),
    ("GET", r"jobs/(?P<job_id>[^/]+)/logs"),
    ("POST", r"jobs/(?P<job_id>[^/]+)/cancel"),
    ("POST", r"jobs/(?P<job_id>[^/]+)/interrupt"),
    ("GET", r"sessions/(?P<name>[^/]+)"),
)
#: The routes a worker's channel carries (its heartbeats, registrations, uploads and
#: downloads stay HTTP).
WORKER_CALLS: tuple[tuple[Method, str], ...] = (
    ("POST", r"tasks/(?P<task_id>[^/]+)/logs"),
    ("POST", r"tasks/(?P<task_id>[^/]+)/complete"),
)
