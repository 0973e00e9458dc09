-- The operator console's tables. Arrivals are evidence about keys, not a ledger: they
-- are kept while their key has a record or an archive entry (migration 4 moves them to
-- the store's own tables).

-- Per key: when it first and last arrived and how many arrivals got each decision.
CREATE TABLE arrival_keys (
    tenant_id   TEXT   NOT NULL,
    idem_key    TEXT   NOT NULL,
    first_at    BIGINT NOT NULL,
    last_at     BIGINT NOT NULL,
    executed    BIGINT NOT NULL CHECK (executed >= 0),
    replayed    BIGINT NOT NULL CHECK (replayed >= 0),
    in_progress BIGINT NOT NULL CHECK (in_progress >= 0),
    mismatch    BIGINT NOT NULL CHECK (mismatch >= 0),
    refused     BIGINT NOT NULL CHECK (refused >= 0),
    total       BIGINT NOT NULL CHECK (total > 0),
    PRIMARY KEY (tenant_id, idem_key)
);
CREATE INDEX arrival_keys_by_last ON arrival_keys (last_at);

-- The first arrivals of each key, one row each (bounded per key by the writer).
CREATE TABLE arrivals (
    tenant_id  TEXT   NOT NULL,
    idem_key   TEXT   NOT NULL,
    seq        BIGINT NOT NULL CHECK (seq > 0),
    at         BIGINT NOT NULL,
    decision   TEXT   NOT NULL CHECK (decision IN ('executed', 'replayed', 'in_progress',
                   'mismatch', 'refused')),
    status     BIGINT NOT NULL,
    elapsed_ms BIGINT NOT NULL,
    principal  TEXT   NOT NULL,
    PRIMARY KEY (tenant_id, idem_key, seq)
);

-- Console sessions: the cookie's SHA-256 (never the cookie), its CSRF token, expiry, and
-- a digest of the admin token it was opened with (a replaced token ends its sessions).
CREATE TABLE console_sessions (
    session_hash TEXT   PRIMARY KEY,
    operator     TEXT   NOT NULL,
    csrf         TEXT   NOT NULL,
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL,
    ended_at     BIGINT,
    token_digest TEXT   NOT NULL
);

-- What the console did: who, what, on what, why, and how it went.
CREATE TABLE console_audit (
    audit_id TEXT   PRIMARY KEY,
    at       BIGINT NOT NULL,
    operator TEXT   NOT NULL,
    action   TEXT   NOT NULL,
    target   TEXT   NOT NULL,
    reason   TEXT,
    outcome  TEXT   NOT NULL
);
CREATE INDEX console_audit_by_at ON console_audit (at);
