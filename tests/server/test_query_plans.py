"""What every submit and every sweep reads stays small however long the history:
the store's hot statements search an index, never scan every task ever run
(docs/adr/0140; a `.run` took 3x longer with 100,000 jobs in the store before)."""

import asyncio
import sqlite3
import time

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
            await store.holds()  # every submit's placement
            await store.active_tasks()
            await store.expired_leases(time.time())  # every sweep
            await store.apply([forget_parts_of("j1", "t1")])  # every function's completion
        finally:
            await store.close()

    asyncio.run(run())
    hot = [s for s in statements if s.lstrip().upper().startswith(("SELECT", "DELETE", "UPDATE"))]
    assert len(hot) >= 4, hot
    with connect(path) as conn:
        for sql in hot:
            plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql)]
            scans = [p for p in plan if p.startswith("SCAN") and "USING" not in p]
            assert not scans, (sql, plan)
