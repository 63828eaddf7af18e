"""What every submit, sweep and listing reads stays small however long the history:
the store's hot statements search an index, never scan or sort every task or job
ever run (docs/adr/0140; a `.run` took 4x as long with 100,000 jobs in the store,
and listing the newest succeeded jobs held the event loop for 60 ms)."""

import asyncio
import sqlite3
import time

from gpulayer.contracts import JobState
from jupyter_ext.store import Store
from jupyter_ext.store.writes import forget_parts_of


def test_placement_the_sweep_and_completions_search_not_scan(tmp_path, monkeypatch):
    path = tmp_path / "gl.db"
    statements: list[str] = []
    connect = sqlite3.connect

    def traced(*args, **kwargs):
        conn = connect(*args, **kwargs)
        conn.set_trace_callback(statements.append)  # each statement as it runs, values in
        return conn

    monkeypatch.setattr(sqlite3, "connect", traced)

    async def run() -> None:
        store = await Store(path).open()
        try:
            statements.clear()
            await store.holds()  # every submit's placement: from memory, no statement
            await store.active_tasks()
            await store.expired_leases(time.time())  # every sweep
            await store.apply([forget_parts_of("j1", "t1")])  # every function's completion
            # Listings, newest first, by state, owner or both (the sidebar polls them,
            # on the event loop), and a submitter's count of its active jobs.
            for state, owner in ((JobState.succeeded, None), (None, "ada"),
                                 (JobState.failed, "bob"), (JobState.running, "ada")):  # fmt: skip
                await store.list_jobs(state, 50, owner)
            await store.count_jobs([JobState.queued, JobState.running], "ada")
        finally:
            await store.close()

    asyncio.run(run())
    hot = [s for s in statements if s.lstrip().upper().startswith(("SELECT", "DELETE", "UPDATE"))]
    assert len(hot) >= 8, hot
    with connect(path) as conn:
        for sql in hot:
            plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql)]
            scans = [p for p in plan if p.startswith("SCAN") and "USING" not in p]
            sorts = [p for p in plan if "TEMP B-TREE" in p]  # every matching row read
            assert not scans and not sorts, (sql, plan)
