-- Named queries both dialects run as written (:name parameters; now() is the transaction's
-- timestamp on PostgreSQL and the session's on SQLite).  Loaded by schedlock.store.queries.
-- Every statement that moves a row between states runs on the lock session of its scheduler
-- and re-checks the term (fencing): a stale leader's write matches no row.

-- name: db_now
SELECT now() AS now;

-- name: schema_version
SELECT coalesce(max(id), 0) AS id FROM schedlock_migrations;

-- name: record_migration
INSERT INTO schedlock_migrations (id, name, additive, applied_at)
VALUES (:id, :name, :additive, now());

-- name: forget_migration
-- `migrate --to`: the migration's down step ran in this transaction.
DELETE FROM schedlock_migrations WHERE id = :id;

-- name: migrations_beyond
-- The recorded migrations beyond a binary's newest, whether each is additive (the rule is
-- schedlock.store.migrations.blocking).  Only asked when the schema is newer than the binary,
-- so the table was created or upgraded by a release that records `additive`.
SELECT id, additive FROM schedlock_migrations WHERE id > :latest;

-- name: release_term
UPDATE schedlock_terms SET heartbeat_at = now(), released_at = now()
WHERE scheduler = :scheduler AND namespace = :namespace AND target = :target
  AND term = :term;

-- part: claimed_row_columns
-- What a leader delivers of a row it claims or adopts (RETURNING), before the query's orphan
-- flag: the payload is left out when over the limit, its size returned either way.
          id, uid, namespace, name, target, due_at,
          CASE WHEN octet_length(CAST(payload AS text)) <= :max_payload_bytes THEN payload END AS payload,
          octet_length(CAST(payload AS text)) AS payload_bytes, attempts AS attempt, max_attempts,
          backoff_seconds, starting_deadline_seconds, now() AS db_now,

-- name: adopt_orphans
-- Rows left in 'firing' by an earlier term with attempts left: fire them again (same
-- idempotency key).  The payload is left out when over the limit, as claim_due does.
UPDATE schedlock_publishes
SET term = :term, holder = :holder, attempts = attempts + 1, fired_at = now(), updated_at = now()
WHERE scheduler = :scheduler AND namespace = :namespace AND target = :target
  AND state = 'firing' AND term < :term AND attempts < max_attempts
  AND EXISTS (SELECT 1 FROM schedlock_terms t
              WHERE t.scheduler = :scheduler AND t.namespace = :namespace
                AND t.target = :target AND t.term = :term)
RETURNING
          -- include: claimed_row_columns
          true AS orphan;

-- name: exhausted_orphans
-- Rows left in 'firing' by an earlier term whose last attempt was that delivery: max_attempts
-- holds across crashes too, so they are not fired again.  Taken into this term (no attempt
-- counted) for the leader to end them 'failed' through `complete`, fenced and notified like
-- every outcome: a row that keeps killing its leader is quarantined after max_attempts.
UPDATE schedlock_publishes
SET term = :term, holder = :holder, updated_at = now()
WHERE scheduler = :scheduler AND namespace = :namespace AND target = :target
  AND state = 'firing' AND term < :term AND attempts >= max_attempts
  AND EXISTS (SELECT 1 FROM schedlock_terms t
              WHERE t.scheduler = :scheduler AND t.namespace = :namespace
                AND t.target = :target AND t.term = :term)
RETURNING id, uid, namespace, name, target, due_at, '{}' AS payload, attempts AS attempt,
          max_attempts, backoff_seconds, starting_deadline_seconds, now() AS db_now,
          true AS orphan, false AS counted;

-- name: due_schedules
SELECT id, uid, namespace, name, target, expression, time_zone, starting_deadline_seconds,
       watermark_at, now() AS db_now
FROM schedlock_schedules
WHERE namespace = :namespace AND target = :target AND state = 'active'
  AND (next_slot_at IS NULL OR next_slot_at <= now())
ORDER BY id
LIMIT :limit;

-- name: advance_schedule
UPDATE schedlock_schedules AS s
SET watermark_at = :watermark_at, next_slot_at = :next_slot_at,
    last_slot_at = COALESCE(:fired_slot_at, s.last_slot_at), updated_at = now()
WHERE s.id = :schedule_id
  AND EXISTS (SELECT 1 FROM schedlock_terms t
              WHERE t.scheduler = 'recurring' AND t.namespace = s.namespace
                AND t.target = s.target AND t.term = :term);

-- name: upsert_publish
-- Idempotent per (uid, generation): a replay of the same generation changes nothing; a newer
-- generation updates the spec, and re-arms a finished row only when its due time changed.
INSERT INTO schedlock_publishes AS p (scheduler, namespace, name, uid, generation, target, due_at,
                                      next_attempt_at, payload, max_attempts, backoff_seconds,
                                      starting_deadline_seconds, state, created_at, updated_at)
