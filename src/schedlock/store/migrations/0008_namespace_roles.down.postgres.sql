-- loses data: no (the mapping only: `migrate --grant-… --namespace` records it again)
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['schedlock_publishes', 'schedlock_schedules', 'schedlock_terms',
                             'schedlock_reserves'] LOOP
        EXECUTE format('DROP POLICY schedlock_served ON %I', t);
        EXECUTE format('ALTER TABLE %I DISABLE ROW LEVEL SECURITY', t);
    END LOOP;
END $$;
DROP FUNCTION schedlock_lock_ids_taken(text, text, text);
DROP FUNCTION schedlock_lock_objid(text);
DROP FUNCTION schedlock_may_serve(text);
DROP FUNCTION schedlock_served_namespaces(name);
