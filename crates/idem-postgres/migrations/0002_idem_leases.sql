-- The tables of the leases (`src/lease.rs` holds the statements that use them).
-- Migration 2. Unqualified names: the migration runs with `search_path` set to the
-- store's schema.
-- The highest token ever granted per name. A grant bumps it in the same transaction
-- that writes the lease; the row is also the per-name lock every lease change takes.
CREATE TABLE idem_lease_tokens (
    name       text   PRIMARY KEY,
    last_token bigint NOT NULL CHECK (last_token >= 0)
);
-- Tokens never go back: the counter can be neither deleted nor lowered.
CREATE FUNCTION idem_lease_tokens_never_go_back() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF NEW.last_token < OLD.last_token OR NEW.name <> OLD.name THEN
            RAISE EXCEPTION 'idem_lease_tokens: token counter of % cannot go back', OLD.name
                USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'idem_lease_tokens: token counters are never deleted (%)', TG_OP
        USING ERRCODE = 'check_violation';
END
$$;
CREATE TRIGGER idem_lease_tokens_guard BEFORE UPDATE OR DELETE ON idem_lease_tokens
    FOR EACH ROW EXECUTE FUNCTION idem_lease_tokens_never_go_back();
CREATE TRIGGER idem_lease_tokens_no_truncate BEFORE TRUNCATE ON idem_lease_tokens
    FOR EACH STATEMENT EXECUTE FUNCTION idem_lease_tokens_never_go_back();

-- The current lease per name (live, or expired and not yet noticed).
CREATE TABLE idem_leases (
    name        text    PRIMARY KEY,
    owner       text    NOT NULL,
    token       bigint  NOT NULL CHECK (token > 0),
    acquired_at bigint  NOT NULL,
    expires_at  bigint  NOT NULL,
    renewals    integer NOT NULL DEFAULT 0 CHECK (renewals >= 0)
);

-- Evidence: who held what, with which token, when (database clock).
CREATE TABLE idem_lease_events (
    id          bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text    NOT NULL,
    kind        text    NOT NULL CHECK (kind IN ('acquired', 'renewed', 'renew_rejected',
                    'released', 'expired', 'release_owner_mismatch',
                    'fenced_write_rejected', 'force_released')),
    at          bigint  NOT NULL,
    owner       text,
    token       bigint,
    acquired_at bigint,
    expires_at  bigint,
    detail      text
);
CREATE INDEX idem_lease_events_name_idx ON idem_lease_events (name, id);

-- The last token each protected resource accepted (the fence).
CREATE TABLE idem_fences (
    resource   text   PRIMARY KEY,
    last_token bigint NOT NULL,
    lease_name text   NOT NULL,
    owner      text   NOT NULL,
    updated_at bigint NOT NULL
);
