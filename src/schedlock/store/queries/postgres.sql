-- Named queries for PostgreSQL (psycopg %(name)s parameters). Loaded by schedlock.store.queries.
-- Every statement that moves a row between states runs on the lock session of its scheduler
-- and re-checks the term (fencing): a stale leader's write matches no row.

-- name: register_key
-- Record the key's lock ids. No conflict target: replicas of one app registering the same key
-- at the same moment may meet on either unique index, and neither is an error.
INSERT INTO schedlock_terms (scheduler, namespace, target, lock_classid, lock_objid)
VALUES (%(scheduler)s, %(namespace)s, %(target)s, %(classid)s, %(objid)s)
ON CONFLICT DO NOTHING;

-- name: key_of_lock_ids
-- The key registered under these lock ids (after register_key: another key is a collision).
SELECT scheduler, namespace, target FROM schedlock_terms
WHERE lock_classid = %(classid)s AND lock_objid = %(objid)s;

-- name: lock
SELECT pg_advisory_lock(%(classid)s, %(objid)s), pg_backend_pid() AS pid;

-- name: unlock
SELECT pg_advisory_unlock(%(classid)s, %(objid)s) AS released;

-- name: lock_held
-- Run in its own transaction after acquiring: a transaction-mode pooler fails it.
SELECT pg_backend_pid() AS pid,
       EXISTS (
           SELECT 1 FROM pg_locks
           WHERE locktype = 'advisory' AND classid = %(classid)s::int::oid
             AND objid = %(objid)s::int::oid AND objsubid = 2
             AND pid = pg_backend_pid() AND granted
       ) AS held,
       (SELECT client_port FROM pg_stat_activity WHERE pid = pg_backend_pid()) AS client_port;

-- name: take_standby_place
-- Try the key's standby places in order and keep the first one granted (the executor pulls one
-- row through LIMIT 1, so pg_try_advisory_lock runs on the places before it and on that one
-- only).  Never waits: a reserve finding every place taken leaves at once.
SELECT u.place - 1 AS place
FROM unnest(%(place_objids)s::int[]) WITH ORDINALITY AS u(objid, place)
WHERE pg_try_advisory_lock(%(place_classid)s, u.objid)
LIMIT 1;

-- name: standby_places_held
-- How many of these standby places this backend holds (the affinity check: 1 expected).
SELECT count(*) AS held FROM pg_locks
WHERE locktype = 'advisory' AND classid = %(place_classid)s::int::oid
  AND objid = ANY (%(place_objids)s::int[]::oid[]) AND objsubid = 2
  AND pid = pg_backend_pid() AND granted;

-- name: leave_standby_place
SELECT pg_advisory_unlock(%(place_classid)s, %(place_objid)s) AS released;

-- name: reserve_roster
-- This reserve's place among the key's live reserves (by holder) and their number, itself
-- counted, on the database clock that every reserve shares.
SELECT extract(epoch FROM now())::float8 AS db_now,
       count(*) FILTER (WHERE holder < %(holder)s) AS rank,
       count(*) FILTER (WHERE holder <> %(holder)s) + 1 AS reserves
FROM schedlock_reserves
WHERE scheduler = %(scheduler)s AND namespace = %(namespace)s AND target = %(target)s
  AND expires_at > now();

-- name: enlist_reserve
-- Record when this reserve checks next; prune the key's rows that outlived their grace.
WITH pruned AS (
    DELETE FROM schedlock_reserves
    WHERE scheduler = %(scheduler)s AND namespace = %(namespace)s AND target = %(target)s
      AND expires_at <= now() AND holder <> %(holder)s
)
INSERT INTO schedlock_reserves (scheduler, namespace, target, holder, checked_at, next_check_at, expires_at)
VALUES (%(scheduler)s, %(namespace)s, %(target)s, %(holder)s, now(),
        now() + make_interval(secs => %(next_check_in)s),
        now() + make_interval(secs => %(next_check_in)s + %(grace)s))
