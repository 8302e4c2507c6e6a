"""Issue the GKE deployment's TLS certificates (docs/deploy-gcp.md, "TLS"): a private CA and one
certificate per Kubernetes Secret that deploy/k8s mounts.

Owns: `ca` (a new CA: `ca.pem`, its key `ca.key` 0600), `issue` (a fresh key and certificate
signed by that CA for each entry of CERTS, with exactly the in-cluster names its clients check)
and `show` (subject, names, expiry and whether each certificate chains to the CA, to check before
and after a rotation); the certificates themselves are built by `stack.pki`, the project's one
certificate builder. The operator runs it on their own machine; `ca.key` goes to Secret Manager
(`tls-ca-key`, no workload can read it) and is shredded here, each leaf goes into its own
Kubernetes Secret with `kubectl create secret tls`. Must never: overwrite a CA (a second CA is a
rotation: `--dir` another folder), print a private key, or be imported by a component.

Run: `.venv/bin/python deploy/k8s_tls.py ca --dir tls`, then `... issue --dir tls [NAME ...]`.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# The certificates are built by the local stack's PKI, the project's one certificate builder,
# with this deployment's names, lifetimes and usages.
from stack.pki import (
    ca_certificate,
    leaf_certificate,
    load_ca,
    new_key,
    subject,
    write_certificate,
    write_private_key,
)

NAMESPACE = "payouts"
CA_DAYS = 5 * 365
#: A year: rotated by hand like the grant-signing key (the servers read their files at start-up).
CERT_DAYS = 365
ORGANIZATION = "fenced-payouts GKE"


def service_names(service: str) -> tuple[str, ...]:
    """Every name a client in the cluster may use for a Service of namespace `payouts`."""
    return (
        service,
        f"{service}.{NAMESPACE}",
        f"{service}.{NAMESPACE}.svc",
        f"{service}.{NAMESPACE}.svc.cluster.local",
    )


#: The etcd StatefulSet's members (deploy/k8s/10-etcd.yaml): one certificate for the three (a
#: StatefulSet's pods share one template, so one Secret), naming every member. etcd checks a
#: peer's certificate names against the peer's address (forward lookup), so each member's own
#: names must be in it; `*.etcd` is not used: gRPC refuses a wildcard over a single label.
ETCD_MEMBERS = ("etcd-0", "etcd-1", "etcd-2")


def _member_names(member: str) -> tuple[str, ...]:
    """etcd-0.etcd, etcd-0.etcd.payouts, ... (the headless Service's per-pod records)."""
    return tuple(f"{member}.{n}" for n in service_names("etcd"))


def _etcd_names() -> tuple[str, ...]:
    members = (n for member in ETCD_MEMBERS for n in _member_names(member))
    return (*service_names("etcd"), *members, "localhost")


@dataclass(frozen=True)
class Leaf:
    """One certificate: the Kubernetes Secret it goes into, its DNS names (empty: a client
    certificate only), whether it serves, and whether it is presented as a client."""

    name: str
    secret: str
    dns: tuple[str, ...]
    server: bool
    client: bool
    ip: tuple[str, ...] = ()


#: Every certificate deploy/k8s mounts, by the name `issue` takes (files `<name>.pem/.key`).
CERTS: dict[str, Leaf] = {
    leaf.name: leaf
    for leaf in (
        Leaf("lock-server", "lock-server-tls", service_names("lock-server"), True, False),
        Leaf("railproxy", "railproxy-tls", service_names("railproxy"), True, False),
        Leaf("railstub", "railstub-tls", service_names("railstub"), True, False),
        Leaf("finledger", "finledger-tls", service_names("finledger"), True, False),
        Leaf("otel-collector", "otel-collector-tls", service_names("otel-collector"), True, False),
        # The workers' /metrics and /health (WORKER_METRICS_PORT) and the outbox publishers'
        # /metrics (OUTBOX_METRICS_PORT). No Service fronts them: Prometheus scrapes each pod by
        # its address and verifies the name of its job's `tls_config.server_name`
        # (`worker.payouts.svc`, `outbox.payouts.svc`; deploy/prometheus/targets.yml), the
        # names a Service of that name would have; the kubelet's HTTPS probes verify nothing.
        Leaf("worker", "worker-tls", service_names("worker"), True, False),
        Leaf("outbox", "outbox-tls", service_names("outbox"), True, False),
        # Served to clients and presented to the other members (peer mutual TLS); 127.0.0.1
        # and localhost for etcdctl inside a member's pod.
        Leaf("etcd", "etcd-tls", _etcd_names(), True, True, ip=("127.0.0.1",)),
        # The lock server's identity towards etcd (--client-cert-auth).
        Leaf("lock-server-etcd-client", "lock-server-etcd-client-tls", (), False, True),
        # The workers' and jobs' identity towards a Temporal frontend that requires client
        # certificates (Temporal Cloud: this CA is the namespace's accepted client CA).
        Leaf("temporal-client", "temporal-client-tls", (), False, True),
    )
}


def create_ca(directory: Path, common_name: str) -> Path:
    """`directory/ca.pem` and `ca.key` (0600). Refuses a directory that already has a CA."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    cert_file, key_file = directory / "ca.pem", directory / "ca.key"
    if cert_file.exists() or key_file.exists():
        raise FileExistsError(f"{directory} already holds a CA: a new CA goes in another folder")
    key = new_key()
    write_private_key(key_file, key)
    write_certificate(
        cert_file, ca_certificate(key, subject(ORGANIZATION, common_name), days=CA_DAYS)
    )
    return cert_file


def issue(directory: Path, leaf: Leaf) -> tuple[Path, Path]:
    """A fresh key and certificate for `leaf`, signed by `directory`'s CA: `<name>.pem`, and
    `<name>.key` (0600). An earlier pair of the same name is replaced (a rotation)."""
    ca_key, ca_cert = load_ca(directory / "ca.pem", directory / "ca.key")
    key = new_key()
    cert = leaf_certificate(
        ca_key,
        ca_cert,
        key,
        subject(ORGANIZATION, leaf.name),
        dns=leaf.dns,
        ips=leaf.ip,
        server=leaf.server,
        client=leaf.client,
        days=CERT_DAYS,
    )
    cert_file, key_file = directory / f"{leaf.name}.pem", directory / f"{leaf.name}.key"
    write_private_key(key_file, key)
    write_certificate(cert_file, cert)
    return cert_file, key_file


def describe(directory: Path) -> list[str]:
    """One line per certificate in `directory`: name, expiry, names, and whether the CA of
    `directory` signed it."""
    ca = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
    lines = [f"ca: {ca.subject.rfc4514_string()} until {ca.not_valid_after_utc:%Y-%m-%d}"]
    for name in CERTS:
        path = directory / f"{name}.pem"
        if not path.exists():
            lines.append(f"{name}: not issued here")
            continue
        cert = x509.load_pem_x509_certificate(path.read_bytes())
        try:
            cert.verify_directly_issued_by(ca)
            signed = "signed by this CA"
        except (InvalidSignature, ValueError, TypeError):
            signed = "NOT signed by this CA"
        try:
            sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            names = ",".join(str(n.value) for n in sans)
        except x509.ExtensionNotFound:
            names = "(client only)"
        lines.append(f"{name}: until {cert.not_valid_after_utc:%Y-%m-%d}, {signed}, {names}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ca = sub.add_parser("ca", help="create a new CA in --dir (refused if one is there)")
    ca.add_argument("--dir", type=Path, required=True)
    ca.add_argument(
        "--name",
        default=f"fenced-payouts GKE CA {datetime.date.today():%Y-%m}",
        help="the CA's common name (tell two CAs apart during a rotation)",
    )
    iss = sub.add_parser("issue", help="issue certificates signed by the CA in --dir")
    iss.add_argument("--dir", type=Path, required=True)
    iss.add_argument("names", nargs="*", metavar="NAME", help=f"of {', '.join(CERTS)} (all)")
    show = sub.add_parser("show", help="print each certificate's names and expiry")
    show.add_argument("--dir", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "ca":
        try:
            path = create_ca(args.dir, args.name)
        except FileExistsError as exc:
            print(f"k8s_tls: {exc}", file=sys.stderr)  # noqa: T201 - a command's output
            return 2
        print(path)  # noqa: T201 - a command's output
        return 0
    if args.command == "issue":
        unknown = sorted(set(args.names) - set(CERTS))
        if unknown:
            parser.error(f"unknown certificate(s) {unknown}: choose from {', '.join(CERTS)}")
        for name in args.names or list(CERTS):
            cert_file, _ = issue(args.dir, CERTS[name])
            print(f"{cert_file} -> secret {CERTS[name].secret}")  # noqa: T201
        return 0
    for line in describe(args.dir):
        print(line)  # noqa: T201 - a command's output
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
