-- loses data: no (functions only)
-- schedlock_served_namespaces() gets 0008's body back (0008_namespace_roles.postgres.sql).
CREATE OR REPLACE FUNCTION schedlock_served_namespaces(member name) RETURNS text[]
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT CASE
        WHEN NOT pg_has_role(session_user, member, 'MEMBER') THEN '{}'::text[]
        WHEN EXISTS (SELECT 1 FROM pg_roles r
                     WHERE r.rolname = member AND (r.rolsuper OR r.rolbypassrls))
          OR pg_has_role(member, (SELECT c.relowner FROM pg_class c
                                  WHERE c.oid = 'schedlock_publishes'::regclass), 'USAGE')
        THEN '{*}'::text[]
        ELSE ARRAY(SELECT DISTINCT m.namespace
                   FROM schedlock_namespace_roles m JOIN pg_roles r ON r.rolname = m.role
                   WHERE pg_has_role(member, r.oid, 'USAGE')
                   ORDER BY m.namespace)
    END
$$;
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION schedlock_served_namespaces(name) SET search_path = %I, pg_temp',
                   current_schema());
END $$;
DROP FUNCTION schedlock_foreign_lock_holder(integer, integer, text);
DROP FUNCTION schedlock_role_namespaces(name);
