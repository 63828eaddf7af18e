"""Pinned TLS with real processes: a control plane serving HTTPS with a real
self-signed certificate, real `gpulayer join` workers, real handshakes."""

import ipaddress
import os
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import gpulayer as gl
from gpulayer import cli, config, tls
from gpulayer.client import Connection
from gpulayer.cluster import LocalCluster, free_port
from gpulayer.errors import CertificateMismatch, ConfigError, ConnectionFailed

from .conftest import FAST

WRONG = "sha256:" + "ab" * 32


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    """A TLS control plane (forced on loopback) with one worker that joined with the pin."""
    with LocalCluster(tmp_path_factory.mktemp("tls"), tls=True, workers=1, **FAST) as c:
        yield c


def test_join_and_connect_succeed_with_the_right_pin(tls_cluster, tmp_path):
    assert tls_cluster.url.startswith("https://")
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", tls_cluster.fingerprint)
    key = tls_cluster.data_dir / "tls" / "key.pem"
    assert key.stat().st_mode & 0o777 == 0o600
    (tmp_path / "data.txt").write_text("shipped over TLS\n")
    with tls_cluster.connection() as conn:
        assert conn.health().workers_ready == 1
        job = gl.submit(["cat", "data.txt"], workdir=tmp_path, connection=conn).wait(timeout=30)
        assert job.state == "succeeded", job.info.reason
        assert job.logs()[-1] == "shipped over TLS"
        assert conn.channel_open  # the wait went over the channel: wss:// with the pin
    # the same pin in other spellings (upper case, colons) is the same pin
    hexpin = tls_cluster.fingerprint.removeprefix("sha256:").upper()
    colons = ":".join(hexpin[i : i + 2] for i in range(0, 64, 2))
    with Connection(tls_cluster.url, tls_cluster.admin_token, fingerprint=colons) as conn:
        assert conn.health().status == "ok"


def test_a_wrong_pin_fails_clearly_before_anything_is_sent(tls_cluster, capsys):
    conn = Connection(tls_cluster.url, tls_cluster.admin_token, fingerprint=WRONG)
    with conn, pytest.raises(CertificateMismatch) as info:
        conn.jobs()
    msg = info.value.message
    assert WRONG in msg and tls_cluster.fingerprint in msg and "nothing was sent" in msg
    argv = ["--url", tls_cluster.url, "--token", tls_cluster.admin_token,
            "--fingerprint", WRONG, "jobs"]  # fmt: skip
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("gpulayer: error: ") and tls_cluster.fingerprint in err


