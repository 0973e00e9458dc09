//! The ledgers' schema, as versioned migrations recorded in `orders_schema_migrations`.
//!
//! The DDL is shared by SQLite and PostgreSQL (`BIGINT` and `TEXT` columns, partial
//! indexes, `CHECK`s); MySQL/MariaDB has its own form of each version (`MYSQL`). Leases
//! and fences are the stores' own tables (`idem-sqlite`, `idem-postgres`, `idem-mysql`).
//! Migrations are append-only: a released version is never edited. They run inside the
//! caller's transaction, which takes turns with other migrators first (SQLite: `BEGIN
//! IMMEDIATE`; PostgreSQL: a transaction-scoped advisory lock), so two processes starting
//! at once apply each version once. MySQL commits DDL implicitly: its migrators take turns
//! on a named server lock instead, and every statement is safe to run twice.
//!
//! Every ledger is append-or-update: rows are never deleted, and nothing in this schema
//! cascades a delete. The console's tables (migration 2) are not ledgers: expired
//! sessions are dropped, and the arrival timeline, first kept here, now lives in the
//! store's own tables (migration 4 carries it over).

use super::{sql, Conn};
use crate::error::Error;

struct Migration {
    version: i64,
    name: &'static str,
    sql: &'static str,
}

const LEDGERS: &str = r#"
-- Inventory ledger: stock per show (per tenant), and one hold (voucher) per order.
CREATE TABLE inventory (
    tenant_id       TEXT   NOT NULL,
    show_id         TEXT   NOT NULL,
    title           TEXT   NOT NULL,
    capacity        BIGINT NOT NULL CHECK (capacity >= 0),
    available       BIGINT NOT NULL CHECK (available >= 0 AND available <= capacity),
    per_order_limit BIGINT NOT NULL CHECK (per_order_limit > 0),
    price_cents     BIGINT NOT NULL CHECK (price_cents >= 0),
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, show_id)
);

CREATE TABLE inventory_holds (
    hold_id       TEXT   PRIMARY KEY,
    tenant_id     TEXT   NOT NULL,
    order_id      TEXT   NOT NULL UNIQUE,
    show_id       TEXT   NOT NULL,
    quantity      BIGINT NOT NULL CHECK (quantity > 0),
    status        TEXT   NOT NULL CHECK (status IN ('held', 'released')),
    created_at    BIGINT NOT NULL,
    released_at   BIGINT,
    -- Evidence of the release: the lease token and owner the fenced write carried.
    release_token BIGINT,
    release_owner TEXT
);
CREATE INDEX inventory_holds_by_show ON inventory_holds (tenant_id, show_id, status);

