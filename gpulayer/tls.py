"""TLS with a pinned certificate: how ``gpulayer up`` serves HTTPS, and how every
gpulayer client (the Python client, the CLI, ``gpulayer join``) trusts it.

``gpulayer up --tls`` (the default off loopback) makes a self-signed certificate
once, in ``<data_dir>/tls/``, and prints its SHA-256 fingerprint
(``sha256:<64 hex>``, the hash of the DER certificate). Clients given that
fingerprint (``--fingerprint``, ``GPULAYER_FINGERPRINT`` or the saved config)
trust exactly that certificate and no CA: :func:`pinned_context` builds an
``ssl.SSLContext`` whose socket and BIO classes compare the peer certificate's
hash right after the handshake, before httpx writes a byte of the request, so
a wrong pin fails before the token or any body leaves the machine (ADR 0009).
Without a fingerprint, ``https://`` URLs are verified the usual way, against
the CA bundle (httpx's default, or ``SSL_CERT_FILE``).

Tokens never travel in clear text off this machine: :func:`refuse_clear_text`
refuses an ``http://`` URL whose host is not loopback unless the user opted in
(``insecure=True``, ``--insecure``, ``GPULAYER_INSECURE=1``).

``cryptography`` is imported only to generate a certificate.
"""

import functools
import hashlib
import hmac
import ipaddress
import os
import re
import socket
import ssl
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

from gpulayer.errors import ConfigError

PREFIX = "sha256:"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
CERT_FILE, KEY_FILE = "cert.pem", "key.pem"


# ------------------------------------------------------------ fingerprints


def normalize_fingerprint(text: str) -> str:
    """``sha256:<64 lowercase hex>`` from that form, or with colons, or bare hex.

    Raises
    ------
    ConfigError
        If ``text`` is not a SHA-256 fingerprint.
    """
    raw = text.strip().lower()
    raw = raw.removeprefix(PREFIX).replace(":", "")
    if not _HEX64.match(raw):
        raise ConfigError(
            f"{text!r} is not a certificate fingerprint; expected sha256: and 64 hex digits"
            " (what `gpulayer up` prints)"
        )
    return PREFIX + raw


def fingerprint_of(der: bytes) -> str:
    """The fingerprint of a DER-encoded certificate."""
    return PREFIX + hashlib.sha256(der).hexdigest()


def fingerprint_of_file(cert_file: str | os.PathLike[str]) -> str:
    """The fingerprint of the (first) certificate in a PEM file."""
    pem = Path(cert_file).read_text(encoding="ascii")
    return fingerprint_of(ssl.PEM_cert_to_DER_cert(pem))


class PinMismatch(ssl.SSLCertVerificationError):
    """The server's certificate is not the pinned one."""

    def __init__(self, expected: str, seen: str) -> None:
        super().__init__(
            f"certificate fingerprint mismatch: expected {expected}, the server presented {seen}"
        )
        self.expected = expected
        self.seen = seen


# ------------------------------------------------------------------ client


def _check(conn: ssl.SSLSocket | ssl.SSLObject, expected: str) -> None:
    der = conn.getpeercert(binary_form=True)
    seen = fingerprint_of(der) if der else "no certificate"
    if not hmac.compare_digest(seen, expected):
        raise PinMismatch(expected, seen)


class _PinnedSocket(ssl.SSLSocket):
    """A blocking TLS socket (httpx sync) that checks the pin after the handshake."""

    pin = ""

    def do_handshake(self, block: bool = False) -> None:
        super().do_handshake(block)
        _check(self, self.pin)


class _PinnedObject(ssl.SSLObject):
    """A TLS BIO object (httpx async, via anyio) that checks the pin after the handshake."""

    pin = ""

    def do_handshake(self) -> None:
        super().do_handshake()  # raises SSLWantReadError until the handshake is done
        _check(self, self.pin)


def pinned_context(fingerprint: str) -> ssl.SSLContext:
    """A client context that accepts exactly the certificate with ``fingerprint``.

    CA chains and host names are not consulted (the pin is stronger than both);
    TLS 1.2 is the minimum.
    """
    pin = normalize_fingerprint(fingerprint)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the pin check below replaces chain verification
    ctx.sslsocket_class = type("PinnedSSLSocket", (_PinnedSocket,), {"pin": pin})
    ctx.sslobject_class = type("PinnedSSLObject", (_PinnedObject,), {"pin": pin})
    return ctx


