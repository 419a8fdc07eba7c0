-- Named queries for SQLite (:name parameters). Single process by definition: leadership is
-- always granted ('sqlite-leader'); the term and fencing checks are kept so the loops are the same.

-- name: register_key
INSERT INTO schedlock_terms (scheduler, namespace, target, lock_classid, lock_objid)
VALUES (:scheduler, :namespace, :target, :classid, :objid)
ON CONFLICT (scheduler, namespace, target) DO NOTHING;

-- name: previous_term
SELECT term, holder, heartbeat_at, released_at FROM schedlock_terms
WHERE scheduler = :scheduler AND namespace = :namespace AND target = :target;

-- name: begin_term
UPDATE schedlock_terms SET term = term + 1, holder = :holder, since = :now, heartbeat_at = :now,
       released_at = NULL
WHERE scheduler = :scheduler AND namespace = :namespace AND target = :target
RETURNING term;

-- name: heartbeat
UPDATE schedlock_terms SET heartbeat_at = :now
WHERE scheduler = :scheduler AND namespace = :namespace AND target = :target AND term = :term;

-- name: backlog
SELECT count(*) AS backlog, min(next_attempt_at) AS oldest_due
FROM schedlock_publishes
WHERE scheduler = :scheduler AND namespace = :namespace AND target = :target
  AND state IN ('scheduled', 'firing') AND next_attempt_at <= :now;

-- name: release_term
UPDATE schedlock_terms SET heartbeat_at = :now, released_at = :now
WHERE scheduler = :scheduler AND namespace = :namespace AND target = :target AND term = :term;

-- name: adopt_orphans
UPDATE schedlock_publishes
SET term = :term, holder = :holder, attempts = attempts + 1, fired_at = :now, updated_at = :now
WHERE scheduler = :scheduler AND namespace = :namespace AND target = :target
  AND state = 'firing' AND term < :term
  AND EXISTS (SELECT 1 FROM schedlock_terms t
              WHERE t.scheduler = :scheduler AND t.namespace = :namespace
                AND t.target = :target AND t.term = :term)
RETURNING id, uid, namespace, name, target, due_at, payload, attempts, max_attempts,
          backoff_seconds, starting_deadline_seconds, :now AS db_now, 1 AS orphan;

-- name: claim_due
UPDATE schedlock_publishes
SET state = 'firing', term = :term, holder = :holder, attempts = attempts + 1,
    fired_at = :now, updated_at = :now
WHERE id IN (
    SELECT id FROM schedlock_publishes
    WHERE scheduler = :scheduler AND namespace = :namespace AND target = :target
      AND state = 'scheduled' AND next_attempt_at <= :now
    ORDER BY next_attempt_at, id
    LIMIT :limit
)
  AND EXISTS (SELECT 1 FROM schedlock_terms t
              WHERE t.scheduler = :scheduler AND t.namespace = :namespace
                AND t.target = :target AND t.term = :term)
RETURNING id, uid, namespace, name, target, due_at, payload, attempts, max_attempts,
          backoff_seconds, starting_deadline_seconds, :now AS db_now, 0 AS orphan;

-- name: next_due
SELECT min(next_attempt_at) AS next_due FROM schedlock_publishes
WHERE scheduler = :scheduler AND namespace = :namespace AND target = :target
  AND state = 'scheduled';

-- name: complete_one
UPDATE schedlock_publishes
SET state = CASE :outcome WHEN 'retry' THEN 'scheduled' ELSE :outcome END,
    next_attempt_at = COALESCE(:next_attempt_at, next_attempt_at),
    attempts = CASE WHEN :sent THEN attempts ELSE attempts - 1 END,
    last_status = :status,
    last_error = :error,
    finished_at = CASE WHEN :outcome = 'retry' THEN NULL ELSE :now END,
    updated_at = :now
WHERE id = :id AND state = 'firing' AND term = :term
  AND EXISTS (SELECT 1 FROM schedlock_terms t
              WHERE t.scheduler = :scheduler AND t.namespace = :namespace
                AND t.target = :target AND t.term = :term);

-- name: due_schedules
SELECT id, uid, namespace, name, target, expression, time_zone, starting_deadline_seconds,
       watermark_at, :now AS db_now
