"""The Temporal Web UI as a person sees it, through a real headless browser (Debian's chromium).

Owns: staging payouts that end POSTED, FAILED (declined by the rail) and RAIL_AMBIGUOUS (the
rail recorded it, then answered 500, and its lookups see nothing yet) on a running stack, the
UI's addresses of the list and of a payout's page, and reading them through chromium (driven by
Playwright): the text a person sees, the list's rows with the payout columns an operator adds
in the UI's column picker, and a screenshot. Must never: act on a stack it was not
given, start a payout outside its own fresh account, or download a browser (Debian's only).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page, sync_playwright
from temporalio.client import Client

from payouts.batch import PayoutSpec
from payouts.workload import create_payouts, seed_accounts, start_workflows
from stack.system import Stack

#: Debian's chromium; CHROMIUM names another build of it.
CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
#: The browser's window: wide enough for the UI's list columns.
WIDTH, HEIGHT = 1440, 1000
#: How long a page may take to show what is expected (a loaded 2-core machine is slow).
_DEADLINE_S = 120.0
#: The list's columns an operator removes and adds in the UI's column picker
#: (`show_payout_columns`): the payout's search attributes beside its workflow's status.
LIST_COLUMNS_REMOVED = ("Run ID", "Type", "End")
LIST_COLUMNS_ADDED = ("PayoutState", "PayoutAccountId")
#: Each staged payout's amount (minor units), by the state it is staged into.
AMOUNTS = {"POSTED": 2500, "FAILED": 1800, "RAIL_AMBIGUOUS": 4200}
#: What the rail stub does with its submission (railstub.behaviour.Action).
_RAIL_ACTIONS = {"FAILED": "decline", "RAIL_AMBIGUOUS": "ambiguous"}


@dataclass(frozen=True)
class StagedPayout:
    payout_id: str
    account_id: str
    amount: int
    state: str  # what the payment database says at the end of staging
    workflow_id: str
    run_id: str


def chromium_available() -> bool:
    return CHROMIUM.exists() and os.access(CHROMIUM, os.X_OK)


def headline(payout: StagedPayout) -> str:
    """The first line of the payout's current details (workflows/details.py) as the page shows
    it: its state, then its id."""
    return f"{payout.state} · payout {payout.payout_id}"


def list_url(ui_url: str) -> str:
    return f"{ui_url}/namespaces/default/workflows"


def payout_url(ui_url: str, payout: StagedPayout, tab: str = "user-metadata") -> str:
    """The payout's page on `tab`: `user-metadata` (its summary, its details and the
    current details the workflow keeps), `history`, `timeline`, ..."""
    workflow = f"{payout.workflow_id}/{payout.run_id}"
    return f"{ui_url}/namespaces/default/workflows/{workflow}/{tab}"


def _page_words(page: Page) -> str:
    """The text of the page and of every frame in it (the UI renders a workflow's Markdown
    summary and details in sandboxed frames), whitespace collapsed."""
    texts = []
    for frame in page.frames:
        with contextlib.suppress(PlaywrightError):  # a frame replaced while being read
            texts.append(frame.inner_text("body"))
    return _words(" ".join(texts))


def _until_shown(page: Page, needles: list[str], url: str) -> str:
    deadline = time.monotonic() + _DEADLINE_S
    text = ""
    while time.monotonic() < deadline:
        text = _page_words(page)
        if all(n in text for n in needles):
            return text
        page.wait_for_timeout(500)  # the UI renders as its API calls answer
    raise AssertionError(f"{url} never showed {needles}: {text[-1500:]}")


def _words(text: str) -> str:
    """Whitespace collapsed to single spaces, as `_SHOWS_ALL` compares."""
    return " ".join(text.split())


@contextlib.contextmanager
def _browser_page() -> Iterator[Page]:
    """A fresh page of Debian's chromium, driven by Playwright (`executable_path`: nothing is
    downloaded), closed afterwards."""
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM),
            # Root in a container has no user namespace for chromium's sandbox.
            args=["--no-sandbox", "--disable-gpu"],
        )
        try:
            yield browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
        finally:
            browser.close()


def _screenshot(page: Page, shot: Path | None) -> None:
    if shot is not None:
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shot))


def open_page(url: str, expect: Sequence[str], *, shot: Path | None = None) -> str:
    """The page's visible text (whitespace collapsed) once it holds every text in `expect` (the
    UI renders from its API after the page loads), screenshotted to `shot` if given. Raises with
    what the page showed when `expect` is not all there within the deadline."""
    with _browser_page() as page:
        page.goto(url, wait_until="domcontentloaded", timeout=_DEADLINE_S * 1000)
        text = _until_shown(page, [_words(e) for e in expect], url)
        _screenshot(page, shot)
        return text


def show_payout_columns(page: Page) -> None:
    """What docs/workflow.md tells an operator to do once per browser: in the list's column
    picker (*Configure Columns*, at the table's foot) remove the columns a payout does not need,
    add the payout's state and account and move the state up beside the workflow's id. The UI
    keeps the choice in the browser, per namespace; this clicks the UI's own buttons, by the
    names it gives them."""
    page.get_by_role("button", name="Configure Columns").click()
    for column in LIST_COLUMNS_REMOVED:
        page.get_by_role("button", name=f"Remove {column} column", exact=True).click()
    for column in LIST_COLUMNS_ADDED:
        page.get_by_role("button", name=f"Add {column} column", exact=True).click()
    # The state beside the workflow's id: added columns come last, after Start.
    page.get_by_role("button", name="Move PayoutState column up", exact=True).click()
    page.get_by_role("button", name="Close Workflows Table configuration").click()
    page.get_by_text("Configure Workflows Table").wait_for(state="hidden")


def _list_rows(page: Page, workflow_ids: Sequence[str]) -> dict[str, str]:
    """Each listed workflow's row as its visible words ("" for one not listed)."""
    rows = {}
    for workflow_id in workflow_ids:
        row = page.locator("tr").filter(has_text=workflow_id)
        with contextlib.suppress(PlaywrightError):  # a row re-rendered while being read
            rows[workflow_id] = _words(row.first.inner_text()) if row.count() else ""
    return rows


def open_list(url: str, states: dict[str, str], *, shot: Path | None = None) -> dict[str, str]:
    """The payout list with the payout columns shown (`show_payout_columns`), once the row of
    each workflow id in `states` shows its state among its words: each row's words, by
    workflow id, screenshotted to `shot` if given. Raises with the rows seen when a state is
    not shown within the deadline (its search attribute follows the workflow's upsert)."""
    with _browser_page() as page:
        page.goto(url, wait_until="domcontentloaded", timeout=_DEADLINE_S * 1000)
        _until_shown(page, list(states), url)
        show_payout_columns(page)
        deadline = time.monotonic() + _DEADLINE_S
        rows: dict[str, str] = {}
        while time.monotonic() < deadline:
            rows = _list_rows(page, list(states))
            if all(state in rows.get(w, "").split() for w, state in states.items()):
                _screenshot(page, shot)
                return rows
            page.wait_for_timeout(500)  # the list refreshes as visibility catches up
            page.reload(wait_until="domcontentloaded")
        raise AssertionError(f"{url} never showed the states {states}: {rows}")


async def _db_state(database_url: str, payout_id: str) -> str | None:
    conn = await asyncpg.connect(database_url)
    try:
        state = await conn.fetchval(
            "SELECT state FROM paydb.payouts WHERE payout_id = $1", payout_id
        )
    finally:
        await conn.close()
    return None if state is None else str(state)


async def _until_state(database_url: str, payout_id: str, state: str, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    seen = None
    while time.monotonic() < deadline:
        seen = await _db_state(database_url, payout_id)
        if seen == state:
            return
        await asyncio.sleep(0.5)
    raise RuntimeError(f"{payout_id} is {seen}, not {state}, after {within_s:.0f}s")


async def stage(
    stack: Stack, states: tuple[str, ...], within_s: float = 240.0
) -> list[StagedPayout]:
    """One payout per state in `states` (POSTED, FAILED, RAIL_AMBIGUOUS), on a fresh account,
    each waited for until the payment database says it is in that state. The rail stub is told
    to decline the FAILED one and to answer 500 after recording the RAIL_AMBIGUOUS one, whose
    movement it then keeps invisible to lookups for an hour: the payout stays ambiguous, its
    30 s lookup timers running (the stub's behaviour is this stack's: other payouts' lookups
    would see the same delay)."""
    prefix = f"ui{uuid.uuid4().hex[:6]}-"
    ids = {s: f"{prefix}{s.lower().replace('_', '-')}" for s in states}
    rules = [
        {"reference_prefix": ids[s], "action": _RAIL_ACTIONS[s]}
        for s in states
        if s in _RAIL_ACTIONS
    ]
    behaviour = {"rules": rules, "visibility_delay_s": 3600.0}
    async with httpx.AsyncClient(
        base_url=stack.railstub_url, timeout=10, headers=stack.operator_headers()
    ) as http:
        (await http.post("/admin/behaviour", json=behaviour)).raise_for_status()
    paydb = stack.role_dsn("PAYDB_DATABASE_URL")
    [account] = await seed_accounts(paydb, 1, 1_000_000, prefix)
    specs = [PayoutSpec(ids[s], account, AMOUNTS[s]) for s in states]
    await create_payouts(paydb, specs)
    await start_workflows(stack.temporal_address, stack.config.task_queue, specs)
    client = await Client.connect(stack.temporal_address)
    staged = []
    for state, spec in zip(states, specs, strict=True):
        await _until_state(stack.database_url, spec.payout_id, state, within_s)
        workflow_id = f"payout-{spec.payout_id}"
        run_id = (await client.get_workflow_handle(workflow_id).describe()).run_id
        staged.append(
            StagedPayout(spec.payout_id, account, spec.amount, state, workflow_id, run_id)
        )
    return staged
