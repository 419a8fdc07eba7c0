-- loses data: no (functions only)
-- schedlock_served_namespaces() gets 0008's body back (0008_namespace_roles.postgres.sql).
CREATE OR REPLACE FUNCTION schedlock_served_namespaces(member name) RETURNS text[]
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT CASE
        WHEN NOT pg_has_role(session_user, member, 'MEMBER') THEN '{}'::text[]
        -- include: 0008_namespace_roles.role_namespaces.part.sql
    END
$$;
SELECT set_config('search_path', format('%I, pg_temp', current_schema()), true);
ALTER FUNCTION schedlock_served_namespaces(name) SET search_path FROM CURRENT;
DROP FUNCTION schedlock_foreign_lock_holder(integer, integer, text);
DROP FUNCTION schedlock_role_namespaces(name);
