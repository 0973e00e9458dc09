-- Sessions keep the cookie's SHA-256 (never the cookie), the CSRF token, the expiry and
-- a digest of the admin token they were opened with; the audit says who did what.
-- `IF NOT EXISTS`: tables an older host created with the same columns are taken as they
-- are.

CREATE TABLE IF NOT EXISTS console_sessions (
    session_hash TEXT   PRIMARY KEY,
    operator     TEXT   NOT NULL,
    csrf         TEXT   NOT NULL,
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL,
    ended_at     BIGINT,
    token_digest TEXT   NOT NULL
);
CREATE TABLE IF NOT EXISTS console_audit (
    audit_id TEXT   PRIMARY KEY,
    at       BIGINT NOT NULL,
    operator TEXT   NOT NULL,
    action   TEXT   NOT NULL,
    target   TEXT   NOT NULL,
    reason   TEXT,
    outcome  TEXT   NOT NULL
);
CREATE INDEX IF NOT EXISTS console_audit_by_at ON console_audit (at);
