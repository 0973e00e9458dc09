-- Dropped and created again, so the migration that installs it runs twice safely.
DROP TRIGGER IF EXISTS idem_leases_deleted;

DELIMITER //
CREATE TRIGGER idem_leases_deleted BEFORE DELETE ON idem_leases
FOR EACH ROW
    -- In-place grants raise the row's token only: a row that goes leaves its token in
    -- the name's counter, so no later grant repeats it.
    INSERT INTO idem_lease_tokens (name, last_token) VALUES (OLD.name, OLD.token)
    ON DUPLICATE KEY UPDATE last_token = GREATEST(last_token, VALUES(last_token)) //
DELIMITER ;
