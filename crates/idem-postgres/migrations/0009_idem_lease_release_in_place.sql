-- The holder's release writes no event row of its own: about a third of a lease
-- cycle's cost in pgbench (the statements are in `src/lease.rs`).
-- Migration 9: the holder's release is recorded in place on the lease row (one update,
-- no event insert), and moves into the next grant's `acquired` event, which carries it
-- in its `released_*` columns. The stored events are `idem_lease_event_rows`;
-- `idem_lease_events` is a view that shows those releases as events of their own, so
-- every reader sees each release once. A release remembers the last stored event of
-- its name when it happened (`release_after`), so in id order it sits right after it.
SET LOCAL lock_timeout = '10s';
ALTER TABLE idem_lease_events RENAME TO idem_lease_event_rows;
ALTER INDEX idem_lease_events_name_idx RENAME TO idem_lease_event_rows_name_idx;
ALTER INDEX idem_lease_events_at_idx RENAME TO idem_lease_event_rows_at_idx;
ALTER TABLE idem_lease_event_rows
    ADD COLUMN released_after bigint,
    ADD COLUMN released_owner text,
    ADD COLUMN released_token bigint,
    ADD COLUMN released_acquired_at bigint,
    ADD COLUMN released_expires_at bigint,
    ADD COLUMN released_at bigint;
ALTER TABLE idem_leases
    ADD COLUMN release_after bigint,
    ADD COLUMN prev_owner text,
    ADD COLUMN prev_token bigint,
    ADD COLUMN prev_acquired_at bigint,
    ADD COLUMN prev_expires_at bigint,
    ADD COLUMN prev_ended_at bigint,
    ADD COLUMN prev_release_after bigint;
-- Stored events at even ids; a release right after the stored event it followed.
CREATE VIEW idem_lease_events AS
    SELECT id * 2 AS id, name, kind, at, owner, token, acquired_at, expires_at, detail
    FROM idem_lease_event_rows
    UNION ALL
    SELECT released_after * 2 + 1, name, 'released', released_at, released_owner,
           released_token, released_acquired_at, released_expires_at, NULL
    FROM idem_lease_event_rows WHERE released_after IS NOT NULL
    UNION ALL
    SELECT release_after * 2 + 1, name, 'released', ended_at, owner, token, acquired_at,
           expires_at, NULL
    FROM idem_leases WHERE release_after IS NOT NULL;
