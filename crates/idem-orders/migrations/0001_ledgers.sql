-- The four ledgers (SQLite and PostgreSQL). Every ledger is append-or-update: rows are
-- never deleted, and nothing here cascades a delete.

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