def verify_for(url: str, fingerprint: str | None) -> ssl.SSLContext | bool:
    """What to pass as httpx's ``verify=`` for ``url``.

    Raises
    ------
    ConfigError
        If a fingerprint is given for a plain ``http://`` URL (the pin would
        protect nothing, and the token would travel in clear text).
    """
    if fingerprint is None or not fingerprint.strip():
        return True
    if not url.startswith("https://"):
        raise ConfigError(
            f"a certificate fingerprint was given, but {url} is not https://;"
            " the control plane serves TLS at https://..."
        )
    return pinned_context(fingerprint)


def for_httpx(verify: ssl.SSLContext | bool, url: str) -> ssl.SSLContext | bool:
    """``verify`` (from :func:`verify_for`) as an httpx client of ``url`` takes it:
    ``True`` becomes one context per process with the CA bundle httpx itself loads.

    httpx loads that bundle again for every client made with ``verify=True``
    (about 20 ms of CPU): a :class:`~gpulayer.client.Connection`, each start-up
    probe of ``gpulayer up``. A pinned context, or ``False``, is passed as it is.

    An ``http://`` URL uses no TLS, but httpx makes its context when the client is
    made: loading the bundle for it cost each worker and client of a local cluster
    ~50 ms of CPU at start. Such a client gets a context that verifies and trusts no
    certificate, which costs nothing to make and fails closed should it ever meet
    TLS (gpulayer's clients follow no redirects).
    """
    if verify is True and url.startswith("http://"):
        return _trusts_nothing()
    return default_context() if verify is True else verify


@functools.cache
def _trusts_nothing() -> ssl.SSLContext:
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # hostname checked, no CA loaded


def default_context() -> ssl.SSLContext:
    """httpx's default verifying context (its CA bundle, or ``SSL_CERT_FILE`` and
    ``SSL_CERT_DIR`` when set), made once for each value of those two and shared."""
    return _context_for(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


@functools.cache
def _context_for(cafile: str | None, capath: str | None) -> ssl.SSLContext:
    import httpx  # this module is imported where no HTTP client is loaded

    return httpx.create_ssl_context()  # it reads the two variables itself


def is_loopback_url(url: str) -> bool:
    """Whether ``url``'s host is this machine by its name or address alone
    (``localhost``, ``127.0.0.0/8``, ``::1``); no name is looked up."""
    host = (urlsplit(url).hostname or "").lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def refuse_clear_text(url: str, insecure: bool, opt_in: str) -> None:
    """Refuse to send a token over plain ``http://`` to another machine.

    Raises
    ------
    ConfigError
        For an ``http://`` URL whose host is not loopback, unless ``insecure``;
        the message says how to fix it, and how to opt in (``opt_in``).
    """
    if insecure or not url.startswith("http://") or is_loopback_url(url):
        return
    raise ConfigError(
        f"refusing to send a gpulayer token in clear text to {url} (not this machine);"
        " use the https:// URL and fingerprint `gpulayer up` printed, or"
        f" {opt_in} if this network is trusted"
    )


def mismatch_in(exc: BaseException) -> PinMismatch | None:
    """The :class:`PinMismatch` behind an httpx transport error, if that is the cause."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, PinMismatch):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def mismatch_message(url: str, err: PinMismatch) -> str:
    """What a user reads when the pin does not match."""
    return (
        f"the control plane at {url} presented a TLS certificate with fingerprint {err.seen},"
        f" but {err.expected} was expected (from --fingerprint, GPULAYER_FINGERPRINT or the"
        " saved config); nothing was sent. If the server's certificate was replaced on"
        " purpose, use the fingerprint `gpulayer up` prints now."
    )


# ------------------------------------------------------------------ server


def default_hosts(bind_host: str) -> list[str]:
    """Names and addresses to put in a certificate for a server bound to ``bind_host``."""
    hosts = ["localhost", "127.0.0.1", "::1"]
    if bind_host not in ("", "0.0.0.0", "::"):
        hosts.append(bind_host)
    else:
        hosts += [socket.gethostname(), socket.getfqdn()]
    return list(dict.fromkeys(h for h in hosts if h))


def ensure_certificate(
    directory: str | os.PathLike[str], hosts: Sequence[str], *, days: int = 3650
) -> tuple[Path, Path]:
    """A self-signed certificate and key in ``directory`` (made on first use, kept after).

    The key file is written with mode 0600. Returns ``(cert_file, key_file)``.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    root = Path(directory)
    cert_file, key_file = root / CERT_FILE, root / KEY_FILE
    if cert_file.is_file() and key_file.is_file():
        return cert_file, key_file
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpulayer control plane")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key_pem)
    fd = os.open(cert_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:  # public, but it lives in a data dir that is 0600 throughout
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    return cert_file, key_file
