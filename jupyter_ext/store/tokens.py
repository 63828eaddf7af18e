"""Token records: stored hashes, revocation, single use."""

import sqlite3
from collections.abc import Sequence

from .db import Database, marks
from .records import TokenRecord
from .writes import insert_token


class TokenQueries(Database):
    """The ``tokens`` table."""

    async def insert_token(self, t: TokenRecord) -> None:
        """Store a token record (its hash, never the token)."""
        await self._write([insert_token(t)])

    async def _token(self, sql: str, value: str) -> TokenRecord | None:
        row = await self._one(sql, (value,))
        return None if row is None else TokenRecord.from_row(row)

    async def token_by_hash(self, digest: str) -> TokenRecord | None:
        """The token record with this hash."""
        return await self._token("SELECT * FROM tokens WHERE hash = ?", digest)

    async def token_by_id(self, token_id: str) -> TokenRecord | None:
        """The token record with this id."""
        return await self._token("SELECT * FROM tokens WHERE id = ?", token_id)

    async def list_tokens(self) -> list[TokenRecord]:
        """Every token record, oldest first."""
        rows = await self._all("SELECT * FROM tokens ORDER BY created_at, id", big=True)
        return [TokenRecord.from_row(r) for r in rows]

    async def tokens_named(self, name: str) -> list[TokenRecord]:
        """The token records with this name."""
        rows = await self._all("SELECT * FROM tokens WHERE name = ?", (name,))
        return [TokenRecord.from_row(r) for r in rows]

    async def revoke_tokens(self, token_ids: Sequence[str], ts: float) -> None:
        """Revoke these tokens (already revoked ones keep their time)."""
        sql = (
            f"UPDATE tokens SET revoked_at = ? WHERE id IN ({marks(token_ids)})"
            " AND revoked_at IS NULL"
        )
        await self._write([(sql, (ts, *token_ids))])

    async def use_token(self, token_id: str, ts: float) -> bool:
        """Consume a single-use token; False when it was used (or revoked) already."""

        def run(conn: sqlite3.Connection) -> int:
            return conn.execute(
                "UPDATE tokens SET used_at = ?, revoked_at = ?"
                " WHERE id = ? AND used_at IS NULL AND revoked_at IS NULL",
                (ts, ts, token_id),
            ).rowcount

        return await self._commit(run) == 1

    async def worker_token_ids(self, worker_id: str) -> list[str]:
        """Ids of a worker's tokens not yet revoked."""
        rows = await self._all(
            "SELECT id FROM tokens WHERE worker_id = ? AND revoked_at IS NULL", (worker_id,)
        )
        return [str(r["id"]) for r in rows]
