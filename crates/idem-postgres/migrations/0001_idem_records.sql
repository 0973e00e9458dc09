-- Times are epoch milliseconds read from the database clock (never the caller's).
-- Not partitioned: the UNIQUE guard must cover the whole (tenant_id, key) space, and
-- a partitioned table could only enforce it per partition.
CREATE TABLE idem_records (
    tenant_id        text    NOT NULL,
    key              text    NOT NULL,
    principal        text    NOT NULL,
    fingerprint      bytea   NOT NULL CHECK (octet_length(fingerprint) = 32),
    state            text    NOT NULL CHECK (state IN
                         ('PROCESSING', 'SUCCEEDED', 'FAILED_RETRYABLE', 'FAILED_TERMINAL')),
    version          bigint  NOT NULL CHECK (version > 0),
    owner            text,
    lease_expires_at bigint,
    result_status    integer CHECK (result_status BETWEEN 0 AND 65535),
    result_headers   jsonb,
    result_body      bytea,
    result_ref       text,
    attempts         integer NOT NULL CHECK (attempts > 0),
    created_at       bigint  NOT NULL,
    updated_at       bigint  NOT NULL,
    completed_at     bigint
);
-- The last gate (docs/DESIGN.md: key states): two instances that both saw "absent" both INSERT; this index
-- lets one win and makes the other read the winner's record. unique_guard() checks it.
CREATE UNIQUE INDEX idem_records_scope_uq ON idem_records (tenant_id, key);
-- The stale-PROCESSING scan (records whose lease ran out) reads only this small index.
CREATE INDEX idem_records_processing_lease_idx ON idem_records (lease_expires_at)
    WHERE state = 'PROCESSING';
-- Retention sweeps walk finished records by completion time.
CREATE INDEX idem_records_completed_idx ON idem_records (completed_at)
    WHERE completed_at IS NOT NULL;
