-- MySQL / MariaDB: statements run one at a time, each ending with a line that ends in
-- the delimiter (`DELIMITER` switches it, as in the mysql client), each safe to run
-- twice: DDL commits on its own, so a migrator that stopped half-way re-runs them all.

-- Retention (see src/retention.rs). The tier column and its due index are part of
-- `idem_records` from migration 1: MySQL has no `ADD COLUMN IF NOT EXISTS` (MariaDB has),
-- and an `ALTER` that is not safe to run twice has no place in a migration without a
-- transaction.

CREATE TABLE IF NOT EXISTS idem_archive (
    tenant_id          VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    key_digest         BINARY(16) NOT NULL,
    fingerprint        VARBINARY(32) NOT NULL,
    result_digest      VARBINARY(16) NULL,
    result_ref         TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    state              VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    status             INT NULL,
    first_processed_at BIGINT NOT NULL,
    completed_at       BIGINT NULL,
    archived_at        BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, key_digest),
    KEY idem_archive_ref_idx (result_ref(255)),
    KEY idem_archive_at_idx (archived_at)
) ENGINE = InnoDB;

CREATE TABLE IF NOT EXISTS idem_retention_events (
    id        BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    tenant_id VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    `key`     VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    kind      VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    at        BIGINT NOT NULL,
    owner     VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NULL,
    version   BIGINT NULL,
    detail    TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    KEY idem_retention_events_scope_idx (tenant_id, `key`, id)
) ENGINE = InnoDB;
