-- Dropped and created again, so the migration that installs it runs twice safely.
DROP PROCEDURE IF EXISTS idem_check_lease;

DELIMITER //
CREATE PROCEDURE idem_check_lease(IN p_lease_ms BIGINT)
DETERMINISTIC NO SQL SQL SECURITY INVOKER
BEGIN
    -- idem_core::MAX_LEASE: 24 hours.
    IF p_lease_ms IS NULL OR p_lease_ms < 1 OR p_lease_ms > 86400000 THEN
        SIGNAL SQLSTATE 'ID001'
            SET MESSAGE_TEXT = 'idem: lease must be between 1 ms and 86400000 ms';
    END IF;
END //
DELIMITER ;