FROM schedlock_schedules
WHERE namespace = :namespace AND target = :target AND state = 'active'
  AND (next_slot_at IS NULL OR next_slot_at <= :now)
ORDER BY id
LIMIT :limit;

-- name: next_slot
SELECT min(next_slot_at) AS next_slot, max(next_slot_at IS NULL) AS unplanned
FROM schedlock_schedules
WHERE namespace = :namespace AND target = :target AND state = 'active';

-- name: insert_slot
INSERT INTO schedlock_publishes (scheduler, namespace, name, uid, generation, schedule_id, target,
                                 due_at, next_attempt_at, payload, max_attempts, backoff_seconds,
                                 starting_deadline_seconds, created_at, updated_at)
SELECT 'recurring', s.namespace, s.name, :slot_uid, s.generation, s.id, s.target,
       :slot_at, :slot_at, s.payload, s.max_attempts, s.backoff_seconds,
       s.starting_deadline_seconds, :now, :now
FROM schedlock_schedules s
WHERE s.id = :schedule_id
  AND EXISTS (SELECT 1 FROM schedlock_terms t
              WHERE t.scheduler = 'recurring' AND t.namespace = s.namespace
                AND t.target = s.target AND t.term = :term)
ON CONFLICT (uid) DO NOTHING;

-- name: advance_schedule
UPDATE schedlock_schedules
SET watermark_at = :watermark_at, next_slot_at = :next_slot_at,
    last_slot_at = COALESCE(:fired_slot_at, last_slot_at), updated_at = :now
WHERE id = :schedule_id
  AND EXISTS (SELECT 1 FROM schedlock_terms t
              WHERE t.scheduler = 'recurring' AND t.namespace = schedlock_schedules.namespace
                AND t.target = schedlock_schedules.target AND t.term = :term);

-- name: upsert_publish
INSERT INTO schedlock_publishes AS p (scheduler, namespace, name, uid, generation, target, due_at,
                                      next_attempt_at, payload, max_attempts, backoff_seconds,
                                      starting_deadline_seconds, state, created_at, updated_at)
VALUES ('publish', :namespace, :name, :uid, :generation, :target, :due_at, :due_at, :payload,
        :max_attempts, :backoff_seconds, :starting_deadline_seconds,
        CASE WHEN :suspended THEN 'suspended' ELSE 'scheduled' END, :now, :now)
ON CONFLICT (uid) DO UPDATE
SET generation = excluded.generation,
    target = CASE WHEN p.state = 'firing' THEN p.target ELSE excluded.target END,
    payload = excluded.payload,
    max_attempts = excluded.max_attempts,
    backoff_seconds = excluded.backoff_seconds,
    starting_deadline_seconds = excluded.starting_deadline_seconds,
    due_at = CASE WHEN p.state = 'firing' THEN p.due_at ELSE excluded.due_at END,
    next_attempt_at = CASE
        WHEN p.state = 'firing' THEN p.next_attempt_at
        WHEN p.state IN ('scheduled', 'suspended') AND p.due_at = excluded.due_at THEN p.next_attempt_at
        ELSE excluded.due_at END,
    state = CASE
        WHEN p.state = 'firing' THEN p.state
        WHEN p.state IN ('published', 'failed', 'missed') AND p.due_at = excluded.due_at THEN p.state
        WHEN :suspended THEN 'suspended'
        ELSE 'scheduled' END,
    attempts = CASE
        WHEN p.state IN ('published', 'failed', 'missed', 'cancelled') AND p.due_at <> excluded.due_at THEN 0
        ELSE p.attempts END,
    updated_at = :now
WHERE p.generation < excluded.generation
RETURNING id, state, created_at = :now AND updated_at = :now AS inserted;

-- name: cancel_publish
UPDATE schedlock_publishes SET state = 'cancelled', finished_at = :now, updated_at = :now
WHERE uid = :uid AND state IN ('scheduled', 'suspended')
RETURNING id;

-- name: upsert_schedule
INSERT INTO schedlock_schedules AS s (namespace, name, uid, generation, target, expression, time_zone,
                                      payload, max_attempts, backoff_seconds,
                                      starting_deadline_seconds, state, created_at, updated_at)
VALUES (:namespace, :name, :uid, :generation, :target, :expression, :time_zone, :payload,
        :max_attempts, :backoff_seconds, :starting_deadline_seconds,
        CASE WHEN :suspended THEN 'suspended' ELSE 'active' END, :now, :now)
