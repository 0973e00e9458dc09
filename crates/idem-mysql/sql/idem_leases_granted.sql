-- Dropped and created again, so the migration that installs it runs twice safely.
DROP TRIGGER IF EXISTS idem_leases_granted;

DELIMITER //
CREATE TRIGGER idem_leases_granted AFTER INSERT ON idem_leases
FOR EACH ROW
    -- A name's first grant (or one after its row was deleted): the evidence is written
    -- by the statement that grants, whichever path it took.
    INSERT INTO idem_lease_events (name, kind, at, owner, token, acquired_at, expires_at,
                                   detail)
    VALUES (NEW.name, 'acquired', NEW.acquired_at, NEW.owner, NEW.token, NEW.acquired_at,
            NEW.expires_at, NULL) //
DELIMITER ;
