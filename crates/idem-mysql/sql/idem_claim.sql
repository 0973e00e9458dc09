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
    -- The test clock shift, consumed below so that it never outlives this call.
    DECLARE v_shift BIGINT DEFAULT COALESCE(@idem_clock_shift_ms, 0);
    DECLARE v_now BIGINT;
    DECLARE v_run INT DEFAULT 0;
    DECLARE v_found INT;
    DECLARE v_dup INT;
    DECLARE v_message VARCHAR(128);
    DECLARE o_decision VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin;
    DECLARE o_kind VARCHAR(24) CHARACTER SET ascii COLLATE ascii_bin;
    -- The record read, and then the answer: a replay or in_progress answers it as read;
    -- the other decisions set what they answer.
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
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = 0;
    -- ER_DUP_ENTRY: the key has a record (after waiting for an uncommitted one).
    DECLARE CONTINUE HANDLER FOR 1062 SET v_dup = 1;

    -- Cleared only when set: a SET of a user variable is a statement of its own, an IF
    -- is not.
    IF @idem_clock_shift_ms IS NOT NULL THEN
        SET @idem_clock_shift_ms = NULL;
    END IF;
    -- Visible ASCII is one byte per character (CHAR_LENGTH = OCTET_LENGTH rules out the
    -- rest of UTF-8) and no byte outside 0x21..0x7E: an unanchored negated class, which
    -- also refuses a final newline (an anchored '^[!-~]+$' let one through: `$` matches
    -- before it). A nested CALL costs about 1 µs of a claim's 200: the rules stay in one
    -- place.
    CALL idem_check_names(p_tenant, p_key, p_owner);
    IF p_principal IS NULL OR OCTET_LENGTH(p_principal) NOT BETWEEN 1 AND 128
       OR CHAR_LENGTH(p_principal) <> OCTET_LENGTH(p_principal)
       OR p_principal REGEXP '[^!-~]' THEN
        SIGNAL SQLSTATE 'ID001'
            SET MESSAGE_TEXT = 'idem: principal must be 1 to 128 visible ASCII characters';
    END IF;
    IF p_fingerprint IS NULL OR OCTET_LENGTH(p_fingerprint) <> 32 THEN
        SIGNAL SQLSTATE 'ID001' SET MESSAGE_TEXT = 'idem: fingerprint must be 32 bytes (SHA-256)';
    END IF;
    CALL idem_check_lease(p_lease_ms);
    SET v_tenant = p_tenant, v_key = p_key, v_principal = p_principal, v_owner = p_owner;

    claim: LOOP
        SET v_run = v_run + 1, v_found = 1,
            v_now = TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000
                    + v_shift;
        IF v_run > 8 THEN
            SET v_message = LEFT(CONCAT('idem: claim on ', v_tenant, '/', v_key,
                                        ' did not settle; retry'), 128);
            SIGNAL SQLSTATE 'ID004' SET MESSAGE_TEXT = v_message;
        END IF;
        -- The first read is plain (no lock held until the caller commits). A re-run
        -- follows a failed insert or a lost compare-and-set: it reads the newest
        -- committed row with a locking read, which also holds under REPEATABLE READ,
        -- where a plain read would see the transaction's older snapshot.
        -- Not the insert first, though a fresh key is the common case and the read
        -- costs it a statement: an insert that fails on an existing key leaves InnoDB's
        -- shared lock on that row until the caller's commit, so every replay,
        -- in_progress and mismatch would hold one. The holder's finish and heartbeat
        -- would wait behind an in_progress duplicate's transaction, and two takers of
        -- an expired or retryable record would both hold the shared lock and deadlock
        -- on their updates.
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
                v_now + p_lease_ms, 1, v_now, v_now);
            IF v_dup = 0 THEN
                SET o_decision = 'proceed', o_kind = 'fresh', r_state = 'PROCESSING',
                    r_version = 1, r_attempts = 1, r_lease = v_now + p_lease_ms,
                    r_owner = NULL, r_status = NULL, r_headers = NULL, r_body = NULL,
                    r_ref = NULL, r_created = v_now, r_updated = v_now, r_completed = NULL;
                LEAVE claim;
            END IF;
            ITERATE claim;
        END IF;
        IF r_fingerprint <> p_fingerprint OR r_principal <> v_principal THEN
            -- Another request's result is never shown to this one: only its state.
            SET o_decision = 'mismatch', r_version = NULL, r_attempts = NULL, r_lease = NULL,
                r_owner = NULL, r_status = NULL, r_headers = NULL, r_body = NULL,
                r_ref = NULL, r_created = NULL, r_updated = NULL, r_completed = NULL;
            LEAVE claim;
        END IF;
        IF r_state IN ('SUCCEEDED', 'FAILED_TERMINAL')
           OR (r_state = 'PROCESSING' AND r_lease IS NOT NULL AND r_lease > v_now) THEN
            SET o_decision = IF(r_state = 'PROCESSING', 'in_progress', 'replay');
            LEAVE claim;
        END IF;
        -- FAILED_RETRYABLE, or PROCESSING past its lease: a compare-and-set on the
        -- version read. A concurrent taker's committed update fails the re-checked WHERE,
        -- so exactly one wins; the others read again.
        UPDATE idem_records
        SET state = 'PROCESSING', version = version + 1, owner = v_owner,
            lease_expires_at = v_now + p_lease_ms, attempts = attempts + 1,
            updated_at = v_now
        WHERE tenant_id = v_tenant AND `key` = v_key AND version = r_version
          AND principal = v_principal AND fingerprint = p_fingerprint
          AND (state = 'FAILED_RETRYABLE'
               OR (state = 'PROCESSING'
                   AND (lease_expires_at IS NULL OR lease_expires_at <= v_now)));
        -- The version always changes, so the count is of changed rows on any connection.
        IF ROW_COUNT() = 1 THEN
            SET o_decision = 'proceed',
                o_kind = IF(r_state = 'FAILED_RETRYABLE', 'retry_after_failure',
                            'expired_lease'),
                -- The owner it took over from (evidence); NULL after a failure.
                r_owner = IF(r_state = 'PROCESSING', r_owner, NULL),
                r_state = 'PROCESSING', r_version = r_version + 1,
                r_attempts = r_attempts + 1, r_lease = v_now + p_lease_ms,
                r_status = NULL, r_headers = NULL, r_body = NULL, r_ref = NULL,
                r_updated = v_now, r_completed = NULL;
            LEAVE claim;
        END IF;
    END LOOP claim;
    SELECT o_decision AS decision, o_kind AS kind, r_version AS version,
           r_attempts AS attempt, r_lease AS lease_expires_at, v_now AS now_ms,
           r_state AS state, r_owner AS owner, r_status AS status, r_headers AS headers,
           r_body AS body, r_ref AS result_ref, r_created AS created_at,
           r_updated AS updated_at, r_completed AS completed_at;
END //
DELIMITER ;
