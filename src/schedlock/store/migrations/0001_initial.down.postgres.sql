-- loses data: no (the NOTIFY triggers and their functions; the tables go in the shared step)
DROP TRIGGER schedlock_publishes_notify ON schedlock_publishes;
DROP TRIGGER schedlock_schedules_notify ON schedlock_schedules;
DROP FUNCTION schedlock_notify_rows();
DROP FUNCTION schedlock_notify_schedules();
