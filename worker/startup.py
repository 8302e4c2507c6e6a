"""The worker's start-up refusals (FR-29): fencing or verification off outside a verified
experiment, an unreadable token file, unusable Temporal TLS or grant public keys. Checked before
anything (a port, a pool, a connection) has started.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from common.credentials import CredentialsError, read_token
from common.temporal_tls import TemporalTLSError, temporal_tls
from lockservice.verifiers import GrantVerifier, verifier_from_settings
from railproxy.client import RailProxyClient
from worker.settings import WorkerSettings

__all__ = ["StartupRefused", "check_start", "grant_verifier"]


class StartupRefused(Exception):
    """The worker must not start (FR-29); the message names the variable to change."""


async def check_start(settings: WorkerSettings) -> None:
    """Refuse fencing off outside experiment mode, and experiment mode unless the rail proxy is
    in (verified) experiment mode itself: so a worker with fencing off only ever talks to a
    proxy that talks to the rail stub, never to a real rail. A token file that is set but cannot
    be read is refused here too, before anything (a port, a pool, a connection) has started."""
    for variable, path in (
        ("WORKER_TOKEN_FILE", settings.token_file),
        ("RECONCILE_TOKEN_FILE", settings.reconcile_token_file),
    ):
        try:
            read_token(token_file=path, what=variable)
        except CredentialsError as exc:
            raise StartupRefused(f"{exc}; refusing to start") from exc
    try:
        temporal_tls()
    except TemporalTLSError as exc:
        raise StartupRefused(f"{exc}; refusing to start") from exc
    off = [
        name
        for name, on in (
            ("WORKER_ENFORCE_FENCING", settings.enforce_fencing),
            ("WORKER_VERIFY_GRANTS", settings.verify_grants),
            ("WORKER_VERIFY_OPERATOR_ASSERTIONS", settings.verify_operator_assertions),
        )
        if not on
    ]
    if not settings.experiment_mode:
        if off:
            raise StartupRefused(
                f"{' and '.join(f'{n}=false' for n in off)} is experiment-only (FR-29): refusing "
                "to start without WORKER_EXPERIMENT_MODE=true and a rail proxy in experiment mode"
            )
        grant_verifier(settings)  # the public keys must load, before anything starts
        return
    why = "WORKER_EXPERIMENT_MODE=true"
    if off:
        why += f" (with {' and '.join(f'{n}=false' for n in off)})"
    deadline = time.monotonic() + settings.experiment_verify_s
    verify = settings.client_verify()
    async with RailProxyClient(settings.railproxy_url, read_timeout_s=2.0, verify=verify) as proxy:
        while True:
            try:
                health = await proxy.health()
            except (httpx.TransportError, ValueError) as exc:
                last = type(exc).__name__  # not listening yet? ask again until the deadline
            else:
                if health.get("experiment_mode") is True:
                    grant_verifier(settings)
                    return
                raise StartupRefused(
                    f"{why} but the rail proxy at {settings.railproxy_url} is not in experiment "
                    f"mode (its /health: experiment_mode={health.get('experiment_mode')!r}): "
                    "refusing to start"
                )
            if time.monotonic() >= deadline:
                raise StartupRefused(
                    f"{why} but the rail proxy at {settings.railproxy_url} did not answer within "
                    f"{settings.experiment_verify_s:g}s ({last}): refusing to start"
                )
            await asyncio.sleep(0.2)


def grant_verifier(settings: WorkerSettings) -> GrantVerifier | None:
    """The payment store's grant verifier; None only with WORKER_VERIFY_GRANTS=false."""
    try:
        return verifier_from_settings(
            settings.verify_grants, settings.grant_public_keys, "WORKER_GRANT_PUBLIC_KEYS"
        )
    except ValueError as exc:
        raise StartupRefused(str(exc)) from exc
