-- MySQL / MariaDB: statements run one at a time, each ending with a line that ends in
-- the delimiter (`DELIMITER` switches it, as in the mysql client), each safe to run
-- twice: DDL commits on its own, so a migrator that stopped half-way re-runs them all.

-- Transaction-scoped named locks for the facade's `Transaction::advisory_lock`: MySQL's
-- GET_LOCK is held by the session, not the transaction, so it would outlive a
-- rolled-back transaction on a pooled connection. A row lock here ends with the
-- transaction.
CREATE TABLE IF NOT EXISTS idem_advisory_locks (
    name_digest BINARY(32) NOT NULL PRIMARY KEY
) ENGINE = InnoDB;
