"""Every Secret and ConfigMap a deploy/k8s pod mounts for TLS is created by a command that
docs/deploy-gcp.md documents ("TLS"), with a negative control: documented commands that create
fewer are caught."""

from __future__ import annotations

import re

from tests.deploy.conftest import ROOT, k8s_documents
from tests.deploy.k8s_tls_mounts import CA_CONFIGMAP, CERTS, Docs, by_name, spec

# --- where the Secrets come from ------------------------------------------------------------


def mounted_tls_objects(docs: Docs) -> tuple[set[str], set[str]]:
    """(Secrets, ConfigMaps) mounted by any pod, less the ones that are not TLS material."""
    secrets, config_maps = set(), set()
    for doc in by_name(docs).values():
        for v in spec(doc).get("volumes", []):
            if "secret" in v:
                secrets.add(v["secret"]["secretName"])
            if "configMap" in v:
                config_maps.add(v["configMap"]["name"])
    return secrets, config_maps - {"payouts-config", "otel-collector"}


def documented_commands() -> str:
    doc = (ROOT / "docs" / "deploy-gcp.md").read_text()
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", doc, re.M | re.S)
    return "\n".join(blocks)


def created_by_docs(commands: str) -> tuple[set[str], set[str]]:
    """Secrets and ConfigMaps the documented kubectl commands create (a `for s in ...` loop over
    `create secret tls $s-tls` counts each name)."""
    secrets = set(
        re.findall(r"kubectl -n payouts create secret (?:tls|generic) ([a-z0-9-]+)", commands)
    )
    for names, body in re.findall(
        r"for s in ([a-z0-9 -]+); do\s*\\?\s*\n?\s*(kubectl[^\n]*)", commands
    ):
        if "create secret tls $s-tls" in body:
            secrets |= {f"{n}-tls" for n in names.split()}
    config_maps = set(re.findall(r"kubectl -n payouts create configmap ([a-z0-9-]+)", commands))
    return secrets, config_maps


def test_every_mounted_secret_is_created_by_a_documented_command() -> None:
    secrets, config_maps = mounted_tls_objects(k8s_documents())
    assert secrets == {leaf.secret for leaf in CERTS.values()}
    assert config_maps == {CA_CONFIGMAP}
    made_secrets, made_config_maps = created_by_docs(documented_commands())
    assert secrets <= made_secrets and config_maps <= made_config_maps
    # Negative controls: a command that creates fewer is caught.
    fewer = documented_commands().replace(" finledger ", " ")
    assert "finledger-tls" not in created_by_docs(fewer)[0]
    fewer = documented_commands().replace(" worker outbox ", " ")
    assert {"worker-tls", "outbox-tls"}.isdisjoint(created_by_docs(fewer)[0])
