"""The verifying context clients share (``tls.for_httpx``): made once, still verifying,
and following ``SSL_CERT_FILE``."""

import ssl
from pathlib import Path

import pytest

from gpulayer import tls


def test_clients_share_one_verifying_context(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    first = tls.for_httpx(True)
    assert isinstance(first, ssl.SSLContext)
    # Shared, not loaded again for the next client; and it still checks the peer.
    assert tls.for_httpx(True) is first
    assert first.verify_mode == ssl.CERT_REQUIRED and first.check_hostname


def test_a_pin_or_no_verification_passes_through() -> None:
    pinned = tls.pinned_context("sha256:" + "ab" * 32)
    assert tls.for_httpx(pinned) is pinned
    assert tls.for_httpx(False) is False


def test_a_ca_bundle_named_later_is_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    before = tls.default_context()
    cert, _ = tls.ensure_certificate(tmp_path, ["localhost"])
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    after = tls.default_context()
    assert after is not before
    # The context now holds that one certificate, not the default bundle.
    assert before.cert_store_stats()["x509"] > 1
    assert after.cert_store_stats()["x509"] == 1
