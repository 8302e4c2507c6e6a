-- Outbox delivery state (issue 8, seed 001): the publisher's bookkeeping on each outbox row.
-- Applied with search_path = paydb; objects are paydb-qualified anyway.

ALTER TABLE paydb.outbox
    -- pending -> delivered | conflict_blocked | delivery_failed (dead letter); an operator can
    -- send conflict_blocked / delivery_failed back to pending (retry) or to discarded.
    ADD COLUMN status text NOT NULL DEFAULT 'pending' CHECK (status IN (
        'pending', 'delivered', 'conflict_blocked', 'delivery_failed', 'discarded')),
    -- The pending scan skips a row until this instant (backoff), so one failing row never
    -- blocks the others (head-of-line protection).
    ADD COLUMN next_retry_at timestamptz,
    ADD COLUMN last_outcome text CHECK (last_outcome IN (
        'completed', 'duplicate_completed', 'retryable_failure', 'conflict_blocked',
        'permanent_failure')),
    ADD COLUMN last_error text,
    ADD COLUMN delivered_at timestamptz,
    -- Lease: a publisher claims a row until claimed_until; a crashed publisher's rows become
    -- claimable again when the lease runs out. `attempts` (from 001) is incremented at claim
    -- time and doubles as the claim's fence when the outcome is written back.
    ADD COLUMN claimed_by text,
    ADD COLUMN claimed_until timestamptz,
    -- The idempotency key sent downstream (seed 001: {asset_id}:{order_id}:{execution_id}).
    -- A ledger posting already carries it as its correlation id ({account}:{payout}:{group});
    -- a payout event reaches each state at most once, so {account}:{payout}:{event_type} is
    -- stable; anything else falls back to its event id, which is never regenerated.
    ADD COLUMN delivery_key text GENERATED ALWAYS AS (
        CASE
            WHEN event_type = 'ledger.posted' THEN correlation_id
            WHEN event_type LIKE 'payout.%' AND payload ? 'account_id' AND payload ? 'payout_id'
                THEN (payload ->> 'account_id') || ':' || (payload ->> 'payout_id') || ':' || event_type
            WHEN event_type = 'account.opened' AND payload ? 'account_id'
                THEN (payload ->> 'account_id') || ':' || event_type
            ELSE 'event:' || event_id::text
        END
    ) STORED;

-- Local deduplication: the same posting or payout event can be staged at most once. The second
-- staging fails the business transaction that tried it, which can only be a bug upstream.
CREATE UNIQUE INDEX outbox_delivery_key ON paydb.outbox (delivery_key);
CREATE UNIQUE INDEX outbox_posting_correlation ON paydb.outbox (correlation_id)
    WHERE event_type = 'ledger.posted';

-- The pending scan: due rows, oldest first.
DROP INDEX paydb.outbox_unpublished;
CREATE INDEX outbox_pending ON paydb.outbox (occurred_at) WHERE status = 'pending';
CREATE INDEX outbox_status ON paydb.outbox (status);

-- STD01-10: replay must preserve the original message identity, so what a row says is frozen;
-- only the delivery bookkeeping columns may change. Rows are never deleted (discard is a status).
CREATE FUNCTION paydb.outbox_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'outbox rows are never deleted' USING ERRCODE = 'restrict_violation';
    END IF;
    IF NEW.event_id IS DISTINCT FROM OLD.event_id
       OR NEW.event_type IS DISTINCT FROM OLD.event_type
       OR NEW.correlation_id IS DISTINCT FROM OLD.correlation_id
       OR NEW.causation_id IS DISTINCT FROM OLD.causation_id
       OR NEW.occurred_at IS DISTINCT FROM OLD.occurred_at
       OR NEW.contract_version IS DISTINCT FROM OLD.contract_version
       OR NEW.payload IS DISTINCT FROM OLD.payload THEN
        RAISE EXCEPTION 'outbox event % is immutable', OLD.event_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER outbox_guard BEFORE UPDATE OR DELETE ON paydb.outbox
    FOR EACH ROW EXECUTE FUNCTION paydb.outbox_guard();

-- Wake the publishers: NOTIFY inside the inserting transaction is delivered at its COMMIT (and
-- never for a rollback), so a publisher is woken exactly when there is a committed row to send.
CREATE FUNCTION paydb.outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('paydb_outbox', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER outbox_notify AFTER INSERT ON paydb.outbox
    FOR EACH STATEMENT EXECUTE FUNCTION paydb.outbox_notify();
