"""The lock server's etcd TLS settings (issue 27 §1): `https://` endpoints are reached only with
the CA that verifies them, and every half-configured or unused TLS file is refused at start-up
with one line naming the variables, as the HTTP TLS settings are (common.tls)."""

from __future__ import annotations

import pytest

from lockservice.server import LockSettings

_HTTPS = "https://127.0.0.1:2379,https://127.0.0.1:2479"


@pytest.fixture(autouse=True)
def _no_etcd_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("ETCD_ENDPOINTS", "LOCK_ETCD_ENDPOINTS", "LOCK_ETCD_CA_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("LOCK_ETCD_CERT_FILE", raising=False)
    monkeypatch.delenv("LOCK_ETCD_KEY_FILE", raising=False)


def test_complete_tls_settings_give_the_client_its_files() -> None:
    """The positive control: https endpoints with a CA, a certificate and its key."""
    s = LockSettings(
        etcd_endpoints=_HTTPS, etcd_ca_file="ca.pem", etcd_cert_file="c.pem", etcd_key_file="c.key"
    )
    assert s.etcd_endpoint_list() == _HTTPS.split(",")
    tls = s.etcd_tls()
    assert tls is not None
    assert (tls.ca_file, tls.cert_file, tls.key_file) == ("ca.pem", "c.pem", "c.key")


def test_plaintext_endpoints_without_files_stay_plaintext() -> None:
    """An external cluster without TLS (http:// or bare host:port) keeps the plain client."""
    s = LockSettings(etcd_endpoints="http://127.0.0.1:2379,127.0.0.1:2479")
    assert s.etcd_endpoint_list() == ["127.0.0.1:2379", "127.0.0.1:2479"]
    assert s.etcd_tls() is None


def test_https_endpoints_without_a_ca_are_refused() -> None:
    with pytest.raises(ValueError, match="are https:// but LOCK_ETCD_CA_FILE is not set"):
        LockSettings(etcd_endpoints=_HTTPS)


def test_a_client_certificate_without_its_key_is_refused() -> None:
    with pytest.raises(ValueError, match="LOCK_ETCD_CERT_FILE and LOCK_ETCD_KEY_FILE are set"):
        LockSettings(etcd_endpoints=_HTTPS, etcd_ca_file="ca.pem", etcd_cert_file="c.pem")
    with pytest.raises(ValueError, match="LOCK_ETCD_CERT_FILE and LOCK_ETCD_KEY_FILE are set"):
        LockSettings(etcd_endpoints=_HTTPS, etcd_ca_file="ca.pem", etcd_key_file="c.key")


def test_tls_files_with_plaintext_endpoints_are_refused() -> None:
    """A CA set for http:// endpoints would protect nothing: the operator meant https://."""
    with pytest.raises(ValueError, match="are not https://: etcd would be reached in plaintext"):
        LockSettings(etcd_endpoints="127.0.0.1:2379", etcd_ca_file="ca.pem")


def test_a_mix_of_https_and_plaintext_endpoints_is_refused() -> None:
    with pytest.raises(ValueError, match="mix https:// and plaintext endpoints"):
        LockSettings(etcd_endpoints="https://127.0.0.1:2379,127.0.0.1:2479", etcd_ca_file="ca.pem")


def test_a_client_certificate_without_a_ca_is_refused() -> None:
    """A certificate alone (no CA, whatever the endpoints) is a mistake to name, not to ignore."""
    with pytest.raises(ValueError, match="LOCK_ETCD_CERT_FILE is set without LOCK_ETCD_CA_FILE"):
        LockSettings(etcd_cert_file="c.pem", etcd_key_file="c.key")
    with pytest.raises(ValueError, match="are not https://: etcd would be reached in plaintext"):
        LockSettings(etcd_endpoints="127.0.0.1:2379", etcd_cert_file="c.pem", etcd_key_file="k")