def test_join_with_a_wrong_pin_exits_with_the_reason(tls_cluster):
    env = {**os.environ, "GPULAYER_JOIN_TOKEN": tls_cluster.join_token}
    proc = subprocess.run(
        [sys.executable, "-m", "gpulayer", "join", tls_cluster.url, "--fingerprint", WRONG,
         "--name", "intruder", "--data-dir", str(tls_cluster.data_dir / "intruder")],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.startswith("gpulayer: error: ")
    assert WRONG in proc.stderr and tls_cluster.fingerprint in proc.stderr
    with tls_cluster.connection() as conn:
        assert "intruder" not in {w.name for w in conn.workers()}


def test_without_a_pin_the_self_signed_certificate_is_refused(tls_cluster):
    conn = Connection(tls_cluster.url, tls_cluster.admin_token)
    with conn, pytest.raises(ConnectionFailed, match="CERTIFICATE_VERIFY_FAILED"):
        conn.health()


def test_plain_http_is_refused_when_tls_is_on(tls_cluster):
    plain = tls_cluster.url.replace("https://", "http://", 1)
    with Connection(plain, tls_cluster.admin_token) as conn, pytest.raises(ConnectionFailed):
        conn.health()
    with pytest.raises(ConfigError, match="not https"):
        Connection(plain, tls_cluster.admin_token, fingerprint=tls_cluster.fingerprint)


def test_the_pin_comes_from_the_environment_or_the_saved_config(tls_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAYER_CONFIG", str(tmp_path / "connection.json"))
    for var in ("GPULAYER_URL", "GPULAYER_TOKEN", "GPULAYER_FINGERPRINT"):
        monkeypatch.delenv(var, raising=False)
    saved = config.ConnectionConfig(
        url=tls_cluster.url, token=tls_cluster.admin_token, fingerprint=tls_cluster.fingerprint
    )
    config.save(saved)
    conn = gl.connect()
    assert conn.health().status == "ok"
    conn.close()
    monkeypatch.setenv("GPULAYER_FINGERPRINT", WRONG)  # the environment wins over the file
    with pytest.raises(CertificateMismatch):
        gl.connect()


def _ca_signed(directory: Path) -> tuple[Path, Path, Path]:
    """A test CA and a server certificate for 127.0.0.1 signed by it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder().subject_name(name("gpulayer test CA")).issuer_name(
            name("gpulayer test CA")).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                       critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder().subject_name(name("127.0.0.1")).issuer_name(ca.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    pem = serialization.Encoding.PEM
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(cert.public_bytes(pem))
    paths[2].write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))  # fmt: skip
    return paths


def test_a_ca_signed_certificate_works_without_a_pin(tmp_path, monkeypatch):
    ca, cert, key = _ca_signed(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))  # the "system" CA bundle of this test
    with LocalCluster(tmp_path / "ca", certfile=cert, keyfile=key, workers=1, **FAST) as c:
        assert c.url.startswith("https://") and c.fingerprint is None
        with Connection(c.url, c.admin_token) as conn:
            assert conn.health().workers_ready == 1
            assert gl.submit("true", connection=conn).wait(timeout=60).state == "succeeded"
            assert conn.channel_open  # wss:// checked against the CA bundle


def test_gpulayer_up_off_loopback_is_tls_on_and_prints_the_pin(tmp_path):
    env = {**os.environ, "GPULAYER_CONFIG": str(tmp_path / "connection.json")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpulayer", "up", "--host", "0.0.0.0", "--port", str(free_port()),
         "--data-dir", str(tmp_path / "data"), "--local-workers", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip
    out = []
    try:
        deadline = time.monotonic() + 60
        assert proc.stdout is not None
        for line in proc.stdout:
            out.append(line)
            if line.startswith("gpulayer is up") or time.monotonic() > deadline:
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    text = "".join(out)
    pin = tls.fingerprint_of_file(tmp_path / "data" / "tls" / "cert.pem")
    assert "https://" in text and f"TLS certificate: {pin}" in text, text
    # The join token is exported, never on the join command line (`ps` shows argv).
    assert re.search(r"^  export GPULAYER_JOIN_TOKEN=gl_\S+$", text, re.MULTILINE), text
    assert re.search(rf"^  gpulayer join https://\S+ --fingerprint {pin}$", text, re.MULTILINE)
    assert "--token" not in text
    assert f'fingerprint="{pin}"' in text
    assert config.load(tmp_path / "connection.json").fingerprint == pin


def test_token_cli_create_list_revoke_over_pinned_tls(tls_cluster, capsys):
    base = ["--url", tls_cluster.url, "--token", tls_cluster.admin_token,
            "--fingerprint", tls_cluster.fingerprint]  # fmt: skip
    assert (
        cli.main(["token", "create", "ada", "--role", "submitter", "--expires", "30d", *base]) == 0
    )
    out, err = capsys.readouterr()
    secret = out.strip()
    assert secret.startswith("gl_") and "shown only this once" in err
    assert cli.main(["token", "list", *base]) == 0
    listing = capsys.readouterr().out
    assert "ada" in listing and "submitter" in listing and secret not in listing
    mine = ["--url", tls_cluster.url, "--token", secret, "--fingerprint", tls_cluster.fingerprint]
    assert cli.main(["jobs", *mine]) == 0
    assert cli.main(["token", "list", *mine]) == 1  # a submitter may not manage tokens
    assert "may not" in capsys.readouterr().err
    assert cli.main(["token", "revoke", "ada", *base]) == 0
    capsys.readouterr()
    assert cli.main(["jobs", *mine]) == 1
    assert "revoked" in capsys.readouterr().err
