"""The local stack's private CA and one certificate per component (issue 27 §1).

Owns: issuing, with the `cryptography` package, a CA (`ca.pem`, its key `ca.key` 0600) kept
across runs like the grant-signing key, and a server certificate per component
(`<name>.pem`/`<name>.key`) for 127.0.0.1, localhost and the component's name, also usable as a
client certificate; for etcd (mutual TLS, client and peer), a certificate per member that it
serves to clients and presents to its peers, and a client certificate for each of its clients
(the lock server's, and the stack's own: its leader checks, the local Prometheus, the operator's
shell); for PostgreSQL, the certificate its TLS front serves (stack.pgtls); and the building
of every certificate of the project (`ca_certificate`, `leaf_certificate`, the key and
certificate writers), which the GKE deployment's script (deploy/k8s_tls.py) issues through with
its own names, lifetimes and usages. Must never: be imported by a component (production
certificates come from the deployment's CA), hand a CA key to any process, or issue a
certificate without the SANs its clients check.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from common.tls import client_context
from stack.embedded.etcd import EtcdMemberTLS
from stack.embedded.postgres import PostgresTLS

if TYPE_CHECKING:
    from lockservice.server import EtcdTLSFiles

#: A local stack's certificates outlive any run; a CA a year longer than what it signs.
_CERT_DAYS = 365
_CA_DAYS = 2 * 365


@dataclass(frozen=True)
class CertFiles:
    """One issued certificate: `cert` (PEM) and its private key `key` (PEM, 0600)."""

    cert: Path
    key: Path


# ---------------------------------------------------------------- certificate building
# The one place that builds certificates: the local stack's CA below, and the GKE deployment's
# (deploy/k8s_tls.py, with its own names, lifetimes and usages) both issue through these.


def new_key() -> ec.EllipticCurvePrivateKey:
    """A fresh P-256 private key (every certificate of the project has its own)."""
    return ec.generate_private_key(ec.SECP256R1())


def subject(organization: str, common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        key_cert_sign=ca,
        crl_sign=ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        encipher_only=False,
        decipher_only=False,
    )


def ca_certificate(
    key: ec.EllipticCurvePrivateKey, name: x509.Name, *, days: int
) -> x509.Certificate:
    """A self-signed CA certificate for `key`, valid `days` (from five minutes ago: clock skew),
    that signs leaf certificates only (path length 0)."""
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )


def leaf_certificate(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    key: ec.EllipticCurvePrivateKey,
    name: x509.Name,
    *,
    dns: Sequence[str] = (),
    ips: Sequence[str] = (),
    server: bool,
    client: bool,
    days: int,
) -> x509.Certificate:
    """A certificate for `key` signed by the CA, for exactly the names its clients check (`dns`,
    `ips`; none: a client certificate only) and exactly the usages given (serves, is presented
    as a client), valid `days` from five minutes ago."""
    now = datetime.datetime.now(datetime.UTC)
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
    usages += [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
    )
    sans: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(a)) for a in ips]
    sans += [x509.DNSName(n) for n in dns]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def load_ca(cert_file: Path, key_file: Path) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A CA's key and certificate, as `write_private_key` and `write_certificate` left them."""
    ca_key = serialization.load_pem_private_key(key_file.read_bytes(), None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{key_file} is not an EC key")
    return ca_key, x509.load_pem_x509_certificate(cert_file.read_bytes())


def write_private_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """`key` as PEM, readable by its owner only (0600), replacing any earlier one at once."""
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)  # created below with 0600, never with an earlier file's mode
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    tmp.replace(path)  # atomic: a reader sees the old key or the new one, never half of one


def write_certificate(path: Path, cert: x509.Certificate) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    tmp.replace(path)


#: The local stack's certificates' organisation (deploy/k8s_tls.py names the GKE deployment's).
_ORGANIZATION = "fenced-payouts local stack"


def _name(common_name: str) -> x509.Name:
    return subject(_ORGANIZATION, common_name)


class StackPKI:
    """A CA under `directory`, created on first use and reused after, and the certificates it
    issues there. `StackPKI(d).issue("lock-server")` -> CertFiles under d."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ca_file = directory / "ca.pem"
        self._ca_key_file = directory / "ca.key"

    def ensure_ca(self) -> Path:
        """The CA certificate's path, creating the CA if there is none yet."""
        if self.ca_file.exists() and self._ca_key_file.exists():
            return self.ca_file
        self.directory.mkdir(parents=True, exist_ok=True)
        key = new_key()
        name = _name(f"fenced-payouts local CA {self.directory.resolve()}"[:64])
        write_private_key(self._ca_key_file, key)
        write_certificate(self.ca_file, ca_certificate(key, name, days=_CA_DAYS))
        return self.ca_file

    def postgres_tls(self) -> PostgresTLS:
        """A fresh certificate for a PostgreSQL TLS front (stack.pgtls) in this CA's directory,
        with the CA its clients verify it against: a server outside a stack (the tests' own,
        the benchmarks')."""
        files = self.issue(POSTGRES)
        return PostgresTLS(self.ca_file, files.cert, files.key)

    def issue(self, name: str, *, extra_hosts: tuple[str, ...] = ()) -> CertFiles:
        """`issue_to` this CA's own directory."""
        return self.issue_to(self.directory, name, extra_hosts=extra_hosts)

    def issue_to(
        self, directory: Path, name: str, *, extra_hosts: tuple[str, ...] = ()
    ) -> CertFiles:
        """A fresh certificate for component `name` valid for 127.0.0.1, localhost, `name` and
        `extra_hosts`, for server and client authentication, signed by the CA."""
        self.ensure_ca()
        ca_key, ca_cert = load_ca(self.ca_file, self._ca_key_file)
        key = new_key()
        hosts = tuple(dict.fromkeys(("localhost", name, *extra_hosts)))
        cert = leaf_certificate(
            ca_key,
            ca_cert,
            key,
            _name(name),
            dns=hosts,
            ips=("127.0.0.1",),
            server=True,
            client=True,
            days=_CERT_DAYS,
        )
        files = CertFiles(directory / f"{name}.pem", directory / f"{name}.key")
        write_private_key(files.key, key)
        write_certificate(files.cert, cert)
        return files


