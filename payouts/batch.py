"""Payouts as input: one from options, a batch from a file, or N generated with a seed.

Owns: `PayoutSpec` and its validation. A batch is validated whole (fields, amounts, size,
duplicate ids) before anything is written. Must never: touch the database or Temporal.
"""

from __future__ import annotations

import csv
import json
import random
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledger.records import BIGINT_MAX
from payouts.errors import CommandError

MAX_BATCH = 100_000
#: The largest amount the payment database holds (`amount bigint`), in minor units.
MAX_AMOUNT = BIGINT_MAX


@dataclass(frozen=True)
class PayoutSpec:
    payout_id: str
    account_id: str
    amount: int
    state: str = "PENDING"  # as the payment database has it (a re-driven payout's may differ)


def parse_spec(raw: dict[str, Any], where: str) -> PayoutSpec:
    try:
        payout_id = str(raw["payout_id"]).strip()
        account_id = str(raw["account_id"]).strip()
        amount_raw = raw["amount"]
    except KeyError as exc:
        raise CommandError(f"{where}: missing field {exc.args[0]!r}") from None
    try:
        amount = int(str(amount_raw).strip())
    except ValueError:
        raise CommandError(
            f"{where}: amount {amount_raw!r} is not an integer (minor units)"
        ) from None
    if not payout_id or not account_id:
        raise CommandError(f"{where}: payout_id and account_id must not be empty")
    check_amount(amount, where)
    return PayoutSpec(payout_id, account_id, amount)


def check_amount(amount: int, where: str) -> None:
    if amount <= 0:
        raise CommandError(f"{where}: amount must be positive, got {amount}")
    if amount > MAX_AMOUNT:
        raise CommandError(
            f"{where}: amount {amount} exceeds the largest, {MAX_AMOUNT} minor units"
        )


def read_batch(path: Path) -> list[PayoutSpec]:
    """Payouts from a JSON list of objects or a CSV with a header payout_id,account_id,amount."""
    if not path.exists():
        raise CommandError(f"{path}: no such file")
    text = path.read_text()
    if path.suffix.lower() == ".json":
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CommandError(f"{path}: invalid JSON ({exc})") from None
        if not isinstance(rows, list):
            raise CommandError(f"{path}: expected a JSON list of payouts")
    elif path.suffix.lower() == ".csv":
        rows = list(csv.DictReader(text.splitlines()))
    else:
        raise CommandError(f"{path}: expected a .json or .csv file")
    specs = [
        parse_spec(r if isinstance(r, dict) else {}, f"{path}: item {i + 1}")
        for i, r in enumerate(rows)
    ]
    check_batch(specs)
    return specs


def check_batch(specs: list[PayoutSpec]) -> None:
    if not specs:
        raise CommandError("no payouts given")
    if len(specs) > MAX_BATCH:
        raise CommandError(f"at most {MAX_BATCH} payouts per batch")
    seen: set[str] = set()
    for s in specs:
        check_amount(s.amount, f"payout {s.payout_id}")
        if s.payout_id in seen:
            raise CommandError(f"payout id {s.payout_id} appears twice in the batch")
        seen.add(s.payout_id)


def generate(
    count: int,
    accounts: int,
    *,
    seed: int,
    min_amount: int,
    max_amount: int,
    account_prefix: str = "acct-",
) -> list[PayoutSpec]:
    rng = random.Random(seed)
    run = uuid.uuid4().hex[:6]
    return [
        PayoutSpec(
            payout_id=f"po-{run}-{i:06d}",
            account_id=f"{account_prefix}{rng.randrange(accounts):05d}",
            amount=rng.randint(min_amount, max_amount),
        )
        for i in range(count)
    ]