-- Orders ledger. `idempotency_key` is the key the order was created under (NULL for the
-- legacy route that mints ids server-side).
CREATE TABLE orders (
    order_id        TEXT   PRIMARY KEY,
    tenant_id       TEXT   NOT NULL,
    user_id         TEXT   NOT NULL,
    show_id         TEXT   NOT NULL,
    quantity        BIGINT NOT NULL CHECK (quantity > 0),
    amount_cents    BIGINT NOT NULL CHECK (amount_cents >= 0),
    client_session  TEXT,
    idempotency_key TEXT,
    status          TEXT   NOT NULL CHECK (status IN ('pending_payment', 'paid', 'ticketed',
                        'cancelled', 'refund_pending', 'refunded')),
    version         BIGINT NOT NULL CHECK (version > 0),
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL,
    paid_at         BIGINT,
    ticketed_at     BIGINT,
    refunded_at     BIGINT,
    cancelled_at    BIGINT
);
-- A second gate behind idem_records' UNIQUE(tenant_id, key): one order per key.
CREATE UNIQUE INDEX orders_idempotency_key_uq ON orders (tenant_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- Reconciliation groups by user, show, client session and time window.
CREATE INDEX orders_by_user_show ON orders (tenant_id, user_id, show_id, created_at);
CREATE INDEX orders_by_show ON orders (tenant_id, show_id, created_at);

-- Every status change, with who made it and why.
CREATE TABLE order_transitions (
    transition_id TEXT   PRIMARY KEY,
    tenant_id     TEXT   NOT NULL,
    order_id      TEXT   NOT NULL,
    from_status   TEXT,
    to_status     TEXT   NOT NULL,
    event         TEXT   NOT NULL,
    at            BIGINT NOT NULL,
    actor         TEXT   NOT NULL,
    detail        TEXT
);
CREATE INDEX order_transitions_by_order ON order_transitions (order_id, at);

-- Payments ledger: charges and refunds as the provider confirmed them, one per
-- business-derived provider key (pay:{order_id}, refund:{order_id}).
CREATE TABLE payments (
    payment_id   TEXT   PRIMARY KEY,
    tenant_id    TEXT   NOT NULL,
    order_id     TEXT   NOT NULL,
    kind         TEXT   NOT NULL CHECK (kind IN ('charge', 'refund')),
    provider_key TEXT   NOT NULL,
    provider_ref TEXT   NOT NULL,
    amount_cents BIGINT NOT NULL CHECK (amount_cents >= 0),
    status       TEXT   NOT NULL CHECK (status IN ('succeeded')),
    created_at   BIGINT NOT NULL,
    UNIQUE (tenant_id, provider_key)
);
CREATE INDEX payments_by_order ON payments (order_id);

-- The payment provider simulator's own books. It stands for an external system and is
-- idempotent on the key the caller derives from the business: `calls` counts arrivals.
CREATE TABLE psp_operations (
    tenant_id    TEXT   NOT NULL,
    provider_key TEXT   NOT NULL,
    kind         TEXT   NOT NULL CHECK (kind IN ('charge', 'refund')),
    order_id     TEXT   NOT NULL,
    amount_cents BIGINT NOT NULL,
    provider_ref TEXT   NOT NULL,
    created_at   BIGINT NOT NULL,
    calls        BIGINT NOT NULL,
    last_call_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, provider_key)
);

CREATE TABLE tickets (
    ticket_id  TEXT   PRIMARY KEY,
    tenant_id  TEXT   NOT NULL,
    order_id   TEXT   NOT NULL UNIQUE,
    user_id    TEXT   NOT NULL,
    show_id    TEXT   NOT NULL,
    quantity   BIGINT NOT NULL,
    issued_at  BIGINT NOT NULL,
    message_id TEXT   NOT NULL
);

-- Messages ledger: the transactional outbox. One message per (topic, order): a second
-- emission of the same fact is impossible, not just unlikely.
CREATE TABLE outbox_messages (
    message_id       TEXT   PRIMARY KEY,
    tenant_id        TEXT   NOT NULL,
    topic            TEXT   NOT NULL,
    order_id         TEXT   NOT NULL,
    user_id          TEXT   NOT NULL,
    show_id          TEXT   NOT NULL,
    payload          TEXT   NOT NULL,
    created_at       BIGINT NOT NULL,
    published_at     BIGINT,
    publish_attempts BIGINT NOT NULL DEFAULT 0,
    UNIQUE (tenant_id, topic, order_id)
);
CREATE INDEX outbox_unpublished ON outbox_messages (created_at) WHERE published_at IS NULL;
CREATE INDEX outbox_by_order ON outbox_messages (tenant_id, order_id);

