-- Leases with fencing tokens (idem_core::lease).

-- The highest token ever granted per name. Never deleted: a grant bumps it in the same
-- transaction, so tokens never go back after release, expiry or a deleted lease row.
CREATE TABLE idem_lease_tokens (
    name       TEXT    PRIMARY KEY,
    last_token INTEGER NOT NULL
);

-- The current lease per name. An expired row stays until the store notices it (a later
-- acquire, renew, release or force-release), which records `expired` and removes it.
CREATE TABLE idem_leases (
    name        TEXT    PRIMARY KEY,
    owner       TEXT    NOT NULL,
    token       INTEGER NOT NULL,
    acquired_at INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    renewals    INTEGER NOT NULL DEFAULT 0
);

-- Evidence: who held what, with which token, when (store clock).
CREATE TABLE idem_lease_events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    name        TEXT    NOT NULL,
    kind        TEXT    NOT NULL,
    at          INTEGER NOT NULL,
    owner       TEXT,
    token       INTEGER,
    acquired_at INTEGER,
    expires_at  INTEGER,
    detail      TEXT
);
CREATE INDEX idem_lease_events_name ON idem_lease_events (name, id);

-- The last token each protected resource accepted (the fence).
CREATE TABLE idem_fences (
    resource   TEXT    PRIMARY KEY,
    last_token INTEGER NOT NULL,
    lease_name TEXT    NOT NULL,
    owner      TEXT    NOT NULL,
    updated_at INTEGER NOT NULL
);
