-- The key-state machine as SQL functions (docs/SQL-API.md), for services in any language
-- that finish the idempotency record in their own transaction.
--
-- Every function pins `search_path` to the schema it was installed in (`SET search_path
-- FROM CURRENT`: the migration runs with search_path set to the store's schema). So the
-- file stays free of a spliced-in schema name, and a caller whose search_path differs
-- (or is hostile) still reaches this schema's table. The cost is one setting saved and
-- restored per call.
--
-- Errors a caller branches on use SQLSTATE class ID (implementation-defined, unused by
-- PostgreSQL): ID001 invalid argument, ID002 result too large, ID003 superseded (stale
-- owner or version), ID004 claim did not settle (retry).
--
-- `p_clock_shift_ms` moves the store clock for tests of lease expiry; callers leave it out.

-- Internal checks, called only from the functions below (whose search_path is pinned);
-- they name no table, so they skip the per-call setting.
CREATE FUNCTION idem_check_names(p_tenant text, p_key text, p_owner text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    -- The rules of idem_core's TenantId, IdempotencyKey and OwnerId: visible ASCII
    -- (0x21..0x7E), at most 128 (255 for a key), and no ',' or ';' in a key. Lengths are
    -- checked apart: a bounded repeat ({1,128}) made the regex most of a claim's cost.
    IF p_tenant IS NULL OR octet_length(p_tenant) NOT BETWEEN 1 AND 128
       OR p_tenant !~ '^[!-~]+$' THEN
        RAISE EXCEPTION 'idem: tenant must be 1 to 128 visible ASCII characters'
            USING ERRCODE = 'ID001';
    END IF;
    IF p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND 255
       OR p_key !~ '^[!-+.-:<-~-]+$' THEN
        RAISE EXCEPTION 'idem: key must be 1 to 255 visible ASCII characters other than , and ;'
            USING ERRCODE = 'ID001';
    END IF;
    IF p_owner IS NULL OR octet_length(p_owner) NOT BETWEEN 1 AND 128
       OR p_owner !~ '^[!-~]+$' THEN
        RAISE EXCEPTION 'idem: owner must be 1 to 128 visible ASCII characters'
            USING ERRCODE = 'ID001';
    END IF;
END
$$;

CREATE FUNCTION idem_check_lease(p_lease_ms bigint) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    -- idem_core::MAX_LEASE: 24 hours.
    IF p_lease_ms IS NULL OR p_lease_ms < 1 OR p_lease_ms > 86400000 THEN
        RAISE EXCEPTION 'idem: lease must be between 1 ms and 86400000 ms, got %', p_lease_ms
            USING ERRCODE = 'ID001';
    END IF;
END
$$;

-- Decides what this arrival of (tenant, key) may do, writing PROCESSING when it may
-- proceed. The decision table of idem_core::decide (docs/DESIGN.md: key states).
CREATE FUNCTION idem_claim(
    p_tenant text, p_key text, p_fingerprint bytea, p_principal text, p_owner text,
    p_lease_ms bigint, p_clock_shift_ms bigint DEFAULT 0
) RETURNS TABLE (
    decision text, kind text, version bigint, attempt integer, lease_expires_at bigint,
    now_ms bigint, state text, owner text, status integer, headers jsonb, body bytea,
    result_ref text, created_at bigint, updated_at bigint, completed_at bigint
)
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    r idem_records%ROWTYPE;
BEGIN
    PERFORM idem_check_names(p_tenant, p_key, p_owner);
    IF p_principal IS NULL OR octet_length(p_principal) NOT BETWEEN 1 AND 128
       OR p_principal !~ '^[!-~]+$' THEN
        RAISE EXCEPTION 'idem: principal must be 1 to 128 visible ASCII characters'
            USING ERRCODE = 'ID001';
    END IF;
    IF p_fingerprint IS NULL OR octet_length(p_fingerprint) <> 32 THEN
        RAISE EXCEPTION 'idem: fingerprint must be 32 bytes (SHA-256)' USING ERRCODE = 'ID001';
    END IF;
    PERFORM idem_check_lease(p_lease_ms);
    -- Each statement of a volatile function takes a new snapshot (READ COMMITTED), so a
    -- re-run sees what made the previous one come back empty.
    FOR run IN 1..8 LOOP
        now_ms := (extract(epoch FROM clock_timestamp()) * 1000)::bigint
                  + coalesce(p_clock_shift_ms, 0);
        SELECT * INTO r FROM idem_records t WHERE t.tenant_id = p_tenant AND t.key = p_key;
        IF NOT FOUND THEN
            -- A duplicate's uncommitted row makes this wait on the unique index; after
            -- its commit nothing is inserted and the next run reads it, after its
            -- rollback this inserts.
            INSERT INTO idem_records AS t (tenant_id, key, principal, fingerprint, state,
                version, owner, lease_expires_at, attempts, created_at, updated_at)
            VALUES (p_tenant, p_key, p_principal, p_fingerprint, 'PROCESSING', 1, p_owner,
                now_ms + p_lease_ms, 1, now_ms, now_ms)
            ON CONFLICT (tenant_id, key) DO NOTHING
            RETURNING t.version, t.attempts, t.lease_expires_at
                INTO version, attempt, lease_expires_at;
            IF FOUND THEN
                decision := 'proceed'; kind := 'fresh'; state := 'PROCESSING';
                created_at := now_ms; updated_at := now_ms;
                RETURN NEXT;
                RETURN;
            END IF;
            CONTINUE;
        END IF;
        state := r.state;
        IF r.fingerprint <> p_fingerprint OR r.principal <> p_principal THEN
            -- Another request's result is never shown to this one.
            decision := 'mismatch';
            RETURN NEXT;
            RETURN;
        END IF;
        IF r.state IN ('SUCCEEDED', 'FAILED_TERMINAL')
           OR (r.state = 'PROCESSING' AND r.lease_expires_at > now_ms) THEN
            decision := CASE WHEN r.state = 'PROCESSING' THEN 'in_progress' ELSE 'replay' END;
            version := r.version; attempt := r.attempts;
            lease_expires_at := r.lease_expires_at; owner := r.owner;
            status := r.result_status; headers := r.result_headers; body := r.result_body;
            result_ref := r.result_ref; created_at := r.created_at;
            updated_at := r.updated_at; completed_at := r.completed_at;
            RETURN NEXT;
            RETURN;
        END IF;
        -- FAILED_RETRYABLE, or PROCESSING past its lease: a compare-and-set on the version
        -- read. A concurrent taker's committed update fails the re-checked WHERE, so
        -- exactly one wins; the others read again.
        UPDATE idem_records t
        SET state = 'PROCESSING', version = t.version + 1, owner = p_owner,
            lease_expires_at = now_ms + p_lease_ms, attempts = t.attempts + 1,
            updated_at = now_ms
        WHERE t.tenant_id = p_tenant AND t.key = p_key AND t.version = r.version
          AND t.principal = p_principal AND t.fingerprint = p_fingerprint
          AND (t.state = 'FAILED_RETRYABLE'
               OR (t.state = 'PROCESSING'
                   AND (t.lease_expires_at IS NULL OR t.lease_expires_at <= now_ms)))
        RETURNING t.version, t.attempts, t.lease_expires_at, t.created_at
            INTO version, attempt, lease_expires_at, created_at;
        IF FOUND THEN
            decision := 'proceed';
            kind := CASE WHEN r.state = 'FAILED_RETRYABLE' THEN 'retry_after_failure'
                         ELSE 'expired_lease' END;
            state := 'PROCESSING';
            -- The owner it took over from (evidence); NULL after a failure.
            owner := CASE WHEN r.state = 'PROCESSING' THEN r.owner END;
            updated_at := now_ms;
            RETURN NEXT;
            RETURN;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'idem: claim on %/% did not settle; retry', p_tenant, p_key
        USING ERRCODE = 'ID004';
END
$$;

-- Ends a claim: compare-and-set on (version, owner, PROCESSING). Returns the record's
-- new version and the columns the caller did not send.
CREATE FUNCTION idem_finish(
    p_tenant text, p_key text, p_owner text, p_version bigint, p_outcome text,
    p_status integer, p_headers jsonb, p_body bytea, p_result_ref text,
    p_clock_shift_ms bigint DEFAULT 0
) RETURNS TABLE (
    version bigint, attempt integer, principal text, fingerprint bytea,
    created_at bigint, updated_at bigint, completed_at bigint
)
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    target text;
    stored_headers jsonb;
    size bigint;
    r idem_records%ROWTYPE;
    now_ms bigint;
BEGIN
    PERFORM idem_check_names(p_tenant, p_key, p_owner);
    target := CASE p_outcome WHEN 'succeeded' THEN 'SUCCEEDED'
                             WHEN 'terminal' THEN 'FAILED_TERMINAL'
                             WHEN 'retryable' THEN 'FAILED_RETRYABLE' END;
    IF target IS NULL THEN
        RAISE EXCEPTION 'idem: outcome must be succeeded, terminal or retryable, got %',
            p_outcome USING ERRCODE = 'ID001';
    END IF;
    IF p_version IS NULL OR p_version < 1 THEN
        RAISE EXCEPTION 'idem: version must be the claim''s (positive)' USING ERRCODE = 'ID001';
    END IF;
    IF p_status IS NULL THEN
        IF p_headers IS NOT NULL OR p_body IS NOT NULL OR p_result_ref IS NOT NULL THEN
            RAISE EXCEPTION 'idem: a result needs a status' USING ERRCODE = 'ID001';
        END IF;
    ELSE
        IF p_status < 0 OR p_status > 65535 THEN
            RAISE EXCEPTION 'idem: status must be between 0 and 65535' USING ERRCODE = 'ID001';
        END IF;
        -- Headers are [[name, value], ...], as every idem store keeps them.
        IF p_headers IS NOT NULL AND (jsonb_typeof(p_headers) <> 'array' OR EXISTS (
               SELECT 1 FROM jsonb_array_elements(p_headers) h
               WHERE jsonb_typeof(h) <> 'array' OR jsonb_array_length(h) <> 2
                  OR jsonb_typeof(h -> 0) <> 'string' OR jsonb_typeof(h -> 1) <> 'string'))
        THEN
            RAISE EXCEPTION 'idem: headers must be a JSON array of [name, value] strings'
                USING ERRCODE = 'ID001';
        END IF;
        -- StoredResult::size: body, header names and values, reference; the default
        -- limit of idem_core (1 MiB).
        size := coalesce(octet_length(p_body), 0) + coalesce(octet_length(p_result_ref), 0)
              + coalesce((SELECT sum(octet_length(h ->> 0) + octet_length(h ->> 1))
                          FROM jsonb_array_elements(p_headers) h), 0);
        IF size > 1048576 THEN
            RAISE EXCEPTION 'idem: result is % bytes; the limit is 1048576', size
                USING ERRCODE = 'ID002';
        END IF;
    END IF;
    -- A result's headers are never NULL in the table (an empty list is []).
    stored_headers := CASE WHEN p_status IS NOT NULL THEN coalesce(p_headers, '[]') END;
    now_ms := (extract(epoch FROM clock_timestamp()) * 1000)::bigint
              + coalesce(p_clock_shift_ms, 0);
    UPDATE idem_records t
    SET state = target, version = t.version + 1, updated_at = now_ms,
        lease_expires_at = NULL,
        completed_at = CASE WHEN target <> 'FAILED_RETRYABLE' THEN now_ms END,
        result_status = p_status,
        result_headers = stored_headers,
        result_body = p_body, result_ref = p_result_ref
    WHERE t.tenant_id = p_tenant AND t.key = p_key AND t.version = p_version
      AND t.owner = p_owner AND t.state = 'PROCESSING'
    RETURNING t.version, t.attempts, t.principal, t.fingerprint, t.created_at,
              t.updated_at, t.completed_at
        INTO version, attempt, principal, fingerprint, created_at, updated_at, completed_at;
    IF FOUND THEN
        RETURN NEXT;
        RETURN;
    END IF;
    -- A retry of this very finish whose answer was lost: answered as the first time.
    SELECT * INTO r FROM idem_records t WHERE t.tenant_id = p_tenant AND t.key = p_key;
    IF FOUND AND r.version = p_version + 1 AND r.owner = p_owner AND r.state = target
       AND r.result_status IS NOT DISTINCT FROM p_status
       AND r.result_headers IS NOT DISTINCT FROM stored_headers
       AND r.result_body IS NOT DISTINCT FROM p_body
       AND r.result_ref IS NOT DISTINCT FROM p_result_ref THEN
        version := r.version; attempt := r.attempts; principal := r.principal;
        fingerprint := r.fingerprint; created_at := r.created_at;
        updated_at := r.updated_at; completed_at := r.completed_at;
        RETURN NEXT;
        RETURN;
    END IF;
    RAISE EXCEPTION 'idem: claim on %/% at version % by % is no longer current',
        p_tenant, p_key, p_version, p_owner USING ERRCODE = 'ID003';
END
$$;

-- Moves a live claim's lease deadline to now + lease (claim-ahead work: claim, call a
-- provider, heartbeat, finish later). No version bump: the claim stays valid.
CREATE FUNCTION idem_heartbeat(
    p_tenant text, p_key text, p_owner text, p_version bigint, p_lease_ms bigint,
    p_clock_shift_ms bigint DEFAULT 0
) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
DECLARE
    deadline bigint;
    now_ms bigint;
BEGIN
    PERFORM idem_check_names(p_tenant, p_key, p_owner);
    PERFORM idem_check_lease(p_lease_ms);
    now_ms := (extract(epoch FROM clock_timestamp()) * 1000)::bigint
              + coalesce(p_clock_shift_ms, 0);
    UPDATE idem_records t
    SET lease_expires_at = now_ms + p_lease_ms, updated_at = now_ms
    WHERE t.tenant_id = p_tenant AND t.key = p_key AND t.version = p_version
      AND t.owner = p_owner AND t.state = 'PROCESSING'
    RETURNING t.lease_expires_at INTO deadline;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'idem: claim on %/% at version % by % is no longer current',
            p_tenant, p_key, p_version, p_owner USING ERRCODE = 'ID003';
    END IF;
    RETURN deadline;
END
$$;
