"""`payouts-lab screenshots` (`make screenshots`): the Temporal Web UI's payout list and the
pages of a POSTED, a FAILED and a RAIL_AMBIGUOUS payout, by Debian's headless chromium into
docs/screenshots/.

Owns: the private stack the captures are taken on (free ports, its own run directory, stopped
afterwards) and the files' names. Must never: capture a stack it did not start (a developer's
`payouts up` is left alone).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from pathlib import Path
from typing import Any

from lab.screenshots.ui_pages import (
    chromium_available,
    headline,
    list_url,
    open_list,
    open_page,
    payout_url,
    stage,
)
from stack.config import Ports, StackConfig
from stack.pki import trust_stack_ca_in_this_process
from stack.system import Stack

OUT = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
STATES = ("POSTED", "FAILED", "RAIL_AMBIGUOUS")


def file_name(state: str) -> str:
    return f"payout-{state.lower().replace('_', '-')}.png"


async def capture_all(out: Path, run_dir: Path) -> list[Path]:
    config = StackConfig.from_env(run_dir=run_dir, workers=1, ports=Ports.isolated())
    written = []
    async with Stack(config, progress=lambda line: print(f"  .. {line}", file=sys.stderr)) as stack:
        staged = await stage(stack, STATES)
        for payout in staged:
            path = out / file_name(payout.state)
            expect = [headline(payout), f"amount {payout.amount}"]
            await asyncio.to_thread(open_page, payout_url(stack.ui_url, payout), expect, shot=path)
            written.append(path)
        path = out / "workflow-list.png"
        states = {p.workflow_id: p.state for p in staged}
        await asyncio.to_thread(open_list, list_url(stack.ui_url), states, shot=path)
        written.append(path)
    return written


def _cmd_screenshots(args: argparse.Namespace) -> int:
    if not chromium_available():
        print("chromium is absent: make screenshots installs it (Debian, as root)", file=sys.stderr)
        return 2
    run_dir = args.run_dir / f"stack-{uuid.uuid4().hex[:6]}"
    trust_stack_ca_in_this_process()  # the staging's calls to the stack's https rail stub
    for path in asyncio.run(capture_all(args.out, run_dir)):
        print(f"wrote {path}")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "screenshots", help="the Temporal Web UI's pages, by headless chromium, into docs/"
    )
    p.add_argument("--out", type=Path, default=OUT, help="folder of the PNGs")
    p.add_argument("--run-dir", type=Path, default=Path(".run") / "screenshots")
    p.set_defaults(func=_cmd_screenshots)
