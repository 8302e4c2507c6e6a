"""The lock server signs every grant it issues and the SDK carries the signature (INV-07).

A real lock server (uvicorn + FastAPI) over both real backends, signing with the test key; the
enforcement points' verifier (public key only) checks what the SDK hands out.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from lockservice.api import LockBackend
from lockservice.sdk import LockClient
from lockservice.server import create_app
from lockservice.verifiers import TokenMismatch
from tests.grants import grant_signer, grant_verifier
from tests.lockservice import server_fixtures as _fx
from tests.lockservice.server_fixtures import serve_app

real_backend = _fx.real_backend  # fixture


@pytest.fixture
async def signing_server(real_backend: LockBackend) -> AsyncIterator[str]:
    async with serve_app(create_app(real_backend, signer=grant_signer())) as url:
        yield url


async def test_acquired_and_renewed_grants_verify_with_the_public_key(
    signing_server: str, key_prefix: str
) -> None:
    """The acquire's grant verifies offline; a grant presented near its stated expiry is renewed
    first and the renewed statement (later expiry, new signature) verifies too."""
    key = f"{key_prefix}payout:signed"
    verifier = grant_verifier()
    async with LockClient(signing_server, ttl_s=5, heartbeat_s=1) as locks:
        lease = await locks.acquire(key, wait_s=2)
        try:
            first = lease.signed
            assert first is not None and first.kid == grant_signer().kid
            assert (first.key, first.token) == (key, lease.token)
            assert verifier.verify(first, key=key, token=lease.token) == first
            with pytest.raises(TokenMismatch):
                verifier.verify(first, key=key, token=lease.token + 1)
            # Fresh: presented as is, no renew.
            assert await lease.signed_grant() is first
            # Close to its stated expiry (within ttl x margin): renewed before it is presented.
            near = first.expires_at - timedelta(seconds=0.5)
            renewed = await lease.signed_grant(now=near)
            assert renewed is not None and renewed is not first
            assert renewed.token == first.token and renewed.expires_at >= first.expires_at
            assert verifier.verify(renewed, key=key, token=lease.token) == renewed
        finally:
            await locks.release(lease)
