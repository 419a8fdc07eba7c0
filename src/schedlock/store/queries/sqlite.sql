-- Named queries SQLite runs its own way (:name parameters); the ones both dialects share are
-- in common.sql.  Single process by definition: leadership is always granted ('sqlite-leader');
-- the term and fencing checks are kept so the loops are the same.  A query of several
-- statements runs in one transaction and answers with the last row-returning one's rows, each
-- joined by the first row of the row-returning ones before it.  Durations are computed here,
-- as PostgreSQL computes them (julianday: milliseconds).

-- name: register_key
INSERT INTO schedlock_terms (scheduler, namespace, target, lock_classid, lock_objid)
VALUES (:scheduler, :namespace, :target, :classid, :objid)
ON CONFLICT (scheduler, namespace, target) DO NOTHING;

-- name: begin_term
SELECT holder AS previous_holder, released_at IS NOT NULL AS previous_released,
       (julianday(now()) - julianday(COALESCE(released_at, heartbeat_at))) * 86400.0 AS gap_seconds
FROM schedlock_terms
WHERE scheduler = :scheduler AND namespace = :namespace AND target = :target;
UPDATE schedlock_terms SET term = term + 1, holder = :holder, since = now(), heartbeat_at = now(),
       released_at = NULL
WHERE scheduler = :scheduler AND namespace = :namespace AND target = :target
RETURNING term;

-- name: heartbeat
-- The backlog as two halves, each on its partial index (see postgres.sql).
UPDATE schedlock_terms SET heartbeat_at = now()
WHERE scheduler = :scheduler AND namespace = :namespace AND target = :target AND term = :term;
SELECT changes() AS alive, count(*) AS backlog,
       (julianday(now()) - julianday(min(next_attempt_at))) * 86400.0 AS oldest_due_age
FROM (SELECT next_attempt_at FROM schedlock_publishes
      WHERE scheduler = :scheduler AND namespace = :namespace AND target = :target
        AND state = 'scheduled' AND next_attempt_at <= now()
      UNION ALL
      SELECT next_attempt_at FROM schedlock_publishes
      WHERE scheduler = :scheduler AND namespace = :namespace AND target = :target
        AND state = 'firing' AND next_attempt_at <= now());

-- name: claim_due
UPDATE schedlock_publishes
SET state = 'firing', term = :term, holder = :holder, attempts = attempts + 1,
    fired_at = now(), updated_at = now()
WHERE id IN (
    SELECT id FROM schedlock_publishes
    WHERE scheduler = :scheduler AND namespace = :namespace AND target = :target
      AND state = 'scheduled' AND next_attempt_at <= now()
    ORDER BY next_attempt_at, id
    LIMIT :limit
)
  AND EXISTS (SELECT 1 FROM schedlock_terms t
              WHERE t.scheduler = :scheduler AND t.namespace = :namespace
                AND t.target = :target AND t.term = :term)
RETURNING
          -- include: claimed_row_columns
          false AS orphan;

-- name: next_due
SELECT (julianday(min(next_attempt_at)) - julianday(now())) * 86400.0 AS next_due_in
FROM schedlock_publishes
WHERE scheduler = :scheduler AND namespace = :namespace AND target = :target
  AND state = 'scheduled';

-- name: complete
-- One statement per batch of outcomes (a JSON array), as on PostgreSQL; the key's last fire
-- first, so that changes() counts the outcomes.
UPDATE schedlock_terms SET last_fire_at = now()
WHERE scheduler = :scheduler AND namespace = :namespace AND target = :target AND term = :term
  AND EXISTS (SELECT 1 FROM json_each(:completions) WHERE value ->> '$.outcome' = 'published');
UPDATE schedlock_publishes
SET state = CASE v.outcome WHEN 'retry' THEN 'scheduled' ELSE v.outcome END,
    next_attempt_at = COALESCE(v.next_attempt_at, schedlock_publishes.next_attempt_at),
    attempts = CASE WHEN v.sent THEN attempts ELSE attempts - 1 END,
    last_status = v.status,
    last_error = v.error,
    finished_at = CASE WHEN v.outcome = 'retry' THEN NULL ELSE now() END,
    updated_at = now()
