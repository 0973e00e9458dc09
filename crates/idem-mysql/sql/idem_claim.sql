-- Dropped and created again, so the migration that installs it runs twice safely.
DROP PROCEDURE IF EXISTS idem_claim;

DELIMITER //
CREATE PROCEDURE idem_claim(
    IN p_tenant TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_key TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_fingerprint BLOB,
    IN p_principal TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_owner TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_lease_ms BIGINT
)
MODIFIES SQL DATA SQL SECURITY INVOKER
BEGIN
    -- Checked arguments, in the table's character set and collation (so comparisons use
    -- the primary key, byte for byte).
    DECLARE v_tenant VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin;
    DECLARE v_key VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin;
    DECLARE v_principal VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin;
    DECLARE v_owner VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin;
    DECLARE v_shift BIGINT;
    DECLARE v_run INT DEFAULT 0;
    DECLARE v_found INT DEFAULT 1;
    DECLARE v_dup INT DEFAULT 0;
    DECLARE v_message VARCHAR(128);
    -- The record read.
    DECLARE r_principal VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin;
    DECLARE r_fingerprint VARBINARY(32);
    DECLARE r_state VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin;
    DECLARE r_version BIGINT;
    DECLARE r_owner VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin;
    DECLARE r_lease BIGINT;
    DECLARE r_status INT;
    DECLARE r_headers MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE r_body LONGBLOB;
    DECLARE r_ref TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE r_attempts INT;
    DECLARE r_created BIGINT;
    DECLARE r_updated BIGINT;
    DECLARE r_completed BIGINT;
    -- The answer: one row, the columns of the PostgreSQL function.
    DECLARE o_decision VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin;
    DECLARE o_kind VARCHAR(24) CHARACTER SET ascii COLLATE ascii_bin;
    DECLARE o_version BIGINT;
    DECLARE o_attempt INT;
    DECLARE o_lease BIGINT;
    DECLARE o_now BIGINT;
    DECLARE o_state VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin;
    DECLARE o_owner VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin;
    DECLARE o_status INT;
    DECLARE o_headers MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE o_body LONGBLOB;
    DECLARE o_ref TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE o_created BIGINT;
    DECLARE o_updated BIGINT;
    DECLARE o_completed BIGINT;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = 0;
    -- ER_DUP_ENTRY: the key has a record (after waiting for an uncommitted one).
    DECLARE CONTINUE HANDLER FOR 1062 SET v_dup = 1;

    -- The test clock shift is consumed first, so it never outlives this call.
    SET v_shift = COALESCE(@idem_clock_shift_ms, 0);
    SET @idem_clock_shift_ms = NULL;
    CALL idem_check_names(p_tenant, p_key, p_owner);
    IF p_principal IS NULL OR OCTET_LENGTH(p_principal) NOT BETWEEN 1 AND 128
       OR CHAR_LENGTH(p_principal) <> OCTET_LENGTH(p_principal)
       OR p_principal NOT REGEXP '^[!-~]+$' THEN
        SIGNAL SQLSTATE 'ID001'
            SET MESSAGE_TEXT = 'idem: principal must be 1 to 128 visible ASCII characters';
    END IF;
    IF p_fingerprint IS NULL OR OCTET_LENGTH(p_fingerprint) <> 32 THEN
        SIGNAL SQLSTATE 'ID001' SET MESSAGE_TEXT = 'idem: fingerprint must be 32 bytes (SHA-256)';
    END IF;
    CALL idem_check_lease(p_lease_ms);
    SET v_tenant = p_tenant, v_key = p_key, v_principal = p_principal, v_owner = p_owner;

    claim: WHILE v_run < 8 DO
        SET v_run = v_run + 1;
        SET o_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000
                    + v_shift;
        SET v_found = 1;
        -- The first read is plain (no lock held until the caller commits). A re-run
        -- follows a failed insert or a lost compare-and-set: it reads the newest
        -- committed row with a locking read, which also holds under REPEATABLE READ,
        -- where a plain read would see the transaction's older snapshot.
        IF v_run = 1 THEN
            SELECT principal, fingerprint, state, version, owner, lease_expires_at,
                   result_status, result_headers, result_body, result_ref, attempts,
                   created_at, updated_at, completed_at
              INTO r_principal, r_fingerprint, r_state, r_version, r_owner, r_lease,
                   r_status, r_headers, r_body, r_ref, r_attempts, r_created, r_updated,
                   r_completed
              FROM idem_records WHERE tenant_id = v_tenant AND `key` = v_key;
        ELSE
            SELECT principal, fingerprint, state, version, owner, lease_expires_at,
                   result_status, result_headers, result_body, result_ref, attempts,
                   created_at, updated_at, completed_at
              INTO r_principal, r_fingerprint, r_state, r_version, r_owner, r_lease,
                   r_status, r_headers, r_body, r_ref, r_attempts, r_created, r_updated,
                   r_completed
              FROM idem_records WHERE tenant_id = v_tenant AND `key` = v_key
              LOCK IN SHARE MODE;
        END IF;
        IF v_found = 0 THEN
            -- A duplicate's uncommitted row makes this wait on the primary key; after
            -- its commit this fails (ER_DUP_ENTRY) and the next run reads it, after its
            -- rollback this inserts.
            SET v_dup = 0;
            INSERT INTO idem_records (tenant_id, `key`, principal, fingerprint, state,
                version, owner, lease_expires_at, attempts, created_at, updated_at)
            VALUES (v_tenant, v_key, v_principal, p_fingerprint, 'PROCESSING', 1, v_owner,
                o_now + p_lease_ms, 1, o_now, o_now);
            IF v_dup = 0 THEN
                SET o_decision = 'proceed', o_kind = 'fresh', o_state = 'PROCESSING',
                    o_version = 1, o_attempt = 1, o_lease = o_now + p_lease_ms,
                    o_created = o_now, o_updated = o_now;
                LEAVE claim;
            END IF;
            ITERATE claim;
        END IF;
        SET o_state = r_state;
        IF r_fingerprint <> p_fingerprint OR r_principal <> v_principal THEN
            -- Another request's result is never shown to this one.
            SET o_decision = 'mismatch';
            LEAVE claim;
        END IF;
        IF r_state IN ('SUCCEEDED', 'FAILED_TERMINAL')
           OR (r_state = 'PROCESSING' AND r_lease IS NOT NULL AND r_lease > o_now) THEN
            SET o_decision = IF(r_state = 'PROCESSING', 'in_progress', 'replay'),
                o_version = r_version, o_attempt = r_attempts, o_lease = r_lease,
                o_owner = r_owner, o_status = r_status, o_headers = r_headers,
                o_body = r_body, o_ref = r_ref, o_created = r_created,
                o_updated = r_updated, o_completed = r_completed;
            LEAVE claim;
        END IF;
        -- FAILED_RETRYABLE, or PROCESSING past its lease: a compare-and-set on the
        -- version read. A concurrent taker's committed update fails the re-checked WHERE,
        -- so exactly one wins; the others read again.
        UPDATE idem_records
        SET state = 'PROCESSING', version = version + 1, owner = v_owner,
            lease_expires_at = o_now + p_lease_ms, attempts = attempts + 1,
            updated_at = o_now
        WHERE tenant_id = v_tenant AND `key` = v_key AND version = r_version
          AND principal = v_principal AND fingerprint = p_fingerprint
          AND (state = 'FAILED_RETRYABLE'
               OR (state = 'PROCESSING'
                   AND (lease_expires_at IS NULL OR lease_expires_at <= o_now)));
        -- The version always changes, so the count is of changed rows on any connection.
        IF ROW_COUNT() = 1 THEN
            SET o_decision = 'proceed',
                o_kind = IF(r_state = 'FAILED_RETRYABLE', 'retry_after_failure',
                            'expired_lease'),
                o_state = 'PROCESSING', o_version = r_version + 1,
                o_attempt = r_attempts + 1, o_lease = o_now + p_lease_ms,
                -- The owner it took over from (evidence); NULL after a failure.
                o_owner = IF(r_state = 'PROCESSING', r_owner, NULL),
                o_created = r_created, o_updated = o_now;
            LEAVE claim;
        END IF;
    END WHILE claim;
    IF o_decision IS NULL THEN
        SET v_message = LEFT(CONCAT('idem: claim on ', v_tenant, '/', v_key,
                                    ' did not settle; retry'), 128);
        SIGNAL SQLSTATE 'ID004' SET MESSAGE_TEXT = v_message;
    END IF;
    SELECT o_decision AS decision, o_kind AS kind, o_version AS version,
           o_attempt AS attempt, o_lease AS lease_expires_at, o_now AS now_ms,
           o_state AS state, o_owner AS owner, o_status AS status, o_headers AS headers,
           o_body AS body, o_ref AS result_ref, o_created AS created_at,
           o_updated AS updated_at, o_completed AS completed_at;
END //
DELIMITER ;
