"""The token cache (jupyter_ext/auth.py, docs/adr/0115): a request does not read the
store each time, yet a revoked, used or expired token is refused at once here and
within ``cache_seconds`` on a replica that learns of it only from the file."""

import asyncio
import sqlite3
import time

import pytest

from gpulayer.errors import AuthError
from jupyter_ext.auth import TokenService
from jupyter_ext.store import Store
from jupyter_ext.store.writes import revoke_task_tokens

#: Every check below must hold within 1 s (the cache trusts a token 0.5 s); the
#: deadline polls allow more only because these machines are shared and loaded.
DEADLINE = 1.0 + 3.0


async def refused_within(svc: TokenService, token: str, seconds: float) -> str:
    """Poll until ``token`` is refused (its message) or fail after ``seconds``."""
    end = time.monotonic() + seconds
    while True:
        try:
            await svc.resolve(token)
        except AuthError as e:
            return str(e)
        assert time.monotonic() < end, "the token was still accepted"
        await asyncio.sleep(0.02)


@pytest.fixture
def stores(tmp_path):
    """Two connections to one database file: this control plane, and a replica."""

    async def both():
        return await Store(tmp_path / "gl.db").open(), await Store(tmp_path / "gl.db").open()

    return both


def test_a_cached_token_is_served_without_reading_the_store(tmp_path):
    async def body():
        store = await Store(tmp_path / "gl.db").open()
        try:
            svc = TokenService(store)
            token = await svc.create("ada", "submitter")
            reads = 0
            by_hash = store.token_by_hash

            async def counted(digest):
                nonlocal reads
                reads += 1
                return await by_hash(digest)

            store.token_by_hash = counted
            for _ in range(20):
                assert (await svc.resolve(token)).name == "ada"
            assert reads == 1
        finally:
            await store.close()

    asyncio.run(body())


def test_a_revoked_token_is_refused_at_once_here_and_soon_on_a_replica(stores):
    async def body():
        here_store, replica_store = await stores()
        try:
            here, replica = TokenService(here_store), TokenService(replica_store)
            token = await here.create("ada", "submitter")
            revoked: list[str] = []
            here.on_revoked(revoked.append)
            principal = await here.resolve(token)
            await replica.resolve(token)  # both have it cached now
            await here.revoke("ada")
            with pytest.raises(AuthError, match="revoked"):
                await here.resolve(token)
            assert revoked == [principal.token_id]
            assert "revoked" in await refused_within(replica, token, DEADLINE)
        finally:
            await here_store.close()
            await replica_store.close()

    asyncio.run(body())


def test_a_tasks_token_ends_with_its_task_and_tells_on_revoked(tmp_path):
    async def body():
        store = await Store(tmp_path / "gl.db").open()
        try:
            svc = TokenService(store)
            token, stmt = svc.for_task("ada", "task1")
            await store.apply([stmt])
            principal = await svc.resolve(token)
            ended = asyncio.Event()
            stop = svc.on_revoked(lambda token_id: ended.set())
            # The task ends: its token is revoked in the task's own transaction.
            await store.apply([revoke_task_tokens("task1", time.time())])
            with pytest.raises(AuthError, match="revoked"):
                await svc.resolve(token)
            await asyncio.wait_for(ended.wait(), DEADLINE)
            stop()
            assert principal.token_id is not None
        finally:
            await store.close()

    asyncio.run(body())


def test_an_expired_token_is_refused_and_its_open_channels_are_told(tmp_path):
    async def body():
        store = await Store(tmp_path / "gl.db").open()
        try:
            svc = TokenService(store)
            token = await svc.create("ada", "viewer", expires_at=time.time() + 0.3)
            principal = await svc.resolve(token)  # cached, its expiry armed
            expired = asyncio.Event()
            svc.on_revoked(lambda token_id: token_id == principal.token_id and expired.set())
            assert "expired" in await refused_within(svc, token, DEADLINE)
            await asyncio.wait_for(expired.wait(), DEADLINE)
        finally:
            await store.close()

    asyncio.run(body())


def test_a_role_changed_in_the_file_applies_within_the_cache_time(tmp_path):
    async def body():
        store = await Store(tmp_path / "gl.db").open()
        try:
            svc = TokenService(store)
            token = await svc.create("ada", "admin")
            assert (await svc.resolve(token)).role == "admin"
            # Another process (an operator's sqlite3, another replica) demotes it.
            with sqlite3.connect(tmp_path / "gl.db") as other:
                other.execute("UPDATE tokens SET role = 'viewer' WHERE name = 'ada'")
            end = time.monotonic() + DEADLINE
            while (await svc.resolve(token)).role != "viewer":
                assert time.monotonic() < end, "the old role was still served"
                await asyncio.sleep(0.02)
        finally:
            await store.close()

    asyncio.run(body())


def test_a_single_use_token_is_never_served_from_the_cache(tmp_path):
    async def body():
        store = await Store(tmp_path / "gl.db").open()
        try:
            svc = TokenService(store)
            token = await svc.create("join", "join", single_use=True)
            await svc.use(await svc.resolve(token))
            with pytest.raises(AuthError, match="already used"):
                await svc.resolve(token)
        finally:
            await store.close()

    asyncio.run(body())
