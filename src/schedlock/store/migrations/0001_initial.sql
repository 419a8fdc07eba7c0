-- additive: no (the first schema: no binary ran before it)
-- 0001 initial: one-shot publishes, recurring schedules, per-key leadership terms.
-- Written for PostgreSQL; SQLite reads it through the type rules of schedlock.store.migrations.
CREATE TABLE schedlock_schedules (
    id bigserial PRIMARY KEY,
    namespace text NOT NULL,
    name text NOT NULL,
    uid text NOT NULL UNIQUE,
    generation bigint NOT NULL DEFAULT 0,
    target text NOT NULL,
    expression text NOT NULL,
    time_zone text NOT NULL DEFAULT 'UTC',
    payload jsonb NOT NULL DEFAULT '{}'::jsonb,
    max_attempts integer NOT NULL DEFAULT 3,
    backoff_seconds double precision NOT NULL DEFAULT 1,
    starting_deadline_seconds integer,
    state text NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'suspended', 'cancelled')),
    watermark_at timestamptz,
    last_slot_at timestamptz,
    next_slot_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX schedlock_schedules_next ON schedlock_schedules (namespace, target, next_slot_at)
    WHERE state = 'active';

CREATE TABLE schedlock_publishes (
    id bigserial PRIMARY KEY,
    scheduler text NOT NULL DEFAULT 'publish' CHECK (scheduler IN ('publish', 'recurring')),
    namespace text NOT NULL,
    name text NOT NULL,
    uid text NOT NULL UNIQUE,
    generation bigint NOT NULL DEFAULT 0,
    schedule_id bigint REFERENCES schedlock_schedules (id) ON DELETE CASCADE,
    target text NOT NULL,
    due_at timestamptz NOT NULL,
    next_attempt_at timestamptz NOT NULL,
    payload jsonb NOT NULL DEFAULT '{}'::jsonb,
    state text NOT NULL DEFAULT 'scheduled' CHECK (
        state IN ('scheduled', 'firing', 'published', 'failed', 'missed', 'cancelled', 'suspended')
    ),
    attempts integer NOT NULL DEFAULT 0,
    max_attempts integer NOT NULL DEFAULT 3,
    backoff_seconds double precision NOT NULL DEFAULT 1,
    starting_deadline_seconds integer,
    term bigint,
    holder text,
    last_status integer,
    last_error text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    fired_at timestamptz,
    finished_at timestamptz
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
    term bigint NOT NULL DEFAULT 0,
    holder text,
    since timestamptz,
    heartbeat_at timestamptz,
    released_at timestamptz,
    PRIMARY KEY (scheduler, namespace, target),
    UNIQUE (lock_classid, lock_objid)
);
