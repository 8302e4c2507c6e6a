"""The chaos run's hostile-signals fault (issue 24): what anyone who can reach Temporal can send a
running payout workflow, sent to a few of them at random.

Each payout hit gets, as one burst: an abandon with two arguments (which used to raise in the
SDK's dispatch on every workflow task and wedge the workflow), one whose payload encoding no
converter knows (which the SDK used to drop unaudited), a signal name the workflow does not
take, an uncredentialed abandon and revoke under a made-up name, an abandon with a forged
assertion (a genuine one re-labelled), and a cancellation request; and, for one payout of the
burst, a genuine signed revoke sent twice, so that the second is a replay of a single-use
assertion. Each must end as an audited refusal (the revoke's first copy as a real revoke, which
costs the holder its grant and never safety), and the run's own checks then show that no payout
was wedged (every one terminal) and nothing moved twice (INV-01..INV-10).

Owns: choosing the payouts (seeded by the fault), sending, and the fault's record (what was sent
to how many payouts). Must never: send a valid abandon (an abandon is an operator's decision, not
chaos), or touch a workflow that is not a payout's.
"""

from __future__ import annotations

import random
from typing import Any

import httpx
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.common import RawValue
from temporalio.service import RPCError

from activities.models import OperatorCommand
from common.lockkey import lock_key
from lab.chaos.schedule import Fault
from stack.system import Stack
from workflows.search_attributes import PAYOUT_ACCOUNT

#: How many running payouts one fault hits.
PAYOUTS_PER_FAULT = 3
_RUNNING = 'WorkflowType="PayoutWorkflow" AND ExecutionStatus="Running"'
_MALLORY = {"operator": "mallory", "reason": "chaos: let me in"}


class HostileSignals:
    """Fires `hostile_signals` faults against the payouts running on `stack`."""

    def __init__(self, stack: Stack, http: httpx.AsyncClient) -> None:
        self.stack = stack
        self._http = http  # carries the stack operator's credential (assertions)
        self._client: Client | None = None

    async def fire(self, fault: Fault) -> dict[str, Any]:
        try:
            client = await self._temporal()
            running: list[tuple[str, str]] = []
            async for wf in client.list_workflows(_RUNNING, limit=200):
                account = wf.typed_search_attributes.get(PAYOUT_ACCOUNT)
                if wf.id.startswith("payout-") and account:
                    running.append((wf.id, account))
        except (RPCError, RuntimeError) as exc:  # Temporal down (another fault): nothing sent
            return {"payouts_hit": 0, "signals_sent": 0, "skipped": str(exc)[:200]}
        rng = random.Random(fault.seed)  # the schedule's seeded draw for this fault
        chosen = rng.sample(running, min(PAYOUTS_PER_FAULT, len(running)))
        sent = 0
        for n, (workflow_id, account) in enumerate(chosen):
            sent += await self._burst(client, workflow_id, account, replay=n == 0)
        return {"payouts_hit": len(chosen), "signals_sent": sent, "running_seen": len(running)}

    async def _burst(self, client: Client, workflow_id: str, account: str, *, replay: bool) -> int:
        """One payout's burst; how many signals (and cancellation requests) reached Temporal.
        A payout that ended meanwhile answers NOT_FOUND: counted as not sent, never an error."""
        handle = client.get_workflow_handle(workflow_id)
        payout_id = workflow_id.removeprefix("payout-")
        odd = RawValue(Payload(metadata={"encoding": b"binary/chaos"}, data=b"\x00\xff"))
        genuine = await self._assertion("abandon", payout_id, lock_key(account))
        forged = {**genuine, "identity": "mallory"} if genuine else None
        sends: list[tuple[str, list[Any]]] = [
            ("abandon", [_MALLORY, _MALLORY]),
            ("abandon", [odd]),
            ("chaos-unknown", [_MALLORY]),
            ("abandon", [_MALLORY]),
            ("revoke", [_MALLORY]),
            ("abandon", [OperatorCommand("mallory", "chaos: forged", forged)]),
        ]
        if replay:
            signed = await self._assertion("revoke", payout_id, lock_key(account))
            if signed:
                command = OperatorCommand(signed["identity"], "chaos: replayed revoke", signed)
                sends += [("revoke", [command]), ("revoke", [command])]
        sent = 0
        for name, args in sends:
            try:
                await handle.signal(name, args=args)
                sent += 1
            except RPCError:
                return sent  # the payout's workflow ended: nothing left to send it
        try:
            await handle.cancel()
            sent += 1
        except RPCError:
            pass
        return sent

    async def _assertion(self, action: str, payout_id: str, key: str) -> dict[str, Any] | None:
        """A genuine operator assertion (as `payouts payout` obtains one); None if the lock
        server is down at that moment (another fault may have it down)."""
        body = {"action": action, "payout_id": payout_id, "reason": "chaos", "key": key}
        try:
            r = await self._http.post(f"{self.stack.lock_url}/v1/operator-assertions", json=body)
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            return None
        assertion: dict[str, Any] = r.json()
        return assertion

    async def _temporal(self) -> Client:
        if self._client is None:
            self._client = await Client.connect(self.stack.temporal_address)
        return self._client
