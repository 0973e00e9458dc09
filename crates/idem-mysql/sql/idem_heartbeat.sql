-- Dropped and created again, so the migration that installs it runs twice safely.
DROP PROCEDURE IF EXISTS idem_heartbeat;

DELIMITER //
CREATE PROCEDURE idem_heartbeat(
    IN p_tenant TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_key TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_owner TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_version BIGINT,
    IN p_lease_ms BIGINT
)
MODIFIES SQL DATA SQL SECURITY INVOKER
BEGIN
    DECLARE v_tenant VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin;
    DECLARE v_key VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin;
    DECLARE v_owner VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin;
    DECLARE v_shift BIGINT;
    DECLARE v_now BIGINT;
    DECLARE v_found INT DEFAULT 1;
    DECLARE v_message VARCHAR(128);
    DECLARE o_deadline BIGINT;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = 0;

    SET v_shift = COALESCE(@idem_clock_shift_ms, 0);
    SET @idem_clock_shift_ms = NULL;
    CALL idem_check_names(p_tenant, p_key, p_owner);
    CALL idem_check_lease(p_lease_ms);
    SET v_tenant = p_tenant, v_key = p_key, v_owner = p_owner;
    SET v_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000
                + v_shift;
    UPDATE idem_records
    SET lease_expires_at = v_now + p_lease_ms, updated_at = v_now
    WHERE tenant_id = v_tenant AND `key` = v_key AND version = p_version
      AND owner = v_owner AND state = 'PROCESSING';
    -- ROW_COUNT() counts changed rows unless the client asked for found rows, and a
    -- heartbeat within the same millisecond changes nothing: read back instead. The
    -- claim's version never comes back once gone, so the read agrees with the update.
    SELECT lease_expires_at INTO o_deadline FROM idem_records
     WHERE tenant_id = v_tenant AND `key` = v_key AND version = p_version
       AND owner = v_owner AND state = 'PROCESSING'
       FOR UPDATE;
    IF v_found = 0 THEN
        SET v_message = LEFT(CONCAT('idem: claim on ', v_tenant, '/', v_key, ' at version ',
                                    p_version, ' by ', v_owner, ' is no longer current'), 128);
        SIGNAL SQLSTATE 'ID003' SET MESSAGE_TEXT = v_message;
    END IF;
    SELECT o_deadline AS lease_expires_at;
END //
DELIMITER ;