-- The in-process transport: one delivery per (consumer, message), acked or pending.
CREATE TABLE message_deliveries (
    consumer     TEXT   NOT NULL,
    message_id   TEXT   NOT NULL,
    state        TEXT   NOT NULL CHECK (state IN ('pending', 'acked')),
    attempts     BIGINT NOT NULL DEFAULT 0,
    available_at BIGINT NOT NULL,
    last_error   TEXT,
    created_at   BIGINT NOT NULL,
    acked_at     BIGINT,
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX message_deliveries_pending ON message_deliveries (consumer, available_at)
    WHERE state = 'pending';

-- Per consumer, the business keys it has processed (its idempotency evidence).
CREATE TABLE consumer_processed (
    consumer     TEXT   NOT NULL,
    tenant_id    TEXT   NOT NULL,
    business_key TEXT   NOT NULL,
    order_id     TEXT   NOT NULL,
    message_id   TEXT   NOT NULL,
    outcome      TEXT   NOT NULL,
    processed_at BIGINT NOT NULL,
    PRIMARY KEY (consumer, tenant_id, business_key)
);

-- Freeze switches. tenant_id '' = every tenant; scope_value '' for scope 'all'.
-- Unfreezing sets unfrozen_at: the history stays.
CREATE TABLE freezes (
    freeze_id   TEXT   PRIMARY KEY,
    tenant_id   TEXT   NOT NULL,
    scope_kind  TEXT   NOT NULL CHECK (scope_kind IN ('user', 'show', 'all')),
    scope_value TEXT   NOT NULL,
    what        TEXT   NOT NULL CHECK (what IN ('payment-confirm', 'ticketing',
                    'inventory-release')),
    reason      TEXT,
    frozen_by   TEXT   NOT NULL,
    frozen_at   BIGINT NOT NULL,
    unfrozen_at BIGINT,
    unfrozen_by TEXT
);
CREATE UNIQUE INDEX freezes_active_uq ON freezes (tenant_id, scope_kind, scope_value, what)
    WHERE unfrozen_at IS NULL;
"#;

/// The operator console's tables. Arrivals are evidence about keys, not a ledger: they
/// are kept while their key has a record or an archive entry (`crate::arrivals`).
const CONSOLE: &str = r#"
-- Per key: when it first and last arrived and how many arrivals got each decision.
CREATE TABLE arrival_keys (
    tenant_id   TEXT   NOT NULL,
    idem_key    TEXT   NOT NULL,
    first_at    BIGINT NOT NULL,
    last_at     BIGINT NOT NULL,
    executed    BIGINT NOT NULL CHECK (executed >= 0),
    replayed    BIGINT NOT NULL CHECK (replayed >= 0),
    in_progress BIGINT NOT NULL CHECK (in_progress >= 0),
    mismatch    BIGINT NOT NULL CHECK (mismatch >= 0),
    refused     BIGINT NOT NULL CHECK (refused >= 0),
    total       BIGINT NOT NULL CHECK (total > 0),
    PRIMARY KEY (tenant_id, idem_key)
);
CREATE INDEX arrival_keys_by_last ON arrival_keys (last_at);

-- The first arrivals of each key, one row each (bounded per key by the writer).
CREATE TABLE arrivals (
    tenant_id  TEXT   NOT NULL,
    idem_key   TEXT   NOT NULL,
    seq        BIGINT NOT NULL CHECK (seq > 0),
    at         BIGINT NOT NULL,
    decision   TEXT   NOT NULL CHECK (decision IN ('executed', 'replayed', 'in_progress',
                   'mismatch', 'refused')),
    status     BIGINT NOT NULL,
    elapsed_ms BIGINT NOT NULL,
    principal  TEXT   NOT NULL,
    PRIMARY KEY (tenant_id, idem_key, seq)
);

-- Console sessions: the cookie's SHA-256 (never the cookie), its CSRF token, expiry, and
-- a digest of the admin token it was opened with (a replaced token ends its sessions).
CREATE TABLE console_sessions (
    session_hash TEXT   PRIMARY KEY,
    operator     TEXT   NOT NULL,
    csrf         TEXT   NOT NULL,
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL,
    ended_at     BIGINT,
    token_digest TEXT   NOT NULL
);

-- What the console did: who, what, on what, why, and how it went.
CREATE TABLE console_audit (
    audit_id TEXT   PRIMARY KEY,
    at       BIGINT NOT NULL,
    operator TEXT   NOT NULL,
    action   TEXT   NOT NULL,
    target   TEXT   NOT NULL,
    reason   TEXT,
    outcome  TEXT   NOT NULL
);
CREATE INDEX console_audit_by_at ON console_audit (at);
"#;

/// A show's stock in bucket rows, so that concurrent orders of one show lock different
/// rows (`crate::ledgers` inventory). The stock a show had moves into its buckets; its
/// `inventory.available` becomes the reserve, empty from here on (a build from before
/// the buckets sees an empty reserve and answers sold out: it cannot oversell).
const STOCK_BUCKETS: &str = r#"
CREATE TABLE inventory_buckets (
    tenant_id  TEXT   NOT NULL,
    show_id    TEXT   NOT NULL,
    bucket     BIGINT NOT NULL CHECK (bucket >= 0),
    available  BIGINT NOT NULL CHECK (available >= 0),
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, show_id, bucket)
);

WITH RECURSIVE n(bucket) AS (SELECT CAST(0 AS BIGINT)
    UNION ALL SELECT bucket + 1 FROM n WHERE bucket + 1 < 32)
