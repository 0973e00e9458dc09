-- MySQL / MariaDB: statements run one at a time, each ending with a line that ends in
-- the delimiter (`DELIMITER` switches it, as in the mysql client), each safe to run
-- twice: DDL commits on its own, so a migrator that stopped half-way re-runs them all.

-- Times are epoch milliseconds (BIGINT) from the server clock, as in the other stores.
-- Tenant, key, principal and owner are visible ASCII (idem_core checks it), so they are
-- `ascii` with the binary collation: byte comparison (keys `A` and `a` differ; the
-- default utf8mb4 collations are case-insensitive) and at most 383 bytes in the primary
-- key, far below InnoDB's 3072-byte index limit. The primary key is the unique guard:
-- a duplicate on a primary key takes a record lock, never the next-key (gap) lock a
-- duplicate on a secondary unique index takes, so concurrent claims of neighbouring
-- keys do not block or deadlock each other.
CREATE TABLE IF NOT EXISTS idem_records (
    tenant_id        VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    `key`            VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    principal        VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    fingerprint      VARBINARY(32) NOT NULL,
    state            VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    version          BIGINT NOT NULL,
    owner            VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NULL,
    lease_expires_at BIGINT NULL,
    result_status    INT NULL,
    result_headers   MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    result_body      LONGBLOB NULL,
    result_ref       TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    attempts         INT NOT NULL,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    completed_at     BIGINT NULL,
    tier             VARCHAR(8) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT 'retry',
    PRIMARY KEY (tenant_id, `key`),
    -- The stale-PROCESSING scan.
    KEY idem_records_processing_lease_idx (state, lease_expires_at),
    -- The sweeper walks finished records per tier in (completed_at, tenant_id, key) order.
    KEY idem_records_tier_due_idx (tier, completed_at, tenant_id, `key`),
    CONSTRAINT idem_records_fingerprint_ck CHECK (LENGTH(fingerprint) = 32),
    CONSTRAINT idem_records_state_ck CHECK (state IN
        ('PROCESSING', 'SUCCEEDED', 'FAILED_RETRYABLE', 'FAILED_TERMINAL')),
    CONSTRAINT idem_records_version_ck CHECK (version > 0),
    CONSTRAINT idem_records_status_ck CHECK (result_status BETWEEN 0 AND 65535),
    CONSTRAINT idem_records_attempts_ck CHECK (attempts > 0),
    CONSTRAINT idem_records_tier_ck CHECK (tier IN ('retry', 'replay', 'dispute'))
) ENGINE = InnoDB;
