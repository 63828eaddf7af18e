"""Group commits (jupyter_ext/store/commits.py, docs/adr/0112): writes that arrive
while a commit is in flight share the next one, each is answered only once that
commit is on disk, and a write that fails is refused alone."""

import asyncio
import sqlite3
import threading
import time

import pytest

from gpulayer.errors import Conflict
from jupyter_ext.store import Store, TokenRecord
from jupyter_ext.store.writes import insert_token


def token(i: int | str) -> TokenRecord:
    return TokenRecord(
        id=f"t{i}", name=f"n{i}", role="submitter", hash=f"h{i}", created_at=time.time(),
        expires_at=None, revoked_at=None, worker_id=None, single_use=False, used_at=None,
    )  # fmt: skip


def stored_ids(path) -> set[str]:
    """What another process reading the file sees now."""
    with sqlite3.connect(path) as conn:
        return {r[0] for r in conn.execute("SELECT id FROM tokens")}


def wal_frames(path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1])


def on_store(path, body) -> None:
    """Run ``body(store)`` on a store opened at ``path``, closed after."""

    async def run() -> None:
        store = await Store(path).open()
        try:
            await body(store)
        finally:
            await store.close()

    asyncio.run(run())


def test_writes_that_arrive_together_share_commits_and_each_is_stored_when_answered(tmp_path):
    path = tmp_path / "gl.db"

    async def body():
        store = await Store(path).open()
        try:
            with sqlite3.connect(path) as conn:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # count from an empty WAL

            async def write(i: int) -> None:
                await store.insert_token(token(i))
                assert f"t{i}" in stored_ids(path)  # answered only once committed

            await asyncio.gather(*(write(i) for i in range(100)))
            assert stored_ids(path) == {f"t{i}" for i in range(100)}
            # A commit a write would append about five WAL frames each (100 writes
            # stay under the store's checkpoint every 256 commits, which empties it).
            assert wal_frames(path) < 100
        finally:
            await store.close()

    asyncio.run(body())


def test_a_write_that_fails_is_refused_alone_and_the_rest_of_its_commit_is_stored(tmp_path):
    path = tmp_path / "gl.db"

    async def body():
        store = await Store(path).open()
        try:
            await store.insert_token(token("old"))
            await store.insert_token(token("kept"))
            heard: list[tuple[str, bool]] = []
            store.on_token_change(heard.extend)
            revoke_kept = ("UPDATE tokens SET revoked_at = 1 WHERE id = ?", ("tkept",))
            results = await asyncio.gather(
                store.insert_token(token(1)),
                # Revokes a token, then fails: the revocation goes with it.
                store.apply([revoke_kept, insert_token(token("old"))]),
                store.insert_token(token(2)),
                return_exceptions=True,
            )
            assert results[0] is None and results[2] is None
            assert isinstance(results[1], Conflict)
            assert "conflicts with stored data" in str(results[1])
            assert stored_ids(path) == {"told", "tkept", "t1", "t2"}
            kept = await store.token_by_id("tkept")
            assert kept is not None and kept.revoked_at is None
            assert heard == []  # the token cache never heard of the rolled-back revocation
        finally:
            await store.close()

    asyncio.run(body())


def test_a_write_whose_caller_gave_up_is_stored_all_the_same(tmp_path):
    path = tmp_path / "gl.db"

    async def body():
        store = await Store(path).open()
        try:
            first = asyncio.ensure_future(store.insert_token(token(1)))
            second = asyncio.ensure_future(store.insert_token(token(2)))
            await asyncio.sleep(0)  # both are waiting for their commit
            second.cancel()
            await first
            with pytest.raises(asyncio.CancelledError):
                await second
            await store.insert_token(token(3))  # a later commit: the group is done
            assert stored_ids(path) == {"t1", "t2", "t3"}
        finally:
            await store.close()

    asyncio.run(body())


def test_the_wal_is_folded_back_while_small_writes_commit_on_the_loop(tmp_path):
    # Small writes commit on the event loop with SQLite's own checkpoint off
    # (docs/adr/0139); the store checkpoints on its thread instead, so the WAL
    # does not grow with every commit.
    path = tmp_path / "gl.db"

    async def body(store):
        for i in range(800):  # one at a time: 800 commits of ~5 frames each
            await store.insert_token(token(i))
        assert len(stored_ids(path)) == 800
        assert wal_frames(path) < 2000, "the WAL was never checkpointed"

    on_store(path, body)


def test_writes_commit_while_a_checkpoint_is_in_flight(tmp_path, monkeypatch):
    # A checkpoint may fsync for tens of milliseconds; it runs on its own
    # connection and thread, so the writes after it do not wait for it
    # (docs/adr/0154). Here a checkpoint is held until 300 more writes committed.
    from jupyter_ext.store import db

    path = tmp_path / "gl.db"
    started, release, returned = threading.Event(), threading.Event(), threading.Event()
    checkpoint = db._checkpoint_wal

    def held_checkpoint(conn):
        started.set()
        release.wait(10)  # writes that waited for it would finish only after this
        returned.set()
        checkpoint(conn)

    monkeypatch.setattr(db, "_checkpoint_wal", held_checkpoint)

    async def body(store):
        i = 0
        while not started.is_set():  # up to the commit that starts a checkpoint
            await store.insert_token(token(i))
            i += 1
            assert i <= db.CHECKPOINT_EVERY_COMMITS + 1, "no checkpoint was started"
        for j in range(i, i + 300):
            await store.insert_token(token(j))
        assert not returned.is_set(), "the writes waited for the checkpoint"
        assert len(stored_ids(path)) == i + 300
        release.set()

    on_store(path, body)


def test_small_writes_and_large_reads_on_the_thread_interleave_safely(tmp_path):
    # A large read runs on aiosqlite's thread, on the connection the small writes
    # commit on from the loop (docs/adr/0139): each read sees every write answered
    # before it and nothing more, and every write is stored.
    path = tmp_path / "gl.db"
    written: list[int] = []

    async def writes(store) -> None:
        for i in range(300):
            await store.insert_token(token(i))
            written.append(i)

    async def reads(store) -> None:
        for _ in range(60):
            before = len(written)
            seen = {t.id for t in await store.list_tokens()}
            # Every write answered before the read started is in it, and nothing
            # that was not written yet.
            assert {f"t{i}" for i in range(before)} <= seen
            assert seen <= {f"t{i}" for i in range(300)}
            await asyncio.sleep(0)

    async def body(store):
        await asyncio.gather(writes(store), reads(store))
        assert stored_ids(path) == {f"t{i}" for i in range(300)}

    on_store(path, body)


def test_a_writer_that_never_pauses_still_lets_the_loop_turn_between_its_writes(tmp_path):
    # A small write commits at once when nothing else is ready to run (no task,
    # no turn of the loop: docs/adr/0139), but at most once a turn: a coroutine
    # that writes in a loop never holds up the loop's timers and I/O meanwhile.
    path = tmp_path / "gl.db"

    async def body(store):
        written = 0
        seen: list[int] = []
        asyncio.get_running_loop().call_later(0.0, lambda: seen.append(written))
        for i in range(200):
            await store.insert_token(token(i))
            written += 1
        assert seen and seen[0] <= 2, f"the loop turned only after {seen} writes"
        assert len(stored_ids(path)) == 200

    on_store(path, body)
