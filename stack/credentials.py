"""Who is who in a local stack: one bearer token per identity and one credentials file per
server, listing only the identities that server accepts (docs/security.md).

Owns: the stack's identities (`STACK_IDENTITIES`, the operator `STACK_OPERATOR`), which server
accepts which (`STACK_ACCEPTS`, also read by deploy/gen_env.py for the compose stack), and
generating their files under `<run dir>/credentials/` (0600, kept for the next start). Must
never: print a token, or accept an identity on a server that the table does not list.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from common.credentials import Kind, issue_tokens, write_credentials

#: The stack's operator (one bearer token; `payouts up` prints its export line).
STACK_OPERATOR = "local-operator"
#: Every identity of a local stack and its kind: one token each under `<run dir>/credentials/`.
STACK_IDENTITIES: dict[str, Kind] = {
    STACK_OPERATOR: "operator",
    "worker": "component",
    "railproxy": "component",
    "outbox": "component",
    "reconciler": "component",
    "invariants": "component",
}
#: Which identities each server accepts (its credentials file lists only these; the endpoint
#: policy in each service then decides what each may do).
STACK_ACCEPTS: dict[str, tuple[str, ...]] = {
    "lock-server": (STACK_OPERATOR, "worker", "invariants", "reconciler"),
    "railstub": (STACK_OPERATOR, "railproxy", "reconciler", "invariants"),
    "railproxy": (STACK_OPERATOR, "worker", "reconciler", "invariants"),
    "finledger": (STACK_OPERATOR, "outbox", "invariants", "reconciler"),
    "outbox-cli": (STACK_OPERATOR,),
}


@dataclass(frozen=True)
class StackCredentials:
    """Token files (one per identity) and credentials files (one per server), all 0600."""

    tokens: dict[str, Path]
    servers: dict[str, Path]

    @property
    def operator_token_file(self) -> Path:
        return self.tokens[STACK_OPERATOR]


def stack_credentials(run_dir: Path) -> StackCredentials:
    """Generated on first start under `<run dir>/credentials/` and kept for the next."""
    base = run_dir / "credentials"
    tokens = issue_tokens(base / "tokens", STACK_IDENTITIES)
    servers = {
        server: write_credentials(
            base / f"{server}.json", {n: STACK_IDENTITIES[n] for n in names}, tokens
        )
        for server, names in STACK_ACCEPTS.items()
    }
    return StackCredentials(tokens, servers)
