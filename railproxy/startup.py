"""The rail proxy's start-up guard (FR-29): a switched-off enforcement never meets a real rail.

`RAILPROXY_ENFORCE_FENCING`, `RAILPROXY_ENFORCE_SUBMISSION_GUARD` and `RAILPROXY_VERIFY_GRANTS`
exist for negative controls only. With any of them off the proxy refuses to start unless
`RAILPROXY_EXPERIMENT_MODE=true`, and experiment mode is itself verified rather than believed:
the rail at `RAILPROXY_RAIL_URL` must identify itself as the rail stub (`GET /admin/identity`
answers `{"rail": "stub"}`, an endpoint of the stub that no real rail has). The check runs
before anything else starts (no migration, no pool, no port), and a refusal names the variable
to change. The grant verifier's public keys (`RAILPROXY_GRANT_PUBLIC_KEYS`) are loaded here too,
so a proxy without them never starts. Workers check the proxy's `experiment_mode` in turn before
they run with their own fencing off.

Must never: start with a switch off outside a verified experiment mode; treat an unreachable or
unknown rail as the stub.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from common.credentials import CredentialsError
from lockservice.verifiers import GrantVerifier, verifier_from_settings
from railproxy.errors import StartupRefused
from railproxy.rail import rail_auth_headers
from railproxy.settings import ProxySettings

STUB_IDENTITY = {"rail": "stub"}
_RETRY_S = 0.2


async def check_start(
    settings: ProxySettings, *, transport: httpx.AsyncBaseTransport | None = None
) -> None:
    """Raise `StartupRefused` unless this configuration may start."""
    off = settings.switches_off()
    if off and not settings.experiment_mode:
        raise StartupRefused(
            f"{_listed(off)} is experiment-only (FR-29): refusing to start without "
            "RAILPROXY_EXPERIMENT_MODE=true against the rail stub"
        )
    load_verifier(settings)  # fails before anything starts if the keys are missing or bad
    try:  # the lifespan reads it only after migrating and opening the pool
        rail_auth_headers(settings)
    except CredentialsError as exc:
        raise StartupRefused(f"{exc}; refusing to start") from exc
    if settings.experiment_mode:
        await verify_rail_is_stub(settings, off, transport=transport)


def load_verifier(settings: ProxySettings) -> GrantVerifier | None:
    """The grant verifier (None only with RAILPROXY_VERIFY_GRANTS=false); StartupRefused if the
    public keys are not configured or cannot be read."""
    try:
        return verifier_from_settings(
            settings.verify_grants, settings.grant_public_keys, "RAILPROXY_GRANT_PUBLIC_KEYS"
        )
    except ValueError as exc:
        raise StartupRefused(str(exc)) from exc


async def verify_rail_is_stub(
    settings: ProxySettings,
    off: list[str],
    *,
    transport: httpx.AsyncBaseTransport | None = None,
) -> None:
    """Wait (at most `experiment_verify_s`) for the rail to answer; it must be the stub."""
    why = f"RAILPROXY_EXPERIMENT_MODE=true{f' (with {_listed(off)})' if off else ''}"
    deadline = time.monotonic() + settings.experiment_verify_s
    async with httpx.AsyncClient(
        base_url=settings.rail_url,
        timeout=min(2.0, settings.experiment_verify_s),
        follow_redirects=False,
        transport=transport,
        verify=settings.client_verify(),
        headers=rail_auth_headers(settings),
    ) as http:
        while True:
            try:
                response = await http.get("/admin/identity")
            except httpx.TransportError as exc:
                last = type(exc).__name__  # not listening yet? ask again until the deadline
            else:
                if response.status_code == 200 and _json(response) == STUB_IDENTITY:
                    return
                raise StartupRefused(
                    f"{why} but the rail at {settings.rail_url} is not the rail stub "
                    f"(GET /admin/identity: HTTP {response.status_code}): refusing to start"
                )
            if time.monotonic() >= deadline:
                raise StartupRefused(
                    f"{why} but the rail at {settings.rail_url} could not be verified as the rail "
                    f"stub within {settings.experiment_verify_s:g}s ({last}): refusing to start"
                )
            await asyncio.sleep(_RETRY_S)


def _listed(names: list[str]) -> str:
    return " and ".join(f"{n}=false" for n in names)


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None
