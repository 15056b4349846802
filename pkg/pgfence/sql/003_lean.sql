-- fencekeeper schema version 3: the same rules for less work per segment.
-- Measured by make bench (docs/performance.md), a segment cost the server
-- 4.5× a plain transaction's CPU and 15× its WAL. What went:
--   - receipt_digest was a SQL function that is not inlined, so it was
--     planned again at every call; as plpgsql its plan is kept per session;
--   - the receipts' foreign key took a KEY SHARE lock on the resource row
--     begin_segment already holds FOR NO KEY UPDATE: a MultiXact per segment;
--   - resources.last_envelope kept the whole envelope (≈600 bytes written at
--     every segment) only to recognise it again: its digest does that;
--   - the guard found the transaction's segment by an index on receipts
--     (one more index entry per segment): the resource row now names the
--     transaction that last began a segment of it.

CREATE OR REPLACE FUNCTION fencekeeper.receipt_digest(resource text, fence bigint, root text, segment bigint, operation text, payload text)
RETURNS text LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog AS $$
BEGIN
    RETURN 'sha256:' || encode(sha256(convert_to(
        resource || E'\n' || fence || E'\n' || root || E'\n' || segment || E'\n' || operation || E'\n' || payload, 'UTF8')), 'hex');
END $$;

-- The digest of an envelope as jsonb prints it (keys ordered, whitespace
-- normalised): two envelopes with equal digests are the same document.
CREATE FUNCTION fencekeeper.envelope_digest(env jsonb)
RETURNS bytea LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog AS $$
BEGIN
    RETURN sha256(convert_to(env::text, 'UTF8'));
END $$;

-- envelope_problem: the same checks, the member checks as operators on the
-- document rather than a query of its keys (a query is an executor run),
-- and the grant's integers checked as pkg/grant checks them.
CREATE OR REPLACE FUNCTION fencekeeper.envelope_problem(env jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    k text;
    size integer;
BEGIN
    IF jsonb_typeof(env) <> 'object' THEN
        RETURN 'the envelope is not a JSON object';
    END IF;
    size := octet_length(env::text);
    IF size > 8192 THEN
        RETURN format('the envelope is %s bytes, limit 8192', size);
    END IF;
    IF NOT env ?& ARRAY['grant', 'proof', 'operation', 'segment', 'payload'] THEN
        FOREACH k IN ARRAY ARRAY['grant', 'proof', 'operation', 'segment', 'payload'] LOOP
            IF NOT env ? k THEN
                RETURN format('missing member %s', k);
            END IF;
        END LOOP;
    END IF;
    IF env - ARRAY['grant', 'proof', 'operation', 'segment', 'payload', 'intent'] <> '{}'::jsonb THEN
        SELECT key INTO k FROM jsonb_object_keys(env - ARRAY['grant', 'proof', 'operation', 'segment', 'payload', 'intent']) AS key LIMIT 1;
        RETURN format('unknown member %s', k);
    END IF;
    IF jsonb_typeof(env->'grant') <> 'object' OR jsonb_typeof(env->'grant'->'resource') IS DISTINCT FROM 'string'
       OR jsonb_typeof(env->'grant'->'fenceToken') IS DISTINCT FROM 'number' THEN
        RETURN 'grant: not a grant document';
    END IF;
    -- The grant's integers as pkg/grant reads them (an int64, the fence
    -- positive), so that none fails a cast later as another error than BAD_GRANT.
    IF (env->'grant'->>'fenceToken') !~ '^[1-9][0-9]{0,18}$' OR (env->'grant'->>'fenceToken')::numeric > 9223372036854775807 THEN
        RETURN format('grant: fenceToken %s is not a positive int64', env->'grant'->'fenceToken');
    END IF;
    FOREACH k IN ARRAY ARRAY['policyGeneration', 'issuerEpoch'] LOOP
        IF jsonb_typeof(env->'grant'->k) IS DISTINCT FROM 'number' OR (env->'grant'->>k) !~ '^(0|[1-9][0-9]{0,18})$'
           OR (env->'grant'->>k)::numeric > 9223372036854775807 THEN
            RETURN format('grant: %s %s is not a non-negative int64', k, env->'grant'->k);
        END IF;
    END LOOP;
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

