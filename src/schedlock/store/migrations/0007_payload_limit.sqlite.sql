-- 0007 payload limit, SQLite: it cannot add a CHECK to an existing table, so triggers refuse
-- an insert or update whose payload is over the bound (its stored JSON text, in bytes): the
-- inserts' triggers, then the payload updates'.
CREATE TRIGGER schedlock_publishes_payload_size_insert BEFORE INSERT ON schedlock_publishes
WHEN length(CAST(NEW.payload AS BLOB)) > 16384
BEGIN SELECT RAISE(ABORT, 'payload over 16384 bytes (schedlock_publishes_payload_size)'); END;
CREATE TRIGGER schedlock_schedules_payload_size_insert BEFORE INSERT ON schedlock_schedules
WHEN length(CAST(NEW.payload AS BLOB)) > 16384
BEGIN SELECT RAISE(ABORT, 'payload over 16384 bytes (schedlock_schedules_payload_size)'); END;
CREATE TRIGGER schedlock_publishes_payload_size_update BEFORE UPDATE OF payload ON schedlock_publishes
WHEN length(CAST(NEW.payload AS BLOB)) > 16384
BEGIN SELECT RAISE(ABORT, 'payload over 16384 bytes (schedlock_publishes_payload_size)'); END;
CREATE TRIGGER schedlock_schedules_payload_size_update BEFORE UPDATE OF payload ON schedlock_schedules
WHEN length(CAST(NEW.payload AS BLOB)) > 16384
BEGIN SELECT RAISE(ABORT, 'payload over 16384 bytes (schedlock_schedules_payload_size)'); END;