FROM (SELECT value ->> '$.id' AS id, value ->> '$.outcome' AS outcome,
             value ->> '$.next_attempt_at' AS next_attempt_at, value ->> '$.status' AS status,
             value ->> '$.error' AS error, value ->> '$.sent' AS sent
      FROM json_each(:completions)) AS v
WHERE schedlock_publishes.id = v.id AND state = 'firing' AND term = :term
  AND EXISTS (SELECT 1 FROM schedlock_terms t
              WHERE t.scheduler = :scheduler AND t.namespace = :namespace
                AND t.target = :target AND t.term = :term);
SELECT changes() AS completed;

-- name: insert_slot
-- A recurring schedule's active slot row, copied from the schedule (PostgreSQL: the function
-- schedlock_insert_slot of migration 0010 does the same).  Slot identity is unique per
-- (schedule, slot time): the uid is schedule uid @ slot time.
-- A schedule whose payload is over the bound (older than migration 0007, whose trigger would
-- refuse the slot and with it the key's whole wake-up) gets no slot.
INSERT INTO schedlock_publishes (scheduler, namespace, name, uid, generation, schedule_id, target,
                                 due_at, next_attempt_at, payload, max_attempts, backoff_seconds,
                                 starting_deadline_seconds, created_at, updated_at)
SELECT 'recurring', s.namespace, s.name, :slot_uid, s.generation, s.id, s.target,
       :slot_at, :slot_at, s.payload, s.max_attempts, s.backoff_seconds,
       s.starting_deadline_seconds, now(), now()
FROM schedlock_schedules s
WHERE s.id = :schedule_id AND s.state = 'active' AND octet_length(CAST(s.payload AS text)) <= :max_payload_bytes
  AND EXISTS (SELECT 1 FROM schedlock_terms t
              WHERE t.scheduler = 'recurring' AND t.namespace = s.namespace
                AND t.target = s.target AND t.term = :term)
ON CONFLICT (uid) DO NOTHING
RETURNING 1 AS inserted;

-- name: next_slot
SELECT (julianday(min(next_slot_at)) - julianday(now())) * 86400.0 AS next_slot_in,
       max(next_slot_at IS NULL) AS unplanned
FROM schedlock_schedules
WHERE namespace = :namespace AND target = :target AND state = 'active';

-- name: cancel_schedule
UPDATE schedlock_publishes SET state = 'cancelled', finished_at = now(), updated_at = now()
WHERE schedule_id IN (SELECT id FROM schedlock_schedules WHERE uid = :uid AND state <> 'cancelled')
  AND state IN ('scheduled', 'suspended')
RETURNING id;
UPDATE schedlock_schedules SET state = 'cancelled', updated_at = now()
WHERE uid = :uid AND state <> 'cancelled';

-- name: publishes_by_id
-- Ids passed as a JSON array: one query whatever their number.
SELECT id, scheduler, namespace, name, uid, generation, target, due_at, next_attempt_at, payload,
       state, attempts, max_attempts, term, holder, last_status, last_error, fired_at, finished_at
FROM schedlock_publishes WHERE id IN (SELECT value FROM json_each(:ids));

-- name: row_versions
-- The operator's re-assertion (uids passed as a JSON array: one query whatever their number).
SELECT 'publish' AS kind, uid, generation, state FROM schedlock_publishes
WHERE scheduler = 'publish' AND uid IN (SELECT value FROM json_each(:uids))
UNION ALL
SELECT 'schedule' AS kind, uid, generation, state FROM schedlock_schedules
WHERE uid IN (SELECT value FROM json_each(:uids));

-- name: migrations_recorded
SELECT EXISTS (SELECT 1 FROM sqlite_master
               WHERE type = 'table' AND name = 'schedlock_migrations') AS recorded,
       NULL AS location, NULL AS unusable_schema, NULL AS elsewhere;

-- name: create_migrations_table
-- A table of an older release gets `additive` from the connector (SQLite's ADD COLUMN has no
-- IF NOT EXISTS): schedlock.store.sqlite.SqliteConnector.migration_session.
CREATE TABLE IF NOT EXISTS schedlock_migrations (
    id integer PRIMARY KEY, name text NOT NULL, applied_at text NOT NULL,
    additive boolean NOT NULL DEFAULT false
);

-- name: migrations_columns
SELECT name FROM pragma_table_info('schedlock_migrations');

-- name: add_migrations_additive
ALTER TABLE schedlock_migrations ADD COLUMN additive boolean NOT NULL DEFAULT false;
-- name: key_sessions
-- Always the leader: the holder of a live term holds the "lock"; nobody waits.
SELECT scheduler, namespace, target,
       CASE WHEN released_at IS NULL AND term > 0 THEN holder END AS lock_holder, 0 AS waiters
FROM schedlock_terms;

-- name: session_budget
-- One process owns the file: no server sessions to count.
SELECT 0 AS leaders, 0 AS standbys, 0 AS sessions, 0 AS client_sessions,
       NULL AS max_connections;


-- ── retention (schedlock.store.retention) ────────────────────────────────────────────────────
-- One process, one connection: each batch is its own short session, so the firing loops'
-- statements run between batches.

-- name: maintenance_begin
SELECT 1 AS ok;

-- name: maintenance_end
SELECT 1 AS ok;

-- name: claim_maintenance
-- Take or renew the lease of a maintenance task (database clock); no row: another holds it.
UPDATE schedlock_maintenance SET holder = :holder, lease_until = :lease_until
WHERE task = :task AND (lease_until IS NULL OR lease_until <= now() OR holder = :holder)
RETURNING holder, lease_until;

-- name: prune_publishes
DELETE FROM schedlock_publishes
WHERE id IN (SELECT id FROM schedlock_publishes
             WHERE state = :state AND updated_at < :cutoff
             ORDER BY updated_at
             LIMIT :limit);

-- name: prune_schedules
DELETE FROM schedlock_schedules
WHERE id IN (SELECT s.id FROM schedlock_schedules s
             WHERE s.state = 'cancelled' AND s.updated_at < :cutoff
               AND NOT EXISTS (SELECT 1 FROM schedlock_publishes p
                               WHERE p.schedule_id = s.id
                                 AND p.state IN ('scheduled', 'firing', 'suspended'))
             LIMIT :limit);

-- name: prune_terms
-- As on PostgreSQL, with the term's release instead of the lock check: the one process that
-- holds every lock is this one, and a key it leads has a term not released whose heartbeat may
-- be older than a short retention (heartbeats come every third of the lease).  So a term not
-- released goes only once its heartbeat is older than the longest lease allows before the
-- cutoff (:unreleased_cutoff): its process is gone.
DELETE FROM schedlock_terms
WHERE rowid IN (
    SELECT k.rowid FROM schedlock_terms k
    WHERE k.heartbeat_at < :cutoff
      AND (k.released_at IS NOT NULL OR k.term = 0 OR k.heartbeat_at < :unreleased_cutoff)
      AND NOT EXISTS (SELECT 1 FROM schedlock_publishes p
                      WHERE p.scheduler = k.scheduler AND p.namespace = k.namespace
                        AND p.target = k.target
                        AND p.state IN ('scheduled', 'firing', 'suspended'))
      -- include: prune_terms_schedules_and_reserves
    LIMIT :limit);

-- name: history_stats
-- Ages as on PostgreSQL; table sizes are PostgreSQL's only (NULL here).
SELECT (julianday(now()) - julianday((SELECT min(updated_at) FROM schedlock_publishes
                                          WHERE state = 'published'))) * 86400.0 AS published_age_seconds,
       (julianday(now()) - julianday((SELECT min(updated_at) FROM schedlock_publishes
                                          WHERE state = 'cancelled'))) * 86400.0 AS cancelled_age_seconds,
       (julianday(now()) - julianday((SELECT min(updated_at) FROM schedlock_publishes
                                          WHERE state = 'failed'))) * 86400.0 AS failed_age_seconds,
       (julianday(now()) - julianday((SELECT min(updated_at) FROM schedlock_publishes
                                          WHERE state = 'missed'))) * 86400.0 AS missed_age_seconds,
       NULL AS publishes_bytes, NULL AS schedules_bytes, NULL AS terms_bytes,
       NULL AS reserves_bytes;
