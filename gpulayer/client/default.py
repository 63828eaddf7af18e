"""The process's default connection: what ``gl.connect()`` sets and ``gl.submit``,
``@gl.remote`` and the magics use when given none."""

import logging

from gpulayer.client import config
from gpulayer.client.connection import Connection

log = logging.getLogger(__name__)

_default: Connection | None = None


def default_connection() -> Connection | None:
    """The default connection, or None before anything connected (no connecting)."""
    return _default


def set_default(conn: Connection | None) -> Connection | None:
    """Make ``conn`` the default connection (None: forget it); answers the previous one."""
    global _default
    previous, _default = _default, conn
    return previous


def connect(
    url: str | None = None,
    token: str | None = None,
    *,
    fingerprint: str | None = None,
    insecure: bool = False,
    reconnect_seconds: float | None = None,
) -> Connection:
    """Connect to a control plane and make it the default for :func:`submit`.

    Parameters
    ----------
    url, token
        Where and as whom; missing ones come from ``GPULAYER_URL`` /
        ``GPULAYER_TOKEN`` or the file ``gpulayer up`` saved.
    fingerprint
        The server certificate's pinned ``sha256:...``; else
        ``GPULAYER_FINGERPRINT`` or the saved file's (for the same URL).
    insecure
        Send the token over ``http://`` to another machine all the same (clear text;
        also ``GPULAYER_INSECURE=1``). Loopback and ``https://`` need no opt-in.
    reconnect_seconds
        How long waits, log follows, function calls, maps and cells keep
        reconnecting when the control plane goes away (a restart) before they
        raise; default ``GPULAYER_RECONNECT_SECONDS`` or 120. 0: fail at once.

    Raises
    ------
    ConfigError
        If no URL or token can be found, or the URL is ``http://`` to another
        machine without ``insecure``.
    ConnectionFailed
        If the control plane does not answer.
    CertificateMismatch
        If its TLS certificate is not the pinned one (nothing was sent).
    """
    cfg = config.resolve(url, token, fingerprint, insecure)
    conn = Connection(
        cfg.url,
        cfg.token,
        fingerprint=cfg.fingerprint,
        insecure=cfg.insecure,
        reconnect_seconds=reconnect_seconds,
    )
    try:
        conn.health()
    except BaseException:
        conn.close()
        raise
    previous = set_default(conn)
    if previous is not None:
        previous.close()
    log.debug("connected to %s", cfg.url)
    return conn


def current_connection() -> Connection:
    """The default connection, connecting from the configuration on first use."""
    return _default if _default is not None else connect()
