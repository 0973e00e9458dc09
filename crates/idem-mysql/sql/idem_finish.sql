-- Dropped and created again, so the migration that installs it runs twice safely.
DROP PROCEDURE IF EXISTS idem_finish;

DELIMITER //
CREATE PROCEDURE idem_finish(
    IN p_tenant TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_key TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_owner TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_version BIGINT,
    IN p_outcome TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_status BIGINT,
    IN p_headers LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_body LONGBLOB,
    IN p_result_ref LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
MODIFIES SQL DATA SQL SECURITY INVOKER
BEGIN
    DECLARE v_tenant VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin;
    DECLARE v_key VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin;
    DECLARE v_owner VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin;
    DECLARE v_target VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin;
    DECLARE v_headers MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_size BIGINT DEFAULT 0;
    DECLARE v_i BIGINT DEFAULT 0;
    DECLARE v_n BIGINT;
    DECLARE v_pair LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_name LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_value LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    -- The test clock shift, consumed below so that it never outlives this call.
    DECLARE v_shift BIGINT DEFAULT COALESCE(@idem_clock_shift_ms, 0);
    DECLARE v_now BIGINT;
    DECLARE v_found INT DEFAULT 1;
    DECLARE v_message VARCHAR(128);
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = 0;

    -- Cleared only when set: a SET of a user variable is a statement of its own, an IF
    -- is not.
    IF @idem_clock_shift_ms IS NOT NULL THEN
        SET @idem_clock_shift_ms = NULL;
    END IF;
    CALL idem_check_names(p_tenant, p_key, p_owner);
    SET v_target = CASE p_outcome WHEN 'succeeded' THEN 'SUCCEEDED'
                                  WHEN 'terminal' THEN 'FAILED_TERMINAL'
                                  WHEN 'retryable' THEN 'FAILED_RETRYABLE' END;
    IF v_target IS NULL THEN
        SIGNAL SQLSTATE 'ID001'
            SET MESSAGE_TEXT = 'idem: outcome must be succeeded, terminal or retryable';
    END IF;
    IF p_version IS NULL OR p_version < 1 THEN
        SIGNAL SQLSTATE 'ID001' SET MESSAGE_TEXT = 'idem: version must be the claim''s (positive)';
    END IF;
    IF p_status IS NULL THEN
        IF p_headers IS NOT NULL OR p_body IS NOT NULL OR p_result_ref IS NOT NULL THEN
            SIGNAL SQLSTATE 'ID001' SET MESSAGE_TEXT = 'idem: a result needs a status';
        END IF;
    ELSE
        IF p_status < 0 OR p_status > 65535 THEN
            SIGNAL SQLSTATE 'ID001' SET MESSAGE_TEXT = 'idem: status must be between 0 and 65535';
        END IF;
        -- Headers are [[name, value], ...], as every idem store keeps them.
        IF p_headers IS NOT NULL THEN
            IF NOT JSON_VALID(p_headers) OR JSON_TYPE(p_headers) <> 'ARRAY' THEN
                SIGNAL SQLSTATE 'ID001'
                    SET MESSAGE_TEXT = 'idem: headers must be a JSON array of [name, value] strings';
            END IF;
            SET v_n = JSON_LENGTH(p_headers);
            WHILE v_i < v_n DO
                SET v_pair = JSON_EXTRACT(p_headers, CONCAT('$[', v_i, ']'));
                SET v_name = JSON_EXTRACT(v_pair, '$[0]'), v_value = JSON_EXTRACT(v_pair, '$[1]');
                IF JSON_TYPE(v_pair) <> 'ARRAY' OR JSON_LENGTH(v_pair) <> 2
                   OR JSON_TYPE(v_name) <> 'STRING' OR JSON_TYPE(v_value) <> 'STRING' THEN
                    SIGNAL SQLSTATE 'ID001'
                        SET MESSAGE_TEXT = 'idem: headers must be a JSON array of [name, value] strings';
                END IF;
                SET v_size = v_size + OCTET_LENGTH(JSON_UNQUOTE(v_name))
                                    + OCTET_LENGTH(JSON_UNQUOTE(v_value)),
                    v_i = v_i + 1;
            END WHILE;
        END IF;
        -- The column holds 65535 bytes; a longer reference must not be cut.
        IF OCTET_LENGTH(p_result_ref) > 65535 THEN
            SIGNAL SQLSTATE 'ID001' SET MESSAGE_TEXT = 'idem: result_ref must be at most 65535 bytes';
        END IF;
        -- StoredResult::size: body, header names and values, reference; the default
        -- limit of idem_core (1 MiB).
        SET v_size = v_size + COALESCE(OCTET_LENGTH(p_body), 0)
                   + COALESCE(OCTET_LENGTH(p_result_ref), 0);
        IF v_size > 1048576 THEN
            SET v_message = CONCAT('idem: result is ', v_size, ' bytes; the limit is 1048576');
            SIGNAL SQLSTATE 'ID002' SET MESSAGE_TEXT = v_message;
        END IF;
    END IF;
    -- A result's headers are never NULL in the table (an empty list is []).
    SET v_headers = IF(p_status IS NOT NULL, COALESCE(p_headers, '[]'), NULL),
        v_tenant = p_tenant, v_key = p_key, v_owner = p_owner,
        v_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000
                + v_shift;
    UPDATE idem_records
    SET state = v_target, version = version + 1, updated_at = v_now,
        lease_expires_at = NULL,
        completed_at = IF(v_target <> 'FAILED_RETRYABLE', v_now, NULL),
        result_status = p_status, result_headers = v_headers,
        result_body = p_body, result_ref = p_result_ref
    WHERE tenant_id = v_tenant AND `key` = v_key AND version = p_version
      AND owner = v_owner AND state = 'PROCESSING';
    IF ROW_COUNT() <> 1 THEN
        -- A retry of this very finish whose answer was lost: answered as the first
        -- time. A locking read sees the newest committed row at any isolation level.
        SELECT 1 INTO v_found FROM idem_records
         WHERE tenant_id = v_tenant AND `key` = v_key AND version = p_version + 1
           AND owner = v_owner AND state = v_target AND result_status <=> p_status
           AND result_headers <=> v_headers AND result_body <=> p_body
           AND result_ref <=> p_result_ref
          LOCK IN SHARE MODE;
        IF v_found = 0 THEN
            SET v_message = LEFT(CONCAT('idem: claim on ', v_tenant, '/', v_key, ' at version ',
                                        p_version, ' by ', v_owner, ' is no longer current'), 128);
            SIGNAL SQLSTATE 'ID003' SET MESSAGE_TEXT = v_message;
        END IF;
    END IF;
    -- The answer is the row: this transaction's own change (it holds the row's lock), or
    -- the finish it repeats (share-locked above).
    SELECT version, attempts AS attempt, principal, fingerprint, created_at, updated_at,
           completed_at
      FROM idem_records WHERE tenant_id = v_tenant AND `key` = v_key;
END //
DELIMITER ;
