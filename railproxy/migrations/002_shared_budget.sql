-- The rail Connection's budget, shared by every replica of the proxy (issue 26, STD01-07/08), and
-- each replica's identity on the attempts it records (docs/rail.md "Replicas").

-- One row per unit of the budget of one Connection (`connection_id`) for one kind of call
-- (`budget`: submit or lookup):
-- * kind 'concurrency': a slot. Taken for one call to the rail (busy_until = the lease's end,
--   lease_id = the taker's), freed by the taker when the call is over (busy_until = -infinity);
--   a taker that dies frees it by the lease running out. At most `max concurrency` slots are
--   busy, so at most that many calls of the Connection are open at once, whatever the replicas.
-- * kind 'rate': a permit. Taken for one call and busy for burst/rate seconds, never freed early:
--   in any window of W seconds at most burst + rate * W calls take one (each of the `burst`
--   permits at most W / (burst / rate) + 1 times), which is the token bucket's bound.
-- Rows are made at start-up by each proxy for its settings (INSERT ... ON CONFLICT DO NOTHING);
-- a take uses rows below its own limits only. Times are the database's clock (clock_timestamp),
-- one clock for every replica.
CREATE TABLE budget_slots (
    connection_id  text NOT NULL,
    budget         text NOT NULL CHECK (budget IN ('submit', 'lookup')),
    kind           text NOT NULL CHECK (kind IN ('concurrency', 'rate')),
    slot           integer NOT NULL CHECK (slot >= 0),
    busy_until     timestamptz NOT NULL DEFAULT '-infinity',
    lease_id       uuid,          -- a concurrency slot's current taker; NULL for permits
    holder         text,          -- the replica id of the last taker (diagnostics)
    taken_at       timestamptz,
    PRIMARY KEY (connection_id, budget, kind, slot)
);

-- Which replica recorded (and forwarded) each attempt. NULL on attempts recorded before 002.
ALTER TABLE attempts ADD COLUMN replica_id text;
