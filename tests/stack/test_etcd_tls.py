"""The local stack's etcd over mutual TLS (issue 27 §1): a real three-member cluster started as
the stack starts its members (`--client-cert-auth`, `--peer-client-cert-auth`, https client and
peer URLs, certificates from `stack.pki`), probed by the clients the project uses.

The first test is the positive control of every refusal after it: the same cluster, the same
endpoints, only the client's credentials differ.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import aetcd
import aetcd.exceptions
import pytest

from lockservice.api import Grant
from lockservice.server import EtcdTLSFiles, create_backend, etcd_client
from stack.embedded.etcd import EmbeddedEtcd, EtcdMember
from stack.pki import StackPKI, StackTLS, issue_stack_tls

pytestmark = pytest.mark.timeout(120)
_MEMBERS = ("m0", "m1", "m2")
#: Long enough for a healthy TLS round trip on a busy 2-core machine, short for a refusal.
_TIMEOUT_S = 5


@pytest.fixture(scope="module")
def etcd_tls(tmp_path_factory: pytest.TempPathFactory) -> StackTLS:
    return issue_stack_tls(tmp_path_factory.mktemp("etcd-tls"), etcd_members=_MEMBERS)


@pytest.fixture(scope="module")
def tls_etcd(etcd_tls: StackTLS, run_dir: Path) -> Iterator[EmbeddedEtcd]:
    base = run_dir / f"etcd-tls-{uuid.uuid4().hex[:8]}"
    members = [EtcdMember(m, base / m, tls=etcd_tls.etcd_member(m)) for m in _MEMBERS]
    cluster = EmbeddedEtcd(base_dir=base, members=members)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
async def stack_client(tls_etcd: EmbeddedEtcd, etcd_tls: StackTLS) -> AsyncIterator[aetcd.Client]:
    async with etcd_client(
        tls_etcd.endpoints, etcd_tls.etcd_client("stack"), timeout=_TIMEOUT_S
    ) as client:
        yield client


async def test_a_client_with_the_stacks_certificate_reads_and_writes(
    stack_client: aetcd.Client, tls_etcd: EmbeddedEtcd, key_prefix: str
) -> None:
    """Through one channel over all three members (the `ipv4:` target the lock server uses): a
    put and a get, and the members found each other over their https peer URLs."""
    assert all(e.startswith("https://127.0.0.1:") for e in tls_etcd.endpoints)
    await stack_client.put(f"{key_prefix}probe".encode(), b"1")
    got = await stack_client.get(f"{key_prefix}probe".encode())
    assert got is not None and got.value == b"1"
    peers = sorted(u for m in await _members(stack_client) for u in m.peer_urls)
    assert peers == sorted(m.peer_url for m in tls_etcd.members)
    assert all(u.startswith("https://") for u in peers)


def client_of(cluster: EmbeddedEtcd, tls: EtcdTLSFiles) -> aetcd.Client:
    return etcd_client(cluster.endpoints, tls, timeout=_TIMEOUT_S)


async def _members(client: aetcd.Client) -> list[aetcd.members.Member]:
    return [m async for m in client.members()]


async def _refused(client: aetcd.Client, key_prefix: str, why: str) -> None:
    """The first RPC fails, for the reason `why` (a regex of gRPC's message) names."""
    with pytest.raises(aetcd.exceptions.ConnectionFailedError, match=why):
        async with client:
            await client.put(f"{key_prefix}refused".encode(), b"x")


async def test_a_plaintext_grpc_client_is_refused(tls_etcd: EmbeddedEtcd, key_prefix: str) -> None:
    member = tls_etcd.members[0]
    plain = aetcd.Client(host="127.0.0.1", port=member.client_port, timeout=_TIMEOUT_S)
    await _refused(plain, key_prefix, "UNAVAILABLE.*Socket closed")


async def test_a_client_certificate_from_another_ca_is_refused(
    tls_etcd: EmbeddedEtcd, etcd_tls: StackTLS, tmp_path: Path, key_prefix: str
) -> None:
    """The client verifies etcd (the stack's CA) but presents a certificate etcd did not sign."""
    stranger = StackPKI(tmp_path / "other-ca").issue("lock-server")
    tls = replace(
        etcd_tls.etcd_client("lock-server"),
        cert_file=str(stranger.cert),
        key_file=str(stranger.key),
    )
    await _refused(client_of(tls_etcd, tls), key_prefix, "BAD_CERTIFICATE")


async def test_a_tls_client_without_a_client_certificate_is_refused(
    tls_etcd: EmbeddedEtcd, etcd_tls: StackTLS, key_prefix: str
) -> None:
    tls = EtcdTLSFiles(ca_file=str(etcd_tls.ca_file))
    await _refused(client_of(tls_etcd, tls), key_prefix, "BAD_CERTIFICATE")


async def test_a_client_that_trusts_another_ca_refuses_etcd(
    tls_etcd: EmbeddedEtcd, etcd_tls: StackTLS, tmp_path: Path, key_prefix: str
) -> None:
    other_ca = StackPKI(tmp_path / "other-ca").ensure_ca()
    tls = replace(etcd_tls.etcd_client("stack"), ca_file=str(other_ca))
    await _refused(client_of(tls_etcd, tls), key_prefix, "CERTIFICATE_VERIFY_FAILED")


async def test_the_lock_backend_acquires_and_releases_over_tls(
    tls_etcd: EmbeddedEtcd, etcd_tls: StackTLS, key_prefix: str
) -> None:
    backend = await create_backend(
        "etcd",
        etcd_endpoints=tls_etcd.endpoints,
        prefix=key_prefix,
        etcd_tls=etcd_tls.etcd_client("lock-server"),
    )
    try:
        session = await backend.open_session(ttl_s=10)
        grant = await backend.acquire(session.session_id, "payout:tls", wait_s=0)
        assert isinstance(grant, Grant) and grant.token > 0
        await backend.release(grant)
        await backend.close_session(session.session_id)
    finally:
        await backend.close()


def test_https_endpoints_without_tls_files_are_refused(tls_etcd: EmbeddedEtcd) -> None:
    """The one client helper never reaches an https:// endpoint in plaintext."""
    from lockservice.api import InvalidRequest

    with pytest.raises(InvalidRequest, match="need the CA"):
        etcd_client(tls_etcd.endpoints)
