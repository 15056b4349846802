-- fencekeeper schema version 1: the fence state, the published grants, the
-- receipts and begin_segment. Applied once, inside Install's transaction.

CREATE SCHEMA IF NOT EXISTS fencekeeper;
REVOKE ALL ON SCHEMA fencekeeper FROM PUBLIC;

CREATE TABLE fencekeeper.schema_version (
    version      integer PRIMARY KEY,
    installed_at timestamptz NOT NULL DEFAULT now()
);

-- The store's view of the registry: written by the operator only.
CREATE TABLE fencekeeper.issuer (
    singleton           boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    revoked_below_epoch bigint NOT NULL DEFAULT 0 CHECK (revoked_below_epoch >= 0)
);
INSERT INTO fencekeeper.issuer DEFAULT VALUES;

-- One row per resource: what the fence annotation is for an object.
CREATE TABLE fencekeeper.resources (
    resource_id   text PRIMARY KEY CHECK (octet_length(resource_id) BETWEEN 1 AND 253),
    mode          text NOT NULL DEFAULT 'Enforce' CHECK (mode IN ('Shadow', 'Enforce')),
    generation    bigint NOT NULL DEFAULT 0,
    highest_fence bigint NOT NULL DEFAULT 0,
    root          text NOT NULL DEFAULT '',
    last_segment  bigint NOT NULL DEFAULT 0,
    grant_digest  text NOT NULL DEFAULT '',
    last_envelope jsonb,
    published_at  timestamptz NOT NULL DEFAULT now()
);

-- Every grant the registry issued for a resource this store serves, and its end.
CREATE TABLE fencekeeper.grants (
    digest       text PRIMARY KEY,
    resource_id  text NOT NULL REFERENCES fencekeeper.resources ON DELETE CASCADE,
    fence        bigint NOT NULL,
    grant_doc    jsonb NOT NULL,
    expires_at   timestamptz NOT NULL,
    ended_at     timestamptz,
    end_reason   text,
    published_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX grants_holder ON fencekeeper.grants (resource_id, fence DESC) WHERE ended_at IS NULL;
CREATE INDEX grants_fence ON fencekeeper.grants (resource_id, fence);

-- Every accepted segment, kept while its fence is the resource's highest.
CREATE TABLE fencekeeper.receipts (
    resource_id  text NOT NULL REFERENCES fencekeeper.resources ON DELETE CASCADE,
    fence        bigint NOT NULL,
    segment      bigint NOT NULL,
    operation    text NOT NULL,
    payload      text NOT NULL,
    receipt      text NOT NULL,
    xact_id      xid8 NOT NULL DEFAULT pg_current_xact_id(),
    committed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (resource_id, fence, segment)
);
CREATE INDEX receipts_operation ON fencekeeper.receipts (resource_id, operation);
CREATE INDEX receipts_xact ON fencekeeper.receipts (xact_id, resource_id);

-- refuse raises a refusal: SQLSTATE FK000 (a class of its own), the message
-- starting with the verdict code, the original receipt as the DETAIL.
CREATE FUNCTION fencekeeper.refuse(resource text, verdict text, message text, receipt text)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'FK000', MESSAGE = verdict || ': ' || message,
        DETAIL = coalesce('receipt ' || receipt, ''), HINT = coalesce('resource ' || resource, '');
END $$;

-- envelope_problem says what makes the envelope unreadable (NULL when it is
-- well formed): the same members and limits as the fence annotation's.
CREATE FUNCTION fencekeeper.envelope_problem(env jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    k text;
BEGIN
    IF jsonb_typeof(env) <> 'object' THEN
        RETURN 'the envelope is not a JSON object';
    END IF;
    IF octet_length(env::text) > 8192 THEN
        RETURN format('the envelope is %s bytes, limit 8192', octet_length(env::text));
    END IF;
    FOREACH k IN ARRAY ARRAY['grant', 'proof', 'operation', 'segment', 'payload'] LOOP
        IF NOT env ? k THEN
            RETURN format('missing member %s', k);
        END IF;
    END LOOP;
    SELECT key INTO k FROM jsonb_object_keys(env) AS key
        WHERE key NOT IN ('grant', 'proof', 'operation', 'segment', 'payload', 'intent') LIMIT 1;
    IF k IS NOT NULL THEN
        RETURN format('unknown member %s', k);
    END IF;
    IF jsonb_typeof(env->'grant') <> 'object' OR jsonb_typeof(env->'grant'->'resource') IS DISTINCT FROM 'string'
       OR jsonb_typeof(env->'grant'->'fenceToken') IS DISTINCT FROM 'number' THEN
        RETURN 'grant: not a grant document';
    END IF;
    IF jsonb_typeof(env->'segment') <> 'number' OR (env->>'segment') !~ '^[1-9][0-9]{0,18}$'
       OR (env->>'segment')::numeric > 9223372036854775807 THEN
        RETURN format('segment %s is not a positive int64', env->>'segment');
    END IF;
    IF jsonb_typeof(env->'operation') <> 'string' OR octet_length(env->>'operation') NOT BETWEEN 1 AND 253 THEN
        RETURN 'operation must be 1..253 bytes';
    END IF;
    IF jsonb_typeof(env->'payload') <> 'string' OR (env->>'payload') !~ '^sha256:[0-9a-f]{64}$' THEN
        RETURN format('payload %s is not sha256:<64 hex digits>', env->'payload');
    END IF;
    IF jsonb_typeof(env->'proof') <> 'string' OR env->>'proof' = '' THEN
        RETURN 'proof must be a non-empty string';
    END IF;
    IF env ? 'intent' AND env->'intent' IS DISTINCT FROM '"delete"'::jsonb THEN
        RETURN format('intent %s is not "delete"', env->'intent');
    END IF;
    RETURN NULL;
END $$;

-- receipt_digest is fence.ReceiptDigest.
CREATE FUNCTION fencekeeper.receipt_digest(resource text, fence bigint, root text, segment bigint, operation text, payload text)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT 'sha256:' || pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
        resource || E'\n' || fence || E'\n' || root || E'\n' || segment || E'\n' || operation || E'\n' || payload, 'UTF8')), 'hex')
