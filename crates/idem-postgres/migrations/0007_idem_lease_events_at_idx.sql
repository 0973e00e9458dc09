-- Retention of the evidence (`trim_events`) finds old events by time. A B-tree:
-- a BRIN summary would only widen as trimmed space is reused, until every range
-- matched. The build blocks event inserts (every lease change) while it reads the
-- log once: run `idem migrate` when it is quiet on a large log.
SET LOCAL lock_timeout = '10s';
CREATE INDEX IF NOT EXISTS idem_lease_events_at_idx ON idem_lease_events (at);