INSERT INTO inventory_buckets (tenant_id, show_id, bucket, available, updated_at)
SELECT i.tenant_id, i.show_id, n.bucket,
       i.available / 32 + CASE WHEN n.bucket < i.available % 32 THEN 1 ELSE 0 END,
       i.updated_at
FROM inventory i CROSS JOIN n;

UPDATE inventory SET available = 0;

-- Which consumer instance claimed a delivery (with `available_at` as the claim's end):
-- instances of one consumer take disjoint deliveries instead of racing on the same.
ALTER TABLE message_deliveries ADD COLUMN claim TEXT;
"#;

/// The arrival timeline moved to the store's own tables (`idem_arrival_keys`,
/// `idem_arrivals`, created by the store's migrations, which run first): what the old
/// tables held is carried over, then they go. (`WHERE true`: without it SQLite reads the
/// `ON` of `ON CONFLICT` as a join's.)
const ARRIVALS_TO_STORE: &str = r#"
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
"#;

const COMMON: &[Migration] = &[
    Migration {
        version: 1,
        name: "ledgers",
        sql: LEDGERS,
    },
    Migration {
        version: 2,
        name: "console",
        sql: CONSOLE,
    },
    Migration {
        version: 3,
        name: "stock buckets, delivery claims",
        sql: STOCK_BUCKETS,
    },
    Migration {
        version: 4,
        name: "arrival timeline to the store",
        sql: ARRIVALS_TO_STORE,
    },
];

const VERSIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS orders_schema_migrations (\
    version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)";

/// MySQL/MariaDB: the same versions, each a list of statements run one by one (every DDL
/// statement commits on its own), each safe to run again (`CREATE TABLE IF NOT EXISTS`,
/// indexes declared with their table) so a migrator that stopped half-way is finished by
/// the next. A MySQL database starts at the shape the other backends reach at version 4:
/// version 1 already has the stock buckets and the delivery claim, and versions 2 to 4
/// have nothing left to do (the console's tables are `idem_console::migrate`'s, the
/// arrival timeline is the store's). Identifiers and enumerations are `ascii_bin` (byte comparison,
/// one byte a character in keys), names and free text `utf8mb4_bin`; every key fits
/// InnoDB's 3,072-byte index limit. Partial indexes become plain ones: a UNIQUE index
/// lets NULLs repeat, and the one active freeze per scope is a unique index on a
/// generated column that is NULL once the freeze ends.
const MYSQL_LEDGERS: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS inventory (
    tenant_id       VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    show_id         VARCHAR(128) NOT NULL,
    title           VARCHAR(255) NOT NULL,
    capacity        BIGINT NOT NULL CHECK (capacity >= 0),
    available       BIGINT NOT NULL CHECK (available >= 0 AND available <= capacity),
    per_order_limit BIGINT NOT NULL CHECK (per_order_limit > 0),
    price_cents     BIGINT NOT NULL CHECK (price_cents >= 0),
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, show_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS inventory_buckets (
    tenant_id  VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    show_id    VARCHAR(128) NOT NULL,
    bucket     BIGINT NOT NULL CHECK (bucket >= 0),
    available  BIGINT NOT NULL CHECK (available >= 0),
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, show_id, bucket)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS inventory_holds (
    hold_id       VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    tenant_id     VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    order_id      VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    show_id       VARCHAR(128) NOT NULL,
    quantity      BIGINT NOT NULL CHECK (quantity > 0),
    status        VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL
                  CHECK (status IN ('held', 'released')),
    created_at    BIGINT NOT NULL,
    released_at   BIGINT,
    release_token BIGINT,
    release_owner TEXT,
    UNIQUE KEY inventory_holds_order_uq (order_id),
    KEY inventory_holds_by_show (tenant_id, show_id, status)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS orders (
    order_id        VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    tenant_id       VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    user_id         VARCHAR(128) NOT NULL,
    show_id         VARCHAR(128) NOT NULL,
    quantity        BIGINT NOT NULL CHECK (quantity > 0),
    amount_cents    BIGINT NOT NULL CHECK (amount_cents >= 0),
    client_session  VARCHAR(128),
    idempotency_key VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin,
    status          VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL
                    CHECK (status IN ('pending_payment', 'paid', 'ticketed', 'cancelled',
                        'refund_pending', 'refunded')),
    version         BIGINT NOT NULL CHECK (version > 0),
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL,
    paid_at         BIGINT,
    ticketed_at     BIGINT,
    refunded_at     BIGINT,
    cancelled_at    BIGINT,
    UNIQUE KEY orders_idempotency_key_uq (tenant_id, idempotency_key),
    KEY orders_by_user_show (tenant_id, user_id, show_id, created_at),
    KEY orders_by_show (tenant_id, show_id, created_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS order_transitions (
    transition_id VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    tenant_id     VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    order_id      VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    from_status   VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin,
    to_status     VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    event         VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    at            BIGINT NOT NULL,
    actor         TEXT NOT NULL,
    detail        TEXT,
    KEY order_transitions_by_order (order_id, at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS payments (
    payment_id   VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    tenant_id    VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    order_id     VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    kind         VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL
                 CHECK (kind IN ('charge', 'refund')),
    provider_key VARCHAR(255) NOT NULL,
    provider_ref VARCHAR(255) NOT NULL,
    amount_cents BIGINT NOT NULL CHECK (amount_cents >= 0),
    status       VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL
                 CHECK (status IN ('succeeded')),
    created_at   BIGINT NOT NULL,
    UNIQUE KEY payments_provider_key_uq (tenant_id, provider_key),
    KEY payments_by_order (order_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS psp_operations (
    tenant_id    VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    provider_key VARCHAR(255) NOT NULL,
    kind         VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL
                 CHECK (kind IN ('charge', 'refund')),
    order_id     VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    amount_cents BIGINT NOT NULL,
    provider_ref VARCHAR(255) NOT NULL,
    created_at   BIGINT NOT NULL,
    calls        BIGINT NOT NULL,
    last_call_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, provider_key)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS tickets (
    ticket_id  VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    tenant_id  VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    order_id   VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    user_id    VARCHAR(128) NOT NULL,
    show_id    VARCHAR(128) NOT NULL,
    quantity   BIGINT NOT NULL,
    issued_at  BIGINT NOT NULL,
    message_id VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    UNIQUE KEY tickets_order_uq (order_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS outbox_messages (
    message_id       VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    tenant_id        VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    topic            VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    order_id         VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    user_id          VARCHAR(128) NOT NULL,
    show_id          VARCHAR(128) NOT NULL,
    payload          MEDIUMTEXT NOT NULL,
    created_at       BIGINT NOT NULL,
    published_at     BIGINT,
    publish_attempts BIGINT NOT NULL DEFAULT 0,
    UNIQUE KEY outbox_topic_order_uq (tenant_id, topic, order_id),
    KEY outbox_unpublished (published_at, created_at),
    KEY outbox_by_order (tenant_id, order_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS message_deliveries (
    consumer     VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    message_id   VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    state        VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL
                 CHECK (state IN ('pending', 'acked')),
    attempts     BIGINT NOT NULL DEFAULT 0,
    available_at BIGINT NOT NULL,
    last_error   TEXT,
    created_at   BIGINT NOT NULL,
    acked_at     BIGINT,
    claim        VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin,
    PRIMARY KEY (consumer, message_id),
    KEY message_deliveries_pending (consumer, state, available_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS consumer_processed (
    consumer     VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    tenant_id    VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    business_key VARCHAR(255) NOT NULL,
    order_id     VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    message_id   VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    outcome      TEXT NOT NULL,
    processed_at BIGINT NOT NULL,
    PRIMARY KEY (consumer, tenant_id, business_key)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS freezes (
    freeze_id   VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    tenant_id   VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    scope_kind  VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL
                CHECK (scope_kind IN ('user', 'show', 'all')),
    scope_value VARCHAR(128) NOT NULL,
    what        VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL
                CHECK (what IN ('payment-confirm', 'ticketing', 'inventory-release')),
    reason      TEXT,
    frozen_by   TEXT NOT NULL,
    frozen_at   BIGINT NOT NULL,
    unfrozen_at BIGINT,
    unfrozen_by TEXT,
    -- 1 while active, NULL once unfrozen: NULLs do not collide, so the history stays.
    active      TINYINT GENERATED ALWAYS AS (CASE WHEN unfrozen_at IS NULL THEN 1 END) STORED,
    UNIQUE KEY freezes_active_uq (tenant_id, scope_kind, scope_value, what, active)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
];

/// `COMMON`'s versions in MySQL's form (same numbers and names).
const MYSQL: &[(i64, &[&str])] = &[(1, MYSQL_LEDGERS), (2, &[]), (3, &[]), (4, &[])];

const MYSQL_VERSIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS orders_schema_migrations (\
    version BIGINT NOT NULL PRIMARY KEY, name VARCHAR(128) NOT NULL, applied_at BIGINT NOT NULL\
    ) ENGINE = InnoDB";

/// The newest ledger schema version this build knows.
pub(super) fn newest() -> i64 {
    COMMON.last().map_or(0, |m| m.version)
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

pub(super) async fn apply(c: &mut Conn<'_>) -> Result<(), Error> {
    apply_up_to(c, i64::MAX).await
}

async fn apply_up_to(c: &mut Conn<'_>, last: i64) -> Result<(), Error> {
    c.execute_script(VERSIONS_TABLE).await?;
    let applied = applied(c).await?;
    for m in COMMON
        .iter()
        .filter(|m| m.version <= last && !applied.contains(&m.version))
    {
        c.execute_script(m.sql).await?;
        record(c, m).await?;
    }
    Ok(())
}

/// MySQL/MariaDB: applies the pending versions statement by statement, outside any
/// transaction (each DDL statement commits on its own). The caller holds the migrators'
/// named lock; a version is recorded after all its statements ran.
pub(super) async fn apply_mysql(c: &mut Conn<'_>) -> Result<(), Error> {
    c.execute_script(MYSQL_VERSIONS_TABLE).await?;
    let applied = applied(c).await?;
    for m in COMMON.iter().filter(|m| !applied.contains(&m.version)) {
        let statements = MYSQL
            .iter()
            .find(|(v, _)| *v == m.version)
            .map(|(_, s)| *s)
            .ok_or_else(|| {
                Error::Backend(format!("ledger migration {} has no MySQL form", m.version))
            })?;
        for statement in statements {
            c.execute_script(statement).await?;
        }
        record(c, m).await?;
    }
    Ok(())
}

async fn applied(c: &mut Conn<'_>) -> Result<Vec<i64>, Error> {
    c.all(sql("SELECT version FROM orders_schema_migrations"))
        .await?
        .iter()
        .map(|row| row.int("version"))
        .collect()
}

async fn record(c: &mut Conn<'_>, m: &Migration) -> Result<(), Error> {
    c.execute(
        sql(
            "INSERT INTO orders_schema_migrations (version, name, applied_at) \
             VALUES ($1, $2, $3)",
        )
        .bind(m.version)
        .bind(m.name)
        .bind(now_ms()),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_sql::arrivals::key_arrivals;
    use idem_sql::SqlStore;

    /// A service that kept the timeline in its own tables upgrades without losing it.
    #[tokio::test]
    async fn the_old_timeline_is_carried_to_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqlStore::open_sqlite_path(dir.path().join("o.db"))
            .await
            .unwrap();
        let mut tx = store.begin().await.unwrap();
        apply_up_to(&mut Conn(tx.conn()), 3).await.unwrap();
        Conn(tx.conn())
            .execute_script(
                "INSERT INTO arrival_keys VALUES ('t1', 'k1', 10, 20, 1, 7, 0, 0, 0, 8); \
                 INSERT INTO arrivals VALUES ('t1', 'k1', 1, 10, 'executed', 201, 5, 'p'); \
                 INSERT INTO arrivals VALUES ('t1', 'k1', 2, 20, 'replayed', 201, 1, 'p');",
            )
            .await
            .unwrap();
        apply(&mut Conn(tx.conn())).await.unwrap();
        tx.commit().await.unwrap();
        let moved = key_arrivals(&store, "t1", "k1").await.unwrap().unwrap();
        assert_eq!(moved.summary(), "8 arrivals: 1 executed, 7 replayed");
        assert_eq!(moved.arrivals.len(), 2);
        assert!(!store.has_table("arrival_keys").await.unwrap());
        assert!(!store.has_table("arrivals").await.unwrap());
    }
}
