-- MySQL / MariaDB form of the ledgers: statements run one at a time, each ending in `;`
-- (DDL commits on its own), each safe to run again (`CREATE TABLE IF NOT EXISTS`, indexes
-- declared with their table), so a migrator that stopped half-way is finished by the
-- next. A MySQL database starts at the shape the other backends reach at version 4:
-- version 1 already has the stock buckets and the delivery claim, and versions 2 to 4
-- have nothing left to do (the console's tables are idem-console's, the arrival timeline
-- is the store's). Identifiers and enumerations are `ascii_bin` (byte comparison, one byte
-- a character in keys), names and free text `utf8mb4_bin`; every key fits InnoDB's
-- 3,072-byte index limit. Partial indexes become plain ones: a UNIQUE index lets NULLs
-- repeat, and the one active freeze per scope is a unique index on a generated column
-- that is NULL once the freeze ends.

CREATE TABLE IF NOT EXISTS inventory (
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
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS inventory_buckets (
    tenant_id  VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    show_id    VARCHAR(128) NOT NULL,
    bucket     BIGINT NOT NULL CHECK (bucket >= 0),
    available  BIGINT NOT NULL CHECK (available >= 0),
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, show_id, bucket)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS inventory_holds (
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
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS orders (
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
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS order_transitions (
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
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS payments (
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
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS psp_operations (
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
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS tickets (
    ticket_id  VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    tenant_id  VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    order_id   VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    user_id    VARCHAR(128) NOT NULL,
    show_id    VARCHAR(128) NOT NULL,
    quantity   BIGINT NOT NULL,
    issued_at  BIGINT NOT NULL,
    message_id VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    UNIQUE KEY tickets_order_uq (order_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS outbox_messages (
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
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS message_deliveries (
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
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS consumer_processed (
    consumer     VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    tenant_id    VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    business_key VARCHAR(255) NOT NULL,
    order_id     VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    message_id   VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    outcome      TEXT NOT NULL,
    processed_at BIGINT NOT NULL,
    PRIMARY KEY (consumer, tenant_id, business_key)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS freezes (
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
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
