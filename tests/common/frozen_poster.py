"""The holder a frozen-holder test freezes (tests/common/test_frozen_holder.py): a separate
process that posts one payout with the real PayoutStore on a pool built as worker/process.py builds
it (`create_pool(..., idle_in_transaction_s=<its lock TTL>)`), then prints one JSON line with
what happened and exits 0 (posted) or 3 (the post failed).

Run: python -m tests.common.frozen_poster DSN PAYOUT_ID TOKEN IDLE_S  (IDLE_S 0: no setting)
"""

from __future__ import annotations

import asyncio
import json
import sys

from common.pgutil import create_pool
from ledger import PayoutStore, WorkContext


async def _post(dsn: str, payout_id: str, token: int, idle_s: float) -> dict[str, str]:
    pool = await create_pool(
        dsn,
        min_size=1,
        max_size=1,
        idle_in_transaction_s=idle_s or None,
        server_settings={"application_name": f"frozen-poster-{payout_id}"},
    )
    try:
        ctx = WorkContext(correlation_id=payout_id, actor="frozen-holder")
        result = await PayoutStore(pool).post(payout_id, token, ctx)
        return {"result": type(result).__name__, "state": str(getattr(result, "state", ""))}
    except Exception as exc:  # reported to the test, which judges it
        return {"error": type(exc).__name__, "message": str(exc)[:300]}
    finally:
        pool.terminate()


def main() -> int:
    dsn, payout_id, token, idle_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    outcome = asyncio.run(_post(dsn, payout_id, token, idle_s))
    print(json.dumps(outcome), flush=True)
    return 3 if "error" in outcome else 0


if __name__ == "__main__":
    sys.exit(main())
