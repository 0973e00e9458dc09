-- The event log is append-only with ids from its identity sequence, read by
-- (name, id): that index is the only one it needs. Every lease change writes an
-- event, so a second index was a second write on the hot path.
SET LOCAL lock_timeout = '10s';
ALTER TABLE idem_lease_events DROP CONSTRAINT IF EXISTS idem_lease_events_pkey;
