"""One peer job per ``schedlock_publishes`` row, enqueued as the peer's own client would.

The scenarios write rows (``bench.rows``); a statement trigger turns each row into one job of
the peer in the same transaction, with the row's due time as the job's schedule:

- River: the INSERT of River's client (``JobInsertFastMany`` of ``riverpgxv5``) with
  ``InsertOpts.ScheduledAt`` set — state ``scheduled``, River's default queue, priority 1 and
  25 attempts (River's defaults);
- procrastinate: ``procrastinate_defer_jobs_v1``, the function ``task.defer(schedule_at=…)``
  calls, so procrastinate's own insert trigger sends its ``job_inserted`` notification.

The job's arguments are the fields of the body every system POSTs (see ``bench.baselines``).
"""

from __future__ import annotations

import psycopg

ARGS = """jsonb_build_object(
    'id', n.id, 'uid', n.uid, 'namespace', n.namespace, 'name', n.name, 'target', n.target,
    'scheduledAt', to_char(n.due_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
    'payload', n.payload)"""

ENQUEUE = {
    "river": f"""
INSERT INTO river_job (args, kind, max_attempts, priority, queue, scheduled_at, state, metadata, tags)
SELECT {ARGS}, 'schedlock_fire', 25, 1, 'default', n.due_at, 'scheduled', '{{}}'::jsonb,
       '{{}}'::varchar(255)[]
FROM new_rows n ORDER BY n.id;
""",
    "procrastinate": f"""
PERFORM procrastinate_defer_jobs_v1(ARRAY(
    SELECT ROW('default', 'fire', 0, NULL, NULL, {ARGS}, n.due_at)::procrastinate_job_to_defer_v1
    FROM new_rows n ORDER BY n.id));
""",
}

TRIGGER = """
CREATE FUNCTION bench_enqueue_peer_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
{body}
RETURN NULL;
END $$;
CREATE TRIGGER bench_enqueue_peer_jobs AFTER INSERT ON schedlock_publishes
REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION bench_enqueue_peer_jobs();
"""


def install(url: str, system: str) -> None:
    """Make every row written to ``schedlock_publishes`` at ``url`` a job of ``system``."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(TRIGGER.format(body=ENQUEUE[system]).encode())
