"""The payout workflow's custom search attributes: how operators find payouts by state.

Owns: the names and types of the attributes, and the dev-server flags that register them. Must
never: import anything with side effects (the workflow sandbox passes this module through).

`temporal workflow list --query 'PayoutState="RAIL_AMBIGUOUS"'` and the Web UI's filter use
them. `PayoutState` is the state the workflow last learned from an activity's result, not the
payment database's row now (docs/workflow.md, "What `PayoutState` means"): `payouts payout list`
answers from the database. A real cluster registers them once per namespace (docs/workflow.md):
`temporal operator search-attribute create --name PayoutState --type Keyword` and likewise for
the others.
"""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

PAYOUT_STATE = SearchAttributeKey.for_keyword("PayoutState")
PAYOUT_ACCOUNT = SearchAttributeKey.for_keyword("PayoutAccountId")
PAYOUT_ESCALATED = SearchAttributeKey.for_bool("PayoutEscalated")

#: Every attribute the payout workflow upserts.
SEARCH_ATTRIBUTES: tuple[SearchAttributeKey[str] | SearchAttributeKey[bool], ...] = (
    PAYOUT_STATE,
    PAYOUT_ACCOUNT,
    PAYOUT_ESCALATED,
)
#: Each attribute's type as `temporal` and the dev server name it.
SEARCH_ATTRIBUTE_TYPES = {
    PAYOUT_STATE.name: "Keyword",
    PAYOUT_ACCOUNT.name: "Keyword",
    PAYOUT_ESCALATED.name: "Bool",
}


def dev_server_flags() -> list[str]:
    """`temporal server start-dev` flags that register every attribute."""
    flags: list[str] = []
    for name, kind in SEARCH_ATTRIBUTE_TYPES.items():
        flags += ["--search-attribute", f"{name}={kind}"]
    return flags


def query(state: str | None = None, account_id: str | None = None) -> str:
    """A visibility query for payout workflows in `state` (and of `account_id`)."""
    parts = ['WorkflowType="PayoutWorkflow"']
    if state:
        parts.append(f'{PAYOUT_STATE.name}="{state}"')
    if account_id:
        parts.append(f'{PAYOUT_ACCOUNT.name}="{account_id}"')
    return " AND ".join(parts)
