-- Every grant bumps its counter, and the guard ran a PL/pgSQL call for each bump
-- only to find it rising (about a tenth of a grant's cost in pgbench). The
-- trigger's WHEN clause now tests the rule in the executor and calls the function
-- only to refuse a counter that would go back or be renamed; deletes and
-- truncates are refused as before.
SET LOCAL lock_timeout = '10s';
DROP TRIGGER IF EXISTS idem_lease_tokens_guard ON idem_lease_tokens;
CREATE TRIGGER idem_lease_tokens_guard BEFORE UPDATE ON idem_lease_tokens FOR EACH ROW WHEN (NEW.last_token < OLD.last_token OR NEW.name <> OLD.name) EXECUTE FUNCTION idem_lease_tokens_never_go_back();
CREATE TRIGGER idem_lease_tokens_no_delete BEFORE DELETE ON idem_lease_tokens FOR EACH ROW EXECUTE FUNCTION idem_lease_tokens_never_go_back();
