-- Dropped and created again, so the migration that installs it runs twice safely.
DROP PROCEDURE IF EXISTS idem_lease_acquire;

DELIMITER //
CREATE PROCEDURE idem_lease_acquire(
    IN p_name VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin,
    IN p_owner VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin,
    IN p_ttl_ms BIGINT,
    IN p_shift_ms BIGINT
)
MODIFIES SQL DATA SQL SECURITY INVOKER
BEGIN
    -- The store's try_acquire in one round trip (crates/idem-mysql/src/lease.rs has the
    -- rules; the Rust side checks the name, owner and TTL before calling). Answers one
    -- row: 'held' with the live holder, or 'granted' with the new lease. The evidence of
    -- a grant is written by the triggers on idem_leases.
    DECLARE v_now BIGINT DEFAULT CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) + p_shift_ms;
    DECLARE v_found INT DEFAULT 1;
    DECLARE v_last BIGINT DEFAULT 0;
    DECLARE v_token BIGINT;
    DECLARE l_owner VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin;
    DECLARE l_token BIGINT;
    DECLARE l_acquired BIGINT;
    DECLARE l_expires BIGINT;
    DECLARE l_renewals BIGINT;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = 0;
    -- A refused statement (deadlock victim, lock wait timeout) leaves nothing behind and
    -- reaches the caller with its own error code, which retries the call.
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

    -- An ended lease (owner '') is granted in place, its token + 1 (the row holds the
    -- name's last token). A deadline at or before this statement's time also means that
    -- an end this waited for is not later than the grant.
    UPDATE idem_leases
       SET owner = p_owner, token = LAST_INSERT_ID(token + 1), acquired_at = v_now,
           expires_at = v_now + p_ttl_ms, renewals = 0
     WHERE name = p_name AND owner = '' AND expires_at <= v_now;
    IF ROW_COUNT() = 1 THEN
        SELECT 'granted' AS outcome, p_owner AS owner, CAST(LAST_INSERT_ID() AS SIGNED) AS token,
               v_now AS acquired_at, v_now + p_ttl_ms AS expires_at,
               CAST(0 AS SIGNED) AS renewals, v_now AS now_ms;
    ELSE
        -- A live holder is answered from a plain read, without the name's lock.
        SELECT owner, token, acquired_at, expires_at, renewals
          INTO l_owner, l_token, l_acquired, l_expires, l_renewals
          FROM idem_leases WHERE name = p_name;
        IF v_found = 1 AND l_owner <> '' AND l_expires > v_now THEN
            SELECT 'held' AS outcome, l_owner AS owner, l_token AS token,
                   l_acquired AS acquired_at, l_expires AS expires_at,
                   l_renewals AS renewals, v_now AS now_ms;
        ELSE
            START TRANSACTION;
            -- The name's lock: its counter row (a record lock on the primary key).
            INSERT INTO idem_lease_tokens (name, last_token) VALUES (p_name, 0)
                ON DUPLICATE KEY UPDATE last_token = last_token;
            -- The counter row exists now (locked above): one locking read of it and the
            -- lease row, so the in-place changes wait for this one.
            SELECT l.owner, l.token, l.acquired_at, l.expires_at, l.renewals, t.last_token
              INTO l_owner, l_token, l_acquired, l_expires, l_renewals, v_last
              FROM idem_lease_tokens t LEFT JOIN idem_leases l ON l.name = t.name
             WHERE t.name = p_name
               FOR UPDATE;
            -- Read after the locks: no change this call waited for is later than its time.
            SET v_now = CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) + p_shift_ms;
            SET v_found = l_token IS NOT NULL AND l_owner <> '';
            IF v_found = 1 AND l_expires > v_now THEN
                ROLLBACK;
                SELECT 'held' AS outcome, l_owner AS owner, l_token AS token,
                       l_acquired AS acquired_at, l_expires AS expires_at,
                       l_renewals AS renewals, v_now AS now_ms;
            ELSE
                IF v_found = 1 THEN
                    -- The expiry is recorded once, by the change that notices it.
                    INSERT INTO idem_lease_events (name, kind, at, owner, token,
                                                   acquired_at, expires_at, detail)
                        VALUES (p_name, 'expired', v_now, l_owner, l_token, l_acquired,
                                l_expires, NULL);
                END IF;
                SET v_token = GREATEST(v_last, COALESCE(l_token, 0)) + 1;
                UPDATE idem_lease_tokens SET last_token = v_token WHERE name = p_name;
                INSERT INTO idem_leases (name, owner, token, acquired_at, expires_at, renewals)
                    VALUES (p_name, p_owner, v_token, v_now, v_now + p_ttl_ms, 0)
                    ON DUPLICATE KEY UPDATE owner = VALUES(owner), token = VALUES(token),
                        acquired_at = VALUES(acquired_at), expires_at = VALUES(expires_at),
                        renewals = 0;
                COMMIT;
                SELECT 'granted' AS outcome, p_owner AS owner, v_token AS token,
                       v_now AS acquired_at, v_now + p_ttl_ms AS expires_at,
                       CAST(0 AS SIGNED) AS renewals, v_now AS now_ms;
            END IF;
        END IF;
    END IF;
END //
DELIMITER ;
