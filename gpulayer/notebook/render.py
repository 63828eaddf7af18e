"""How things show in a notebook: a remote cell's relayed messages as the remote kernel
showed them, and the rich reprs of :class:`~gpulayer.Job` and :class:`~gpulayer.Connection`
(the widget in a notebook, a plain-text summary anywhere else)."""

import html
import sys
from typing import Any

import ipywidgets as w
from IPython.display import clear_output, publish_display_data

from gpulayer import contracts, errors
from gpulayer.client import Connection, Job
from gpulayer.client.cells import RemoteCell
from gpulayer.notebook.progress import in_notebook
from gpulayer.notebook.widgets import JobMonitor, WorkersTable


class RemoteResult:
    """The remote cell's last value, shown as the local cell's ``Out[]``."""

    def __init__(self, data: dict[str, Any], metadata: dict[str, Any]) -> None:
        self.data = data
        self.metadata = metadata

    def __repr__(self) -> str:
        return str(self.data.get("text/plain", "<remote result>"))

    def _repr_mimebundle_(
        self, include: Any = None, exclude: Any = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        return self.data, self.metadata


class Renderer:
    """Shows relayed messages in this kernel the way the remote kernel showed them."""

    def __init__(self) -> None:
        self.result: RemoteResult | None = None

    def __call__(self, msg: contracts.KernelMessage) -> None:
        c = msg.content
        kind = msg.msg_type
        if kind == "stream":
            out = sys.stderr if c.get("name") == "stderr" else sys.stdout
            out.write(str(c.get("text", "")))
            out.flush()  # the kernel's own stream batches; live output should not wait
        elif kind in ("display_data", "update_display_data"):
            publish_display_data(
                c.get("data", {}),
                c.get("metadata") or {},
                transient=msg.transient or None,
                **({"update": True} if kind == "update_display_data" else {}),
            )
        elif kind == "execute_result":
            self.result = RemoteResult(c.get("data", {}), c.get("metadata") or {})
        elif kind == "clear_output":
            clear_output(wait=bool(c.get("wait", False)))

    @staticmethod
    def line(line: contracts.LogLine) -> None:
        """gpulayer's own lines (a session starting, why a cell waits) go to stderr."""
        print(f"[gpulayer] {line.text}", file=sys.stderr, flush=True)


def follow(run: RemoteCell, renderer: Renderer) -> None:
    """Render a cell's messages until it is done; the first Ctrl-C interrupts the
    remote cell (its traceback still shows), the second cancels it."""
    while True:
        try:
            for msg in run.messages(on_line=renderer.line):
                renderer(msg)
            break
        except KeyboardInterrupt:
            run.interrupt()  # raises KeyboardInterrupt the second time
    if run.interrupted:
        raise KeyboardInterrupt


def job_bundle(job: Job, include: Any = None, exclude: Any = None) -> dict[str, Any]:
    """``Job._repr_mimebundle_``: a following monitor in a notebook, text elsewhere."""
    text = job_summary(job.info)
    if not in_notebook():
        return {"text/plain": text}
    bundle = JobMonitor(job, follow=True)._repr_mimebundle_()
    return {**(bundle or {}), "text/plain": text}


def connection_bundle(conn: Connection, include: Any = None, exclude: Any = None) -> dict[str, Any]:
    """``Connection._repr_mimebundle_``: the workers table in a notebook, text elsewhere."""
    try:
        health = conn.health()
        text = (
            f"<gpulayer.Connection {conn.url}: gpulayer {health.version},"
            f" {health.workers_ready} workers ready, {health.jobs_active} jobs active>"
        )
    except errors.GpulayerError as e:
        return {"text/plain": f"<gpulayer.Connection {conn.url}: {e.message}>"}
    if not in_notebook():
        return {"text/plain": text}
    box = w.VBox([w.HTML(html.escape(text)), WorkersTable(conn)])
    return {**(box._repr_mimebundle_() or {}), "text/plain": text}


def job_summary(info: contracts.Job) -> str:
    """One line about a job: ``job ab12cd (cell) running on gpu-box-1, GPU 0, 3.2s``."""
    parts = [f"job {info.id} ({info.spec.kind}) {info.state}"]
    if info.worker_name:
        parts.append(f"on {info.worker_name}")
    if info.tasks and info.tasks[-1].gpu_indices:
        parts.append("GPU " + ",".join(map(str, info.tasks[-1].gpu_indices)))
    if info.duration is not None:
        parts.append(contracts.format_duration(info.duration))
    text = ", ".join(parts)
    if info.reason and info.state != "running":
        text += f": {info.reason}"
    return text
