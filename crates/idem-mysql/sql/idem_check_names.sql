-- Dropped and created again, so the migration that installs it runs twice safely.
DROP PROCEDURE IF EXISTS idem_check_names;

DELIMITER //
CREATE PROCEDURE idem_check_names(
    IN p_tenant TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_key TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_owner TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
DETERMINISTIC NO SQL SQL SECURITY INVOKER
BEGIN
    -- The rules of idem_core's TenantId, IdempotencyKey and OwnerId: visible ASCII
    -- (0x21..0x7E; one byte per character rules out the rest of UTF-8), at most 128
    -- bytes (255 for a key), and no ',' or ';' in a key. The negated class finds any
    -- byte outside the range, a final newline too (an anchored '^[!-~]+$' let one
    -- through: `$` matches before it). idem_claim, idem_finish and idem_heartbeat call
    -- this.
    IF p_tenant IS NULL OR OCTET_LENGTH(p_tenant) NOT BETWEEN 1 AND 128
       OR CHAR_LENGTH(p_tenant) <> OCTET_LENGTH(p_tenant) OR p_tenant REGEXP '[^!-~]' THEN
        SIGNAL SQLSTATE 'ID001'
            SET MESSAGE_TEXT = 'idem: tenant must be 1 to 128 visible ASCII characters';
    END IF;
    IF p_key IS NULL OR OCTET_LENGTH(p_key) NOT BETWEEN 1 AND 255
       OR CHAR_LENGTH(p_key) <> OCTET_LENGTH(p_key) OR p_key REGEXP '[^!-~]'
       OR LOCATE(',', p_key) > 0 OR LOCATE(';', p_key) > 0 THEN
        SIGNAL SQLSTATE 'ID001'
            SET MESSAGE_TEXT = 'idem: key must be 1 to 255 visible ASCII characters other than , and ;';
    END IF;
    IF p_owner IS NULL OR OCTET_LENGTH(p_owner) NOT BETWEEN 1 AND 128
       OR CHAR_LENGTH(p_owner) <> OCTET_LENGTH(p_owner) OR p_owner REGEXP '[^!-~]' THEN
        SIGNAL SQLSTATE 'ID001'
            SET MESSAGE_TEXT = 'idem: owner must be 1 to 128 visible ASCII characters';
    END IF;
END //
DELIMITER ;
