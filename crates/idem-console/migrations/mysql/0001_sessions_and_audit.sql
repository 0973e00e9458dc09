-- The sessions and the audit on MySQL / MariaDB: no TEXT in keys; statements run one at
-- a time, each ending in `;`, each safe to run again.

CREATE TABLE IF NOT EXISTS console_sessions (
    session_hash VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    operator     TEXT NOT NULL,
    csrf         VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL,
    ended_at     BIGINT,
    token_digest VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
CREATE TABLE IF NOT EXISTS console_audit (
    audit_id VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    at       BIGINT NOT NULL,
    operator TEXT NOT NULL,
    action   TEXT NOT NULL,
    target   TEXT NOT NULL,
    reason   TEXT,
    outcome  TEXT NOT NULL,
    KEY console_audit_by_at (at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
