"""Reading a job's stored output: the one "read every line stored so far" loop.

(:meth:`Connection.follow_logs <gpulayer.client.connection.Connection.follow_logs>`
follows live output until the job ends.)
"""

from collections.abc import Iterator

from gpulayer import contracts
from gpulayer.client.connection import Connection


def stored_lines(conn: Connection, job_id: str, offset: int = 0) -> Iterator[contracts.LogLine]:
    """Yield the job's lines stored so far from ``offset``, each once, page by page."""
    while True:
        page = conn.logs(job_id, offset)
        for line in page.lines:
            if line.offset >= offset:  # a page that overlaps the last one
                yield line
        if not page.lines or page.next_offset <= offset:
            return
        offset = page.next_offset
