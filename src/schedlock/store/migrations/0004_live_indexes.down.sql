-- loses data: no (indexes, and the last fire per key, which schema 3 reads from the history)
DROP INDEX schedlock_publishes_unfired_slots;
DROP INDEX schedlock_publishes_schedule;
ALTER TABLE schedlock_terms DROP COLUMN last_fire_at;
