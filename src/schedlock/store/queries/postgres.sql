-- Named queries PostgreSQL runs its own way (psycopg %(name)s parameters); the ones both
-- dialects share are in common.sql.  Loaded by schedlock.store.queries.

-- name: register_key
-- Record the key's lock ids. No conflict target: replicas of one app registering the same key
-- at the same moment may meet on either unique index, and neither is an error.
INSERT INTO schedlock_terms (scheduler, namespace, target, lock_classid, lock_objid)
VALUES (%(scheduler)s, %(namespace)s, %(target)s, %(classid)s, %(objid)s)
ON CONFLICT DO NOTHING;

-- name: lock_ids_taken
-- Whether another key holds this key's lock ids (after register_key: a collision).  Asked of
-- the database (migration 0008) because row-level security hides the terms of the namespaces
-- this role may not serve: the answer is yes or no, never the other key's row.
SELECT schedlock_lock_ids_taken(%(scheduler)s, %(namespace)s, %(target)s) AS taken;

-- name: served_namespaces
-- The connected role and the namespaces it may serve ('{*}': every one; '{}': none), asked
-- before any lock and by `schedlock status` (row-level security hides the others' keys).
SELECT current_user AS role, schedlock_served_namespaces(current_user) AS namespaces;

-- name: lock
-- Wait until the lock is granted, without holding a snapshot for long.  A statement holds one
-- while it runs: a standby waiting in one pg_advisory_lock for as long as the leader lives
-- held back the database's xmin horizon, so VACUUM could remove no row deleted or updated
-- since, in any table of the database (the app's too), and index scans could not skip them.
-- So the block waits in slices of {slice_ms} ms (lock_timeout, set for one slice's transaction)
-- and COMMITs between them, which ends the transaction and its snapshot (a DO block at top
-- level may, PostgreSQL 11+; the portal's snapshot is released too, 14+).  A slice that ends
-- is an error caught here, so the server logs nothing; one statement for the client, however
-- long it waits, and a grant ends it at once.  No parameters in a DO block: the lock ids are
-- formatted in as integers (lock_statement).  {after_slice}: nothing, or a key's look at who
-- holds its lock (lock_after_slice).
DO $$
DECLARE
    reported text := '[]';
    holders text;
BEGIN
    LOOP
        BEGIN
            PERFORM set_config('lock_timeout', '{slice_ms}', true);
            PERFORM pg_advisory_lock({classid}, {objid});
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
        {after_slice}
        COMMIT;
    END LOOP;
END
$$;

-- name: lock_after_slice
-- A key's standby, after each slice of its wait: whether a session of a role that may not serve
-- the key's namespace holds the lock (migration 0009, lock squatting).  Said to the client as a
-- NOTICE when the answer changes (a JSON array of {pid, role}, '[]' once gone), so the
-- standby's client still runs one statement and no query; the notice arrives while it runs.
-- The namespace is formatted in as hex (any text, no quoting to get wrong).
holders := coalesce((SELECT json_agg(json_build_object('pid', h.pid, 'role', h.role))::text
                     FROM schedlock_foreign_lock_holder({classid}, {objid},
                         convert_from(decode('{namespace_hex}', 'hex'), 'UTF8')) AS h), '[]');
IF holders IS DISTINCT FROM reported THEN
    reported := holders;
    RAISE NOTICE USING MESSAGE = 'schedlock_foreign_lock_holder', DETAIL = holders;
END IF;

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
       set_config('tcp_keepalives_count', %(keepalive_count)s, false),
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
-- Bump the term right after acquiring; report how long the key was leaderless (from the
-- previous term's last heartbeat or release, on the database clock).  Through the function of
-- migration 0010: a sidecar's role may not write a term itself (no UPDATE of that column).
SELECT term, previous_holder, gap_seconds, previous_released
FROM schedlock_begin_term(%(scheduler)s, %(namespace)s, %(target)s, %(holder)s);

-- name: heartbeat
-- Proves the lock session is alive, renews nothing (the lock is the lease) and reads the backlog:
-- the due scheduled rows (claim index) and the firing ones (firing index), each half bounded
-- by live rows (an IN over both states matches neither partial index: a scan of the history).
WITH hb AS (
    UPDATE schedlock_terms SET heartbeat_at = now()
    WHERE scheduler = %(scheduler)s AND namespace = %(namespace)s AND target = %(target)s
      AND term = %(term)s
    RETURNING term
), live AS (
    SELECT next_attempt_at FROM schedlock_publishes
    WHERE scheduler = %(scheduler)s AND namespace = %(namespace)s AND target = %(target)s
      AND state = 'scheduled' AND next_attempt_at <= now()
    UNION ALL
    SELECT next_attempt_at FROM schedlock_publishes
    WHERE scheduler = %(scheduler)s AND namespace = %(namespace)s AND target = %(target)s
      AND state = 'firing' AND next_attempt_at <= now()
)
SELECT (SELECT count(*) FROM hb) AS alive,
       pg_backend_pid() AS pid,
       count(*) AS backlog,
       extract(epoch FROM now() - min(live.next_attempt_at))::float8 AS oldest_due_age
FROM live;

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
-- A payload over the limit (a row older than migration 0007's NOT VALID check, or written around
-- it) is left out and only its size returned: the leader fails that row without fetching it.
RETURNING p.id, p.uid, p.namespace, p.name, p.target, p.due_at,
          CASE WHEN octet_length(p.payload::text) <= %(max_payload_bytes)s THEN p.payload END AS payload,
          octet_length(p.payload::text) AS payload_bytes, p.attempts AS attempt,
          p.max_attempts, p.backoff_seconds, p.starting_deadline_seconds, now() AS db_now, false AS orphan;

-- name: next_due
SELECT extract(epoch FROM min(next_attempt_at) - now())::float8 AS next_due_in
FROM schedlock_publishes
WHERE scheduler = %(scheduler)s AND namespace = %(namespace)s AND target = %(target)s
  AND state = 'scheduled';

-- name: complete
-- One statement per batch of outcomes; one NOTIFY per batch for the operator.
WITH v AS (
    SELECT * FROM jsonb_to_recordset(%(completions)s::jsonb)
        AS v(id bigint, outcome text, next_attempt_at timestamptz, status int, error text, sent bool)
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
    RETURNING p.id, p.state
), fired AS (
    -- The key's last fire, for `schedlock status` (kept here, not read from the history).
    UPDATE schedlock_terms SET last_fire_at = now()
    WHERE scheduler = %(scheduler)s AND namespace = %(namespace)s AND target = %(target)s
      AND term = %(term)s AND EXISTS (SELECT 1 FROM done WHERE done.state = 'published')
)
SELECT count(*) AS completed,
       pg_notify(%(channel)s, json_build_object(
           'scheduler', %(scheduler)s::text, 'namespace', %(namespace)s::text,
           'target', %(target)s::text, 'term', %(term)s::bigint,
           -- pg_notify refuses more than 8,000 bytes, which would fail the whole batch: past
           -- 350 ids (at most 20 bytes each) the notice names none, and the operator, which
           -- cannot use it, sweeps instead (schedlock.store.notices.parse_outcomes).
           'ids', CASE WHEN count(*) <= 350 THEN COALESCE(json_agg(done.id), '[]'::json) END
       )::text) AS notified
FROM done;

-- name: insert_slot
-- Through the function of migration 0010, which copies the slot's row from the schedule row
-- (a sidecar's role has no INSERT on the publishes) and derives the slot uid as
-- schedlock.core.identities.slot_uid does: a row when the slot was inserted, none otherwise.
SELECT inserted
FROM schedlock_insert_slot(%(schedule_id)s, %(slot_at)s, %(term)s, %(max_payload_bytes)s) AS inserted
WHERE inserted = 1;

-- name: next_slot
SELECT extract(epoch FROM min(next_slot_at) - now())::float8 AS next_slot_in,
       bool_or(next_slot_at IS NULL) AS unplanned
FROM schedlock_schedules
WHERE namespace = %(namespace)s AND target = %(target)s AND state = 'active';

-- name: cancel_schedule
-- The schedule's live slots through schedlock_publishes_unfired_slots (migration 0004).
WITH s AS (
    UPDATE schedlock_schedules SET state = 'cancelled', updated_at = now()
    WHERE uid = %(uid)s AND state <> 'cancelled' RETURNING id
)
UPDATE schedlock_publishes p SET state = 'cancelled', finished_at = now(), updated_at = now()
FROM s WHERE p.schedule_id = s.id AND p.state IN ('scheduled', 'suspended')
RETURNING p.id;

-- name: key_sessions
-- Who holds each key's lock, who waits to lead it, its live reserves, and a holder of its lock
-- or of its target's leadership lock whose role may not serve its namespace (migration 0009;
-- as a definer function, so that a role under row-level security is told too).  A replica
-- waits for its target's leadership lock (class %(leader_classid)s, objid one of the target's
-- keys': schedlock.store.keys.TargetLock), a replica of a release before it for the key's own
-- lock: both are the key's standbys.  A target's reserves are on the roster of its first key.
WITH locks AS MATERIALIZED (
    SELECT l.classid::int AS classid, l.objid::int AS objid, l.granted, a.application_name
    FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.objsubid = 2
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
)
SELECT t.scheduler, t.namespace, t.target,
       (SELECT l.application_name FROM locks l
        WHERE l.classid = t.lock_classid AND l.objid = t.lock_objid AND l.granted
        LIMIT 1) AS lock_holder,
       cardinality(w.standbys) AS waiters,
       w.standbys,
       ARRAY(SELECT DISTINCT r.holder FROM schedlock_reserves r
             WHERE r.namespace = t.namespace AND r.target = t.target AND r.expires_at > now()
             ORDER BY r.holder) AS reserves,
       f.role AS foreign_holder_role, f.pid AS foreign_holder_pid
FROM schedlock_terms t
CROSS JOIN LATERAL (
    SELECT ARRAY(SELECT DISTINCT l.application_name FROM locks l
                 WHERE NOT l.granted
                   AND ((l.classid = t.lock_classid AND l.objid = t.lock_objid)
                        OR (l.classid = %(leader_classid)s AND l.objid IN (
                                SELECT o.lock_objid FROM schedlock_terms o
                                WHERE o.namespace = t.namespace AND o.target = t.target)))
                 ORDER BY l.application_name) AS standbys
) AS w
LEFT JOIN LATERAL (SELECT h.role, h.pid
                   FROM (SELECT t.lock_classid AS classid, t.lock_objid AS objid
                         UNION ALL
                         SELECT %(leader_classid)s, o.lock_objid FROM schedlock_terms o
                         WHERE o.namespace = t.namespace AND o.target = t.target) AS ids
                   CROSS JOIN LATERAL schedlock_foreign_lock_holder(ids.classid, ids.objid,
                                                                    t.namespace) AS h
                   LIMIT 1) AS f ON true;

-- name: session_budget
-- The database's sessions as schedlock's replicas use them (pg_locks: a leader holds its
-- target's leadership lock or a key's lock, a standby a standby place), against the server's
-- max_connections and every client session now: `schedlock status`'s budget line.
SELECT count(DISTINCT l.pid) FILTER (
           WHERE l.granted AND l.classid::int IN (%(leader_classid)s, %(key_classid)s)
             AND l.objid::int <> 0) AS leaders,
       count(DISTINCT l.pid) FILTER (
           WHERE l.granted AND l.classid::int = %(standby_classid)s) AS standbys,
       count(DISTINCT l.pid) AS sessions,
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')
           AS client_sessions,
       current_setting('max_connections')::int AS max_connections
FROM pg_locks l
WHERE l.locktype = 'advisory' AND l.objsubid = 2
  AND l.classid::int IN (%(leader_classid)s, %(key_classid)s, %(standby_classid)s)
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database());

-- name: publishes_by_id
SELECT id, scheduler, namespace, name, uid, generation, target, due_at, next_attempt_at, payload,
       state, attempts, max_attempts, term, holder, last_status, last_error, fired_at, finished_at
FROM schedlock_publishes WHERE id = ANY(%(ids)s::bigint[]);

-- name: role_exists
SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = %(role)s) AS exists;

-- name: sidecar_writes
-- A role granted as a sidecar: whether it writes whole rows as the operator too (INSERT on the
-- schedules, which no sidecar has: `migrate --grant-sidecar --narrow` leaves its table-wide
-- writes), and whether it still holds the table-wide writes of releases before migration 0010.
SELECT has_table_privilege(%(role)s, 'schedlock_schedules', 'INSERT') AS operator,
       has_table_privilege(%(role)s, 'schedlock_publishes', 'UPDATE')
       OR has_table_privilege(%(role)s, 'schedlock_publishes', 'INSERT') AS table_wide;

-- name: policy_lock_timeout
-- A grant's transaction waits this long for a lock (POLICY_LOCK_TIMEOUT_MS): the ACCESS
-- EXCLUSIVE one that writing row-level security policies takes (record_namespaces).
SELECT set_config('lock_timeout', %(ms)s, true);

-- name: record_namespaces
-- `migrate --grant-… [--namespace NS …] [--only]` (migration 0008's mapping, as the owner): add
-- the namespaces to the role's, or with `only` make them all of it; answers every namespace the
-- role may serve then (the statement's CTEs see the table as it was: the answer is computed).
-- Migration 0011's trigger on the mapping then rewrites the policies of every role whose
-- mapping changed (constant predicates TO the role), in this statement.
WITH dropped AS (
    DELETE FROM schedlock_namespace_roles
    WHERE role = %(role)s AND %(only)s AND namespace <> ALL (%(namespaces)s::text[])
), added AS (
    INSERT INTO schedlock_namespace_roles (role, namespace)
    SELECT %(role)s, n FROM unnest(%(namespaces)s::text[]) AS n
    ON CONFLICT DO NOTHING
)
SELECT ARRAY(
    SELECT namespace FROM schedlock_namespace_roles
    WHERE role = %(role)s AND NOT (%(only)s AND namespace <> ALL (%(namespaces)s::text[]))
    UNION
    SELECT unnest(%(namespaces)s::text[])
    ORDER BY 1) AS namespaces;

-- name: schema_create
-- Who may create objects in the schema the tables are in: PUBLIC (by an ACL entry: PostgreSQL
-- 14 and older grant it on `public`), and which of the granted roles, by any path.
SELECT current_schema() AS schema,
       EXISTS (SELECT 1 FROM pg_namespace n, aclexplode(n.nspacl) AS a
               WHERE n.nspname = current_schema() AND a.grantee = 0
                 AND a.privilege_type = 'CREATE') AS public_may_create,
       ARRAY(SELECT r FROM unnest(%(roles)s::text[]) AS r
             WHERE has_schema_privilege(r, current_schema(), 'CREATE') ORDER BY r) AS creators;

-- name: session_setup
-- Every session checks where it landed (a hot standby grants advisory locks too, so a session
-- there must neither lead nor write) and puts its search_path on schedlock's schema: the
-- configured one, or `public` where an earlier release installed schedlock there and the
-- configured one holds no install (the catalogs tell, whatever the role may use).  Nothing else
-- is on the path: an object another role created elsewhere never stands in for one of ours
-- (pg_catalog is searched first, as always).
SELECT pg_is_in_recovery() AS in_recovery,
       current_setting('default_transaction_read_only') AS default_read_only,
       current_setting('transaction_read_only') AS read_only,
       set_config('search_path', quote_ident(CASE
           WHEN NOT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                            WHERE n.nspname = %(schema)s AND c.relname = 'schedlock_migrations')
            AND EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                        WHERE n.nspname = 'public' AND c.relname = 'schedlock_migrations')
           THEN 'public' ELSE %(schema)s END), false) AS search_path;

-- name: schema_in_use
-- The schema this session's search_path names (session_setup's choice), whether it exists,
-- and the other schemas of this database that hold a schedlock install.
SELECT s.name AS schema, to_regnamespace(quote_ident(s.name)) IS NOT NULL AS exists,
       ARRAY(SELECT n.nspname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE c.relname = 'schedlock_migrations' AND n.nspname <> s.name
             ORDER BY n.nspname) AS elsewhere
FROM (SELECT (parse_ident(current_setting('search_path')))[1] AS name) AS s;

-- name: row_versions
-- The operator's re-assertion: one query for every object it knows (uid, generation, state).
SELECT 'publish' AS kind, uid, generation, state FROM schedlock_publishes
WHERE scheduler = 'publish' AND uid = ANY(%(uids)s::text[])
UNION ALL
SELECT 'schedule' AS kind, uid, generation, state FROM schedlock_schedules
WHERE uid = ANY(%(uids)s::text[]);

-- name: schema_usage
-- Whether the current role may use the schema on its search_path (without USAGE, PostgreSQL
-- leaves it off the path: every table looks missing).
SELECT current_user AS role, s.name AS schema,
       to_regnamespace(quote_ident(s.name)) IS NOT NULL AND has_schema_privilege(s.name, 'USAGE')
           AS usable
FROM (SELECT (parse_ident(current_setting('search_path')))[1] AS name) AS s;

-- name: migrations_recorded
-- Also: the schema on the search_path when it holds an install this role may not use (it
-- lacks USAGE: PostgreSQL then leaves the schema off its path and every table looks missing),
-- and another schema holding an install (the setting names the wrong one).
SELECT to_regclass('schedlock_migrations') IS NOT NULL AS recorded, s.name AS location,
       CASE WHEN EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                         WHERE n.nspname = s.name AND c.relname = 'schedlock_migrations')
             AND NOT has_schema_privilege(s.name, 'USAGE')
            THEN s.name END AS unusable_schema,
       (SELECT min(n.nspname::text) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.relname = 'schedlock_migrations' AND n.nspname <> s.name) AS elsewhere
FROM (SELECT (parse_ident(current_setting('search_path')))[1] AS name) AS s;

-- name: create_migrations_table
-- `additive` joined the table with the rollback rule: a table of an older release gets it
-- too (its rows are migrations every binary that reads the column knows: the default is moot).
-- Only when missing: ALTER TABLE locks the table against the sidecars' schema checks even
-- when it has nothing to do.
DO $$ BEGIN
    CREATE TABLE IF NOT EXISTS schedlock_migrations (
        id integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now()
    );
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = 'schedlock_migrations'::regclass AND attname = 'additive'
                     AND NOT attisdropped) THEN
        ALTER TABLE schedlock_migrations ADD COLUMN IF NOT EXISTS additive boolean NOT NULL DEFAULT false;
    END IF;
