-- Cheap blocked acquirers: acquire_grant answers 'held' from a plain read, with no row lock and no
-- write, and reports how long the holder's session has left, so that a waiter sleeps until then
-- (or a NOTIFY) instead of polling (lockservice/server/backends/postgres.py, PostgresBackend.acquire).
--
-- Before, every attempt took the epoch row FOR SHARE and the key's counter row FOR UPDATE before
-- it looked at the holder: each poll of each waiter was a write transaction that queued behind the
-- key's other acquirers. Everything past the pre-check is the 002 function unchanged, including
-- the holder check under the counter row lock, which is what decides (the pre-check can race
-- with a release or an expiry; it may only ever answer 'held', never grant).
--
-- A new OUT column changes the function's result type, which CREATE OR REPLACE cannot do.

DROP FUNCTION acquire_grant(text, text, uuid, bigint);

-- status: 'granted' | 'held' | 'no_session'. On 'granted', token/acquired_at/expires_at describe
-- the new grant and expired_token/expired_session the expired grant it replaced, if any. On
-- 'held', holder_expires_in is the number of seconds (>= 0, on the server's clock) until the
-- current holder's session expires unless it is kept alive.
CREATE FUNCTION acquire_grant(p_prefix text, p_key text, p_sid uuid, p_stride bigint,
    OUT status text, OUT token bigint, OUT acquired_at timestamptz, OUT expires_at timestamptz,
    OUT expired_token bigint, OUT expired_session uuid, OUT holder_expires_in double precision)
LANGUAGE plpgsql AS $$
DECLARE
    v_epoch   bigint;
    v_counter bigint;
    v_holder  record;
BEGIN
    -- Pre-check: plain reads only (no FOR SHARE/UPDATE, no INSERT), so a waiter that finds the key
    -- held costs one index lookup per table and never queues behind the key's row lock. The
    -- caller's own session is checked first, as below, so a dead session still gets 'no_session'.
    SELECT s.expires_at INTO expires_at FROM lockservice.sessions s
     WHERE s.session_id = p_sid AND s.expires_at > clock_timestamp();
    IF NOT FOUND THEN
        status := 'no_session';
        RETURN;
    END IF;
    SELECT greatest(extract(epoch FROM s.expires_at - clock_timestamp()), 0)::double precision
      INTO holder_expires_in
      FROM lockservice.holders h
      JOIN lockservice.sessions s ON s.session_id = h.session_id
     WHERE h.key = p_key AND s.expires_at > clock_timestamp();
    IF FOUND THEN
        -- Also when the holder is this very session: no re-entrancy (DR-04).
        status := 'held';
        RETURN;
    END IF;

    -- Shared lock on the epoch row: bump_epoch (FOR UPDATE) waits for in-flight grants.
    SELECT e.epoch INTO v_epoch FROM lockservice.epochs e WHERE e.prefix = p_prefix FOR SHARE;
    IF NOT FOUND THEN
        INSERT INTO lockservice.epochs (prefix) VALUES (p_prefix) ON CONFLICT DO NOTHING;
        SELECT e.epoch INTO v_epoch FROM lockservice.epochs e WHERE e.prefix = p_prefix FOR SHARE;
    END IF;
    SELECT s.expires_at INTO expires_at FROM lockservice.sessions s
     WHERE s.session_id = p_sid AND s.expires_at > clock_timestamp();
    IF NOT FOUND THEN
        status := 'no_session';
        RETURN;
    END IF;
    INSERT INTO lockservice.key_counters (key) VALUES (p_key) ON CONFLICT DO NOTHING;
    -- The counter row lock serialises every acquirer (and revoker) of this key.
    PERFORM 1 FROM lockservice.key_counters kc WHERE kc.key = p_key FOR UPDATE;
    -- Re-checked under the lock (a new statement, so a fresh snapshot): the pre-check raced.
    SELECT h.session_id, h.token, s.expires_at AS session_expires,
           coalesce(s.expires_at > clock_timestamp(), false) AS valid,
           greatest(extract(epoch FROM s.expires_at - clock_timestamp()), 0)::double precision
               AS expires_in
      INTO v_holder
      FROM lockservice.holders h
      LEFT JOIN lockservice.sessions s ON s.session_id = h.session_id
     WHERE h.key = p_key;
    IF FOUND AND v_holder.valid THEN
        -- Also when the holder is this very session: no re-entrancy (DR-04).
        status := 'held';
        holder_expires_in := v_holder.expires_in;
        RETURN;
    END IF;
    IF FOUND THEN
        -- The holder's session expired on the server's clock: its grant ended at that expiry.
        DELETE FROM lockservice.holders h WHERE h.key = p_key;
        PERFORM lockservice.end_grant(p_key, v_holder.token, 'expired',
                                      coalesce(v_holder.session_expires, clock_timestamp()));
        expired_token := v_holder.token;
        expired_session := v_holder.session_id;
    END IF;
    -- The counter is only ever raised (INV-04); the token base must stay below the epoch stride.
    UPDATE lockservice.key_counters kc SET counter = kc.counter + 1,
           last_token = v_epoch * p_stride + kc.counter + 1
     WHERE kc.key = p_key
    RETURNING kc.counter, kc.last_token INTO v_counter, token;
    IF v_counter >= p_stride THEN
        RAISE EXCEPTION 'token base of % overflows its epoch', p_key
              USING ERRCODE = 'numeric_value_out_of_range';
    END IF;
    acquired_at := clock_timestamp();
    INSERT INTO lockservice.holders (key, session_id, token, acquired_at)
    VALUES (p_key, p_sid, token, acquired_at);
    INSERT INTO lockservice.grant_history (key, token, session_id, acquired_at)
    VALUES (p_key, token, p_sid, acquired_at);
    status := 'granted';
END;
$$;
