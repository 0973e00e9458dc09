-- Dropped and created again, so the migration that installs it runs twice safely.
DROP TRIGGER IF EXISTS idem_leases_changed;

DELIMITER //
CREATE TRIGGER idem_leases_changed AFTER UPDATE ON idem_leases
FOR EACH ROW BEGIN
    -- The evidence of the two changes made in place, written by the statement that makes
    -- them: a grant writes a new token; the holder's release ends the row (owner '', the
    -- deadline moved to the release time) and keeps the token. Renewals and the other
    -- changes record their own events; a lease ended by an expiry or a force-release is
    -- deleted, not ended here.
    IF NEW.token <> OLD.token THEN
        INSERT INTO idem_lease_events (name, kind, at, owner, token, acquired_at,
                                       expires_at, detail)
        VALUES (NEW.name, 'acquired', NEW.acquired_at, NEW.owner, NEW.token,
                NEW.acquired_at, NEW.expires_at, NULL);
    ELSEIF NEW.owner = '' AND OLD.owner <> '' THEN
        INSERT INTO idem_lease_events (name, kind, at, owner, token, acquired_at,
                                       expires_at, detail)
        VALUES (NEW.name, 'released', NEW.expires_at, OLD.owner, OLD.token,
                OLD.acquired_at, OLD.expires_at, NULL);
    END IF;
END //
DELIMITER ;
