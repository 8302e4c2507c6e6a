"""PayoutActivities's step objects, one module per concern, composed in
`activities.payout_activities` (one flat activity class that delegates to them).

`support`: the module-level helpers (views of a payout, the fenced/lost errors, the heartbeat of
a running step); `grants`: `HeldGrants`, the grants this process holds (in use, released, swept
when idle); `fenced`: `HolderWriter`, every fenced write and the store's refusals; `lock_steps`:
acquire, hand-over, release; `revokes`: break-glass revoke; `critical`: the critical-section
steps (submit, recover, post, resolve, abandon); `execute`: the merged `execute_payout` step
(claim, submit, post, release); `lookups`: rail lookups, escalation and audit of refused
operator commands. Each object receives what it uses in its constructor; none inherits from
another. Import PayoutActivities from `activities.payout_activities`.
"""
