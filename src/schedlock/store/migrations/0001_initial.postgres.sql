-- 0001 initial, PostgreSQL only: NOTIFY the leaders when rows change (SQLite has no NOTIFY).
-- Wake the leader of a key whenever a row becomes due-able (any writer: operator, CLI, SQL).
CREATE FUNCTION schedlock_notify_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('schedlock_rows', NEW.scheduler || '/' || NEW.namespace || '/' || NEW.target);
    RETURN NULL;
END $$;
CREATE TRIGGER schedlock_publishes_notify AFTER INSERT OR UPDATE OF state, next_attempt_at
    ON schedlock_publishes FOR EACH ROW WHEN (NEW.state = 'scheduled')
    EXECUTE FUNCTION schedlock_notify_rows();

CREATE FUNCTION schedlock_notify_schedules() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('schedlock_rows', 'recurring/' || NEW.namespace || '/' || NEW.target);
    RETURN NULL;
END $$;
CREATE TRIGGER schedlock_schedules_notify AFTER INSERT OR UPDATE OF state, generation
    ON schedlock_schedules FOR EACH ROW WHEN (NEW.state = 'active')
    EXECUTE FUNCTION schedlock_notify_schedules();
