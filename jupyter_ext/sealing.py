"""Sealing secret values at rest: AES-GCM with a key kept in the data dir.

The key is 32 random bytes in ``<data_dir>/secrets.key`` (base64, mode 0600),
made at the first use. A sealed value is ``version byte | 12-byte nonce |
ciphertext and tag``; the owner and name are the associated data, so a sealed
value copied onto another owner's or name's row does not open. What this
protects (a copied database file, a backup without the key) and what it does not
(anyone who reads the data dir, the control plane's memory) is docs/adr/0108.
"""

import asyncio
import base64
import binascii
import os
from pathlib import Path
from typing import TYPE_CHECKING

from gpulayer.errors import StorageError

if TYPE_CHECKING:  # imported at the first use: ~10 ms of every control plane's start
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

#: The key file's name in the data dir.
KEY_FILE = "secrets.key"
_VERSION = b"\x01"
_NONCE_BYTES = 12


class Sealer:
    """Seals and opens secret values with the key at ``path`` (made on first use)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._aead: AESGCM | None = None
        self._loading = asyncio.Lock()

    async def _cipher(self) -> "AESGCM":
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        if self._aead is None:
            async with self._loading:
                if self._aead is None:
                    self._aead = AESGCM(await asyncio.to_thread(self._key))
        return self._aead

    def _key(self) -> bytes:
        """The key, read from its file or made there (blocking)."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return self._read()
        key = os.urandom(32)  # what AESGCM.generate_key(bit_length=256) makes
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(base64.b64encode(key).decode() + "\n")
        return key

    def _read(self) -> bytes:
        text = self.path.read_text(encoding="ascii").strip()
        try:
            key = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as e:
            raise StorageError(f"{self.path} is not a gpulayer secrets key: {e}") from e
        if len(key) != 32:
            raise StorageError(f"{self.path} is not a gpulayer secrets key (not 32 bytes)")
        return key

    async def seal(self, owner: str, name: str, value: str) -> bytes:
        """``value`` encrypted for ``owner``'s secret ``name``."""
        nonce = os.urandom(_NONCE_BYTES)
        aead = await self._cipher()
        return _VERSION + nonce + aead.encrypt(nonce, value.encode(), _bound(owner, name))

    async def open(self, owner: str, name: str, sealed: bytes) -> str:
        """The value of a sealed secret.

        Raises
        ------
        StorageError
            When it does not open with this key (another data dir's key, a changed
            row): the message names the secret, never a value.
        """
        from cryptography.exceptions import InvalidTag

        aead = await self._cipher()
        nonce, body = sealed[1 : 1 + _NONCE_BYTES], sealed[1 + _NONCE_BYTES :]
        try:
            if sealed[:1] != _VERSION:
                raise InvalidTag
            return aead.decrypt(nonce, body, _bound(owner, name)).decode()
        except (InvalidTag, UnicodeDecodeError) as e:
            raise StorageError(
                f"secret {name!r} of {owner!r} does not open with {self.path} (was the key"
                " replaced, or the database copied from another data dir?); set it again"
            ) from e


def _bound(owner: str, name: str) -> bytes:
    """The associated data: which row a sealed value belongs to."""
    return f"gpulayer-secret\x00{owner}\x00{name}".encode()