END $$;

-- ── retention (schedlock.store.retention) ────────────────────────────────────────────────────
-- Batches take their rows FOR UPDATE SKIP LOCKED: a prune never waits for a row another
-- statement holds, and never touches a scheduled or firing row (claims and completions).

-- name: maintenance_begin
-- Bound every batch of this session in time; a lock it would wait for past lock_timeout ends
-- the batch instead (a cascade is the only way a prune can meet one).
SELECT set_config('statement_timeout', %(statement_timeout_ms)s, false) AS statement_timeout,
       set_config('lock_timeout', %(lock_timeout_ms)s, false) AS lock_timeout;

-- name: maintenance_end
-- The session may be the operator's pooled one: give it back with the settings it had.
SELECT set_config(name, reset_val, false) AS reset FROM pg_settings
WHERE name IN ('statement_timeout', 'lock_timeout');

-- name: claim_maintenance
-- Take or renew the lease of a maintenance task (database clock); no row: another holds it.
-- Only a role that may serve every namespace (migration 0008) takes it: a pass of a role scoped
-- to some namespaces would prune only theirs (row-level security) while it held the lease.
UPDATE schedlock_maintenance SET holder = %(holder)s, lease_until = %(lease_until)s
WHERE task = %(task)s
  AND (lease_until IS NULL OR lease_until <= now() OR holder = %(holder)s)
  AND schedlock_may_serve('*')
