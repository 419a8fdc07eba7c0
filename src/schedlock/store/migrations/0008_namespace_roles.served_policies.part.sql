-- Part of 0008_namespace_roles.postgres.sql (see schedlock.store.migrations): 0008's one
-- policy per table, schedlock_served, which reads the role's namespaces through
-- schedlock_served_namespaces(current_user) on every statement; 0011's down step writes them
-- again.  Frozen, as the migrations that include it.
DO $$
DECLARE
    t text;
    served constant text := '(namespace = ANY ((SELECT schedlock_served_namespaces(current_user))::text[]) '
                            'OR (SELECT ''*'' = ANY (schedlock_served_namespaces(current_user))))';
BEGIN
    FOREACH t IN ARRAY ARRAY['schedlock_publishes', 'schedlock_schedules', 'schedlock_reserves']
    LOOP
        EXECUTE format('CREATE POLICY schedlock_served ON %I USING %s WITH CHECK %s',
                       t, served, served);
    END LOOP;
    EXECUTE format(
        'CREATE POLICY schedlock_served ON schedlock_terms USING %s WITH CHECK (%s AND '
        'lock_classid = 1396919371 AND lock_objid = schedlock_lock_objid('
        '''schedlock/v1/'' || scheduler || ''/'' || namespace || ''/'' || target))',
        served, served);
END $$;
