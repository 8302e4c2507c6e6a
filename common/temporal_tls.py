"""TLS to Temporal's frontend (issue 27 §1), for every process of ours that connects to it.

Owns: reading the connection's TLS from the Temporal CLI's own environment variables, through the
SDK's `temporalio.envconfig` (the same parser the CLI's settings follow), so that one set of
exports serves `temporal` and `payouts` alike and a worker is configured as either is:
`TEMPORAL_TLS` (true: TLS with the system's trust store), `TEMPORAL_TLS_SERVER_CA_CERT_PATH`,
`TEMPORAL_TLS_CLIENT_CERT_PATH` + `TEMPORAL_TLS_CLIENT_KEY_PATH` (mutual TLS, as Temporal Cloud
and a self-hosted frontend with `requireClientAuth` ask), `TEMPORAL_TLS_SERVER_NAME`. None of them
set: plain gRPC (the dev server of the local stack and of compose has no TLS at all,
docs/security.md). Refused, naming the variable: a certificate without its key, a file that cannot
be read, and `TEMPORAL_TLS_DISABLE_HOST_VERIFICATION` (the SDK would silently ignore it; we never
turn verification off).
Must never: put a key's bytes into a message, or fall back to plain gRPC when TLS was asked for.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from temporalio.envconfig import ClientConfigProfile
from temporalio.service import TLSConfig

#: The Temporal CLI's variables (`temporal options`), read by the SDK's envconfig.
CA = "TEMPORAL_TLS_SERVER_CA_CERT_PATH"
CERT = "TEMPORAL_TLS_CLIENT_CERT_PATH"
KEY = "TEMPORAL_TLS_CLIENT_KEY_PATH"
NO_HOST_CHECK = "TEMPORAL_TLS_DISABLE_HOST_VERIFICATION"
#: Every variable `temporal_tls` reads (itself or through envconfig): the deployments' contract
#: (tests/deploy/envcontract.py) takes it from here.
VARIABLES = ("TEMPORAL_TLS", CA, CERT, KEY, "TEMPORAL_TLS_SERVER_NAME", NO_HOST_CHECK)


class TemporalTLSError(ValueError):
    """The Temporal TLS settings are incomplete or refused; the message names the variable."""


def temporal_tls(env: Mapping[str, str] | None = None) -> bool | TLSConfig:
    """`Client.connect(tls=...)` from `env` (default: this process's environment)."""
    env = dict(os.environ if env is None else env)
    if env.get(NO_HOST_CHECK, "").strip().lower() in ("1", "true", "yes", "on"):
        raise TemporalTLSError(
            f"{NO_HOST_CHECK}=true is refused: the server's name is always checked"
        )
    files = [name for name in (CA, CERT, KEY) if env.get(name)]
    if files and env.get("TEMPORAL_TLS", "").strip().lower() in ("0", "false", "no", "off"):
        raise TemporalTLSError(f"TEMPORAL_TLS=false contradicts {', '.join(files)}: unset one")
    if bool(env.get(CERT)) != bool(env.get(KEY)):
        raise TemporalTLSError(f"{CERT} and {KEY} are set together or not at all")
    for name in (CA, CERT, KEY):
        path = env.get(name)
        if path and not (os.path.isfile(path) and os.access(path, os.R_OK)):
            raise TemporalTLSError(f"{name}={path} cannot be read")
    # No config file: only the environment decides (a stray ~/.config/temporal profile must not).
    profile = ClientConfigProfile.load(disable_file=True, override_env_vars=env)
    if profile.tls is None:
        return False
    return profile.tls.to_connect_tls_config()
