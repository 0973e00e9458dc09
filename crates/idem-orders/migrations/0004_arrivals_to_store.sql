-- The arrival timeline moved to the store's own tables (`idem_arrival_keys`,
-- `idem_arrivals`, created by the store's migrations, which run first): what the old
-- tables held is carried over, then they go. (`WHERE true`: without it SQLite reads the
-- `ON` of `ON CONFLICT` as a join's.)

INSERT INTO idem_arrival_keys (tenant_id, idem_key, first_at, last_at, executed, replayed,
    in_progress, mismatch, refused, total)
  SELECT tenant_id, idem_key, first_at, last_at, executed, replayed, in_progress, mismatch,
    refused, total FROM arrival_keys WHERE true
  ON CONFLICT DO NOTHING;
INSERT INTO idem_arrivals (tenant_id, idem_key, seq, at, decision, status, elapsed_ms,
    principal)
  SELECT tenant_id, idem_key, seq, at, decision, status, elapsed_ms, principal FROM arrivals
  WHERE true ON CONFLICT DO NOTHING;
DROP TABLE arrivals;
DROP TABLE arrival_keys;