ON CONFLICT (scheduler, namespace, target, holder) DO UPDATE
SET checked_at = EXCLUDED.checked_at, next_check_at = EXCLUDED.next_check_at,
    expires_at = EXCLUDED.expires_at;

-- name: leave_reserves
DELETE FROM schedlock_reserves
WHERE scheduler = %(scheduler)s AND namespace = %(namespace)s AND target = %(target)s
  AND holder = %(holder)s;

-- name: backend_pid
SELECT pg_backend_pid() AS pid;

-- name: configure_lock_session
-- The lease: the server ends this session after lease_ms idle (a frozen or partitioned leader),
-- and the server-side keepalives drop a vanished peer even while it waits for the lock.
SELECT set_config('idle_session_timeout', %(lease_ms)s, false),
       set_config('tcp_keepalives_idle', %(keepalive_idle)s, false),
       set_config('tcp_keepalives_interval', %(keepalive_interval)s, false),
       set_config('tcp_keepalives_count', '3', false),
       current_setting('server_version_num')::int AS server_version,
       -- A role that may use the slots superuser_reserved_connections / reserved_connections
       -- keep (PostgreSQL 16+) must not take them: they are the operators' way in when the
       -- database is full.  True when this session is such a role beyond the ordinary slots.
       (
           (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
           OR EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = 'pg_use_reserved_connections'
                      AND pg_has_role(current_user, r.oid, 'MEMBER'))
       ) AND (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')
             > current_setting('max_connections')::int
               - current_setting('superuser_reserved_connections')::int
               - COALESCE(current_setting('reserved_connections', true), '0')::int
       AS in_reserved_slot;

-- name: begin_term
-- Bump the term right after acquiring; report how long the key was leaderless
-- (from the previous term's last heartbeat or release, on the database clock).
WITH prev AS (
    SELECT term, holder, heartbeat_at, released_at FROM schedlock_terms
    WHERE scheduler = %(scheduler)s AND namespace = %(namespace)s AND target = %(target)s
    FOR UPDATE
), bumped AS (
    UPDATE schedlock_terms t
    SET term = t.term + 1, holder = %(holder)s, since = now(), heartbeat_at = now(), released_at = NULL
    FROM prev
    WHERE t.scheduler = %(scheduler)s AND t.namespace = %(namespace)s AND t.target = %(target)s
    RETURNING t.term, t.since
)
SELECT bumped.term,
       prev.holder AS previous_holder,
       extract(epoch FROM bumped.since - COALESCE(prev.released_at, prev.heartbeat_at))::float8 AS gap_seconds,
       prev.released_at IS NOT NULL AS previous_released
FROM bumped, prev;

-- name: heartbeat
-- Proves the lock session is alive, renews nothing (the lock is the lease) and reads the backlog.
WITH hb AS (
    UPDATE schedlock_terms SET heartbeat_at = now()
    WHERE scheduler = %(scheduler)s AND namespace = %(namespace)s AND target = %(target)s
      AND term = %(term)s
    RETURNING term
)
SELECT (SELECT count(*) FROM hb) AS alive,
       pg_backend_pid() AS pid,
       count(*) AS backlog,
       extract(epoch FROM now() - min(p.next_attempt_at))::float8 AS oldest_due_age
FROM schedlock_publishes p
WHERE p.scheduler = %(scheduler)s AND p.namespace = %(namespace)s AND p.target = %(target)s
  AND p.state IN ('scheduled', 'firing') AND p.next_attempt_at <= now();

-- name: release_term
UPDATE schedlock_terms SET heartbeat_at = now(), released_at = now()
WHERE scheduler = %(scheduler)s AND namespace = %(namespace)s AND target = %(target)s
  AND term = %(term)s;

-- name: adopt_orphans
-- Rows left in 'firing' by an earlier term: fire them again (same idempotency key).
UPDATE schedlock_publishes p
SET term = %(term)s, holder = %(holder)s, attempts = p.attempts + 1, fired_at = now(), updated_at = now()
WHERE p.scheduler = %(scheduler)s AND p.namespace = %(namespace)s AND p.target = %(target)s
  AND p.state = 'firing' AND p.term < %(term)s
  AND EXISTS (SELECT 1 FROM schedlock_terms t
              WHERE t.scheduler = p.scheduler AND t.namespace = p.namespace
                AND t.target = p.target AND t.term = %(term)s)
RETURNING p.id, p.uid, p.namespace, p.name, p.target, p.due_at, p.payload, p.attempts,
          p.max_attempts, p.backoff_seconds, p.starting_deadline_seconds, now() AS db_now, true AS orphan;

-- name: claim_due
WITH due AS (
    SELECT id FROM schedlock_publishes
    WHERE scheduler = %(scheduler)s AND namespace = %(namespace)s AND target = %(target)s
      AND state = 'scheduled' AND next_attempt_at <= now()
    ORDER BY next_attempt_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE schedlock_publishes p
SET state = 'firing', term = %(term)s, holder = %(holder)s, attempts = p.attempts + 1,
    fired_at = now(), updated_at = now()
FROM due
WHERE p.id = due.id
  AND EXISTS (SELECT 1 FROM schedlock_terms t
              WHERE t.scheduler = p.scheduler AND t.namespace = p.namespace
                AND t.target = p.target AND t.term = %(term)s)
RETURNING p.id, p.uid, p.namespace, p.name, p.target, p.due_at, p.payload, p.attempts,
          p.max_attempts, p.backoff_seconds, p.starting_deadline_seconds, now() AS db_now, false AS orphan;

-- name: next_due
SELECT extract(epoch FROM min(next_attempt_at) - now())::float8 AS next_due_in
FROM schedlock_publishes
WHERE scheduler = %(scheduler)s AND namespace = %(namespace)s AND target = %(target)s
  AND state = 'scheduled';

-- name: complete
-- One statement per batch of outcomes; one NOTIFY per batch for the operator.
WITH v AS (
    SELECT * FROM unnest(
        %(ids)s::bigint[], %(outcomes)s::text[], %(next_attempts)s::timestamptz[],
        %(statuses)s::int[], %(errors)s::text[], %(sent)s::bool[]
    ) AS v(id, outcome, next_attempt_at, status, error, sent)
), done AS (
    UPDATE schedlock_publishes p
    SET state = CASE v.outcome WHEN 'retry' THEN 'scheduled' ELSE v.outcome END,
        next_attempt_at = COALESCE(v.next_attempt_at, p.next_attempt_at),
        attempts = CASE WHEN v.sent THEN p.attempts ELSE p.attempts - 1 END,
        last_status = v.status,
        last_error = v.error,
        finished_at = CASE WHEN v.outcome = 'retry' THEN NULL ELSE now() END,
        updated_at = now()
    FROM v
    WHERE p.id = v.id AND p.state = 'firing' AND p.term = %(term)s
      AND EXISTS (SELECT 1 FROM schedlock_terms t
                  WHERE t.scheduler = %(scheduler)s AND t.namespace = %(namespace)s
                    AND t.target = %(target)s AND t.term = %(term)s)
    RETURNING p.id
)
SELECT count(*) AS completed,
       pg_notify('schedlock_outcomes', json_build_object(
           'scheduler', %(scheduler)s::text, 'namespace', %(namespace)s::text,
           'target', %(target)s::text, 'term', %(term)s::bigint,
           'ids', COALESCE(json_agg(done.id), '[]'::json))::text) AS notified
FROM done;

-- name: due_schedules
SELECT s.id, s.uid, s.namespace, s.name, s.target, s.expression, s.time_zone, s.payload,
       s.max_attempts, s.backoff_seconds, s.starting_deadline_seconds, s.watermark_at,
       s.next_slot_at, now() AS db_now
FROM schedlock_schedules s
WHERE s.namespace = %(namespace)s AND s.target = %(target)s AND s.state = 'active'
  AND (s.next_slot_at IS NULL OR s.next_slot_at <= now())
ORDER BY s.id
LIMIT %(limit)s;

-- name: next_slot
SELECT extract(epoch FROM min(next_slot_at) - now())::float8 AS next_due_in,
       bool_or(next_slot_at IS NULL) AS unplanned
FROM schedlock_schedules
WHERE namespace = %(namespace)s AND target = %(target)s AND state = 'active';

-- name: insert_slot
-- Slot identity is unique per (schedule, slot time): the uid is schedule uid @ slot time.
INSERT INTO schedlock_publishes (scheduler, namespace, name, uid, generation, schedule_id, target,
                                 due_at, next_attempt_at, payload, max_attempts, backoff_seconds,
                                 starting_deadline_seconds)
SELECT 'recurring', s.namespace, s.name, %(slot_uid)s, s.generation, s.id, s.target,
       %(slot_at)s, %(slot_at)s, s.payload, s.max_attempts, s.backoff_seconds, s.starting_deadline_seconds
FROM schedlock_schedules s
WHERE s.id = %(schedule_id)s
  AND EXISTS (SELECT 1 FROM schedlock_terms t
              WHERE t.scheduler = 'recurring' AND t.namespace = s.namespace
                AND t.target = s.target AND t.term = %(term)s)
ON CONFLICT (uid) DO NOTHING;

-- name: advance_schedule
UPDATE schedlock_schedules s
SET watermark_at = %(watermark_at)s, next_slot_at = %(next_slot_at)s,
    last_slot_at = COALESCE(%(fired_slot_at)s, s.last_slot_at), updated_at = now()
WHERE s.id = %(schedule_id)s
  AND EXISTS (SELECT 1 FROM schedlock_terms t
              WHERE t.scheduler = 'recurring' AND t.namespace = s.namespace
                AND t.target = s.target AND t.term = %(term)s);

-- name: upsert_publish
-- Idempotent per (uid, generation): a replay of the same generation changes nothing; a newer
-- generation updates the spec, and re-arms a finished row only when its due time changed.
INSERT INTO schedlock_publishes AS p (scheduler, namespace, name, uid, generation, target, due_at,
                                      next_attempt_at, payload, max_attempts, backoff_seconds,
                                      starting_deadline_seconds, state)
VALUES ('publish', %(namespace)s, %(name)s, %(uid)s, %(generation)s, %(target)s, %(due_at)s,
        %(due_at)s, %(payload)s, %(max_attempts)s, %(backoff_seconds)s,
        %(starting_deadline_seconds)s, CASE WHEN %(suspended)s THEN 'suspended' ELSE 'scheduled' END)
ON CONFLICT (uid) DO UPDATE
SET generation = EXCLUDED.generation,
    target = CASE WHEN p.state = 'firing' THEN p.target ELSE EXCLUDED.target END,
    payload = EXCLUDED.payload,
    max_attempts = EXCLUDED.max_attempts,
    backoff_seconds = EXCLUDED.backoff_seconds,
    starting_deadline_seconds = EXCLUDED.starting_deadline_seconds,
    due_at = CASE WHEN p.state = 'firing' THEN p.due_at ELSE EXCLUDED.due_at END,
    next_attempt_at = CASE
        WHEN p.state = 'firing' THEN p.next_attempt_at
        WHEN p.state IN ('scheduled', 'suspended') AND p.due_at = EXCLUDED.due_at THEN p.next_attempt_at
        ELSE EXCLUDED.due_at END,
    state = CASE
        WHEN p.state = 'firing' THEN p.state
        WHEN p.state IN ('published', 'failed', 'missed') AND p.due_at = EXCLUDED.due_at THEN p.state
        WHEN %(suspended)s THEN 'suspended'
        ELSE 'scheduled' END,
    attempts = CASE
        WHEN p.state IN ('published', 'failed', 'missed', 'cancelled') AND p.due_at <> EXCLUDED.due_at THEN 0
        ELSE p.attempts END,
    updated_at = now()
WHERE p.generation < EXCLUDED.generation
RETURNING p.id, p.state, (xmax = 0) AS inserted;

-- name: cancel_publish
UPDATE schedlock_publishes SET state = 'cancelled', finished_at = now(), updated_at = now()
WHERE uid = %(uid)s AND state IN ('scheduled', 'suspended')
RETURNING id;

-- name: upsert_schedule
INSERT INTO schedlock_schedules AS s (namespace, name, uid, generation, target, expression, time_zone,
                                      payload, max_attempts, backoff_seconds,
                                      starting_deadline_seconds, state)
VALUES (%(namespace)s, %(name)s, %(uid)s, %(generation)s, %(target)s, %(expression)s, %(time_zone)s,
        %(payload)s, %(max_attempts)s, %(backoff_seconds)s, %(starting_deadline_seconds)s,
        CASE WHEN %(suspended)s THEN 'suspended' ELSE 'active' END)
ON CONFLICT (uid) DO UPDATE
SET generation = EXCLUDED.generation, target = EXCLUDED.target, expression = EXCLUDED.expression,
    time_zone = EXCLUDED.time_zone, payload = EXCLUDED.payload,
    max_attempts = EXCLUDED.max_attempts, backoff_seconds = EXCLUDED.backoff_seconds,
    starting_deadline_seconds = EXCLUDED.starting_deadline_seconds,
    state = EXCLUDED.state,
    next_slot_at = CASE WHEN s.expression = EXCLUDED.expression AND s.time_zone = EXCLUDED.time_zone
                        THEN s.next_slot_at ELSE NULL END,
    watermark_at = CASE WHEN s.state <> 'active' AND EXCLUDED.state = 'active' THEN NULL ELSE s.watermark_at END,
    updated_at = now()
WHERE s.generation < EXCLUDED.generation
RETURNING s.id, s.state, (xmax = 0) AS inserted;

-- name: cancel_schedule
WITH s AS (
    UPDATE schedlock_schedules SET state = 'cancelled', updated_at = now()
    WHERE uid = %(uid)s AND state <> 'cancelled' RETURNING id
)
UPDATE schedlock_publishes p SET state = 'cancelled', finished_at = now(), updated_at = now()
FROM s WHERE p.schedule_id = s.id AND p.state IN ('scheduled', 'suspended')
RETURNING p.id;

-- name: key_status
SELECT t.scheduler, t.namespace, t.target, t.term, t.holder, t.since, t.heartbeat_at, t.released_at,
       (SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
        WHERE l.locktype = 'advisory' AND l.classid = t.lock_classid::oid
          AND l.objid = t.lock_objid::oid AND l.objsubid = 2 AND l.granted
        LIMIT 1) AS lock_holder,
       (SELECT count(*) FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.classid = t.lock_classid::oid
          AND l.objid = t.lock_objid::oid AND l.objsubid = 2 AND NOT l.granted) AS waiters,
       ARRAY(SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
             WHERE l.locktype = 'advisory' AND l.classid = t.lock_classid::oid
               AND l.objid = t.lock_objid::oid AND l.objsubid = 2 AND NOT l.granted
             ORDER BY a.application_name) AS standbys,
       ARRAY(SELECT r.holder FROM schedlock_reserves r
             WHERE r.scheduler = t.scheduler AND r.namespace = t.namespace
               AND r.target = t.target AND r.expires_at > now()
             ORDER BY r.holder) AS reserves,
       (SELECT count(*) FROM schedlock_publishes p
        WHERE p.scheduler = t.scheduler AND p.namespace = t.namespace AND p.target = t.target
          AND p.state IN ('scheduled', 'firing') AND p.next_attempt_at <= now()) AS backlog,
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
FROM schedlock_publishes WHERE uid = %(uid)s;

-- name: publishes_by_id
SELECT id, scheduler, namespace, name, uid, generation, target, due_at, next_attempt_at, payload,
       state, attempts, max_attempts, term, holder, last_status, last_error, fired_at, finished_at
FROM schedlock_publishes WHERE id = ANY(%(ids)s::bigint[]);

-- name: get_schedule
SELECT id, uid, namespace, name, generation, target, expression, time_zone, state,
       watermark_at, last_slot_at, next_slot_at, updated_at
FROM schedlock_schedules WHERE uid = %(uid)s;

-- name: latest_slot
SELECT p.id, p.scheduler, p.namespace, p.name, p.uid, p.generation, p.target, p.due_at,
       p.next_attempt_at, p.payload, p.state, p.attempts, p.max_attempts, p.term, p.holder,
       p.last_status, p.last_error, p.fired_at, p.finished_at
FROM schedlock_publishes p JOIN schedlock_schedules s ON s.id = p.schedule_id
WHERE s.uid = %(uid)s
ORDER BY p.due_at DESC, p.id DESC
LIMIT 1;

-- name: changed_since
-- The operator's sweep: rows changed after a watermark (database clock), oldest first.
SELECT id, scheduler, namespace, name, uid, generation, target, due_at, next_attempt_at, payload,
       state, attempts, max_attempts, term, holder, last_status, last_error, fired_at, finished_at,
       updated_at
FROM schedlock_publishes
WHERE updated_at > %(since)s
ORDER BY updated_at, id
LIMIT %(limit)s;

-- name: db_now
SELECT now() AS now;

-- name: role_exists
SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = %(role)s) AS exists;

-- name: server_writable
-- Every session checks where it landed: a hot standby grants advisory locks too, so a session
-- there must neither lead nor write.
SELECT pg_is_in_recovery() AS in_recovery,
       current_setting('default_transaction_read_only') AS default_read_only,
       current_setting('transaction_read_only') AS read_only;

-- name: row_versions
-- The operator's re-assertion: one query for every object it knows (uid, generation, state).
SELECT 'publish' AS kind, uid, generation, state FROM schedlock_publishes
WHERE scheduler = 'publish' AND uid = ANY(%(uids)s::text[])
UNION ALL
SELECT 'schedule' AS kind, uid, generation, state FROM schedlock_schedules
WHERE uid = ANY(%(uids)s::text[]);

-- name: restore_publish
-- A row lost (or reverted to scheduled) behind an object whose status records a terminal
-- outcome: store it in that outcome, so it never fires again.  A row that moved on (firing,
-- finished, or a newer generation) is left alone.
INSERT INTO schedlock_publishes AS p (scheduler, namespace, name, uid, generation, target, due_at,
                                      next_attempt_at, payload, max_attempts, backoff_seconds,
                                      starting_deadline_seconds, state, attempts, fired_at,
                                      finished_at, last_error, term, holder)
VALUES ('publish', %(namespace)s, %(name)s, %(uid)s, %(generation)s, %(target)s, %(due_at)s,
        %(due_at)s, %(payload)s, %(max_attempts)s, %(backoff_seconds)s,
        %(starting_deadline_seconds)s, %(state)s, %(attempts)s, %(fired_at)s, now(),
        %(last_error)s, %(term)s, %(holder)s)
ON CONFLICT (uid) DO UPDATE
SET generation = EXCLUDED.generation, state = EXCLUDED.state, attempts = EXCLUDED.attempts,
    fired_at = EXCLUDED.fired_at, finished_at = now(), last_error = EXCLUDED.last_error,
    term = EXCLUDED.term, holder = EXCLUDED.holder, updated_at = now()
WHERE p.state IN ('scheduled', 'suspended') AND p.generation <= EXCLUDED.generation
RETURNING p.id, p.state, (xmax = 0) AS inserted;
