-- 0008 namespace roles, PostgreSQL: row-level security keyed by a role -> namespace mapping.
--
-- schedlock_namespace_roles (0008_namespace_roles.sql): which namespaces each role may serve
-- ('*': every one), written by
-- `schedlock migrate --grant-sidecar|--grant-operator ROLE [--namespace NS …]` as the schema
-- owner.  No runtime role has any privilege on it: a role reads its own mapping only through
-- schedlock_served_namespaces(), a SECURITY DEFINER function with a pinned search_path.  A role
-- also serves what the roles it inherits from (pg_has_role … USAGE) are mapped to, as it holds
-- their table privileges.  Roles that bypass row-level security (superusers, BYPASSRLS, the
-- tables' owner and its members) serve every namespace whatever the mapping says.
REVOKE ALL ON schedlock_namespace_roles FROM PUBLIC;

-- The namespaces ROLE may serve, as an array ('{*}': every one).  Asked about a role the
-- session's user is not a member of (which it could not SET ROLE to), it answers nothing: no
-- role reads another's mapping.  STABLE, called with current_user from the policies below as
-- a scalar subquery: the planner runs it once per statement (an InitPlan), not once per row.
CREATE FUNCTION schedlock_served_namespaces(member name) RETURNS text[]
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT CASE
        WHEN NOT pg_has_role(session_user, member, 'MEMBER') THEN '{}'::text[]
        -- include: 0008_namespace_roles.role_namespaces.part.sql
    END
$$;

-- Whether the current role may serve NAMESPACE: what a sidecar asks before it takes any lock,
-- and the pruner before it contends for the lease (with '*': only a role that serves every
-- namespace prunes, so that one pass prunes them all).  SECURITY INVOKER (current_user is the
-- caller), search_path pinned.
CREATE FUNCTION schedlock_may_serve(namespace text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT $1 = ANY (s.served) OR '*' = ANY (s.served)
    FROM (SELECT schedlock_served_namespaces(current_user) AS served) AS s
$$;

-- A key's advisory lock objid, derived in the database as schedlock.store.keys derives it
-- (the first four bytes of SHA-256 over 'schedlock/v1/<scheduler>/<namespace>/<target>',
-- big-endian, signed): a runtime role may register a terms row only under its key's own lock
-- ids, so no role can plant a row that holds another key's ids (a LockKeyCollision for ever).
CREATE FUNCTION schedlock_lock_objid(key_text text) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT ('x' || substr(encode(sha256(convert_to(key_text, 'UTF8')), 'hex'), 1, 8))::bit(32)::integer
$$;

-- Whether another key holds this key's lock ids (a hash collision): the sidecar's check after
-- registering its key.  SECURITY DEFINER because the colliding row may be another namespace's,
-- which row-level security hides; it answers yes or no and reveals nothing of that row.
CREATE FUNCTION schedlock_lock_ids_taken(scheduler text, namespace text, target text)
RETURNS boolean LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT EXISTS (
        SELECT 1 FROM schedlock_terms t
        WHERE t.lock_classid = 1396919371
          AND t.lock_objid = schedlock_lock_objid('schedlock/v1/' || $1 || '/' || $2 || '/' || $3)
          AND (t.scheduler, t.namespace, t.target) IS DISTINCT FROM ($1, $2, $3))
$$;

-- Every function resolves names in this schema only (then pg_temp, never first): a role that
-- can create objects elsewhere on the search path cannot stand in for a table or a function.
-- That path is set for the rest of this migration's transaction, and pinned FROM CURRENT.
SELECT set_config('search_path', format('%I, pg_temp', current_schema()), true);
ALTER FUNCTION schedlock_served_namespaces(name) SET search_path FROM CURRENT;
ALTER FUNCTION schedlock_may_serve(text) SET search_path FROM CURRENT;
ALTER FUNCTION schedlock_lock_objid(text) SET search_path FROM CURRENT;
ALTER FUNCTION schedlock_lock_ids_taken(text, text, text) SET search_path FROM CURRENT;

-- Row-level security, ENABLE and not FORCE: the owner (migrations, `schedlock migrate`) and
-- superusers are not subject to it.  One policy per table for every command: USING hides and
-- protects the rows of namespaces the role may not serve (SELECT, UPDATE, DELETE match 0 rows
-- there), WITH CHECK refuses a row written into one (INSERT, or an UPDATE moving a row there).
-- A terms row must also carry its key's own lock ids.  Each takes a brief ACCESS EXCLUSIVE lock.
ALTER TABLE schedlock_publishes ENABLE ROW LEVEL SECURITY;
ALTER TABLE schedlock_schedules ENABLE ROW LEVEL SECURITY;
ALTER TABLE schedlock_reserves ENABLE ROW LEVEL SECURITY;
ALTER TABLE schedlock_terms ENABLE ROW LEVEL SECURITY;
-- include: 0008_namespace_roles.served_policies.part.sql

-- Existing installs keep firing: every role that holds privileges on the publishes today (the
-- roles `migrate --grant-…` granted) may serve every namespace, as it could before.  Narrow
-- them with `migrate --grant-sidecar ROLE --namespace NS --only` (docs/operations.md).
INSERT INTO schedlock_namespace_roles (role, namespace)
SELECT DISTINCT pg_get_userbyid(a.grantee), '*'
FROM pg_class c, aclexplode(c.relacl) AS a
WHERE c.oid = 'schedlock_publishes'::regclass AND a.grantee <> 0 AND a.grantee <> c.relowner
ON CONFLICT DO NOTHING;
