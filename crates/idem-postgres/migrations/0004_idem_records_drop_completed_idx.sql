-- The sweeper's (tier, completed_at, tenant_id, key) index serves every scan by
-- completion time; this one only cost each completion an extra index write.
-- DROP INDEX takes the table's exclusive lock: give up rather than queue every
-- claim behind a long transaction (rerun `idem migrate` when it is quiet).
SET LOCAL lock_timeout = '10s';
DROP INDEX IF EXISTS idem_records_completed_idx;
