"""Issue 28 §1: the Temporal Web UI shows a payout's story at a glance, read through a real
headless browser (Debian's chromium) on a real stack: the page of a POSTED payout and of a
FAILED one each say their state and amount, and the FAILED one why; the list, with the payout
columns added through the UI's own column picker, says FAILED beside a COMPLETED workflow."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from lab.screenshots.ui_pages import (
    chromium_available,
    headline,
    list_url,
    open_list,
    open_page,
    payout_url,
    stage,
)
from stack.config import StackConfig
from stack.system import Stack

pytestmark = pytest.mark.skipif(
    not chromium_available(),
    reason="chromium is absent (/usr/bin/chromium, or $CHROMIUM): `make screenshots` installs it "
    "on Debian as root",
)


async def _page_saying(url: str, *needles: str) -> str:
    """The page's visible text once it holds every needle (the UI polls its API, and a
    workflow's current details follow its last workflow task), within a generous deadline."""
    return await asyncio.to_thread(open_page, url, needles)


@pytest.mark.slow
@pytest.mark.timeout(900)  # a stack's start alone takes minutes on a loaded 2-core machine
async def test_the_ui_shows_each_payouts_state_and_amount(
    stack_env: dict[str, str], stack_dir: Path, external_database_url: str | None
) -> None:
    config = StackConfig.from_env(
        stack_env, run_dir=stack_dir, workers=1, database_url=external_database_url
    )
    async with Stack(config) as stack:
        posted, failed = await stage(stack, ("POSTED", "FAILED"))
        page = await _page_saying(
            payout_url(stack.ui_url, posted), headline(posted), f"amount {posted.amount}"
        )
        # Negative control: one payout's page does not carry another's state or amount.
        assert "FAILED" not in page and f"amount {failed.amount}" not in page
        page = await _page_saying(
            payout_url(stack.ui_url, failed),
            headline(failed),
            f"amount {failed.amount}",
            "failed: declined by the rail",
        )
        assert "POSTED ·" not in page
        # The list, with the payout columns an operator adds in the UI's column picker, says
        # FAILED beside the workflow's COMPLETED.
        states = {posted.workflow_id: "POSTED", failed.workflow_id: "FAILED"}
        rows = await asyncio.to_thread(open_list, list_url(stack.ui_url), states)
        assert "COMPLETED" in rows[failed.workflow_id].split()
        assert failed.account_id in rows[failed.workflow_id].split()
        # Negative control: the POSTED row does not carry the FAILED one's state.
        assert "FAILED" not in rows[posted.workflow_id].split()
