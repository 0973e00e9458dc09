-- Retention tiers and the partitioned archive (`src/retention.rs` holds the statements).
-- Migration 3 (see `migrate.rs`): unqualified names, run with the store's search_path.
-- Where a record's evidence lives (idem_core::retention::Tier). A constant default:
-- adding the column does not rewrite the table.
ALTER TABLE idem_records ADD COLUMN tier text NOT NULL DEFAULT 'retry'
    CHECK (tier IN ('retry', 'replay', 'dispute'));
-- The sweeper walks finished records per tier in (completed_at, tenant_id, key) order.
-- Partial: fresh PROCESSING inserts (completed_at NULL) never touch it.
CREATE INDEX idem_records_tier_due_idx ON idem_records (tier, completed_at, tenant_id, key)
    WHERE completed_at IS NOT NULL;

-- The archive: off the online index (claims never read it), searchable by key digest and
-- by result reference. Partitioned by month so expiry is a partition drop.
CREATE TABLE idem_archive (
    tenant_id          text    NOT NULL,
    key_digest         bytea   NOT NULL CHECK (octet_length(key_digest) = 16),
    fingerprint        bytea   NOT NULL,
    result_digest      bytea,
    result_ref         text,
    state              text    NOT NULL,
    status             integer,
    first_processed_at bigint  NOT NULL,
    completed_at       bigint,
    archived_at        bigint  NOT NULL,
    archived_month     date    NOT NULL
) PARTITION BY RANGE (archived_month);
CREATE INDEX idem_archive_key_idx ON idem_archive (tenant_id, key_digest);
CREATE INDEX idem_archive_ref_idx ON idem_archive (result_ref) WHERE result_ref IS NOT NULL;

-- Evidence of what the sweeper did to individual records (stale recoveries).
CREATE TABLE idem_retention_events (
    id        bigserial PRIMARY KEY,
    tenant_id text   NOT NULL,
    key       text   NOT NULL,
    kind      text   NOT NULL,
    at        bigint NOT NULL,
    owner     text,
    version   bigint,
    detail    text
);
CREATE INDEX idem_retention_events_scope_idx ON idem_retention_events (tenant_id, key, id);