VALUES ('publish', :namespace, :name, :uid, :generation, :target, :due_at, :due_at, :payload,
        :max_attempts, :backoff_seconds, :starting_deadline_seconds,
        CASE WHEN :suspended THEN 'suspended' ELSE 'scheduled' END, now(), now())
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
    updated_at = now()
WHERE p.generation < excluded.generation
RETURNING id, state, created_at = now() AS inserted;

-- name: restore_publish
-- A row behind an object whose status records a terminal outcome keeps that outcome, so it never
-- fires again: missing (pruned, lost), it is stored in it; back in scheduled/suspended (a
-- restore), it is put back in it; finished, a newer generation only moves its spec on (a payload
-- edit after firing: the upsert handler).  Firing, newer, or finished at this generation: left
-- alone.
INSERT INTO schedlock_publishes AS p (scheduler, namespace, name, uid, generation, target, due_at,
                                      next_attempt_at, payload, max_attempts, backoff_seconds,
                                      starting_deadline_seconds, state, attempts, fired_at,
                                      finished_at, last_error, term, holder, created_at, updated_at)
VALUES ('publish', :namespace, :name, :uid, :generation, :target, :due_at, :due_at, :payload,
        :max_attempts, :backoff_seconds, :starting_deadline_seconds, :state, :attempts, :fired_at,
        now(), :last_error, :term, :holder, now(), now())
ON CONFLICT (uid) DO UPDATE
SET generation = excluded.generation, payload = excluded.payload,
    max_attempts = excluded.max_attempts, backoff_seconds = excluded.backoff_seconds,
    starting_deadline_seconds = excluded.starting_deadline_seconds,
    state = CASE WHEN p.state IN ('scheduled', 'suspended') THEN excluded.state ELSE p.state END,
    attempts = CASE WHEN p.state IN ('scheduled', 'suspended') THEN excluded.attempts
                    ELSE p.attempts END,
    fired_at = CASE WHEN p.state IN ('scheduled', 'suspended') THEN excluded.fired_at
                    ELSE p.fired_at END,
    finished_at = CASE WHEN p.state IN ('scheduled', 'suspended') THEN now() ELSE p.finished_at END,
    last_error = CASE WHEN p.state IN ('scheduled', 'suspended') THEN excluded.last_error
                      ELSE p.last_error END,
    term = CASE WHEN p.state IN ('scheduled', 'suspended') THEN excluded.term ELSE p.term END,
    holder = CASE WHEN p.state IN ('scheduled', 'suspended') THEN excluded.holder ELSE p.holder END,
    updated_at = now()
WHERE p.state <> 'firing'
  AND (p.generation < excluded.generation
       OR (p.generation = excluded.generation AND p.state IN ('scheduled', 'suspended')))
RETURNING id, state, created_at = now() AS inserted;

-- name: cancel_publish
UPDATE schedlock_publishes SET state = 'cancelled', finished_at = now(), updated_at = now()
WHERE uid = :uid AND state IN ('scheduled', 'suspended')
RETURNING id;

-- name: upsert_schedule
INSERT INTO schedlock_schedules AS s (namespace, name, uid, generation, target, expression, time_zone,
                                      payload, max_attempts, backoff_seconds,
                                      starting_deadline_seconds, state, created_at, updated_at)
VALUES (:namespace, :name, :uid, :generation, :target, :expression, :time_zone, :payload,
        :max_attempts, :backoff_seconds, :starting_deadline_seconds,
        CASE WHEN :suspended THEN 'suspended' ELSE 'active' END, now(), now())
ON CONFLICT (uid) DO UPDATE
SET generation = excluded.generation, target = excluded.target, expression = excluded.expression,
    time_zone = excluded.time_zone, payload = excluded.payload,
    max_attempts = excluded.max_attempts, backoff_seconds = excluded.backoff_seconds,
    starting_deadline_seconds = excluded.starting_deadline_seconds,
    state = excluded.state,
    next_slot_at = CASE WHEN s.expression = excluded.expression AND s.time_zone = excluded.time_zone
                        THEN s.next_slot_at ELSE NULL END,
    watermark_at = CASE WHEN s.state <> 'active' AND excluded.state = 'active' THEN NULL ELSE s.watermark_at END,
    updated_at = now()
WHERE s.generation < excluded.generation
RETURNING id, state, created_at = now() AS inserted;

-- name: get_publish
SELECT id, scheduler, namespace, name, uid, generation, target, due_at, next_attempt_at, payload,
       state, attempts, max_attempts, term, holder, last_status, last_error, fired_at, finished_at
FROM schedlock_publishes WHERE uid = :uid;

