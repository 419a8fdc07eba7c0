-- 0010 sidecar columns, PostgreSQL: the functions a sidecar's role calls for the writes its
-- column privileges do not allow, and DELETE kept to finished rows.
--
-- The privileges themselves are granted by `schedlock migrate --grant-sidecar ROLE` (this
-- release's SIDECAR_GRANTS, schedlock.store.postgres): UPDATE of the columns its loops change
-- only, no INSERT on the publishes, EXECUTE on these functions.  This migration revokes nothing
-- a role holds, so binaries of schemas 8 and 9 keep running until the owner re-grants.

-- Whether the SESSION's role may serve NAMESPACE: asked inside the SECURITY DEFINER functions
-- below, where current_user is their owner.  session_user is the role that logged in (a
-- session that SET ROLE to a narrower role is still judged by its login, which it could act as
-- anyway).  SECURITY INVOKER: schedlock_served_namespaces answers a role about itself only.
CREATE FUNCTION schedlock_session_serves(namespace text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT $1 = ANY (s.served) OR '*' = ANY (s.served)
    FROM (SELECT schedlock_served_namespaces(session_user) AS served) AS s
$$;

-- A recurring schedule's slot row, every column but the slot time copied from the schedule
-- row itself (payload, target, namespace, name, attempts, deadline): the caller names the
-- schedule, the slot time and its term, nothing else.  The uid is derived here as
-- schedlock.core.identities.slot_uid derives it ('<schedule uid>@<RFC 3339 UTC, microseconds>').
-- Inserts nothing (answers 0) for a schedule the session's role may not serve, one not active,
-- one whose payload is over the bound, or when the term is not the key's current one (fenced
-- like every transition).  The caller still picks the slot time: a compromised sidecar can fire
-- its own namespace's active schedule at a time of its choosing (docs/security.md).
CREATE FUNCTION schedlock_insert_slot(schedule_id bigint, slot_at timestamptz, term bigint,
                                      max_payload_bytes integer)
RETURNS integer LANGUAGE sql VOLATILE SECURITY DEFINER AS $$
    WITH inserted AS (
        INSERT INTO schedlock_publishes (scheduler, namespace, name, uid, generation, schedule_id,
                                         target, due_at, next_attempt_at, payload, max_attempts,
                                         backoff_seconds, starting_deadline_seconds, created_at,
                                         updated_at)
        SELECT 'recurring', s.namespace, s.name,
               s.uid || '@' || to_char($2 AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
               s.generation, s.id, s.target, $2, $2, s.payload, s.max_attempts,
               s.backoff_seconds, s.starting_deadline_seconds, now(), now()
        FROM schedlock_schedules s
        WHERE s.id = $1 AND s.state = 'active' AND octet_length(s.payload::text) <= $4
          AND schedlock_session_serves(s.namespace)
          AND EXISTS (SELECT 1 FROM schedlock_terms t
                      WHERE t.scheduler = 'recurring' AND t.namespace = s.namespace
                        AND t.target = s.target AND t.term = $3)
        ON CONFLICT (uid) DO NOTHING
        RETURNING 1
    )
    SELECT count(*)::integer FROM inserted
$$;

-- The term bump, right after acquiring the key's lock: the term goes up by one and names the
-- holder; nothing else of the row changes.  How long the key was leaderless is reported (from
-- the previous term's last heartbeat or release, on the database clock).  No row (nothing
-- bumped) for a key of a namespace the session's role may not serve, or when this session does
-- not hold the key's lock: only the leader starts a term (a term bumped from outside would end
-- the leader's fenced writes).  Read once per term, pg_locks costs nothing on the hot path.
CREATE FUNCTION schedlock_begin_term(scheduler text, namespace text, target text, holder text)
RETURNS TABLE (term bigint, previous_holder text, gap_seconds double precision,
               previous_released boolean)
LANGUAGE sql VOLATILE SECURITY DEFINER AS $$
    WITH prev AS (
        SELECT p.term, p.holder, p.heartbeat_at, p.released_at FROM schedlock_terms p
        WHERE p.scheduler = $1 AND p.namespace = $2 AND p.target = $3
          AND schedlock_session_serves($2)
          AND EXISTS (SELECT 1 FROM pg_locks l
                      WHERE l.locktype = 'advisory' AND l.classid = p.lock_classid::oid
                        AND l.objid = p.lock_objid::oid AND l.objsubid = 2
                        AND l.pid = pg_backend_pid() AND l.granted)
        FOR UPDATE
    ), bumped AS (
        UPDATE schedlock_terms t
        SET term = t.term + 1, holder = $4, since = now(), heartbeat_at = now(), released_at = NULL
        FROM prev
        WHERE t.scheduler = $1 AND t.namespace = $2 AND t.target = $3
        RETURNING t.term, t.since
    )
    SELECT bumped.term, prev.holder,
           extract(epoch FROM bumped.since - COALESCE(prev.released_at, prev.heartbeat_at))::float8,
           prev.released_at IS NOT NULL
    FROM bumped, prev
$$;

-- Pinned search_path (as 0008's): names resolve in this schema only, then pg_temp.  EXECUTE is
-- not PUBLIC's: `migrate --grant-sidecar` grants it; the roles that hold privileges on the
-- publishes now (granted by an earlier release) get it here, so that this release's binaries
-- run under them before they are re-granted.
SELECT set_config('search_path', format('%I, pg_temp', current_schema()), true);
ALTER FUNCTION schedlock_session_serves(text) SET search_path FROM CURRENT;
ALTER FUNCTION schedlock_insert_slot(bigint, timestamptz, bigint, integer) SET search_path FROM CURRENT;
ALTER FUNCTION schedlock_begin_term(text, text, text, text) SET search_path FROM CURRENT;
DO $$
DECLARE
    r text;
BEGIN
    REVOKE EXECUTE ON FUNCTION schedlock_insert_slot(bigint, timestamptz, bigint, integer),
                               schedlock_begin_term(text, text, text, text) FROM PUBLIC;
    FOR r IN SELECT DISTINCT pg_get_userbyid(a.grantee)
             FROM pg_class c, aclexplode(c.relacl) AS a
             WHERE c.oid = 'schedlock_publishes'::regclass AND a.grantee <> 0
               AND a.grantee <> c.relowner LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION '
                       'schedlock_insert_slot(bigint, timestamptz, bigint, integer), '
                       'schedlock_begin_term(text, text, text, text) TO %I', r);
    END LOOP;
END $$;

-- DELETE only what has finished, whoever deletes (restrictive: on top of 0008's policy; the
-- owner, which prunes as well, is not subject to row-level security).  What the pruner deletes
-- already (schedlock.store.retention): finished publishes; cancelled schedules without a live
-- slot; terms of keys without a live row.  A role's DELETE matches 0 rows elsewhere.
CREATE POLICY schedlock_finished_only ON schedlock_publishes AS RESTRICTIVE FOR DELETE
    USING (state IN ('published', 'failed', 'missed', 'cancelled'));
CREATE POLICY schedlock_finished_only ON schedlock_schedules AS RESTRICTIVE FOR DELETE
    USING (state = 'cancelled'
           AND NOT EXISTS (SELECT 1 FROM schedlock_publishes p
                           WHERE p.schedule_id = schedlock_schedules.id
                             AND p.state IN ('scheduled', 'firing', 'suspended')));
-- A terms row goes only as prune_terms lets it (whatever its age): no live row of its key (each
-- live state its own NOT EXISTS, on its own partial index), no live schedule of its target for
-- the recurring key, and no session holding or waiting for its lock (a leading key's row stays).
CREATE POLICY schedlock_finished_only ON schedlock_terms AS RESTRICTIVE FOR DELETE
    USING (NOT EXISTS (SELECT 1 FROM schedlock_publishes p
                       WHERE p.scheduler = schedlock_terms.scheduler
                         AND p.namespace = schedlock_terms.namespace
                         AND p.target = schedlock_terms.target AND p.state = 'scheduled')
           AND NOT EXISTS (SELECT 1 FROM schedlock_publishes p
                           WHERE p.scheduler = schedlock_terms.scheduler
                             AND p.namespace = schedlock_terms.namespace
                             AND p.target = schedlock_terms.target AND p.state = 'firing')
           AND NOT EXISTS (SELECT 1 FROM schedlock_publishes p
                           WHERE p.state = 'suspended'
                             AND p.scheduler = schedlock_terms.scheduler
                             AND p.namespace = schedlock_terms.namespace
                             AND p.target = schedlock_terms.target)
           AND NOT (schedlock_terms.scheduler = 'recurring' AND EXISTS (
                        SELECT 1 FROM schedlock_schedules s
                        WHERE s.namespace = schedlock_terms.namespace
                          AND s.target = schedlock_terms.target AND s.state <> 'cancelled'))
           AND NOT EXISTS (SELECT 1 FROM pg_locks l
                           WHERE l.locktype = 'advisory'
                             AND l.classid = schedlock_terms.lock_classid::oid
                             AND l.objid = schedlock_terms.lock_objid::oid AND l.objsubid = 2));
