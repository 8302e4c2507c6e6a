"""Unit tests (no server) of `common.temporal_tls`: the Temporal CLI's TLS variables, read by the
SDK's envconfig, become `Client.connect(tls=...)`; what would weaken or silently drop TLS is
refused, naming the variable."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.service import TLSConfig

from common.temporal_tls import CA, CERT, KEY, NO_HOST_CHECK, TemporalTLSError, temporal_tls


def _pem(tmp_path: Path, name: str) -> str:
    path = tmp_path / name
    path.write_bytes(f"-----BEGIN {name}-----\n".encode())
    return str(path)


def test_nothing_set_is_plain_grpc() -> None:
    assert temporal_tls({}) is False


def test_tls_on_alone_uses_the_system_trust_store() -> None:
    tls = temporal_tls({"TEMPORAL_TLS": "true"})
    assert isinstance(tls, TLSConfig) and tls.server_root_ca_cert is None


def test_the_files_are_read_into_the_connection(tmp_path: Path) -> None:
    env = {
        CA: _pem(tmp_path, "ca"),
        CERT: _pem(tmp_path, "cert"),
        KEY: _pem(tmp_path, "key"),
        "TEMPORAL_TLS_SERVER_NAME": "frontend.temporal",
    }
    tls = temporal_tls(env)
    assert isinstance(tls, TLSConfig)
    assert tls.server_root_ca_cert == b"-----BEGIN ca-----\n"
    assert tls.client_cert == b"-----BEGIN cert-----\n"
    assert tls.client_private_key == b"-----BEGIN key-----\n"
    assert tls.domain == "frontend.temporal"


@pytest.mark.parametrize("only", [CERT, KEY])
def test_a_client_certificate_without_its_key_is_refused(tmp_path: Path, only: str) -> None:
    with pytest.raises(TemporalTLSError, match=f"{CERT} and {KEY} are set together"):
        temporal_tls({only: _pem(tmp_path, "half")})


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_a_file_that_cannot_be_read_is_refused_by_name(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "ca.pem"
    if kind == "directory":
        path.mkdir()
    with pytest.raises(TemporalTLSError, match=f"{CA}={path} cannot be read"):
        temporal_tls({CA: str(path)})


def test_turning_host_verification_off_is_refused() -> None:
    with pytest.raises(TemporalTLSError, match=NO_HOST_CHECK):
        temporal_tls({"TEMPORAL_TLS": "true", NO_HOST_CHECK: "true"})


def test_tls_off_beside_tls_files_is_refused_not_a_silent_plain_connection(tmp_path: Path) -> None:
    with pytest.raises(TemporalTLSError, match="TEMPORAL_TLS=false contradicts"):
        temporal_tls({"TEMPORAL_TLS": "false", CA: _pem(tmp_path, "ca")})
