-- One-statement grants and releases (src/lease.rs, "One statement per change"): what
-- must commit with a lease change is written by these triggers inside the statement
-- that makes the change, so SQLite's single write lock is held for one statement.

-- The event log, rebuilt clustered by (name, id): one B-tree write per event instead of
-- the table's and its index's, and no sqlite_sequence write (AUTOINCREMENT). `id` counts
-- per name: the next is one above the name's highest, so a name's events stay in order
-- (retention deletes the oldest; a name whose events are all gone starts again at 1).
-- `renewals`: what a released lease had (Release::Released reports it).
CREATE TABLE idem_lease_events_v4 (
    name        TEXT    NOT NULL,
    id          INTEGER NOT NULL,
    kind        TEXT    NOT NULL,
    at          INTEGER NOT NULL,
    owner       TEXT,
    token       INTEGER,
    acquired_at INTEGER,
    expires_at  INTEGER,
    detail      TEXT,
    renewals    INTEGER,
    PRIMARY KEY (name, id)
) WITHOUT ROWID;
INSERT INTO idem_lease_events_v4
    (name, id, kind, at, owner, token, acquired_at, expires_at, detail)
SELECT name, id, kind, at, owner, token, acquired_at, expires_at, detail
FROM idem_lease_events;
DROP TABLE idem_lease_events;
ALTER TABLE idem_lease_events_v4 RENAME TO idem_lease_events;

-- A new lease row is a grant: the counter keeps the highest token, `acquired` is
-- recorded. (No upsert or OR REPLACE here: a trigger takes the conflict policy of the
-- statement that fired it.)
CREATE TRIGGER idem_lease_granted AFTER INSERT ON idem_leases BEGIN
    UPDATE idem_lease_tokens SET last_token = MAX(last_token, NEW.token)
    WHERE name = NEW.name;
    INSERT INTO idem_lease_tokens (name, last_token) SELECT NEW.name, NEW.token
    WHERE NOT EXISTS (SELECT 1 FROM idem_lease_tokens WHERE name = NEW.name);
    INSERT INTO idem_lease_events
        (name, id, kind, at, owner, token, acquired_at, expires_at)
    VALUES (NEW.name,
        (SELECT COALESCE(MAX(id), 0) + 1 FROM idem_lease_events WHERE name = NEW.name),
        'acquired', NEW.acquired_at, NEW.owner, NEW.token, NEW.acquired_at,
        NEW.expires_at);
END;

-- A row given a new token is a grant over an expired lease: the old lease's expiry is
-- recorded (at the new grant's time), then the grant.
CREATE TRIGGER idem_lease_regranted AFTER UPDATE OF token ON idem_leases
WHEN NEW.token <> OLD.token BEGIN
    INSERT INTO idem_lease_events
        (name, id, kind, at, owner, token, acquired_at, expires_at)
    VALUES (OLD.name,
        (SELECT COALESCE(MAX(id), 0) + 1 FROM idem_lease_events WHERE name = OLD.name),
        'expired', NEW.acquired_at, OLD.owner, OLD.token, OLD.acquired_at,
        OLD.expires_at);
    UPDATE idem_lease_tokens SET last_token = MAX(last_token, NEW.token)
    WHERE name = NEW.name;
    INSERT INTO idem_lease_tokens (name, last_token) SELECT NEW.name, NEW.token
    WHERE NOT EXISTS (SELECT 1 FROM idem_lease_tokens WHERE name = NEW.name);
    INSERT INTO idem_lease_events
        (name, id, kind, at, owner, token, acquired_at, expires_at)
    VALUES (NEW.name,
        (SELECT COALESCE(MAX(id), 0) + 1 FROM idem_lease_events WHERE name = NEW.name),
        'acquired', NEW.acquired_at, NEW.owner, NEW.token, NEW.acquired_at,
        NEW.expires_at);
END;

-- Recording a release ends the lease it names (the release statement inserts the event
-- only when the caller holds the live lease).
CREATE TRIGGER idem_lease_released AFTER INSERT ON idem_lease_events
WHEN NEW.kind = 'released' BEGIN
    DELETE FROM idem_leases WHERE name = NEW.name AND token = NEW.token;
END;
