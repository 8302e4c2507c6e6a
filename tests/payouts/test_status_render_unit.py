"""Unit: how `payouts payout status` words a workflow answer (fabricated answers, no servers)."""

from __future__ import annotations

from typing import Any

from payouts.status_cli import failure_words, payout_failure, render


def _workflow(**over: Any) -> dict[str, Any]:
    wf: dict[str, Any] = {
        "payout_id": "p1",
        "state": "FAILED",
        "token": 7,
        "attempt": {"attempt_id": "12", "outcome": "DECLINED", "token": 7, "recorded_at": ""},
        "escalated": False,
        "rejected_signals": [],
        "last_error": "",
        "pending_revokes": 1,
        "runs": 2,
        "account_id": "acct-1",
        "resolution": "",
        "evidence": "",
        "lookups": 3,
        "last_lookup": {"number": 3, "status": "absent", "detail": "no record", "at": "T3"},
        "commands": [
            {
                "command_id": "c1",
                "action": "revoke",
                "via": "update",
                "operator": "x",
                "reason": "stuck",
                "status": "carried_out",
                "actor": "local-operator",
                "why": "lock revoked",
                "at": "T1",
                "assertion": None,
            },
            {
                "command_id": "c2",
                "action": "abandon",
                "via": "signal",
                "operator": "ana",
                "reason": "sla",
                "status": "refused",
                "actor": "unverified:ana",
                "why": "no assertion",
                "at": "T2",
                "assertion": None,
            },
        ],
        "cancel_requests": 1,
    }
    wf.update(over)
    return wf


def test_each_failure_reason_reads_as_words() -> None:
    assert failure_words("declined_by_rail") == "declined by the rail"
    assert failure_words("insufficient_funds").startswith("insufficient funds")
    assert failure_words("absent_at_rail").startswith("absent at the rail")
    assert failure_words("abandoned: ticket 42") == "abandoned by an operator (ticket 42)"
    assert failure_words("something_new") == "something_new"  # unknown: shown as it is


def test_without_the_row_the_workflow_says_why_it_failed() -> None:
    assert payout_failure(_workflow(), None) == "declined by the rail"
    no_attempt = _workflow(attempt=None)
    assert (payout_failure(no_attempt, None) or "").startswith("absent at the rail")
    assert payout_failure(_workflow(state="POSTED"), None) is None


def test_the_text_names_lookups_commands_verdicts_and_revokes() -> None:
    report = {
        "payout_id": "p1",
        "workflow_id": "payout-p1",
        "workflow": _workflow(),
        "database": None,
        "database_note": "not read: set $PAYDB_DATABASE_URL or $DATABASE_URL",
        "failure": "declined by the rail",
    }
    text = render(report)
    assert "state        FAILED: declined by the rail" in text
    assert "lookups      3; last #3 absent at T3: no record" in text
    assert "revoke via update by local-operator ('stuck'): carried_out: lock revoked [T1]" in text
    assert "abandon via signal by unverified:ana ('sla'): refused: no assertion [T2]" in text
    assert "revokes      1 carried out, 1 waiting" in text
    assert "cancel       1 request(s), refused" in text
    assert "database     not read" in text