RETURNING holder, lease_until;

-- name: prune_publishes
-- Oldest first, one range of the state's own index (0005; planned with the state: the pass's
-- session never prepares); the ids go to the primary key as one array (an IN would let the
-- planner hash-join the whole table).
DELETE FROM schedlock_publishes
WHERE id = ANY (ARRAY(
    SELECT id FROM schedlock_publishes
    WHERE state = %(state)s AND updated_at < %(cutoff)s
    ORDER BY updated_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED));

-- name: prune_schedules
-- Cancelled schedules (their object was deleted) with no live slot; their slots cascade.
DELETE FROM schedlock_schedules
WHERE id IN (SELECT s.id FROM schedlock_schedules s
             WHERE s.state = 'cancelled' AND s.updated_at < %(cutoff)s
               AND NOT EXISTS (SELECT 1 FROM schedlock_publishes p
                               WHERE p.schedule_id = s.id
                                 AND p.state IN ('scheduled', 'firing', 'suspended'))
             LIMIT %(limit)s
             FOR UPDATE OF s SKIP LOCKED);

-- name: prune_terms
-- Terms of keys gone for longer than the retention.  Deleting one restarts the key's term
-- counter, so only a key nothing can still need: last heartbeat (a release writes one too)
-- before the cutoff — a key that never led has none and is kept; no scheduled, firing or
-- suspended row (an orphan of an old term must stay adoptable: adoption needs a higher
-- term); no live schedule of its target (recurring); no live reserve; and no session holding
-- or waiting for its lock.  A begin_term or heartbeat racing the delete changes the row's
-- heartbeat_at and the delete re-checks it (or the term begins after the delete, finds no
-- row and the elector reconnects, registering the key anew).
DELETE FROM schedlock_terms
WHERE (scheduler, namespace, target) IN (
    SELECT k.scheduler, k.namespace, k.target FROM schedlock_terms k
    WHERE k.heartbeat_at < %(cutoff)s
      AND NOT EXISTS (SELECT 1 FROM schedlock_publishes p
                      WHERE p.scheduler = k.scheduler AND p.namespace = k.namespace
                        AND p.target = k.target AND p.state = 'scheduled')
      AND NOT EXISTS (SELECT 1 FROM schedlock_publishes p
                      WHERE p.scheduler = k.scheduler AND p.namespace = k.namespace
                        AND p.target = k.target AND p.state = 'firing')
      AND NOT EXISTS (SELECT 1 FROM schedlock_publishes p
                      WHERE p.state = 'suspended' AND p.scheduler = k.scheduler
                        AND p.namespace = k.namespace AND p.target = k.target)
      -- include: prune_terms_schedules_and_reserves
      AND NOT EXISTS (SELECT 1 FROM pg_locks l
                      WHERE l.locktype = 'advisory' AND l.classid = k.lock_classid::oid
                        AND l.objid = k.lock_objid::oid AND l.objsubid = 2)
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED);

