"""Where the client finds its control plane.

A connection is a URL (the Jupyter server URL, base_url included), a gpulayer
bearer token and, for a control plane with a self-signed certificate, the
certificate's pinned fingerprint. :func:`resolve` takes each of them from the
first place that has it:

1. the explicit arguments (``gl.connect(url, token)``, ``gpulayer --url/--token/--fingerprint``),
2. the environment (``GPULAYER_URL``, ``GPULAYER_TOKEN``, ``GPULAYER_FINGERPRINT``),
3. the file :func:`config_path` names, which ``gpulayer up`` writes.

A token or fingerprint from the file is only used for the URL the file was written
for, so an explicit URL never silently receives the admin token of another server.
A token is never sent over ``http://`` to another machine unless the user opts in
(``insecure=True``, ``--insecure`` or ``GPULAYER_INSECURE=1``; see
:func:`gpulayer.tls.refuse_clear_text`).
"""

import json
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict
from pydantic import ValidationError as PydanticValidationError

from gpulayer import paths
from gpulayer.errors import ConfigError
from gpulayer.private import private_dir

#: How long waits, follows and submits ride through an unreachable control plane.
DEFAULT_RECONNECT_SECONDS = 120.0
RECONNECT_ENV = "GPULAYER_RECONNECT_SECONDS"

_HOW_TO_FIX = (
    "run `gpulayer up`, or set GPULAYER_URL and GPULAYER_TOKEN, or call gl.connect(url, token)"
)


class ConnectionConfig(BaseModel):
    """The URL of a control plane and the token to use with it."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    url: str
    token: str
    fingerprint: str | None = None
    insecure: bool = False  # tokens over http:// to another machine all the same


def config_path() -> Path:
    """The connection file.

    ``$GPULAYER_CONFIG``, else ``connection.json`` in the platform's config folder
    (:func:`gpulayer.paths.config_dir`: ``$XDG_CONFIG_HOME/gpulayer``, i.e.
    ``~/.config/gpulayer`` on Linux). A file an older gpulayer saved at
    ``~/.config/gpulayer/connection.json`` on another platform is read until one is
    saved at the new place.
    """
    explicit = os.environ.get("GPULAYER_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    current = paths.config_dir() / "connection.json"
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    legacy = Path(base).expanduser() / "gpulayer" / "connection.json"
    return legacy if not current.exists() and legacy.is_file() else current


def load(path: Path | None = None) -> ConnectionConfig | None:
    """The saved connection, or None when there is no file.

    Raises
    ------
    ConfigError
        If the file exists but cannot be read or parsed.
    """
    path = path or config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ConfigError(f"cannot read the gpulayer config {path}: {e}") from e
    try:
        return ConnectionConfig.model_validate_json(text)
    except PydanticValidationError as e:
        raise ConfigError(
            f"the gpulayer config {path} is not valid ({e.error_count()} problems); "
            f"delete it and {_HOW_TO_FIX}"
        ) from e


def save(cfg: ConnectionConfig, path: Path | None = None) -> Path:
    """Write ``cfg`` to the connection file (mode 0600, parent folders created).

    Returns
    -------
    Path
        Where it was written.
    """
    path = path or config_path()
    if not path.parent.is_dir():
        private_dir(path.parent)
    # Create with 0600 from the start: the file holds a token, so it is never
    # world-readable, not even between open() and chmod().
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(cfg.model_dump(exclude_none=True, exclude_defaults=True), f, indent=2)
        f.write("\n")
    path.chmod(0o600)
    return path


def resolve(
    url: str | None = None,
    token: str | None = None,
    fingerprint: str | None = None,
    insecure: bool = False,
) -> ConnectionConfig:
    """The connection to use: explicit arguments, then the environment, then the file.

    Parameters
    ----------
    url, token, fingerprint
        Explicit values; they win over everything else.
    insecure
        Allow the token over ``http://`` to another machine (also
        ``GPULAYER_INSECURE=1``, or a saved connection that says so).

    Raises
    ------
    ConfigError
        If no URL or no token can be found, with a message that says how to fix it.
    """
    url = url or os.environ.get("GPULAYER_URL") or None
    if token is None and os.environ.get("GPULAYER_TOKEN") == "":
        # Never fall back to the saved (admin) token because a variable is blank.
        raise ConfigError("GPULAYER_TOKEN is set but empty; set it to a gpulayer token or unset it")
    token = token or os.environ.get("GPULAYER_TOKEN") or None
    fingerprint = fingerprint or os.environ.get("GPULAYER_FINGERPRINT") or None
    insecure = insecure or os.environ.get("GPULAYER_INSECURE", "").lower() in ("1", "true", "yes")
    if url is None or token is None or fingerprint is None:
        saved = load()
        if saved is not None:
            if url is None:
                url = saved.url
            if _same_url(url, saved.url):
                token = token or saved.token
                fingerprint = fingerprint or saved.fingerprint
                insecure = insecure or saved.insecure
    if not url:
        raise ConfigError(f"no gpulayer control plane is configured; {_HOW_TO_FIX}")
    if not token:
        raise ConfigError(f"no gpulayer token for {url}; {_HOW_TO_FIX}")
    return ConnectionConfig(url=url, token=token, fingerprint=fingerprint, insecure=insecure)


def reconnect_seconds(value: float | None = None) -> float:
    """How long a connection rides through outages: ``value``, else
    ``$GPULAYER_RECONNECT_SECONDS``, else 120 s.

    Raises
    ------
    ConfigError
        If the value is not a number of seconds >= 0.
    """
    where = "reconnect_seconds"
    if value is None:
        raw = os.environ.get(RECONNECT_ENV, "").strip()
        if not raw:
            return DEFAULT_RECONNECT_SECONDS
        where = RECONNECT_ENV
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(f"{RECONNECT_ENV}={raw!r} is not a number of seconds") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ConfigError(f"{where} must be a number of seconds >= 0, not {value!r}")
    return float(value)


def _same_url(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")


def jupyter_parent() -> ConnectionConfig | None:
    """The Jupyter server that started this kernel, when there is one.

    A kernel's parent (``JPY_PARENT_PID``, else the parent process, or one of
    its ancestors) that is a Jupyter server has a ``jpserver-<pid>.json`` in the
    Jupyter runtime directory, with its URL and token; the control plane accepts
    that token as the Jupyter user (``c.GpulayerApp.jupyter_user_role``).
    """
    from jupyter_core.paths import jupyter_runtime_dir

    runtime = Path(jupyter_runtime_dir())
    for pid in _ancestors():
        try:
            info = json.loads((runtime / f"jpserver-{pid}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        url, token = info.get("url"), info.get("token")
        if isinstance(url, str) and isinstance(token, str) and token:
            return ConnectionConfig(url=url, token=token)
    return None


def _ancestors(limit: int = 8) -> list[int]:
    """This process's parent pids, nearest first (``JPY_PARENT_PID`` leads)."""
    import psutil

    pids = []
    parent = os.environ.get("JPY_PARENT_PID", "")
    if parent.isdigit():
        pids.append(int(parent))
    try:
        pids += [p.pid for p in psutil.Process().parents()[:limit]]
    except psutil.Error:
        pids.append(os.getppid())
    return list(dict.fromkeys(pids))
