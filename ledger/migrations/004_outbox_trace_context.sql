-- The trace context of the work that staged each outbox row (issue 27, STD01-04): the W3C
-- `traceparent` and `tracestate` current when the row was written, so that the publisher's
-- delivery and the finance ledger's booking join the payout's trace. NULL for a row staged
-- outside any trace (tracing off, a seeding command). Applied with search_path = paydb.
ALTER TABLE paydb.outbox
    ADD COLUMN traceparent text CHECK (traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'),
    ADD COLUMN tracestate text CHECK (length(tracestate) <= 512);

-- Part of what the row says, frozen like the rest of it (002's guard, which this replaces):
-- only the delivery bookkeeping columns may change.
CREATE OR REPLACE FUNCTION paydb.outbox_guard() RETURNS trigger LANGUAGE plpgsql AS $$
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
       OR NEW.payload IS DISTINCT FROM OLD.payload
       OR NEW.traceparent IS DISTINCT FROM OLD.traceparent
       OR NEW.tracestate IS DISTINCT FROM OLD.tracestate THEN
        RAISE EXCEPTION 'outbox event % is immutable', OLD.event_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;
