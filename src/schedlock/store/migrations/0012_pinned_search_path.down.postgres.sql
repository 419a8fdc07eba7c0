-- loses data: no (function settings only)
ALTER FUNCTION schedlock_notify_rows() RESET search_path;
ALTER FUNCTION schedlock_notify_schedules() RESET search_path;
ALTER FUNCTION schedlock_payload_size() RESET search_path;
