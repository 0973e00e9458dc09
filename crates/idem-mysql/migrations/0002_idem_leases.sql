-- MySQL / MariaDB: statements run one at a time, each ending with a line that ends in
-- the delimiter (`DELIMITER` switches it, as in the mysql client), each safe to run
-- twice: DDL commits on its own, so a migrator that stopped half-way re-runs them all.

-- Leases with fencing tokens (see src/lease.rs): the per-name token counter that is the
-- name's lock, the current leases, their evidence and the fences. Triggers refuse
-- lowering or deleting a counter.

CREATE TABLE IF NOT EXISTS idem_lease_tokens (
    name       VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    last_token BIGINT NOT NULL,
    CONSTRAINT idem_lease_tokens_ck CHECK (last_token >= 0)
) ENGINE = InnoDB;

CREATE TABLE IF NOT EXISTS idem_leases (
    name        VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    owner       VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    token       BIGINT NOT NULL,
    acquired_at BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    renewals    INT NOT NULL DEFAULT 0,
    CONSTRAINT idem_leases_token_ck CHECK (token > 0),
    CONSTRAINT idem_leases_renewals_ck CHECK (renewals >= 0)
) ENGINE = InnoDB;

CREATE TABLE IF NOT EXISTS idem_lease_events (
    id          BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    name        VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    kind        VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    at          BIGINT NOT NULL,
    owner       VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NULL,
    token       BIGINT NULL,
    acquired_at BIGINT NULL,
    expires_at  BIGINT NULL,
    detail      TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    KEY idem_lease_events_name_idx (name, id),
    KEY idem_lease_events_at_idx (at),
    CONSTRAINT idem_lease_events_kind_ck CHECK (kind IN ('acquired', 'renewed',
        'renew_rejected', 'released', 'expired', 'release_owner_mismatch',
        'fenced_write_rejected', 'force_released'))
) ENGINE = InnoDB;

-- Resource names are any non-empty text: bytes, so no collation folds two into one.
CREATE TABLE IF NOT EXISTS idem_fences (
    resource   VARBINARY(1024) NOT NULL PRIMARY KEY,
    last_token BIGINT NOT NULL,
    lease_name VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    owner      VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    updated_at BIGINT NOT NULL
) ENGINE = InnoDB;

DROP TRIGGER IF EXISTS idem_lease_tokens_never_go_back;

DELIMITER //
CREATE TRIGGER idem_lease_tokens_never_go_back BEFORE UPDATE ON idem_lease_tokens
FOR EACH ROW BEGIN
    IF NEW.last_token < OLD.last_token OR NEW.name <> OLD.name THEN
        SIGNAL SQLSTATE '45000'
            SET MESSAGE_TEXT = 'idem_lease_tokens: a token counter cannot go back';
    END IF;
END //
DELIMITER ;

DROP TRIGGER IF EXISTS idem_lease_tokens_never_deleted;

DELIMITER //
CREATE TRIGGER idem_lease_tokens_never_deleted BEFORE DELETE ON idem_lease_tokens
FOR EACH ROW
    SIGNAL SQLSTATE '45000'
        SET MESSAGE_TEXT = 'idem_lease_tokens: token counters are never deleted' //
DELIMITER ;
