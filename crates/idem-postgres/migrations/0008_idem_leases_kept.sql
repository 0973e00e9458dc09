-- A lease row outlives its lease (marked ended), so a grant and a release are
-- each one update of it in place instead of a counter bump, an insert and a
-- delete (the statements are in `src/lease.rs`).
-- Migration 8: lease rows are kept after their lease ends (`ended_at`), so the row's
-- token is the name's counter while the row exists and the common grant and release
-- are each one in-place update. The counter table keeps the token of a row that is
-- deleted anyway (by hand), and stays the lock of the locked path.
SET LOCAL lock_timeout = '10s';
ALTER TABLE idem_leases ADD COLUMN ended_at bigint;
-- Names whose lease row is gone: a row that has ended, carrying the counter's token.
INSERT INTO idem_leases (name, owner, token, acquired_at, expires_at, renewals, ended_at)
    SELECT t.name, '-', t.last_token, 0, 0, 0, 0 FROM idem_lease_tokens t
    WHERE t.last_token > 0 AND NOT EXISTS (SELECT 1 FROM idem_leases l WHERE l.name = t.name);
-- A row's token never goes back (nor below the counter when a row is inserted), and a
-- deleted row leaves its token in the counter. The function keeps the migration's
-- search_path, so a delete by hand from any session finds this schema's counter.
CREATE FUNCTION idem_leases_keep_token() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.token < (SELECT last_token FROM idem_lease_tokens WHERE name = NEW.name) THEN
            RAISE EXCEPTION 'idem_leases: a row for % cannot start below its counter', NEW.name
                USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    ELSIF TG_OP = 'UPDATE' THEN
        IF OLD.ended_at IS NOT NULL AND NEW.ended_at IS NOT NULL THEN
            -- Only an idem build older than this schema grants without clearing ended_at.
            RAISE EXCEPTION 'idem_leases: % was written by an idem older than schema version 8; upgrade every process using this schema', OLD.name
                USING ERRCODE = 'check_violation';
        END IF;
        RAISE EXCEPTION 'idem_leases: the token of % cannot go back', OLD.name
            USING ERRCODE = 'check_violation';
    ELSIF TG_OP = 'TRUNCATE' THEN
        RAISE EXCEPTION 'idem_leases: lease rows hold the token counters; delete rows instead'
            USING ERRCODE = 'check_violation';
    END IF;
    INSERT INTO idem_lease_tokens AS t (name, last_token) VALUES (OLD.name, OLD.token)
    ON CONFLICT (name) DO UPDATE SET last_token = GREATEST(t.last_token, EXCLUDED.last_token);
    RETURN OLD;
END
$$;
CREATE TRIGGER idem_leases_token_guard BEFORE UPDATE ON idem_leases
    FOR EACH ROW WHEN (NEW.token < OLD.token OR NEW.name <> OLD.name
        OR (OLD.ended_at IS NOT NULL AND NEW.ended_at IS NOT NULL AND NEW.token <> OLD.token))
    EXECUTE FUNCTION idem_leases_keep_token();
CREATE TRIGGER idem_leases_insert_guard BEFORE INSERT ON idem_leases
    FOR EACH ROW EXECUTE FUNCTION idem_leases_keep_token();
CREATE TRIGGER idem_leases_keep_token AFTER DELETE ON idem_leases
    FOR EACH ROW EXECUTE FUNCTION idem_leases_keep_token();
CREATE TRIGGER idem_leases_no_truncate BEFORE TRUNCATE ON idem_leases
    FOR EACH STATEMENT EXECUTE FUNCTION idem_leases_keep_token();
