-- loses data: no (triggers only)
DROP TRIGGER schedlock_publishes_payload_size ON schedlock_publishes;
DROP TRIGGER schedlock_schedules_payload_size ON schedlock_schedules;
DROP FUNCTION schedlock_payload_size();
