CREATE TABLE idem_records (
    tenant_id        TEXT    NOT NULL,
    key              TEXT    NOT NULL,
    principal        TEXT    NOT NULL,
    fingerprint      BLOB    NOT NULL,
    state            TEXT    NOT NULL,
    version          INTEGER NOT NULL,
    owner            TEXT,
    lease_expires_at INTEGER,
    result_status    INTEGER,
    result_headers   TEXT,
    result_body      BLOB,
    result_ref       TEXT,
    attempts         INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    completed_at     INTEGER
);
-- The last gate: two arrivals that both saw "absent" cannot both insert.
CREATE UNIQUE INDEX idem_records_scope_uq ON idem_records (tenant_id, key);
