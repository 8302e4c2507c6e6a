-- Lock service tables (schema lockservice; run with search_path set to it by payouts.migrate).
-- Keys are stored with the backend's namespace prefix already applied.

-- Session leases. Expiry is decided by the server's clock_timestamp(), never by a client.
CREATE TABLE sessions (
    session_id  uuid PRIMARY KEY,
    ttl         interval    NOT NULL,
    opened_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at  timestamptz NOT NULL
);

-- One row per key that ever had a grant. NEVER deleted and `counter` is never lowered: it is the
-- token base of the PostgreSQL backend (INV-04). `last_token` is the highest token issued.
CREATE TABLE key_counters (
    key         text PRIMARY KEY,
    counter     bigint NOT NULL DEFAULT 0 CHECK (counter >= 0),
    last_token  bigint
);

-- The current grant of a key, if any. A row whose session has expired is no longer a valid grant;
-- it is cleaned up lazily by the next acquire, revoke or inspect of the key.
CREATE TABLE holders (
    key          text PRIMARY KEY REFERENCES key_counters (key),
    session_id   uuid        NOT NULL,
    token        bigint      NOT NULL,
    acquired_at  timestamptz NOT NULL
);
CREATE INDEX holders_session_idx ON holders (session_id);

-- Sessions currently blocked in acquire (for inspect().waiters only).
CREATE TABLE waiters (
    key         text        NOT NULL,
    session_id  uuid        NOT NULL,
    since       timestamptz NOT NULL DEFAULT clock_timestamp(),
    waiter_id   uuid PRIMARY KEY
);
CREATE INDEX waiters_key_idx ON waiters (key);

-- The token epoch per namespace prefix; raised only by the restore procedure (bump_epoch).
CREATE TABLE epochs (
    prefix      text PRIMARY KEY,
    epoch       bigint NOT NULL DEFAULT 0 CHECK (epoch >= 0)
);

-- Append-only history of grants, for the invariant checker (INV-04, INV-06).
CREATE TABLE grant_history (
    id           bigserial PRIMARY KEY,
    key          text        NOT NULL,
    token        bigint      NOT NULL,
    session_id   uuid        NOT NULL,
    acquired_at  timestamptz NOT NULL,
    ended_at     timestamptz,
    end_reason   text CHECK (end_reason IN
                     ('released', 'expired', 'revoked', 'session_closed', 'epoch_bumped'))
);
CREATE UNIQUE INDEX grant_history_key_token_idx ON grant_history (key, token);

-- Break-glass actions with actor and reason (FR-08, FR-30).
CREATE TABLE audit (
    id          bigserial PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    prefix      text        NOT NULL,
    action      text        NOT NULL CHECK (action IN ('force_revoke', 'bump_epoch')),
    key         text,
    operator    text        NOT NULL,
    reason      text        NOT NULL,
    detail      jsonb       NOT NULL DEFAULT '{}'::jsonb
);
