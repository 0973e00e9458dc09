-- The arrival timeline (idem-sql's arrivals module writes and reads it): evidence about
-- keys, kept while the key has a record or an archive entry.
-- Per key: when it first and last arrived and how many arrivals got each decision.
CREATE TABLE idem_arrival_keys (
    tenant_id   text    NOT NULL,
    idem_key    text    NOT NULL,
    first_at    bigint  NOT NULL,
    last_at     bigint  NOT NULL,
    executed    bigint  NOT NULL CHECK (executed >= 0),
    replayed    bigint  NOT NULL CHECK (replayed >= 0),
    in_progress bigint  NOT NULL CHECK (in_progress >= 0),
    mismatch    bigint  NOT NULL CHECK (mismatch >= 0),
    refused     bigint  NOT NULL CHECK (refused >= 0),
    total       bigint  NOT NULL CHECK (total > 0),
    PRIMARY KEY (tenant_id, idem_key)
);
CREATE INDEX idem_arrival_keys_by_last ON idem_arrival_keys (last_at);

-- The first arrivals of each key, one row each (bounded per key by the writer).
CREATE TABLE idem_arrivals (
    tenant_id  text    NOT NULL,
    idem_key   text    NOT NULL,
    seq        bigint  NOT NULL CHECK (seq > 0),
    at         bigint  NOT NULL,
    decision   text    NOT NULL CHECK (decision IN ('executed', 'replayed', 'in_progress',
                   'mismatch', 'refused')),
    status     bigint  NOT NULL,
    elapsed_ms bigint  NOT NULL,
    principal  text    NOT NULL,
    PRIMARY KEY (tenant_id, idem_key, seq)
);
