"""The worker's own credential: the token it got at its first registration.

A join token registers only a *new* worker name. To register again under its
name (after a restart of the agent or the control plane, or a 401/404) a worker
presents the token that registration gave it, at ``workers/{id}/register``
(docs/adr/0070-worker-credentials.md). The agent keeps that token in
``<data_dir>/credential.json``, mode 0600, next to the URL of the control plane
that issued it: a credential is only ever sent back to that control plane, so a
worker pointed at another one never leaks it there.
"""

import contextlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

FILENAME = "credential.json"


@dataclass(frozen=True)
class Credential:
    """A worker id and its token, as issued by the control plane at ``url``."""

    url: str
    worker_id: str
    token: str


class CredentialFile:
    """``<data_dir>/credential.json``: read at start, written after each registration."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / FILENAME

    def load(self, url: str) -> Credential | None:
        """The credential for the control plane at ``url``, or None (none kept, a
        damaged file, or one issued by another control plane)."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            cred = Credential(str(data["url"]), str(data["worker_id"]), str(data["token"]))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("ignoring the worker credential in %s: %s", self.path, e)
            return None
        return cred if _same_url(cred.url, url) else None

    def save(self, cred: Credential) -> None:
        """Keep ``cred`` (mode 0600 from the start, replaced atomically)."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.path.with_name(f".{FILENAME}.{os.getpid()}.part")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"url": cred.url, "worker_id": cred.worker_id, "token": cred.token}, f)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise


def _same_url(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")
