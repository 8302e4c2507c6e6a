-- One round trip per lock operation: acquire, release and session close become plpgsql functions
-- (each call is one statement, so one transaction, in autocommit). The rules are those of the
-- multi-statement transactions they replace (see lockservice/server/backends/postgres.py); what changed
-- is that the grant history now records when an EXPIRED grant ended: its session's expiry time.

-- End one grant's history row. A grant whose session had already expired ended at that expiry,
-- whatever the caller is doing now (revoke, close, takeover); otherwise it ends now for p_reason.
CREATE FUNCTION end_grant(p_key text, p_token bigint, p_reason text, p_session_expires timestamptz)
RETURNS void LANGUAGE sql AS $$
    UPDATE lockservice.grant_history
       SET ended_at   = CASE WHEN p_session_expires <= clock_timestamp()
                             THEN p_session_expires ELSE clock_timestamp() END,
           end_reason = CASE WHEN p_session_expires <= clock_timestamp()
                             THEN 'expired' ELSE p_reason END
     WHERE key = p_key AND token = p_token AND ended_at IS NULL;
$$;

-- status: 'granted' | 'held' | 'no_session'. On 'granted', token/acquired_at/expires_at describe
-- the new grant and expired_token/expired_session the expired grant it replaced, if any.
CREATE FUNCTION acquire_grant(p_prefix text, p_key text, p_sid uuid, p_stride bigint,
    OUT status text, OUT token bigint, OUT acquired_at timestamptz, OUT expires_at timestamptz,
    OUT expired_token bigint, OUT expired_session uuid)
LANGUAGE plpgsql AS $$
DECLARE
    v_epoch   bigint;
    v_counter bigint;
    v_holder  record;
BEGIN
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
    SELECT h.session_id, h.token, s.expires_at AS session_expires,
           coalesce(s.expires_at > clock_timestamp(), false) AS valid
      INTO v_holder
      FROM lockservice.holders h
      LEFT JOIN lockservice.sessions s ON s.session_id = h.session_id
     WHERE h.key = p_key;
    IF FOUND AND v_holder.valid THEN
        -- Also when the holder is this very session: no re-entrancy (DR-04).
        status := 'held';
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

-- Compare-and-delete on (key, session, token) of a still-valid grant (FR-05); true if released.
CREATE FUNCTION release_grant(p_key text, p_sid uuid, p_token bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM lockservice.holders h USING lockservice.sessions s
     WHERE h.key = p_key AND h.session_id = p_sid AND h.token = p_token
       AND s.session_id = h.session_id AND s.expires_at > clock_timestamp();
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE lockservice.grant_history g SET ended_at = clock_timestamp(), end_reason = 'released'
     WHERE g.key = p_key AND g.token = p_token AND g.ended_at IS NULL;
    PERFORM pg_notify('lockservice_release', p_key);
    RETURN true;
END;
$$;

-- Close a session: end (and notify) each of its grants, drop its waiters and the session row.
-- Returns the number of grants ended. Closing an unknown session is a no-op.
CREATE FUNCTION close_session(p_sid uuid)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_expires timestamptz;
    v_row     record;
    v_count   integer := 0;
BEGIN
    SELECT s.expires_at INTO v_expires FROM lockservice.sessions s
     WHERE s.session_id = p_sid FOR UPDATE;
    FOR v_row IN DELETE FROM lockservice.holders h WHERE h.session_id = p_sid
                 RETURNING h.key, h.token LOOP
        PERFORM lockservice.end_grant(v_row.key, v_row.token, 'session_closed',
                                      coalesce(v_expires, clock_timestamp()));
        PERFORM pg_notify('lockservice_release', v_row.key);
        v_count := v_count + 1;
    END LOOP;
    DELETE FROM lockservice.waiters w WHERE w.session_id = p_sid;
    DELETE FROM lockservice.sessions s WHERE s.session_id = p_sid;
    RETURN v_count;
END;
$$;
