"""Unit tests of what the Temporal UI shows of a payout (workflows.details, the static summary of
activities.redrive): the state first, the amount, why it FAILED in words, the lookups, a known
resolution, pending commands."""

from __future__ import annotations

from activities import models as m
from activities.redrive import static_summary
from workflows.details import Snapshot, current_details


def _snap(**kw: object) -> Snapshot:
    base: dict[str, object] = {
        "payout_id": "po-1",
        "account_id": "acct-1",
        "amount": 2500,
        "state": "PENDING",
        "step": "acquire",
        "token": 0,
        "escalated": False,
        "resolution": "",
        "evidence": "",
        "failure_reason": None,
        "lookups": 0,
        "last_lookup": None,
        "commands": [],
        "cancel_requests": 0,
        "last_error": "",
    }
    return Snapshot(**{**base, **kw})  # type: ignore[arg-type]


def test_the_first_line_is_the_state_the_payout_and_the_amount() -> None:
    first = current_details(_snap()).split("\n")[0]
    assert first.startswith("**PENDING**") and "po-1" in first and "2500" in first


def test_a_failed_payout_says_why_in_words() -> None:
    text = current_details(_snap(state="FAILED", failure_reason="insufficient_funds"))
    assert "insufficient funds" in text and "never sent to the rail" in text
    assert "declined by the rail" in current_details(
        _snap(state="FAILED", failure_reason="declined_by_rail")
    )


def test_an_ambiguous_payout_shows_lookups_evidence_escalation_and_commands() -> None:
    text = current_details(
        _snap(
            state="RAIL_AMBIGUOUS",
            step="lookup",
            lookups=7,
            last_lookup=m.LookupRecord(7, "settled", at="2026-12-02T03:00:00+00:00"),
            resolution="settled",
            evidence="lookup 7 at 2026-12-02T03:00:00: settled",
            escalated=True,
            commands=[m.CommandRecord("r:1", "abandon", "update", "ana", status="pending")],
            cancel_requests=1,
        )
    )
    assert "lookups: 7" in text and "#7" in text and "settled" in text
    assert "rail's evidence" in text and "escalated" in text
    assert "abandon pending (ana)" in text and "cancellation requests refused: 1" in text


def test_the_static_summary_names_payout_account_and_amount() -> None:
    inp = m.PayoutInput(payout_id="po-9", account_id="acct-9", amount=700)
    assert static_summary(inp) == "payout po-9 · account acct-9 · amount 700"
    assert "amount ?" in static_summary(m.PayoutInput(payout_id="p", account_id="a"))
