-- MySQL / MariaDB: statements run one at a time, each ending with a line that ends in
-- the delimiter (`DELIMITER` switches it, as in the mysql client), each safe to run
-- twice: DDL commits on its own, so a migrator that stopped half-way re-runs them all.

-- The arrival timeline (idem-sql's arrivals module writes and reads it), the columns of
-- PostgreSQL's migration 10: per key, when it first and last arrived and how many
-- arrivals got each decision. Tenant and key are the records' (visible ASCII, byte
-- comparison); the `(last_at)` index serves the retention pass's walk.
CREATE TABLE IF NOT EXISTS idem_arrival_keys (
    tenant_id   VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    idem_key    VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    first_at    BIGINT NOT NULL,
    last_at     BIGINT NOT NULL,
    executed    BIGINT NOT NULL,
    replayed    BIGINT NOT NULL,
    in_progress BIGINT NOT NULL,
    mismatch    BIGINT NOT NULL,
    refused     BIGINT NOT NULL,
    total       BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, idem_key),
    KEY idem_arrival_keys_by_last (last_at),
    CONSTRAINT idem_arrival_keys_counts_ck CHECK (executed >= 0 AND replayed >= 0
        AND in_progress >= 0 AND mismatch >= 0 AND refused >= 0 AND total > 0)
) ENGINE = InnoDB;

-- The first arrivals of each key, one row each (bounded per key by the writer).
CREATE TABLE IF NOT EXISTS idem_arrivals (
    tenant_id  VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    idem_key   VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    seq        BIGINT NOT NULL,
    at         BIGINT NOT NULL,
    decision   VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    status     BIGINT NOT NULL,
    elapsed_ms BIGINT NOT NULL,
    principal  VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    PRIMARY KEY (tenant_id, idem_key, seq),
    CONSTRAINT idem_arrivals_seq_ck CHECK (seq > 0),
    CONSTRAINT idem_arrivals_decision_ck CHECK (decision IN
        ('executed', 'replayed', 'in_progress', 'mismatch', 'refused'))
) ENGINE = InnoDB;
