-- loses data: no (triggers only)
DROP TRIGGER schedlock_publishes_payload_size_insert;
DROP TRIGGER schedlock_publishes_payload_size_update;
DROP TRIGGER schedlock_schedules_payload_size_insert;
DROP TRIGGER schedlock_schedules_payload_size_update;
