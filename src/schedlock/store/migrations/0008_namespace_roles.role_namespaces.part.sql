-- Part of 0008_namespace_roles.postgres.sql (see schedlock.store.migrations): which namespaces
-- MEMBER may serve, as the branches of a CASE ('{*}': every one), whoever asks.  0008's
-- schedlock_served_namespaces() puts its guard (only a member of the role may ask) before them;
-- 0009's schedlock_role_namespaces() is these branches alone, and 0009's down step gives
-- 0008's function back from them.  Frozen, as the migrations that include it.
        WHEN EXISTS (SELECT 1 FROM pg_roles r
                     WHERE r.rolname = member AND (r.rolsuper OR r.rolbypassrls))
          OR pg_has_role(member, (SELECT c.relowner FROM pg_class c
                                  WHERE c.oid = 'schedlock_publishes'::regclass), 'USAGE')
        THEN '{*}'::text[]
        ELSE ARRAY(SELECT DISTINCT m.namespace
                   FROM schedlock_namespace_roles m JOIN pg_roles r ON r.rolname = m.role
                   WHERE pg_has_role(member, r.oid, 'USAGE')
                   ORDER BY m.namespace)
