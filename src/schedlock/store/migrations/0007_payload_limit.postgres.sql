-- 0007 payload limit, PostgreSQL: a trigger per table that holds payloads refuses an insert, or
-- an update that sets the payload, whose payload is over the bound (octet_length(payload::text):
-- the measure of schedlock.core.payloads.printed_size), with SQLSTATE 23514 (check_violation)
-- and a constraint name, as a CHECK would.  Not a CHECK: a CHECK, even added NOT VALID (which
-- spares the scan of existing rows), is checked again on EVERY update of a row, so one row of
-- an older schema over the bound would make each claim, completion or cancel of its batch fail
-- (measured: the leader's claim failed in a loop).  The trigger is added under a brief SHARE
-- ROW EXCLUSIVE lock, reads no existing row, and fires only when the payload is written.
-- ENABLE ALWAYS: `SET session_replication_role = replica` does not skip it.
CREATE FUNCTION schedlock_payload_size() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'payload is % bytes as JSON; at most 16384 bytes (16 KiB) are allowed: pass a reference (an id or URL) instead of the data',
        octet_length(NEW.payload::text)
        USING ERRCODE = 'check_violation', CONSTRAINT = TG_TABLE_NAME || '_payload_size',
              TABLE = TG_TABLE_NAME, COLUMN = 'payload';
END $$;
CREATE TRIGGER schedlock_publishes_payload_size BEFORE INSERT OR UPDATE OF payload
    ON schedlock_publishes FOR EACH ROW WHEN (octet_length(NEW.payload::text) > 16384)
    EXECUTE FUNCTION schedlock_payload_size();
ALTER TABLE schedlock_publishes ENABLE ALWAYS TRIGGER schedlock_publishes_payload_size;
CREATE TRIGGER schedlock_schedules_payload_size BEFORE INSERT OR UPDATE OF payload
    ON schedlock_schedules FOR EACH ROW WHEN (octet_length(NEW.payload::text) > 16384)
    EXECUTE FUNCTION schedlock_payload_size();
ALTER TABLE schedlock_schedules ENABLE ALWAYS TRIGGER schedlock_schedules_payload_size;