ALTER TABLE fencekeeper.resources ADD COLUMN last_envelope_digest bytea;
-- The transaction that last began a segment of the resource (the guard's test).
ALTER TABLE fencekeeper.resources ADD COLUMN segment_xact xid8;
UPDATE fencekeeper.resources SET last_envelope_digest = fencekeeper.envelope_digest(last_envelope)
    WHERE last_envelope IS NOT NULL;
ALTER TABLE fencekeeper.resources DROP COLUMN last_envelope;

-- Receipts live and die with begin_segment, which holds the resource row's
-- lock whenever it writes them; nothing deletes a resource row.
ALTER TABLE fencekeeper.receipts DROP CONSTRAINT IF EXISTS receipts_resource_id_fkey;
DROP INDEX IF EXISTS fencekeeper.receipts_xact;

CREATE OR REPLACE FUNCTION fencekeeper.begin_segment(envelope jsonb)
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
    env_digest bytea;
    revoked  bigint;
    looked   record;
BEGIN
    IF envelope IS NULL OR envelope = 'null'::jsonb THEN
        PERFORM fencekeeper.refuse(NULL, 'FENCE_REQUIRED', 'begin_segment needs the fence envelope', NULL);
        RETURN NULL;
    END IF;
    IF jsonb_typeof(envelope->'grant'->'resource') = 'string' THEN
        -- NO KEY UPDATE: segments of a resource queue here, while the
        -- operator may still publish grants (their foreign key takes KEY SHARE).
        SELECT * INTO st FROM fencekeeper.resources r WHERE r.resource_id = rid FOR NO KEY UPDATE;
        -- envelope_digest's formula, inline: an expression, not a call.
        env_digest := sha256(convert_to(envelope::text, 'UTF8'));
        IF st.last_envelope_digest = env_digest THEN
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
    -- The grant, the registry's holder and the revocation, in one statement.
    SELECT (SELECT x FROM fencekeeper.grants x
                WHERE x.resource_id = rid AND x.fence = f AND x.grant_doc = envelope->'grant') AS g,
           (SELECT x FROM fencekeeper.grants x
                WHERE x.resource_id = rid AND x.ended_at IS NULL ORDER BY x.fence DESC LIMIT 1) AS holder,
           (SELECT i.revoked_below_epoch FROM fencekeeper.issuer i) AS revoked
        INTO looked;
    g := looked.g; holder := looked.holder; revoked := looked.revoked;
    IF g.digest IS NULL THEN
        PERFORM fencekeeper.refuse(rid, 'FORGED_GRANT', format('no grant with fence %s for resource %s was published to this store', f, rid), NULL);
        RETURN NULL;
    END IF;
    IF (envelope->'grant'->>'issuerEpoch')::bigint < revoked THEN
        PERFORM fencekeeper.refuse(rid, 'REVOKED_EPOCH', format('the grant was issued under epoch %s; epochs below %s are revoked',
            envelope->'grant'->>'issuerEpoch', revoked), NULL);
        RETURN NULL;
    END IF;

    -- isCurrent: the registry's held, unexpired grant of the current generation.
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
        -- receipt_digest's formula, inline.
        receipt := 'sha256:' || encode(sha256(convert_to(
            rid || E'\n' || f || E'\n' || grant_root || E'\n' || seg || E'\n' || (envelope->>'operation') || E'\n' || (envelope->>'payload'), 'UTF8')), 'hex');
        IF f > st.highest_fence THEN
            DELETE FROM fencekeeper.receipts x WHERE x.resource_id = rid AND x.fence < f;
        END IF;
        -- committed_at is when the segment was accepted, after the row lock
        -- (which the resource's previous segment held until it committed):
        -- the receipts of a resource order by it as they committed. now(),
        -- the default, is the transaction's start, which does not.
        INSERT INTO fencekeeper.receipts (resource_id, fence, segment, operation, payload, receipt, committed_at)
            VALUES (rid, f, seg, envelope->>'operation', envelope->>'payload', receipt, clock_timestamp());
        UPDATE fencekeeper.resources r SET highest_fence = f, root = grant_root, last_segment = seg,
            grant_digest = g.digest, last_envelope_digest = env_digest, segment_xact = pg_current_xact_id()
            WHERE r.resource_id = rid;
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

-- guard: the transaction began a segment of the table's resource when the
-- resource row names it (begin_segment sets segment_xact with the receipt).
CREATE OR REPLACE FUNCTION fencekeeper.guard()
RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    resource text := TG_ARGV[0];
    bg       name;
BEGIN
    IF EXISTS (SELECT 1 FROM fencekeeper.resources r WHERE r.resource_id = resource AND r.segment_xact = pg_current_xact_id()) THEN
        RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    bg := fencekeeper.break_glass_role();
    IF bg IS NOT NULL THEN
        INSERT INTO fencekeeper.break_glass_audit (break_glass, table_name, operation, resource_id)
            VALUES (bg, TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME, TG_OP, resource);
        RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    PERFORM fencekeeper.refuse(resource, 'FENCE_REQUIRED', format('%s of %I.%I outside an accepted segment of resource %s; begin the transaction with fencekeeper.begin_segment',
        TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME, resource), NULL);
    RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
END $$;

-- Publications are fenced by the issuer epoch: a leader that read the
-- registry, paused, and publishes after its successor would otherwise end
-- the successor's holder at the store for good (end_grant is final) and
-- reopen its own. Each publishing transaction starts with publish_epoch,
-- which takes the issuer row's lock (publications to a store are one at a
-- time, as publish_revocation already made them) and refuses an epoch
-- below one the store has taken: SQLSTATE FK003.
ALTER TABLE fencekeeper.issuer ADD COLUMN publisher_epoch bigint NOT NULL DEFAULT 0;

CREATE FUNCTION fencekeeper.publish_epoch(issuer_epoch bigint)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    seen bigint;
BEGIN
    UPDATE fencekeeper.issuer SET publisher_epoch = greatest(publisher_epoch, issuer_epoch) RETURNING publisher_epoch INTO seen;
    IF seen > issuer_epoch THEN
        RAISE EXCEPTION USING ERRCODE = 'FK003',
            MESSAGE = format('EPOCH_SUPERSEDED: this store took publications of issuer epoch %s; a publisher of epoch %s is no longer the leader', seen, issuer_epoch),
            HINT = 'after a restore of the registry lowered the issuer epoch, raise it above the store''s (the issuer-epoch ConfigMap)';
    END IF;
END $$;

-- With publications fenced by epoch, the resource's policy generation is
-- the registry's, also when a restore took a spec change back (it only
-- grew before, which refused every new grant POLICY_STALE after such a
-- restore).
CREATE OR REPLACE FUNCTION fencekeeper.publish_resource(resource text, resource_mode text, policy_generation bigint)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM fencekeeper.resources r WHERE r.resource_id = resource
               AND r.mode = resource_mode AND r.generation = policy_generation) THEN
        RETURN;
    END IF;
    INSERT INTO fencekeeper.resources (resource_id, mode, generation) VALUES (resource, resource_mode, policy_generation)
    ON CONFLICT (resource_id) DO UPDATE SET mode = excluded.mode, generation = excluded.generation, published_at = now();
END $$;

-- begin_segment_enforced is begin_segment for a client that sends it in the
-- same round trip as BEGIN and reads no result: it returns nothing and
-- raises unless the segment is accepted with the receipt the client
-- computed. A refusal raises FK000 as ever; a segment Shadow would let
-- through raises FK002 (nothing of it is kept), so that client begins the
-- transaction again with begin_segment, which records and lets it through.
CREATE FUNCTION fencekeeper.begin_segment_enforced(envelope jsonb, expected_receipt text)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    receipt text := fencekeeper.begin_segment(envelope);
BEGIN
    IF receipt IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'FK002', MESSAGE = 'SHADOWED: the resource is in Shadow and would refuse this segment; begin it with begin_segment';
    END IF;
    IF receipt IS DISTINCT FROM expected_receipt THEN
        RAISE EXCEPTION 'fencekeeper: the segment''s receipt is %, the client computed %: client and schema disagree on the receipt formula', receipt, expected_receipt;
    END IF;
END $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA fencekeeper FROM PUBLIC;
