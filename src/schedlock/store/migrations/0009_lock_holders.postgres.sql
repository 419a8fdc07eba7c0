-- 0009 lock holders, PostgreSQL: who holds a key's advisory lock, when that is a role that may
-- not serve the key's namespace.
--
-- schedlock_role_namespaces(role): 0008's answer of which namespaces a role may serve, for any
-- role, factored out of schedlock_served_namespaces() (which keeps its guard: a caller reads
-- only the mapping of roles it is a member of).  No runtime role may call it: EXECUTE is revoked
-- from PUBLIC, and only the owner's SECURITY DEFINER functions do.
CREATE FUNCTION schedlock_role_namespaces(member name) RETURNS text[]
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT CASE
        -- include: 0008_namespace_roles.role_namespaces.part.sql
    END
$$;
REVOKE EXECUTE ON FUNCTION schedlock_role_namespaces(name) FROM PUBLIC;

CREATE OR REPLACE FUNCTION schedlock_served_namespaces(member name) RETURNS text[]
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT CASE
        WHEN NOT pg_has_role(session_user, member, 'MEMBER') THEN '{}'::text[]
        ELSE schedlock_role_namespaces(member)
    END
$$;

-- The sessions holding the advisory lock (CLASSID, OBJID) in this database whose login role
-- may not serve NAMESPACE: their backend pid and role (none when the holder is the key's own,
-- or nobody holds it).  A key's standby asks it while it waits (the `lock` query) and
-- `schedlock status` for each key.  SECURITY DEFINER to read the mapping for any role; it
-- answers only a caller whose login role may serve NAMESPACE itself, so no role learns another
-- namespace's mapping.  Nothing else is revealed: pg_locks and pg_stat_activity show every
-- role the pids and login roles of all sessions.  The login role (session_user of the holder),
-- not a role it SET ROLE to: the credential that leaked is the login.  Costs one look at
-- pg_locks (all lock partitions, briefly) and one backend's pg_stat_activity entry.
CREATE FUNCTION schedlock_foreign_lock_holder(classid integer, objid integer, namespace text)
RETURNS TABLE (pid integer, role name)
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT h.pid, h.role
    FROM (SELECT l.pid, pg_get_userbyid(a.usesysid) AS role
          FROM pg_locks l, pg_stat_get_activity(l.pid) a
          WHERE l.locktype = 'advisory' AND l.granted
            AND l.database = (SELECT d.oid FROM pg_database d
                              WHERE d.datname = current_database())
            AND l.classid = $1::oid AND l.objid = $2::oid AND l.objsubid = 2) AS h,
         LATERAL (SELECT schedlock_role_namespaces(h.role) AS served) AS s
    WHERE NOT ($3 = ANY (s.served) OR '*' = ANY (s.served))
      AND (SELECT $3 = ANY (c.served) OR '*' = ANY (c.served)
           FROM (SELECT schedlock_role_namespaces(session_user) AS served) AS c)
    ORDER BY h.pid
$$;

-- Pinned search_path, as 0008's (CREATE OR REPLACE left schedlock_served_namespaces() unpinned).
SELECT set_config('search_path', format('%I, pg_temp', current_schema()), true);
ALTER FUNCTION schedlock_role_namespaces(name) SET search_path FROM CURRENT;
ALTER FUNCTION schedlock_served_namespaces(name) SET search_path FROM CURRENT;
ALTER FUNCTION schedlock_foreign_lock_holder(integer, integer, text) SET search_path FROM CURRENT;
