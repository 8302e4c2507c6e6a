"""`payouts seed`: funded accounts for a workload (re-runnable: an existing one is topped up)."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from payouts.errors import CommandError, guard
from payouts.settings import connection_options, database_url
from payouts.workload import seed_accounts


def _cmd_seed(args: argparse.Namespace) -> int:
    if args.accounts <= 0 or args.balance <= 0:
        raise CommandError("--accounts and --balance must be positive")
    created = asyncio.run(
        seed_accounts(
            database_url(args, "PAYDB_DATABASE_URL"), args.accounts, args.balance, args.prefix
        )
    )
    print(f"seeded {len(created)} account(s) {created[0]}..{created[-1]} with {args.balance} each")
    return 0


def register(sub: Any) -> None:
    seed = sub.add_parser(
        "seed", help="create funded accounts (re-runnable: tops up existing ones)"
    )
    seed.add_argument("--accounts", type=int, default=50, help="how many accounts")
    seed.add_argument("--balance", type=int, default=1_000_000, help="minor units per account")
    seed.add_argument("--prefix", default="acct-", help="account ids are PREFIX00000, ...")
    connection_options(seed, db=True)
    seed.set_defaults(func=guard(_cmd_seed))
