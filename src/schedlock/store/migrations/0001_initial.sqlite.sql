-- 0001 initial: one-shot publishes, recurring schedules, per-key leadership terms.
-- Timestamps are ISO 8601 UTC text (fixed width, so they sort); payloads are JSON text.
CREATE TABLE schedlock_schedules (
    id integer PRIMARY KEY AUTOINCREMENT,
    namespace text NOT NULL,
    name text NOT NULL,
    uid text NOT NULL UNIQUE,
    generation integer NOT NULL DEFAULT 0,
    target text NOT NULL,
    expression text NOT NULL,
    time_zone text NOT NULL DEFAULT 'UTC',
    payload text NOT NULL DEFAULT '{}',
    max_attempts integer NOT NULL DEFAULT 3,
    backoff_seconds real NOT NULL DEFAULT 1,
    starting_deadline_seconds integer,
    state text NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'suspended', 'cancelled')),
    watermark_at text,
    last_slot_at text,
    next_slot_at text,
    created_at text NOT NULL,
    updated_at text NOT NULL
);
CREATE INDEX schedlock_schedules_next ON schedlock_schedules (namespace, target, next_slot_at)
    WHERE state = 'active';

CREATE TABLE schedlock_publishes (
    id integer PRIMARY KEY AUTOINCREMENT,
    scheduler text NOT NULL DEFAULT 'publish' CHECK (scheduler IN ('publish', 'recurring')),
    namespace text NOT NULL,
    name text NOT NULL,
    uid text NOT NULL UNIQUE,
    generation integer NOT NULL DEFAULT 0,
    schedule_id integer REFERENCES schedlock_schedules (id) ON DELETE CASCADE,
    target text NOT NULL,
    due_at text NOT NULL,
    next_attempt_at text NOT NULL,
    payload text NOT NULL DEFAULT '{}',
    state text NOT NULL DEFAULT 'scheduled' CHECK (
        state IN ('scheduled', 'firing', 'published', 'failed', 'missed', 'cancelled', 'suspended')
    ),
    attempts integer NOT NULL DEFAULT 0,
    max_attempts integer NOT NULL DEFAULT 3,
    backoff_seconds real NOT NULL DEFAULT 1,
    starting_deadline_seconds integer,
    term integer,
    holder text,
    last_status integer,
    last_error text,
    created_at text NOT NULL,
    updated_at text NOT NULL,
    fired_at text,
    finished_at text
);
CREATE INDEX schedlock_publishes_due ON schedlock_publishes (scheduler, namespace, target, next_attempt_at)
    WHERE state = 'scheduled';
CREATE INDEX schedlock_publishes_firing ON schedlock_publishes (scheduler, namespace, target, term)
    WHERE state = 'firing';
CREATE INDEX schedlock_publishes_finished ON schedlock_publishes (updated_at);

CREATE TABLE schedlock_terms (
    scheduler text NOT NULL,
    namespace text NOT NULL,
    target text NOT NULL,
    lock_classid integer NOT NULL,
    lock_objid integer NOT NULL,
    term integer NOT NULL DEFAULT 0,
    holder text,
    since text,
    heartbeat_at text,
    released_at text,
    PRIMARY KEY (scheduler, namespace, target),
    UNIQUE (lock_classid, lock_objid)
);