#: Every HTTP server of the stack: a certificate each (server and client authentication); the
#: workers (one certificate for all) and the outbox publishers serve their /metrics and /health.
SERVERS = ("lock-server", "railstub", "railproxy", "finledger", "worker", "outbox")
#: The embedded PostgreSQL's TLS front (stack.pgtls); every node of a replicated pair serves it.
POSTGRES = "postgres"
#: etcd's clients, a client certificate each: the lock server, and the stack itself (its
#: leader checks, the local Prometheus scraping etcd's /metrics, the operator's etcdctl).
ETCD_CLIENTS = ("lock-server", "stack")


def _etcd_member_cert(member: str) -> str:
    return f"etcd-{member}"


def _etcd_client_cert(client: str) -> str:
    return f"etcd-client-{client}"


@dataclass(frozen=True)
class StackTLS:
    """The CA and the certificates of one stack, and the variables that hand them out."""

    ca_file: Path
    certs: dict[str, CertFiles]

    def server_env(self, prefix: str, name: str) -> dict[str, str]:
        """`<prefix>TLS_CERT_FILE`/`<prefix>TLS_KEY_FILE` of component `name` (common.tls)."""
        files = self.certs[name]
        return {f"{prefix}TLS_CERT_FILE": str(files.cert), f"{prefix}TLS_KEY_FILE": str(files.key)}

    def client_env(self, prefix: str) -> dict[str, str]:
        """`<prefix>TLS_CA_FILE`: the client verifies every server against the stack's CA."""
        return {f"{prefix}TLS_CA_FILE": str(self.ca_file)}

    def client_context(self) -> ssl.SSLContext:
        return client_context(str(self.ca_file))

    def postgres(self) -> PostgresTLS:
        """What the embedded PostgreSQL's TLS front presents, and the CA its clients verify."""
        files = self.certs[POSTGRES]
        return PostgresTLS(self.ca_file, files.cert, files.key)

    @property
    def has_etcd(self) -> bool:
        """Whether etcd's certificates were issued (an embedded etcd with TLS)."""
        return _etcd_client_cert("stack") in self.certs

    def etcd_member(self, member: str) -> EtcdMemberTLS:
        """Member `member`'s certificate, served to clients and presented to peers, and the CA
        every client and peer certificate must chain to."""
        files = self.certs[_etcd_member_cert(member)]
        return EtcdMemberTLS(self.ca_file, files.cert, files.key)

    def etcd_client(self, client: str) -> EtcdTLSFiles:
        """The TLS files an etcd client `client` (of ETCD_CLIENTS) connects with."""
        from lockservice.server import EtcdTLSFiles  # aetcd and grpc: not at import

        files = self.certs[_etcd_client_cert(client)]
        return EtcdTLSFiles(str(self.ca_file), str(files.cert), str(files.key))

    def etcd_client_env(self, prefix: str, client: str) -> dict[str, str]:
        """`<prefix>ETCD_CA_FILE`/`_CERT_FILE`/`_KEY_FILE` (lockservice.server.settings)."""
        files = self.etcd_client(client)
        return {
            f"{prefix}ETCD_CA_FILE": files.ca_file,
            f"{prefix}ETCD_CERT_FILE": str(files.cert_file),
            f"{prefix}ETCD_KEY_FILE": str(files.key_file),
        }


def issue_stack_tls(
    directory: Path, ca_dir: Path | None = None, *, etcd_members: Sequence[str] = ()
) -> StackTLS:
    """The CA under `ca_dir` (default `directory`; kept across runs) and a fresh certificate
    per entry of SERVERS and for PostgreSQL under `directory`; with `etcd_members`, one per
    member and one per entry of ETCD_CLIENTS too."""
    pki = StackPKI(ca_dir or directory)
    pki.ensure_ca()
    directory.mkdir(parents=True, exist_ok=True)
    names = [*SERVERS, POSTGRES]
    if etcd_members:
        names += [_etcd_member_cert(m) for m in etcd_members]
        names += [_etcd_client_cert(c) for c in ETCD_CLIENTS]
    certs = {name: pki.issue_to(directory, name) for name in names}
    return StackTLS(pki.ca_file, certs)


#: A driver's CA folder (lab commands, benches) when PAYOUTS_TLS_CA_DIR does not name one.
DRIVER_CA_DIR = Path(".run/tls-ca")


def trust_stack_ca_in_this_process(default_dir: Path = DRIVER_CA_DIR) -> Path:
    """For a process that drives local stacks and talks to them (the demo, chaos, the benches):
    every stack it starts takes its CA from one folder (PAYOUTS_TLS_CA_DIR, set here to
    `default_dir` when unset) and this process's own httpx clients trust that CA through
    SSL_CERT_FILE, as an operator's shell does after sourcing a stack's env file. Stack
    children never inherit SSL_CERT_FILE (stack.system). Returns the CA file."""
    ca_dir = Path(os.environ.get("PAYOUTS_TLS_CA_DIR") or default_dir).resolve()
    ca = StackPKI(ca_dir).ensure_ca()
    os.environ["PAYOUTS_TLS_CA_DIR"] = str(ca_dir)
    os.environ["SSL_CERT_FILE"] = str(ca)
    return ca
