-- 0012 pinned search_path, PostgreSQL: the trigger functions of 0001 and 0007 get the pinned
-- search_path every later function has (this schema, then pg_temp): a writer whose own
-- search_path puts another schema before pg_catalog (`SET search_path = evil, pg_catalog`) no
-- longer decides what pg_notify or octet_length name inside them.
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['schedlock_notify_rows()', 'schedlock_notify_schedules()',
                             'schedlock_payload_size()'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
END $$;
