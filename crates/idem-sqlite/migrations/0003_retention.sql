-- Retention tiers (idem_core::retention).

-- Where a record's evidence lives: retry (full response), replay (response dropped),
-- dispute (audit fields). Archived records leave this table for idem_archive.
ALTER TABLE idem_records ADD COLUMN tier TEXT NOT NULL DEFAULT 'retry'
    CHECK (tier IN ('retry', 'replay', 'dispute'));
-- The sweeper walks finished records per tier by completion time.
CREATE INDEX idem_records_tier_due ON idem_records (tier, completed_at, tenant_id, key)
    WHERE completed_at IS NOT NULL;
-- The stale-PROCESSING scan reads only this small index.
CREATE INDEX idem_records_stale ON idem_records (lease_expires_at)
    WHERE state = 'PROCESSING';

-- The archive: off the online index (a claim never reads it), searchable by key digest
-- and by result reference (order number).
CREATE TABLE idem_archive (
    tenant_id          TEXT    NOT NULL,
    key_digest         BLOB    NOT NULL,
    fingerprint        BLOB    NOT NULL,
    result_digest      BLOB,
    result_ref         TEXT,
    state              TEXT    NOT NULL,
    status             INTEGER,
    first_processed_at INTEGER NOT NULL,
    completed_at       INTEGER,
    archived_at        INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, key_digest)
) WITHOUT ROWID;
CREATE INDEX idem_archive_ref ON idem_archive (result_ref) WHERE result_ref IS NOT NULL;
CREATE INDEX idem_archive_at ON idem_archive (archived_at);

-- Evidence of what the sweeper did to individual records (stale recoveries).
CREATE TABLE idem_retention_events (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id TEXT    NOT NULL,
    key       TEXT    NOT NULL,
    kind      TEXT    NOT NULL,
    at        INTEGER NOT NULL,
    owner     TEXT,
    version   INTEGER,
    detail    TEXT
);
CREATE INDEX idem_retention_events_scope ON idem_retention_events (tenant_id, key, id);
