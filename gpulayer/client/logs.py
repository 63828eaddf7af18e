"""Reading a job's stored output: the one "read every stored line" loop, and the
marker lines between a retried job's attempts.

(:meth:`Connection.follow_logs <gpulayer.client.connection.Connection.follow_logs>`
follows live output until the job ends.)
"""

from collections.abc import Iterable, Iterator

from gpulayer import contracts
from gpulayer.client.connection import Connection


def stored_lines(
    conn: Connection, job_id: str, offset: int = 0, *, attempt: int | None = None
) -> Iterator[contracts.LogLine]:
    """Yield the job's lines stored so far from ``offset`` (only attempt ``attempt``'s
    when given), each once, page by page."""
    while True:
        page = conn.logs(job_id, offset, attempt=attempt)
        for line in page.lines:
            if line.offset >= offset:  # a page that overlaps the last one
                yield line
        if not page.lines or page.next_offset <= offset:
            return
        offset = page.next_offset


def with_attempt_marks(
    conn: Connection, job_id: str, lines: Iterable[contracts.LogLine]
) -> Iterator[contracts.LogLine]:
    """``lines`` with a ``system`` marker line (offset -1) before the first line of
    each attempt after the first::

        ── attempt 2 on local-2 (attempt 1 lost: worker stopped renewing the lease)
    """
    tasks: dict[str, contracts.Task] = {}
    current = 0
    for line in lines:
        task_id = line.task_id
        if task_id is not None and task_id not in tasks:
            # A new attempt's first line: learn its task (and the one before it).
            tasks = {t.id: t for t in conn.job(job_id, retry=True).tasks}
        task = tasks.get(task_id or "")
        if task is not None and task.attempt != current:
            if task.attempt > 1:
                yield _marker(task, list(tasks.values()), line)
            current = task.attempt
        yield line


def _marker(
    task: contracts.Task, tasks: list[contracts.Task], line: contracts.LogLine
) -> contracts.LogLine:
    where = f" on {task.worker_name}" if task.worker_name else ""
    before = [t for t in tasks if t.attempt == task.attempt - 1]
    why = ""
    if before:
        prev = before[0]
        reason = f": {prev.reason}" if prev.reason else ""
        why = f" (attempt {prev.attempt} {prev.state}{reason})"
    return contracts.LogLine(
        offset=-1, stream=contracts.LogStream.system, ts=line.ts,
        text=f"── attempt {task.attempt}{where}{why}", task_id=task.id,
    )  # fmt: skip
