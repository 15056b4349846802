-- fencekeeper schema version 2: protected business tables, break-glass roles
-- and their audit, and Shadow mode.

-- What Shadow let through that Enforce would refuse.
CREATE TABLE fencekeeper.shadow_refusals (
    id          bigserial PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    resource_id text,
    verdict     text NOT NULL,
    message     text NOT NULL,
    login_role  name NOT NULL DEFAULT session_user,
    xact_id     xid8 NOT NULL DEFAULT pg_current_xact_id()
);

-- The roles the installation names as break-glass, and what they did.
CREATE TABLE fencekeeper.break_glass_roles (
    role_name name PRIMARY KEY
);
CREATE TABLE fencekeeper.break_glass_audit (
    id          bigserial PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    login_role  name NOT NULL DEFAULT session_user,
    break_glass name NOT NULL,
    table_name  text NOT NULL,
    operation   text NOT NULL,
    resource_id text NOT NULL,
    xact_id     xid8 NOT NULL DEFAULT pg_current_xact_id()
);

-- resource_mode: Shadow or Enforce (Enforce for a resource not published).
CREATE FUNCTION fencekeeper.resource_mode(resource text)
RETURNS text LANGUAGE sql STABLE SET search_path = pg_catalog AS $$
    SELECT coalesce((SELECT r.mode FROM fencekeeper.resources r WHERE r.resource_id = resource), 'Enforce')
$$;

-- In Shadow a refusal is recorded, raised as a warning and let through;
-- begin_segment then returns NULL and the transaction goes on.
CREATE OR REPLACE FUNCTION fencekeeper.refuse(resource text, verdict text, message text, receipt text)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
    IF resource IS NOT NULL AND fencekeeper.resource_mode(resource) = 'Shadow' THEN
        INSERT INTO fencekeeper.shadow_refusals (resource_id, verdict, message) VALUES (resource, verdict, message);
        RAISE WARNING USING ERRCODE = 'FK001', MESSAGE = verdict || ': ' || message,
            HINT = 'resource ' || resource || ' is in Shadow: Enforce refuses this';
        RETURN;
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'FK000', MESSAGE = verdict || ': ' || message,
        DETAIL = coalesce('receipt ' || receipt, ''), HINT = coalesce('resource ' || resource, '');
END $$;

-- break_glass_role: the named break-glass role the login role is, or is a
-- member of (explicit membership: superuser alone is not break-glass).
CREATE FUNCTION fencekeeper.break_glass_role()
RETURNS name LANGUAGE sql STABLE SET search_path = pg_catalog AS $$
    WITH RECURSIVE member_of(roleid) AS (
        SELECT oid FROM pg_roles WHERE rolname = session_user
        UNION
        SELECT m.roleid FROM pg_auth_members m JOIN member_of ON m.member = member_of.roleid
    )
    SELECT b.role_name FROM fencekeeper.break_glass_roles b
        JOIN pg_roles r ON r.rolname = b.role_name JOIN member_of ON member_of.roleid = r.oid
        ORDER BY b.role_name LIMIT 1
$$;

-- guard is the trigger fencekeeper.protect installs: a change of the table
-- lands only in a transaction in which begin_segment accepted a segment of
-- the table's resource.
CREATE FUNCTION fencekeeper.guard()
RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    resource text := TG_ARGV[0];
    bg       name;
BEGIN
    IF EXISTS (SELECT 1 FROM fencekeeper.receipts r WHERE r.xact_id = pg_current_xact_id() AND r.resource_id = resource) THEN
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

-- protect puts a business table under a resource's fence: its owner (or a
-- superuser) calls it once; calling it again changes the resource.
CREATE FUNCTION fencekeeper.protect(tbl regclass, resource_id text)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
    IF resource_id IS NULL OR octet_length(resource_id) NOT BETWEEN 1 AND 253 THEN
        RAISE EXCEPTION 'fencekeeper.protect: resource_id must be 1..253 bytes';
    END IF;
    EXECUTE format('DROP TRIGGER IF EXISTS fencekeeper_guard ON %s', tbl);
    EXECUTE format('DROP TRIGGER IF EXISTS fencekeeper_guard_truncate ON %s', tbl);
    EXECUTE format('CREATE TRIGGER fencekeeper_guard BEFORE INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION fencekeeper.guard(%L)', tbl, resource_id);
    EXECUTE format('CREATE TRIGGER fencekeeper_guard_truncate BEFORE TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION fencekeeper.guard(%L)', tbl, resource_id);
END $$;

REVOKE ALL ON ALL TABLES IN SCHEMA fencekeeper FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA fencekeeper FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA fencekeeper FROM PUBLIC;

-- recheck_at_commit: a segment commits only if its grant is still the
-- registry's current, unexpired grant when the transaction commits, so a
-- transaction held open past the grant's end lands nothing. (The resource
-- row's lock keeps every later segment waiting until then.)
CREATE FUNCTION fencekeeper.recheck_at_commit()
RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    st     fencekeeper.resources;
    holder fencekeeper.grants;
BEGIN
    SELECT * INTO st FROM fencekeeper.resources r WHERE r.resource_id = NEW.resource_id;
    IF st.mode = 'Shadow' OR st.highest_fence <> NEW.fence THEN
        RETURN NULL;
    END IF;
    SELECT * INTO holder FROM fencekeeper.grants x
        WHERE x.resource_id = NEW.resource_id AND x.ended_at IS NULL ORDER BY x.fence DESC LIMIT 1;
    IF holder.digest IS DISTINCT FROM st.grant_digest THEN
        PERFORM fencekeeper.refuse(NEW.resource_id, 'NOT_HELD', format('the grant with fence %s ended before its segment %s committed', NEW.fence, NEW.segment), NULL);
    ELSIF clock_timestamp() >= holder.expires_at THEN
        PERFORM fencekeeper.refuse(NEW.resource_id, 'NOT_HELD', format('the grant with fence %s expired at %s, before its segment %s committed', NEW.fence, holder.expires_at, NEW.segment), NULL);
    END IF;
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER recheck_at_commit AFTER INSERT ON fencekeeper.receipts
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION fencekeeper.recheck_at_commit();
REVOKE ALL ON FUNCTION fencekeeper.recheck_at_commit() FROM PUBLIC;
