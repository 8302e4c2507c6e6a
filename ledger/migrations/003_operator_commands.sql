-- Operator commands (abandon, revoke) a payout workflow accepted or refused (issue 24).
-- Applied with search_path = paydb; objects are paydb-qualified anyway.
--
-- Why here: the payment store is where a command's operator assertion is verified when the
-- workflow accepts it, so its nonce is recorded here too, and an assertion is single-use: sent
-- again (from the payout's history, to a reset run, ...) it is refused as a replay. An abandon
-- is carried out against this row (the check made at acceptance), in the same transaction as
-- RAIL_AMBIGUOUS -> ABANDONED, so an assertion that expires while the abandon waits for a grant
-- is neither dropped nor re-judged. Every command ends here as carried_out or refused.
CREATE TABLE paydb.operator_commands (
    -- Chosen by the workflow, never by the sender: {run id}:{action}:{n}. A retried activity
    -- presents the same id and gets the verdict recorded the first time.
    command_id   text PRIMARY KEY CHECK (command_id ~ '^[A-Za-z0-9_.:-]{1,200}$'),
    -- The verified assertion's nonce (unique: single use). NULL when the command was refused
    -- before an assertion was accepted, and 'unverified:{command_id}' with verification off.
    nonce        text UNIQUE,
    payout_id    text NOT NULL REFERENCES paydb.payouts (payout_id),
    action       text NOT NULL CHECK (action IN ('abandon', 'revoke')),
    -- The authenticated identity inside the assertion, or 'unverified:{claim}' for a name the
    -- sender typed (refused commands, or verification off): the two can never look alike.
    actor        text NOT NULL CHECK (actor <> ''),
    verified     boolean NOT NULL,
    reason       text NOT NULL,
    via          text NOT NULL CHECK (via IN ('signal', 'update')),
    recorded_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- NULL: accepted and not carried out yet.
    outcome      text CHECK (outcome IN ('carried_out', 'refused')),
    outcome_at   timestamptz,
    detail       jsonb NOT NULL DEFAULT '{}'::jsonb,
    CHECK ((outcome IS NULL) = (outcome_at IS NULL)),
    CHECK (coalesce(outcome, '') = 'refused' OR nonce IS NOT NULL)
);
CREATE INDEX operator_commands_payout ON paydb.operator_commands (payout_id, recorded_at);
-- A verdict, once given, is final.
CREATE FUNCTION paydb.operator_command_final() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.outcome IS NOT NULL THEN
        RAISE EXCEPTION 'operator command % already %', OLD.command_id, OLD.outcome;
    END IF;
    IF NEW.command_id <> OLD.command_id OR NEW.nonce IS DISTINCT FROM OLD.nonce
       OR NEW.payout_id <> OLD.payout_id OR NEW.action <> OLD.action
       OR NEW.actor <> OLD.actor OR NEW.verified <> OLD.verified THEN
        RAISE EXCEPTION 'operator command %: only its outcome may change', OLD.command_id;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER operator_commands_final BEFORE UPDATE ON paydb.operator_commands
    FOR EACH ROW EXECUTE FUNCTION paydb.operator_command_final();
CREATE TRIGGER operator_commands_no_delete BEFORE DELETE OR TRUNCATE ON paydb.operator_commands
    FOR EACH STATEMENT EXECUTE FUNCTION paydb.refuse_change();
