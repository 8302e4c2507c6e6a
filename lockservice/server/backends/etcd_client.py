"""The one way this project opens an aetcd client: plaintext or mutual TLS, by the endpoints'
scheme (issue 27 §1).

Owns: `etcd_client(endpoints, tls)` (the gRPC target, one channel over every member, and TLS
when the endpoints are `https://`), `EtcdTLSFiles` (the CA, client certificate and key paths)
and `TlsEtcdClient`. Must never: fall back to plaintext for an `https://` endpoint, open a TLS
channel without the CA that verifies the members, or log a key's bytes.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aetcd
import aetcd.rpc
import aetcd.watcher
import grpc

from lockservice.api import InvalidRequest


@dataclass(frozen=True)
class EtcdTLSFiles:
    """PEM paths: the CA that issued the members' certificates and, for a cluster started with
    `--client-cert-auth`, this client's certificate and key."""

    ca_file: str
    cert_file: str | None = None
    key_file: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: str, what: str) -> bytes:
            try:
                return Path(path).read_bytes()
            except OSError as exc:
                raise InvalidRequest(f"etcd TLS {what} {path}: {exc.strerror}") from None

        if bool(self.cert_file) != bool(self.key_file):
            raise InvalidRequest("an etcd client certificate needs its key, and a key its cert")
        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_file, "CA file"),
            private_key=read(self.key_file, "key file") if self.key_file else None,
            certificate_chain=read(self.cert_file, "certificate file") if self.cert_file else None,
        )


class TlsEtcdClient(aetcd.Client):  # type: ignore[misc]  # aetcd ships no type hints
    """aetcd's client on a TLS channel. aetcd 1.x hard-codes `rpc.insecure_channel` in
    `Client.connect` and has no way to pass credentials (aetcd==1.0.0 is pinned in
    constraints.txt): `connect` below is aetcd's own, with `secure_channel` instead, and without
    its user/password branch, which this project never uses (that branch's RPC is the only
    error aetcd's `_handle_errors` wrapper converted there). Re-check it on an aetcd upgrade."""

    # aetcd's own attributes, as its __init__ sets them (it has no annotations)
    _connected: asyncio.Event
    _is_connecting: bool

    def __init__(self, *, tls: EtcdTLSFiles, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._credentials = tls.credentials()  # read now: a missing file fails at start-up

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        if self._is_connecting:  # another task is connecting: wait for it
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        try:
            self._is_connecting = True
            target = f"{self._host}:{self._port}"
            self.channel = aetcd.rpc.secure_channel(
                target, self._credentials, options=self._options.items()
            )
            self.kvstub = aetcd.rpc.KVStub(self.channel)
            self.clusterstub = aetcd.rpc.ClusterStub(self.channel)
            self.leasestub = aetcd.rpc.LeaseStub(self.channel)
            self.maintenancestub = aetcd.rpc.MaintenanceStub(self.channel)
            self._watcher = aetcd.watcher.Watcher(
                aetcd.rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
            )
            self._connected.set()
        finally:
            self._is_connecting = False


def _is_ipv4(host: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv4Address)
    except ValueError:
        return False


def split_endpoints(endpoints: Sequence[str]) -> tuple[bool, list[tuple[str, int]]]:
    """(TLS?, [(host, port)]): `https://` endpoints are TLS, `http://` and bare host:port are
    plaintext; a mix is refused (one channel, one kind of credentials)."""
    schemes, hosts_ports = set(), []
    for raw in endpoints:
        e = raw.strip()
        if not e:
            continue
        scheme, _, address = e.rpartition("://")
        if scheme not in {"", "http", "https"}:
            raise InvalidRequest(f"etcd endpoint {e!r}: the scheme is neither http nor https")
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            raise InvalidRequest(f"etcd endpoint {e!r} is not [scheme://]host:port")
        schemes.add(scheme == "https")
        hosts_ports.append((host, int(port)))
    if not hosts_ports:
        raise InvalidRequest("no etcd endpoints configured")
    if len(schemes) > 1:
        raise InvalidRequest("etcd endpoints mix https:// with plaintext ones")
    return schemes.pop(), hosts_ports


def etcd_client(
    endpoints: Sequence[str], tls: EtcdTLSFiles | None = None, *, timeout: float | None = None
) -> aetcd.Client:
    """One gRPC channel to the cluster. Several IPv4 endpoints use gRPC's `ipv4:` resolver so
    that the channel fails over between members; otherwise the first endpoint is used.
    `https://` endpoints need `tls`, and plaintext ones refuse it (it would protect nothing)."""
    secure, hosts_ports = split_endpoints(endpoints)
    if secure and tls is None:
        raise InvalidRequest("https:// etcd endpoints need the CA that issued their certificates")
    if not secure and tls is not None:
        raise InvalidRequest("etcd TLS files are given but the endpoints are not https://")
    options: dict[str, Any] = {}
    if len(hosts_ports) > 1 and all(_is_ipv4(h) for h, _ in hosts_ports):
        # aetcd builds the target as f"{host}:{port}"; the last port completes the address list.
        head = ",".join(f"{h}:{p}" for h, p in hosts_ports[:-1])
        host, port = f"ipv4:{head},{hosts_ports[-1][0]}", hosts_ports[-1][1]
        # An `ipv4:` list has no single name for TLS to check: every member's certificate must
        # name the first endpoint's host (the local stack's all carry 127.0.0.1).
        options["grpc.default_authority"] = f"{hosts_ports[0][0]}:{hosts_ports[0][1]}"
    else:
        host, port = hosts_ports[0]
    if tls is None:
        return aetcd.Client(host=host, port=port, timeout=timeout)
    return TlsEtcdClient(host=host, port=port, timeout=timeout, options=options, tls=tls)
