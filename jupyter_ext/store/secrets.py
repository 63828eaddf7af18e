"""Secret records: sealed values (never clear text) and the owners they are shared with."""

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from gpulayer.contracts import Secret

from .db import Database, marks
from .records import as_datetime


@dataclass(frozen=True, slots=True)
class SecretRecord:
    """A ``secrets`` row: the value only as ``sealed`` bytes (``jupyter_ext/secrets.py``)."""

    owner: str
    name: str
    sealed: bytes
    shared_with: tuple[str, ...]
    created_at: float
    updated_at: float

    @classmethod
    def from_row(cls, r: sqlite3.Row) -> "SecretRecord":
        """Read a ``secrets`` row."""
        shared = tuple(str(o) for o in json.loads(r["shared_with"] or "[]"))
        return cls(
            r["owner"], r["name"], bytes(r["sealed"]), shared, r["created_at"], r["updated_at"]
        )

    def model(self) -> Secret:
        """The record as users see it (no value)."""
        return Secret(
            name=self.name,
            owner=self.owner,
            created_at=as_datetime(self.created_at),
            updated_at=as_datetime(self.updated_at),
            shared_with=list(self.shared_with),
        )


class SecretQueries(Database):
    """The ``secrets`` table."""

    async def put_secret(self, owner: str, name: str, sealed: bytes, now: float) -> None:
        """Store a sealed value: a new secret, or a new value that keeps its shares."""
        await self._write(
            [
                (
                    "INSERT INTO secrets (owner, name, sealed, created_at, updated_at)"
                    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (owner, name)"
                    " DO UPDATE SET sealed = excluded.sealed, updated_at = excluded.updated_at",
                    (owner, name, sealed, now, now),
                )
            ]
        )

    async def secret(self, owner: str, name: str) -> SecretRecord | None:
        """``owner``'s secret ``name``."""
        row = await self._one("SELECT * FROM secrets WHERE owner = ? AND name = ?", (owner, name))
        return None if row is None else SecretRecord.from_row(row)

    async def secrets_named(self, names: Sequence[str]) -> list[SecretRecord]:
        """Every owner's secrets with these names."""
        if not names:
            return []
        rows = await self._all(
            f"SELECT * FROM secrets WHERE name IN ({marks(names)}) ORDER BY owner, name",
            tuple(names),
        )
        return [SecretRecord.from_row(r) for r in rows]

    async def list_secrets(self) -> list[SecretRecord]:
        """Every secret, by owner and name."""
        rows = await self._all("SELECT * FROM secrets ORDER BY owner, name")
        return [SecretRecord.from_row(r) for r in rows]

    async def delete_secret(self, owner: str, name: str) -> None:
        """Forget a secret (its sealed value with it)."""
        await self._write([("DELETE FROM secrets WHERE owner = ? AND name = ?", (owner, name))])

    async def share_secret(self, owner: str, name: str, shared_with: Sequence[str]) -> None:
        """Set the owners (besides ``owner``) whose jobs may name the secret."""
        await self._write(
            [
                (
                    "UPDATE secrets SET shared_with = ? WHERE owner = ? AND name = ?",
                    (json.dumps(sorted(set(shared_with))), owner, name),
                )
            ]
        )