-- name: get_schedule
SELECT id, uid, namespace, name, generation, target, expression, time_zone, state,
       watermark_at, last_slot_at, next_slot_at, updated_at
FROM schedlock_schedules WHERE uid = :uid;

-- name: latest_slot
-- One backward probe of schedlock_publishes_schedule (migration 0004): the schedule's id is
-- found first, so the index's (schedule_id, due_at, id) order is the ORDER BY (a join would
-- sort every slot the schedule ever had).
SELECT id, scheduler, namespace, name, uid, generation, target, due_at, next_attempt_at, payload,
       state, attempts, max_attempts, term, holder, last_status, last_error, fired_at, finished_at
FROM schedlock_publishes
WHERE schedule_id = (SELECT s.id FROM schedlock_schedules s WHERE s.uid = :uid)
ORDER BY schedule_id DESC, due_at DESC, id DESC
LIMIT 1;

-- name: changed_since
-- The operator's sweep: rows changed since a position (database clock), oldest first.  The
-- position is (updated_at, id): one statement stamps all its rows with the same now(), so a
-- page may end inside such a group and the next one goes on after the last id read (on the
-- updated_at index: a range from :since, the id only filters that one timestamp's rows).
SELECT id, scheduler, namespace, name, uid, generation, target, due_at, next_attempt_at, payload,
       state, attempts, max_attempts, term, holder, last_status, last_error, fired_at, finished_at,
       updated_at
FROM schedlock_publishes
WHERE updated_at >= :since AND (updated_at > :since OR id > :after_id)
ORDER BY updated_at, id
LIMIT :limit;

-- name: key_status
-- Live rows only (migration 0004): the backlog is the due scheduled rows (claim index) plus
-- the firing ones (firing index), next due one probe of the claim index, and the last fire is
-- kept on the term's row by `complete` instead of being found in the key's history.
SELECT t.scheduler, t.namespace, t.target, t.term, t.holder, t.since, t.heartbeat_at, t.released_at,
       (SELECT count(*) FROM (
            SELECT 1 FROM schedlock_publishes p
            WHERE p.scheduler = t.scheduler AND p.namespace = t.namespace AND p.target = t.target
              AND p.state = 'scheduled' AND p.next_attempt_at <= now()
            UNION ALL
            SELECT 1 FROM schedlock_publishes p
            WHERE p.scheduler = t.scheduler AND p.namespace = t.namespace AND p.target = t.target
              AND p.state = 'firing' AND p.next_attempt_at <= now()) AS live) AS backlog,
       (SELECT min(p.next_attempt_at) FROM schedlock_publishes p
        WHERE p.scheduler = t.scheduler AND p.namespace = t.namespace AND p.target = t.target
          AND p.state = 'scheduled') AS next_due,
       t.last_fire_at AS last_fire
FROM schedlock_terms t
ORDER BY t.namespace, t.target, t.scheduler;

-- ── retention (schedlock.store.retention) ────────────────────────────────────────────────────
-- One elected process prunes finished history on a short session of its own, never a lock
-- session, that never prepares statements: each batch is planned with its state, so the
-- planner picks that state's partial index (0005).

-- name: maintenance_lease
SELECT holder, lease_until FROM schedlock_maintenance WHERE task = :task;

-- name: prune_reserves
-- Roster rows past their expiry: ignored by every reader already (a reserve's row lives until
-- its promised next check plus a grace).  One row per reserve replica at most: no batching.
DELETE FROM schedlock_reserves WHERE expires_at <= :cutoff;


-- Status sync cursor (migration 0006): where the operator's sync resumes, on the database clock.

-- name: sync_cursor
-- The stored watermark (NULL: none yet) and the database clock, in one statement.
SELECT now() AS now,
       (SELECT watermark_at FROM schedlock_sync_cursors WHERE name = :name) AS watermark_at;

-- name: store_sync_cursor
INSERT INTO schedlock_sync_cursors (name, watermark_at, holder, updated_at)
VALUES (:name, :watermark_at, :holder, now())
ON CONFLICT (name) DO UPDATE
SET watermark_at = excluded.watermark_at, holder = excluded.holder, updated_at = now();

-- part: prune_terms_schedules_and_reserves
-- Of the conditions on a key's term (k) that both dialects' prune_terms check: no live schedule
-- of its target (recurring), no live reserve.
      AND NOT (k.scheduler = 'recurring' AND EXISTS (
                   SELECT 1 FROM schedlock_schedules s
                   WHERE s.namespace = k.namespace AND s.target = k.target
                     AND s.state <> 'cancelled'))
      AND NOT EXISTS (SELECT 1 FROM schedlock_reserves r
                      WHERE r.scheduler = k.scheduler AND r.namespace = k.namespace
                        AND r.target = k.target AND r.expires_at > now())
