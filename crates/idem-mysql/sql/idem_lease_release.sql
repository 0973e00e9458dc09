-- Dropped and created again, so the migration that installs it runs twice safely.
DROP PROCEDURE IF EXISTS idem_lease_release;

DELIMITER //
CREATE PROCEDURE idem_lease_release(
    IN p_name VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin,
    IN p_owner VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin,
    IN p_token BIGINT,
    IN p_shift_ms BIGINT
)
MODIFIES SQL DATA SQL SECURITY INVOKER
BEGIN
    -- The holder's release in one round trip: 'released' with the lease it ended. Any
    -- other case (not the holder, expired, no lease) answers 'other' and writes nothing:
    -- the caller then runs the general release, which records the mismatch.
    DECLARE v_now BIGINT;
    DECLARE v_found INT DEFAULT 1;
    DECLARE l_acquired BIGINT;
    DECLARE l_expires BIGINT;
    DECLARE l_renewals BIGINT;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = 0;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

    START TRANSACTION;
    -- The row's lock, then the time: no change this waited for is later than the release.
    SELECT acquired_at, expires_at, renewals INTO l_acquired, l_expires, l_renewals
      FROM idem_leases WHERE name = p_name AND owner = p_owner AND token = p_token
       FOR UPDATE;
    SET v_now = CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) + p_shift_ms;
    IF v_found = 1 AND l_expires > v_now THEN
        -- Ended in place, the token kept; the trigger records the release.
        UPDATE idem_leases SET owner = '', expires_at = v_now WHERE name = p_name;
        COMMIT;
        SELECT 'released' AS outcome, p_owner AS owner, p_token AS token,
               l_acquired AS acquired_at, l_expires AS expires_at, l_renewals AS renewals,
               v_now AS now_ms;
    ELSE
        ROLLBACK;
        SELECT 'other' AS outcome, NULL AS owner, NULL AS token, NULL AS acquired_at,
               NULL AS expires_at, NULL AS renewals, v_now AS now_ms;
    END IF;
END //
DELIMITER ;
