"""PayoutActivities's parts, one module per concern, composed in `activities.payout_activities`.

`support`: the module-level helpers (views of a payout, the fenced/lost errors, the heartbeat of
a running step); `base`: the shared state, the fenced-write helpers every step uses and
`_holder_step`; `lock_steps`: acquire, hand-over, release, the idle-lease sweeper and break-glass
revoke; `critical`: the critical-section steps (claim, submit, recover, post, resolve, abandon);
`execute`: the merged `execute_payout` step; `lookups`: rail lookups, escalation and audit of
refused operator commands. Import PayoutActivities from `activities.payout_activities`.
"""