ON CONFLICT (uid) DO UPDATE
SET generation = excluded.generation, target = excluded.target, expression = excluded.expression,
    time_zone = excluded.time_zone, payload = excluded.payload,
    max_attempts = excluded.max_attempts, backoff_seconds = excluded.backoff_seconds,
    starting_deadline_seconds = excluded.starting_deadline_seconds,
    state = excluded.state,
    next_slot_at = CASE WHEN s.expression = excluded.expression AND s.time_zone = excluded.time_zone
                        THEN s.next_slot_at ELSE NULL END,
    watermark_at = CASE WHEN s.state <> 'active' AND excluded.state = 'active' THEN NULL ELSE s.watermark_at END,
    updated_at = :now
WHERE s.generation < excluded.generation
RETURNING id, state, created_at = :now AND updated_at = :now AS inserted;

-- name: cancel_schedule_rows
UPDATE schedlock_publishes SET state = 'cancelled', finished_at = :now, updated_at = :now
WHERE schedule_id IN (SELECT id FROM schedlock_schedules WHERE uid = :uid)
  AND state IN ('scheduled', 'suspended');

-- name: cancel_schedule
UPDATE schedlock_schedules SET state = 'cancelled', updated_at = :now
WHERE uid = :uid AND state <> 'cancelled';

-- name: key_status
SELECT t.scheduler, t.namespace, t.target, t.term, t.holder, t.since, t.heartbeat_at, t.released_at,
       (SELECT count(*) FROM schedlock_publishes p
        WHERE p.scheduler = t.scheduler AND p.namespace = t.namespace AND p.target = t.target
          AND p.state IN ('scheduled', 'firing') AND p.next_attempt_at <= :now) AS backlog,
       (SELECT min(p.next_attempt_at) FROM schedlock_publishes p
        WHERE p.scheduler = t.scheduler AND p.namespace = t.namespace AND p.target = t.target
          AND p.state = 'scheduled') AS next_due,
       (SELECT max(p.finished_at) FROM schedlock_publishes p
        WHERE p.scheduler = t.scheduler AND p.namespace = t.namespace AND p.target = t.target
          AND p.state = 'published') AS last_fire
FROM schedlock_terms t
ORDER BY t.namespace, t.target, t.scheduler;

-- name: get_publish
SELECT id, scheduler, namespace, name, uid, generation, target, due_at, next_attempt_at, payload,
       state, attempts, max_attempts, term, holder, last_status, last_error, fired_at, finished_at
FROM schedlock_publishes WHERE uid = :uid;

-- name: row_versions
-- The operator's re-assertion (uids passed as a JSON array: one query whatever their number).
SELECT 'publish' AS kind, uid, generation, state FROM schedlock_publishes
WHERE scheduler = 'publish' AND uid IN (SELECT value FROM json_each(:uids))
UNION ALL
SELECT 'schedule' AS kind, uid, generation, state FROM schedlock_schedules
WHERE uid IN (SELECT value FROM json_each(:uids));

-- name: restore_publish
-- A row lost (or reverted to scheduled) behind an object whose status records a terminal
-- outcome: store it in that outcome, so it never fires again.
INSERT INTO schedlock_publishes AS p (scheduler, namespace, name, uid, generation, target, due_at,
                                      next_attempt_at, payload, max_attempts, backoff_seconds,
                                      starting_deadline_seconds, state, attempts, fired_at,
                                      finished_at, last_error, term, holder, created_at, updated_at)
VALUES ('publish', :namespace, :name, :uid, :generation, :target, :due_at, :due_at, :payload,
        :max_attempts, :backoff_seconds, :starting_deadline_seconds, :state, :attempts, :fired_at,
        :now, :last_error, :term, :holder, :now, :now)
ON CONFLICT (uid) DO UPDATE
SET generation = excluded.generation, state = excluded.state, attempts = excluded.attempts,
    fired_at = excluded.fired_at, finished_at = :now, last_error = excluded.last_error,
    term = excluded.term, holder = excluded.holder, updated_at = :now
WHERE p.state IN ('scheduled', 'suspended') AND p.generation <= excluded.generation
RETURNING id, state, created_at = :now AND updated_at = :now AS inserted;
