"""The ledger proof query (INV-03, FR-25), reused read-only by the reconciler.

It returns every discrepancy: accounts whose stored balance differs from the sum of their entries
(accounts without a balance row count as stored 0 — they must not exist), and ledger groups whose
entries do not sum to zero. An empty result is the proof that the ledger balances.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import asyncpg

# The rail-clearing account is named here too: readers of the ledger (the reconciler) match a
# payout's posting against it and import it from this, the ledger's read-only interface.
from ledger.journal import RAIL_CLEARING

__all__ = ["PROOF_QUERY", "RAIL_CLEARING", "Discrepancy", "ledger_discrepancies"]

PROOF_QUERY = """
SELECT 'account' AS kind, a.account_id AS subject,
       COALESCE(b.balance, 0)::numeric AS stored, COALESCE(s.total, 0)::numeric AS computed
  FROM paydb.accounts a
  LEFT JOIN paydb.balances b ON b.account_id = a.account_id
  LEFT JOIN (SELECT account_id, SUM(amount) AS total
               FROM paydb.ledger_entries GROUP BY account_id) s ON s.account_id = a.account_id
 WHERE b.account_id IS NULL OR COALESCE(b.balance, 0) <> COALESCE(s.total, 0)
UNION ALL
SELECT 'group', g.group_id::text, 0::numeric, COALESCE(SUM(e.amount), 0)::numeric
  FROM paydb.ledger_groups g
  LEFT JOIN paydb.ledger_entries e ON e.group_id = g.group_id
 GROUP BY g.group_id
HAVING COALESCE(SUM(e.amount), 0) <> 0 OR COUNT(e.entry_id) < 2
ORDER BY 1, 2
"""


@dataclass(frozen=True, slots=True)
class Discrepancy:
    kind: Literal["account", "group"]
    subject: str  # account id or group id
    stored: int  # the stored balance (accounts) or 0, what a group must sum to
    computed: int  # the sum of entries


async def ledger_discrepancies(conn: asyncpg.Connection) -> list[Discrepancy]:
    """Every account whose balance != Σ its entries, and every group whose sum != 0."""
    rows = await conn.fetch(PROOF_QUERY)
    return [
        Discrepancy(
            kind=r["kind"],
            subject=r["subject"],
            stored=int(r["stored"]),
            computed=int(r["computed"]),
        )
        for r in rows
    ]