$$;

-- begin_segment is the first statement of a fenced transaction. It takes the
-- resource row's lock and applies the rules of pkg/fence's Decide in their
-- order; what a database cannot know (the caller's Kubernetes identity, the
-- digest of the change) is the client's to state and is not judged here.
-- It returns the new receipt; a refusal raises FK000.
CREATE FUNCTION fencekeeper.begin_segment(envelope jsonb)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    rid      text := envelope->'grant'->>'resource';
    st       fencekeeper.resources;
    g        fencekeeper.grants;
    holder   fencekeeper.grants;
    problem  text;
    f        bigint;
    seg      bigint;
    grant_root text;
    current  boolean;
    not_cur  text;
    why      text;
    prior    fencekeeper.receipts;
    receipt  text;
BEGIN
    IF envelope IS NULL OR envelope = 'null'::jsonb THEN
        PERFORM fencekeeper.refuse(NULL, 'FENCE_REQUIRED', 'begin_segment needs the fence envelope', NULL);
        RETURN NULL;
    END IF;
    IF jsonb_typeof(envelope->'grant'->'resource') = 'string' THEN
        -- NO KEY UPDATE: segments of a resource queue here, while the
        -- operator may still publish grants (their foreign key takes KEY SHARE).
        SELECT * INTO st FROM fencekeeper.resources r WHERE r.resource_id = rid FOR NO KEY UPDATE;
        IF st.last_envelope = envelope THEN
            PERFORM fencekeeper.refuse(rid, 'FENCE_REQUIRED', 'the envelope is the one of the last accepted segment; every change needs a fresh segment', NULL);
            RETURN NULL;
        END IF;
    END IF;
    problem := fencekeeper.envelope_problem(envelope);
    IF problem IS NOT NULL THEN
        PERFORM fencekeeper.refuse(rid, 'BAD_GRANT', 'bad fence annotation: ' || problem, NULL);
        RETURN NULL;
    END IF;
    f := (envelope->'grant'->>'fenceToken')::bigint;
    seg := (envelope->>'segment')::bigint;
    grant_root := coalesce(envelope->'grant'->>'operationRoot', '');
    -- A store cannot tell a forged grant for a resource it does not serve
    -- from an authentic one: both are WRONG_RESOURCE here.
    IF st.resource_id IS NULL THEN
        PERFORM fencekeeper.refuse(rid, 'WRONG_RESOURCE', format('no FencedResource publishes resource %s to this store', rid), NULL);
        RETURN NULL;
    END IF;
    SELECT * INTO g FROM fencekeeper.grants x
        WHERE x.resource_id = rid AND x.fence = f AND x.grant_doc = envelope->'grant';
    IF NOT FOUND THEN
        PERFORM fencekeeper.refuse(rid, 'FORGED_GRANT', format('no grant with fence %s for resource %s was published to this store', f, rid), NULL);
        RETURN NULL;
    END IF;
    IF (envelope->'grant'->>'issuerEpoch')::bigint < (SELECT revoked_below_epoch FROM fencekeeper.issuer) THEN
        PERFORM fencekeeper.refuse(rid, 'REVOKED_EPOCH', format('the grant was issued under epoch %s; epochs below %s are revoked',
            envelope->'grant'->>'issuerEpoch', (SELECT revoked_below_epoch FROM fencekeeper.issuer)), NULL);
        RETURN NULL;
    END IF;

    -- isCurrent: the registry's held, unexpired grant of the current generation.
    SELECT * INTO holder FROM fencekeeper.grants x
        WHERE x.resource_id = rid AND x.ended_at IS NULL ORDER BY x.fence DESC LIMIT 1;
    current := false;
    IF holder.digest IS NULL THEN
        not_cur := 'NOT_HELD'; why := 'the registry shows no holder for this resource';
    ELSIF holder.digest <> g.digest THEN
        not_cur := 'NOT_HELD'; why := format('the registry''s holder is fence %s (lease %s), not this grant''s fence %s (lease %s)',
            holder.fence, holder.grant_doc->>'lease', f, envelope->'grant'->>'lease');
    ELSIF clock_timestamp() >= holder.expires_at THEN
        not_cur := 'NOT_HELD'; why := format('the grant with fence %s expired at %s', f, holder.expires_at);
    ELSIF (envelope->'grant'->>'policyGeneration')::bigint <> st.generation THEN
        not_cur := 'POLICY_STALE'; why := format('the grant was issued under policy generation %s, the FencedResource is at generation %s; acquire a new grant',
            envelope->'grant'->>'policyGeneration', st.generation);
    ELSE
        current := true;
    END IF;

    -- judgeOlderOrOther, then judgeFence.
    IF f < st.highest_fence AND current THEN
        PERFORM fencekeeper.refuse(rid, 'FENCE_REGRESSION', format('the registry''s current grant has fence %s but the resource already accepted fence %s: the registry went backwards; raise spec.fenceFloor above %s', f, st.highest_fence, st.highest_fence), NULL);
    ELSIF f < st.highest_fence THEN
        PERFORM fencekeeper.refuse(rid, 'STALE_OWNER', format('fence %s is older than fence %s the resource already accepted', f, st.highest_fence), NULL);
    ELSIF f = st.highest_fence AND current AND (grant_root <> st.root OR (st.grant_digest <> '' AND g.digest <> st.grant_digest)) THEN
        PERFORM fencekeeper.refuse(rid, 'FENCE_REGRESSION', format('fence %s was already used at this resource by another grant: the registry went backwards; raise spec.fenceFloor above %s', f, st.highest_fence), NULL);
    ELSIF f = st.highest_fence AND grant_root <> st.root THEN
        PERFORM fencekeeper.refuse(rid, 'ROOT_MISMATCH', format('fence %s is bound to another grant (operation root %s) at this resource; this grant has root %s', f, st.root, grant_root), NULL);
    ELSIF NOT current THEN
        PERFORM fencekeeper.refuse(rid, not_cur, why, NULL);
    ELSIF f > st.highest_fence AND seg <> 1 THEN
        PERFORM fencekeeper.refuse(rid, 'SEGMENT_OUT_OF_ORDER', format('a new fence (%s > %s) must start at segment 1, got %s', f, st.highest_fence, seg), NULL);
    ELSIF f > st.highest_fence OR seg = st.last_segment + 1 THEN
        receipt := fencekeeper.receipt_digest(rid, f, grant_root, seg, envelope->>'operation', envelope->>'payload');
        IF f > st.highest_fence THEN
            DELETE FROM fencekeeper.receipts x WHERE x.resource_id = rid AND x.fence < f;
        END IF;
        INSERT INTO fencekeeper.receipts (resource_id, fence, segment, operation, payload, receipt)
            VALUES (rid, f, seg, envelope->>'operation', envelope->>'payload', receipt);
        UPDATE fencekeeper.resources r SET highest_fence = f, root = grant_root, last_segment = seg,
            grant_digest = g.digest, last_envelope = envelope WHERE r.resource_id = rid;
        RETURN receipt;
    ELSIF seg > st.last_segment + 1 THEN
        PERFORM fencekeeper.refuse(rid, 'SEGMENT_OUT_OF_ORDER', format('segment %s skips ahead: the next segment of fence %s is %s', seg, f, st.last_segment + 1), NULL);
    ELSE
        SELECT * INTO prior FROM fencekeeper.receipts x WHERE x.resource_id = rid AND x.fence = f AND x.segment = seg;
        IF NOT FOUND THEN
            PERFORM fencekeeper.refuse(rid, 'SEGMENT_OUT_OF_ORDER', format('segment %s of fence %s is at or below the last segment %s and its receipt is no longer kept', seg, f, st.last_segment), NULL);
        ELSIF prior.payload = envelope->>'payload' THEN
            PERFORM fencekeeper.refuse(rid, 'ALREADY_APPLIED', format('fence %s segment %s was applied already; receipt %s', f, seg, prior.receipt), prior.receipt);
        ELSE
            PERFORM fencekeeper.refuse(rid, 'QUARANTINED', format('fence %s segment %s was applied with payload %s; this attempt carries %s', f, seg, prior.payload, envelope->>'payload'), NULL);
        END IF;
    END IF;
    RETURN NULL;
