"""The verifying context clients share (``tls.for_httpx``): made once, still verifying,
and following ``SSL_CERT_FILE``; none loaded for a clear-text URL."""

import ssl
from pathlib import Path

import pytest

from gpulayer import tls


def test_clients_share_one_verifying_context(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    first = tls.for_httpx(True, "https://gpu-box:8888/")
    assert isinstance(first, ssl.SSLContext)
    # Shared, not loaded again for the next client; and it still checks the peer.
    assert tls.for_httpx(True, "https://other:8888/") is first
    assert first.verify_mode == ssl.CERT_REQUIRED and first.check_hostname


def test_a_pin_or_no_verification_passes_through() -> None:
    pinned = tls.pinned_context("sha256:" + "ab" * 32)
    assert tls.for_httpx(pinned, "https://gpu-box:8888/") is pinned
    assert tls.for_httpx(False, "https://gpu-box:8888/") is False


def test_a_clear_text_url_loads_no_ca_bundle_and_would_trust_no_certificate() -> None:
    # A client of http:// uses no TLS; what httpx gets still verifies, against nothing.
    context = tls.for_httpx(True, "http://127.0.0.1:8888/")
    assert isinstance(context, ssl.SSLContext)
    assert context is not tls.default_context()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.cert_store_stats()["x509"] == 0


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
