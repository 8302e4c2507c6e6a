-- Rail proxy tables (schema railproxy; search_path is set by payouts.migrate).

-- Per-account high-water fencing token (FR-17). Never deleted, never lowered.
CREATE TABLE account_fences (
    account_id  text PRIMARY KEY,
    high_token  bigint NOT NULL CHECK (high_token >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Every submission attempt, recorded BEFORE it is forwarded (FR-19). outcome NULL = in flight.
CREATE TABLE attempts (
    attempt_id        bigserial PRIMARY KEY,
    payout_id         text NOT NULL,
    account_id        text NOT NULL,
    amount            bigint NOT NULL CHECK (amount > 0),
    client_reference  text NOT NULL,
    token             bigint NOT NULL,
    correlation_id    text NOT NULL,
    causation_id      text NOT NULL,
    deadline_at       timestamptz NOT NULL,
    adapter_version   text NOT NULL,   -- STD01-09 lineage
    contract_version  text NOT NULL,
    connection_id     text NOT NULL,
    fencing_enforced  boolean NOT NULL,
    guard_bypassed    boolean NOT NULL DEFAULT false,  -- experiment negative control only
    outcome           text CHECK (outcome IN ('ACKED', 'DECLINED', 'UNKNOWN', 'NOT_SUBMITTED')),
    rail_status       text,
    rail_movement_id  text,
    error_class       text,
    recorded_at       timestamptz NOT NULL DEFAULT now(),
    completed_at      timestamptz
);

-- FR-18 / FR-23 in the database: at most one attempt per payout that may have reached the rail.
-- Only an attempt with authoritative evidence of no handoff (NOT_SUBMITTED) frees the payout.
-- Two concurrent submits cannot both insert: the second blocks on the first and then violates it.
CREATE UNIQUE INDEX attempts_one_live_per_payout ON attempts (payout_id)
    WHERE outcome IS DISTINCT FROM 'NOT_SUBMITTED' AND NOT guard_bypassed;

CREATE INDEX attempts_by_payout ON attempts (payout_id, attempt_id);
CREATE INDEX attempts_by_reference ON attempts (client_reference);
