-- loses data: no (functions and policies only)
-- The sidecar roles this release granted (EXECUTE on the term function; not an operator's,
-- which inserts schedules) get back the table-wide writes the releases before it granted and
-- run on, so that their binaries lead again without a grant of their own.
DO $$
DECLARE
    r text;
BEGIN
    FOR r IN SELECT DISTINCT pg_get_userbyid(a.grantee)
             FROM pg_proc p, aclexplode(p.proacl) AS a
             WHERE p.oid = 'schedlock_begin_term(text, text, text, text)'::regprocedure
               AND a.grantee <> 0 AND a.grantee <> p.proowner
               AND NOT has_table_privilege(a.grantee, 'schedlock_schedules', 'INSERT') LOOP
        EXECUTE format('GRANT INSERT, UPDATE ON schedlock_publishes, schedlock_terms TO %I', r);
        EXECUTE format('GRANT UPDATE ON schedlock_schedules, schedlock_reserves TO %I', r);
        EXECUTE format('GRANT USAGE ON SEQUENCE schedlock_publishes_id_seq TO %I', r);
    END LOOP;
END $$;
DROP POLICY schedlock_finished_only ON schedlock_publishes;
DROP POLICY schedlock_finished_only ON schedlock_schedules;
DROP POLICY schedlock_finished_only ON schedlock_terms;
DROP FUNCTION schedlock_begin_term(text, text, text, text);
DROP FUNCTION schedlock_insert_slot(bigint, timestamptz, bigint, integer);
DROP FUNCTION schedlock_session_serves(text);
