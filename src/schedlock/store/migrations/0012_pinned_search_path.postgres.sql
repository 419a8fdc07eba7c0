-- 0012 pinned search_path, PostgreSQL: the trigger functions of 0001 and 0007 get the pinned
-- search_path every later function has (this schema, then pg_temp): a writer whose own
-- search_path puts another schema before pg_catalog (`SET search_path = evil, pg_catalog`) no
-- longer decides what pg_notify or octet_length name inside them.
SELECT set_config('search_path', format('%I, pg_temp', current_schema()), true);
ALTER FUNCTION schedlock_notify_rows() SET search_path FROM CURRENT;
ALTER FUNCTION schedlock_notify_schedules() SET search_path FROM CURRENT;
ALTER FUNCTION schedlock_payload_size() SET search_path FROM CURRENT;
