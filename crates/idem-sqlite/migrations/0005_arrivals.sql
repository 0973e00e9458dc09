-- The arrival timeline (idem-sql's arrivals module writes and reads it): evidence about
-- keys, kept while the key has a record or an archive entry.
-- Per key: when it first and last arrived and how many arrivals got each decision.
CREATE TABLE idem_arrival_keys (
    tenant_id   TEXT    NOT NULL,
    idem_key    TEXT    NOT NULL,
    first_at    INTEGER NOT NULL,
    last_at     INTEGER NOT NULL,
    executed    INTEGER NOT NULL CHECK (executed >= 0),
    replayed    INTEGER NOT NULL CHECK (replayed >= 0),
    in_progress INTEGER NOT NULL CHECK (in_progress >= 0),
    mismatch    INTEGER NOT NULL CHECK (mismatch >= 0),
    refused     INTEGER NOT NULL CHECK (refused >= 0),
    total       INTEGER NOT NULL CHECK (total > 0),
    PRIMARY KEY (tenant_id, idem_key)
);
CREATE INDEX idem_arrival_keys_by_last ON idem_arrival_keys (last_at);

-- The first arrivals of each key, one row each (bounded per key by the writer).
CREATE TABLE idem_arrivals (
    tenant_id  TEXT    NOT NULL,
    idem_key   TEXT    NOT NULL,
    seq        INTEGER NOT NULL CHECK (seq > 0),
    at         INTEGER NOT NULL,
    decision   TEXT    NOT NULL CHECK (decision IN ('executed', 'replayed', 'in_progress',
                   'mismatch', 'refused')),
    status     INTEGER NOT NULL,
    elapsed_ms INTEGER NOT NULL,
    principal  TEXT    NOT NULL,
    PRIMARY KEY (tenant_id, idem_key, seq)
);
