"""TLS in transit (issue 27 §1): the settings every server and client takes, and the
`ssl.SSLContext` each one builds from them.

Owns: the per-component TLS settings, mixed into each component's pydantic settings under its
own prefix (`<PREFIX>_TLS_CERT_FILE` / `<PREFIX>_TLS_KEY_FILE` for a server, `<PREFIX>_TLS_CA_FILE`
/ `<PREFIX>_TLS_VERIFY` for a client; docs/security.md, "Encryption in transit"), the refusal of a
client that turns verification off outside experiment mode (the FR-29 pattern), and the server
and client contexts. A client context always verifies the server's chain against the given CA
and checks its host name. The certificates themselves are issued elsewhere (`stack.pki` for the
local stack, the deployment's own CA in production).
Must never: issue a certificate, read a private key's bytes into a log or an error, or build a
client context without verification unless the settings passed their experiment-mode check.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

from pydantic import model_validator
from pydantic_settings import BaseSettings


class TLSSettingsError(ValueError):
    """A TLS setting is incomplete or refused; the message names the variable."""


def server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server context presenting `cert_file` (the chain, PEM) with `key_file`, TLS 1.2+."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    return ctx


def client_context(
    ca_file: str, *, cert_file: str | None = None, key_file: str | None = None
) -> ssl.SSLContext:
    """A client context that trusts only `ca_file`, checks the host name (the default of
    `create_default_context`, kept on) and, given both, presents a client certificate."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    assert ctx.check_hostname and ctx.verify_mode is ssl.CERT_REQUIRED
    if cert_file and key_file:
        ctx.load_cert_chain(cert_file, key_file)
    return ctx


def uvicorn_ssl(cert_file: str | None, key_file: str | None) -> dict[str, Any]:
    """uvicorn's keyword arguments: TLS only with both files, nothing (plain HTTP) with neither."""
    if not cert_file and not key_file:
        return {}
    if not cert_file or not key_file:
        raise TLSSettingsError("a server's TLS needs both its certificate and its key file")
    for path in (cert_file, key_file):
        if not Path(path).is_file():
            raise TLSSettingsError(f"TLS file {path} does not exist")
    return {"ssl_certfile": cert_file, "ssl_keyfile": key_file}


def _prefix(model: BaseSettings) -> str:
    return str(model.model_config.get("env_prefix") or "")


class ServerTLS(BaseSettings):
    """A server's certificate and key (PEM paths): both set, it serves TLS only; neither, plain
    HTTP (a deployment whose mesh terminates TLS). One without the other is refused."""

    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    @model_validator(mode="after")
    def _both_or_neither(self) -> ServerTLS:
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            p = _prefix(self)
            raise TLSSettingsError(
                f"{p}TLS_CERT_FILE and {p}TLS_KEY_FILE are set together or not at all"
            )
        return self

    def uvicorn_ssl(self) -> dict[str, Any]:
        return uvicorn_ssl(self.tls_cert_file, self.tls_key_file)


class ClientTLS(BaseSettings):
    """What a client trusts: `tls_ca_file` (PEM), or the system's trust store when unset.
    `tls_verify=false` (no verification at all) is refused unless the component's own
    `experiment_mode` setting is true: the FR-29 pattern of the fencing switches."""

    tls_ca_file: str | None = None
    tls_verify: bool = True

    @model_validator(mode="after")
    def _verification_off_only_in_experiments(self) -> ClientTLS:
        if not self.tls_verify and not getattr(self, "experiment_mode", False):
            p = _prefix(self)
            raise TLSSettingsError(
                f"{p}TLS_VERIFY=false (no server verification) is refused outside experiment "
                f"mode (FR-29): set {p}TLS_CA_FILE to the CA that issued the server's certificate"
            )
        return self

    def client_verify(self) -> ssl.SSLContext | bool:
        """httpx's `verify=`: a context trusting the CA file, True (the system's store, or
        SSL_CERT_FILE) without one, False only when the experiment check above passed."""
        if not self.tls_verify:
            return False
        if self.tls_ca_file:
            return client_context(self.tls_ca_file)
        return True