-- name: history_stats
-- What the pruner exports: the age of the oldest row of each finished state (one index probe
-- each) and the tables' sizes on disk, indexes and TOAST included.
SELECT extract(epoch FROM now() - (SELECT min(updated_at) FROM schedlock_publishes
                                   WHERE state = 'published'))::float8 AS published_age_seconds,
       extract(epoch FROM now() - (SELECT min(updated_at) FROM schedlock_publishes
                                   WHERE state = 'cancelled'))::float8 AS cancelled_age_seconds,
       extract(epoch FROM now() - (SELECT min(updated_at) FROM schedlock_publishes
                                   WHERE state = 'failed'))::float8 AS failed_age_seconds,
       extract(epoch FROM now() - (SELECT min(updated_at) FROM schedlock_publishes
                                   WHERE state = 'missed'))::float8 AS missed_age_seconds,
       pg_total_relation_size('schedlock_publishes')::float8 AS publishes_bytes,
       pg_total_relation_size('schedlock_schedules')::float8 AS schedules_bytes,
       pg_total_relation_size('schedlock_terms')::float8 AS terms_bytes,
       pg_total_relation_size('schedlock_reserves')::float8 AS reserves_bytes;

-- name: try_lock
-- A replica takes its target's leadership lock without waiting when it is free (leading at once,
-- without a standby place), and a target's leader takes one of its keys' own locks so; while another session
-- holds it (a replica of a release that locks per key, during a rolling update, or a squatter)
-- it tries again later, and hears whether that holder's role may not serve the key's namespace
-- (migration 0009).  The CTE runs the try once, before the look at the holder.
WITH t AS MATERIALIZED (SELECT pg_try_advisory_lock(%(classid)s::int, %(objid)s::int) AS granted)
SELECT t.granted, f.pid AS foreign_pid, f.role AS foreign_role
FROM t
LEFT JOIN LATERAL (SELECT h.pid, h.role
                   FROM schedlock_foreign_lock_holder(%(classid)s::int, %(objid)s::int,
                                                      %(namespace)s) AS h
                   WHERE NOT t.granted
                   LIMIT 1) AS f ON true;
