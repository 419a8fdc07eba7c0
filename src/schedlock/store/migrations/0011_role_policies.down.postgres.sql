-- loses data: no (policies, functions and a trigger only)
-- Back to 0008's policies (0008_namespace_roles.postgres.sql), which read the same mapping
-- through schedlock_served_namespaces() on every statement: every role serves what it served.
DROP TRIGGER schedlock_role_policies ON schedlock_namespace_roles;
DO $$
DECLARE
    p record;
BEGIN
    FOR p IN SELECT polname, polrelid::regclass AS tab FROM pg_policy
             WHERE polrelid IN ('schedlock_publishes'::regclass, 'schedlock_schedules'::regclass,
                                'schedlock_terms'::regclass, 'schedlock_reserves'::regclass)
               AND polname LIKE 'schedlock\_role\_%' LOOP
        EXECUTE format('DROP POLICY %I ON %s', p.polname, p.tab);
    END LOOP;
END $$;
DROP POLICY schedlock_own_lock_ids ON schedlock_terms;
-- include: 0008_namespace_roles.served_policies.part.sql
DROP FUNCTION schedlock_namespace_roles_changed();
DROP FUNCTION schedlock_apply_role_policies();
DROP FUNCTION schedlock_role_policies_drift();