END $$;

-- The receipts of an operation, to resolve a commit whose answer was lost.
CREATE FUNCTION fencekeeper.find_receipts(resource text, operation text)
RETURNS TABLE (fence bigint, segment bigint, payload text, receipt text, committed_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT r.fence, r.segment, r.payload, r.receipt, r.committed_at FROM fencekeeper.receipts r
        WHERE r.resource_id = resource AND r.operation = find_receipts.operation ORDER BY r.fence, r.segment
$$;

-- The resource's fence state, to number the next segment.
CREATE FUNCTION fencekeeper.resource_state(resource text)
RETURNS TABLE (highest_fence bigint, root text, last_segment bigint, grant_digest text, mode text, generation bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT r.highest_fence, r.root, r.last_segment, r.grant_digest, r.mode, r.generation
        FROM fencekeeper.resources r WHERE r.resource_id = resource
$$;

-- Whether a grant is published and not ended: a HELD client waits for it.
CREATE FUNCTION fencekeeper.published(grant_digest text)
RETURNS boolean LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT EXISTS (SELECT 1 FROM fencekeeper.grants g WHERE g.digest = grant_digest AND g.ended_at IS NULL)
$$;

-- Publishing: the operator's role only.
-- An unchanged resource is not written: that would wait for an open segment.
CREATE FUNCTION fencekeeper.publish_resource(resource text, resource_mode text, policy_generation bigint)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM fencekeeper.resources r WHERE r.resource_id = resource
               AND r.mode = resource_mode AND r.generation >= policy_generation) THEN
        RETURN;
    END IF;
    INSERT INTO fencekeeper.resources (resource_id, mode, generation) VALUES (resource, resource_mode, policy_generation)
    ON CONFLICT (resource_id) DO UPDATE SET mode = excluded.mode,
        generation = greatest(fencekeeper.resources.generation, excluded.generation), published_at = now();
END $$;

-- publish_grant records an issued grant, or a renewal's new expiry. A digest
-- names one grant document: publishing another under it is refused.
CREATE FUNCTION fencekeeper.publish_grant(grant_digest text, grant_doc jsonb, expires_at timestamptz)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    stored jsonb;
BEGIN
    INSERT INTO fencekeeper.grants (digest, resource_id, fence, grant_doc, expires_at)
        VALUES (grant_digest, grant_doc->>'resource', (grant_doc->>'fenceToken')::bigint, grant_doc, publish_grant.expires_at)
        ON CONFLICT (digest) DO NOTHING;
    SELECT g.grant_doc INTO stored FROM fencekeeper.grants g WHERE g.digest = grant_digest FOR UPDATE;
    IF stored <> grant_doc THEN
        RAISE EXCEPTION 'grant % is already published with another document', grant_digest;
    END IF;
    UPDATE fencekeeper.grants g SET expires_at = greatest(g.expires_at, publish_grant.expires_at)
        WHERE g.digest = grant_digest AND g.ended_at IS NULL;
END $$;

CREATE FUNCTION fencekeeper.end_grant(grant_digest text, reason text, ended timestamptz)
RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    UPDATE fencekeeper.grants g SET ended_at = ended, end_reason = reason
        WHERE g.digest = grant_digest AND g.ended_at IS NULL
$$;

-- Revocation only grows, like the trust bundle's revokedBelowEpoch.
CREATE FUNCTION fencekeeper.publish_revocation(revoked_below bigint)
RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    UPDATE fencekeeper.issuer SET revoked_below_epoch = greatest(revoked_below_epoch, revoked_below)
$$;

REVOKE ALL ON ALL TABLES IN SCHEMA fencekeeper FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA fencekeeper FROM PUBLIC;
