-- Payment database (schema paydb): accounts, balances, payouts, ledger, audit log, outbox.
-- Applied by payouts.migrate with search_path = paydb; objects are paydb-qualified anyway so that
-- trigger bodies never depend on the caller's search_path.

CREATE TABLE paydb.accounts (
    account_id  text PRIMARY KEY CHECK (account_id ~ '^[A-Za-z0-9_.-]{1,128}$'),
    kind        text NOT NULL CHECK (kind IN ('customer', 'system')),
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- One balance row per account, system accounts included, so that for EVERY account
-- balance = sum of its entries (INV-03). `fence` makes the row an enforcement point (FR-15).
CREATE TABLE paydb.balances (
    account_id  text PRIMARY KEY REFERENCES paydb.accounts (account_id),
    balance     bigint NOT NULL DEFAULT 0,
    fence       bigint NOT NULL DEFAULT 0 CHECK (fence >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- The transition table of ARCHITECTURE §2, mirrored from ledger/states.py (a test checks that
-- the two are equal). The payouts trigger refuses any state change not listed here.
CREATE TABLE paydb.payout_transitions (
    from_state  text NOT NULL,
    to_state    text NOT NULL,
    PRIMARY KEY (from_state, to_state)
);
INSERT INTO paydb.payout_transitions (from_state, to_state) VALUES
    ('PENDING', 'CLAIMED'),
    ('PENDING', 'FAILED'),
    ('CLAIMED', 'RAIL_SUBMITTED'),
    ('RAIL_SUBMITTED', 'RAIL_ACKED'),
    ('RAIL_SUBMITTED', 'FAILED'),
    ('RAIL_SUBMITTED', 'RAIL_AMBIGUOUS'),
    ('RAIL_AMBIGUOUS', 'RAIL_ACKED'),
    ('RAIL_AMBIGUOUS', 'FAILED'),
    ('RAIL_AMBIGUOUS', 'ABANDONED'),
    ('RAIL_ACKED', 'POSTED');

CREATE TABLE paydb.payouts (
    payout_id         text PRIMARY KEY CHECK (payout_id ~ '^[A-Za-z0-9_.:-]{1,128}$'),
    account_id        text NOT NULL REFERENCES paydb.accounts (account_id),
    amount            bigint NOT NULL CHECK (amount > 0),
    state             text NOT NULL DEFAULT 'PENDING' CHECK (state IN (
                          'PENDING', 'CLAIMED', 'RAIL_SUBMITTED', 'RAIL_AMBIGUOUS',
                          'RAIL_ACKED', 'POSTED', 'FAILED', 'ABANDONED')),
    fence             bigint NOT NULL DEFAULT 0 CHECK (fence >= 0),
    -- What the rail sees; stable for the payout's whole life so lookups can find it (FR-23).
    client_reference  text NOT NULL UNIQUE,
    failure_reason    text,
    ledger_group_id   uuid,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX payouts_account_state ON paydb.payouts (account_id, state);
CREATE INDEX payouts_state ON paydb.payouts (state);

CREATE FUNCTION paydb.payouts_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- INV-08: a terminal payout is frozen, whatever the statement and whatever the token.
    IF OLD.state IN ('POSTED', 'FAILED', 'ABANDONED') THEN
        RAISE EXCEPTION 'payout % is terminal (%) and cannot change', OLD.payout_id, OLD.state
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.payout_id IS DISTINCT FROM OLD.payout_id
       OR NEW.account_id IS DISTINCT FROM OLD.account_id
       OR NEW.amount IS DISTINCT FROM OLD.amount
       OR NEW.client_reference IS DISTINCT FROM OLD.client_reference THEN
        RAISE EXCEPTION 'payout % identity columns are immutable', OLD.payout_id
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.state <> OLD.state AND NOT EXISTS (
        SELECT 1 FROM paydb.payout_transitions t
        WHERE t.from_state = OLD.state AND t.to_state = NEW.state
    ) THEN
        RAISE EXCEPTION 'payout %: % -> % is not an allowed transition',
            OLD.payout_id, OLD.state, NEW.state
            USING ERRCODE = 'check_violation';
    END IF;
    NEW.updated_at := now();
    RETURN NEW;
END
$$;
CREATE TRIGGER payouts_guard BEFORE UPDATE ON paydb.payouts
    FOR EACH ROW EXECUTE FUNCTION paydb.payouts_guard();

CREATE FUNCTION paydb.payouts_refuse_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'payouts are never deleted' USING ERRCODE = 'restrict_violation';
END
$$;
CREATE TRIGGER payouts_no_delete BEFORE DELETE ON paydb.payouts
    FOR EACH ROW EXECUTE FUNCTION paydb.payouts_refuse_delete();

-- Ledger: a group is one money movement (a funding, or a payout's posting); its entries sum to 0.
CREATE TABLE paydb.ledger_groups (
    group_id        uuid PRIMARY KEY,
    kind            text NOT NULL CHECK (kind IN ('funding', 'payout')),
    -- UNIQUE: a payout can be posted at most once, even if every other guard failed.
    payout_id       text UNIQUE REFERENCES paydb.payouts (payout_id),
    correlation_id  text NOT NULL,
    token           bigint,
    created_at      timestamptz NOT NULL DEFAULT now(),
    CHECK ((kind = 'payout') = (payout_id IS NOT NULL))
);

CREATE TABLE paydb.ledger_entries (
    entry_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    group_id    uuid NOT NULL REFERENCES paydb.ledger_groups (group_id),
    account_id  text NOT NULL REFERENCES paydb.accounts (account_id),
    amount      bigint NOT NULL CHECK (amount <> 0),  -- signed: debit < 0 < credit
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ledger_entries_group ON paydb.ledger_entries (group_id);
CREATE INDEX ledger_entries_account ON paydb.ledger_entries (account_id);

-- INV-03, enforced by the database: checked at COMMIT (deferred), so a group's entries can be
-- inserted one by one but the transaction cannot commit unless they sum to zero (and there are
-- at least two of them: a group with no entries is not a money movement).
CREATE FUNCTION paydb.ledger_group_balanced() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    total numeric;
    n     bigint;
BEGIN
    SELECT COALESCE(SUM(amount), 0), COUNT(*) INTO total, n
      FROM paydb.ledger_entries WHERE group_id = NEW.group_id;
    IF total <> 0 OR n < 2 THEN
        RAISE EXCEPTION 'ledger group % is unbalanced (sum %, % entries)', NEW.group_id, total, n
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END
$$;
CREATE CONSTRAINT TRIGGER ledger_entries_balanced AFTER INSERT ON paydb.ledger_entries
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION paydb.ledger_group_balanced();
CREATE CONSTRAINT TRIGGER ledger_groups_balanced AFTER INSERT ON paydb.ledger_groups
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION paydb.ledger_group_balanced();

-- Append-only: ledger rows and audit rows are facts; corrections are new groups, never edits.
CREATE FUNCTION paydb.refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only (% refused)', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'restrict_violation';
END
$$;
CREATE TRIGGER ledger_entries_append_only BEFORE UPDATE OR DELETE ON paydb.ledger_entries
    FOR EACH ROW EXECUTE FUNCTION paydb.refuse_change();
CREATE TRIGGER ledger_entries_no_truncate BEFORE TRUNCATE ON paydb.ledger_entries
    FOR EACH STATEMENT EXECUTE FUNCTION paydb.refuse_change();
CREATE TRIGGER ledger_groups_append_only BEFORE UPDATE OR DELETE ON paydb.ledger_groups
    FOR EACH ROW EXECUTE FUNCTION paydb.refuse_change();
CREATE TRIGGER ledger_groups_no_truncate BEFORE TRUNCATE ON paydb.ledger_groups
    FOR EACH STATEMENT EXECUTE FUNCTION paydb.refuse_change();

-- FR-30: every transition, posting, funding and break-glass action, with actor and token.
CREATE TABLE paydb.audit_log (
    audit_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    actor       text NOT NULL CHECK (actor <> ''),
    token       bigint,
    action      text NOT NULL,
    payout_id   text,
    account_id  text,
    from_state  text,
    to_state    text,
    details     jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX audit_log_payout ON paydb.audit_log (payout_id, audit_id);
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON paydb.audit_log
    FOR EACH ROW EXECUTE FUNCTION paydb.refuse_change();
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON paydb.audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION paydb.refuse_change();

-- STD01-10 transactional outbox: written in the same transaction as the change it reports; a
-- publisher (later issue) delivers unpublished rows at least once, never regenerating event_id.
CREATE TABLE paydb.outbox (
    event_id          uuid PRIMARY KEY,
    event_type        text NOT NULL,
    correlation_id    text NOT NULL,
    causation_id      text,
    occurred_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    contract_version  text NOT NULL,
    payload           jsonb NOT NULL,
    published_at      timestamptz,
    attempts          integer NOT NULL DEFAULT 0
);
CREATE INDEX outbox_unpublished ON paydb.outbox (occurred_at) WHERE published_at IS NULL;

-- The system accounts of every posting and funding group (ARCHITECTURE §6).
INSERT INTO paydb.accounts (account_id, kind) VALUES ('rail_clearing', 'system'), ('funding_source', 'system');
INSERT INTO paydb.balances (account_id) VALUES ('rail_clearing'), ('funding_source');
