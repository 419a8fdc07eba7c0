"""History for the ``history`` scenario: millions of finished rows, loaded as the store writes them.

The rows are what years of firing leave behind, spread over ``keys`` lock keys (namespaces
``hist-ns-N`` × targets ``app-M``), oldest first, one every ``span_s / rows`` seconds up to a
minute before the load:

* 40 % one-shot rows (scheduler ``publish``, uid a Kubernetes uid): 90 % published, 3 % failed,
  2 % missed, 5 % cancelled;
* 60 % slots of recurring schedules (scheduler ``recurring``, uid ``<schedule uid>@<slot time>``
  as :func:`schedlock.core.identities.slot_uid` writes it, ``schedule_id`` set): 97 % published,
  1 % failed, 2 % missed; ``per_key`` schedules a key, half of them cancelled (all of them on
  the measured key, whose sidecars must fire only what the scenario writes), the rest active;
* every column the store's own statements set (attempts, term, holder, last status and error,
  created/updated/fired/finished times), payloads as the operator stores them, so a row is
  about :data:`ROW_BYTES` bytes in the heap like the rows of the issue's installation;
* a released term row per key and scheduler, as keys that once had sidecars leave.

Each batch is one ``INSERT … SELECT generate_series`` statement committed on its own (so the
WAL and the locks stay bounded); :func:`load` then runs ``VACUUM (ANALYZE)``: history months old
has long been vacuumed by autovacuum (all-visible) in a real installation; a bulk load is not.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from schedlock.store.keys import LockKey

ROW_BYTES = 536  # the heap size of an average row in the installation
NAMESPACE_PREFIX = "hist-ns-"
TARGET_PREFIX = "app-"
TARGETS_PER_NAMESPACE = 20
BATCH = 250_000
RECENT_S = 60.0  # the newest row finished this long before the load
# Filler in the payload so that an average row is ROW_BYTES: what a typical app passes along
# (a tenant, a kind, some parameters).
PAYLOAD_FILLER = 195

SCHEDULES = f"""
INSERT INTO schedlock_schedules (id, namespace, name, uid, generation, target, expression,
    time_zone, payload, max_attempts, backoff_seconds, starting_deadline_seconds, state,
    watermark_at, last_slot_at, next_slot_at, created_at, updated_at)
SELECT s + 1,
       '{NAMESPACE_PREFIX}' || (s %% %(keys)s / {TARGETS_PER_NAMESPACE}),
       'every-' || s, md5('schedule-' || s)::uuid::text, 1,
       '{TARGET_PREFIX}' || (s %% %(keys)s %% {TARGETS_PER_NAMESPACE}),
       '@every 10s', 'UTC',
       jsonb_build_object('kind', 'report', 'schedule', s, 'params', repeat('p', {PAYLOAD_FILLER})),
       3, 1, 60,
       CASE WHEN s %% %(keys)s = 0 OR s %% 2 = 1 THEN 'cancelled' ELSE 'active' END,
       to_timestamp(%(now)s) - interval '1 hour', to_timestamp(%(now)s) - interval '1 hour',
       to_timestamp(%(now)s) - interval '1 hour' + interval '10 seconds',
       to_timestamp(%(now)s) - make_interval(secs => %(span)s), to_timestamp(%(now)s) - interval '1 hour'
FROM generate_series(0, %(schedules)s - 1) AS s
"""

# One batch: rows lo .. hi-1 of n.  Row i finished at now - RECENT_S - (n - i) * step.
ROWS = f"""
WITH g AS (
    SELECT i, i %% %(keys)s AS k,
           (hashint8(i) & 1023) < 410 AS one_shot,
           (hashint8(i + 1000000007) & 2147483647) %% 100 AS dice,
           to_timestamp(%(now)s) - make_interval(secs => %(recent)s)
               - make_interval(secs => (%(n)s - i) * %(step)s) AS at
    FROM generate_series(%(lo)s::bigint, %(hi)s::bigint - 1) AS i
), r AS (
    SELECT g.*,
           '{NAMESPACE_PREFIX}' || (k / {TARGETS_PER_NAMESPACE}) AS namespace,
           '{TARGET_PREFIX}' || (k %% {TARGETS_PER_NAMESPACE}) AS target,
           k + %(keys)s * (i / %(keys)s %% %(per_key)s) AS s,
           CASE WHEN one_shot THEN CASE WHEN dice < 90 THEN 'published' WHEN dice < 93 THEN 'failed'
                                        WHEN dice < 95 THEN 'missed' ELSE 'cancelled' END
                ELSE CASE WHEN dice < 97 THEN 'published' WHEN dice < 98 THEN 'failed'
                          ELSE 'missed' END
           END AS state
    FROM g
)
INSERT INTO schedlock_publishes (scheduler, namespace, name, uid, generation, schedule_id,
    target, due_at, next_attempt_at, payload, state, attempts, max_attempts, backoff_seconds,
    starting_deadline_seconds, term, holder, last_status, last_error, created_at, updated_at,
    fired_at, finished_at)
SELECT CASE WHEN one_shot THEN 'publish' ELSE 'recurring' END,
       namespace,
       CASE WHEN one_shot THEN 'job-' || i ELSE 'every-' || s END,
       CASE WHEN one_shot THEN md5('one-shot-' || i)::uuid::text
            ELSE md5('schedule-' || s)::uuid::text || '@' ||
                 to_char((at - interval '100 ms') AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
       END,
       1,
       CASE WHEN one_shot THEN NULL ELSE s + 1 END,
       target, at - interval '100 ms', at - interval '100 ms',
       CASE WHEN one_shot
            THEN jsonb_build_object('kind', 'invoice', 'job', i, 'tenant', namespace,
                                    'params', repeat('p', {PAYLOAD_FILLER}))
            ELSE jsonb_build_object('kind', 'report', 'schedule', s,
                                    'params', repeat('p', {PAYLOAD_FILLER}))
       END,
       state,
       CASE state WHEN 'published' THEN 1 WHEN 'failed' THEN 3 ELSE 0 END, 3, 1,
       CASE WHEN one_shot THEN NULL ELSE 60 END,
       1 + i %% 50,
       CASE WHEN state IN ('published', 'failed') THEN target || '-7f9c4d-' || (i %% 3) END,
       CASE state WHEN 'published' THEN 200 WHEN 'failed' THEN 503 END,
       CASE state WHEN 'failed' THEN 'HTTP 503 from the app'
                  WHEN 'missed' THEN 'missed: later than the starting deadline' END,
       CASE WHEN one_shot THEN at - interval '1 hour' ELSE at - interval '100 ms' END,
       at,
       CASE WHEN state IN ('published', 'failed') THEN at - interval '50 ms' END,
       at
FROM r
"""

TERMS = """
INSERT INTO schedlock_terms (scheduler, namespace, target, lock_classid, lock_objid, term,
    holder, since, heartbeat_at, released_at)
VALUES (%s, %s, %s, %s, %s, 50, %s, to_timestamp(%s) - interval '2 hours',
        to_timestamp(%s) - interval '1 hour', to_timestamp(%s) - interval '1 hour')
ON CONFLICT DO NOTHING
"""


def key_of(k: int) -> tuple[str, str]:
    """(namespace, target) of key number ``k``; key 0 is the one the scenario measures."""
    return (
        f"{NAMESPACE_PREFIX}{k // TARGETS_PER_NAMESPACE}",
        f"{TARGET_PREFIX}{k % TARGETS_PER_NAMESPACE}",
    )


@dataclass(frozen=True)
class Loaded:
    rows: int
    keys: int
    schedules: int
    span_s: float
    insert_s: float
    vacuum_analyze_s: float
    table_mb: float  # schedlock_publishes: heap, indexes and TOAST
    heap_bytes_per_row: float
    loaded_at: float  # epoch s: row i finished RECENT_S + (rows - i) * span_s / rows before it

    def as_json(self) -> dict[str, Any]:
        return {k: round(v, 2) if isinstance(v, float) else v for k, v in vars(self).items()}

    def retention_leaving(self, backlog: int, now: float) -> float:
        """The retention (seconds) past which ``backlog`` of the loaded rows are at ``now``."""
        step = self.span_s / self.rows
        return (self.rows - backlog) * step + RECENT_S + (now - self.loaded_at)


def load(
    url: str,
    *,
    rows: int,
    keys: int,
    per_key: int = 10,
    span_s: float = 19 * 30 * 86400.0,
    say: Callable[[str], None] = print,
) -> Loaded:
    """Load ``rows`` finished rows over ``keys`` keys into the (migrated) database ``url``."""
    now = time.time()
    schedules = keys * per_key
    started = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SCHEDULES, {"keys": keys, "now": now, "span": span_s, "schedules": schedules})
        conn.execute(
            "SELECT setval(pg_get_serial_sequence('schedlock_schedules', 'id'), "
            "(SELECT max(id) FROM schedlock_schedules))"
        )
        with conn.cursor() as cur:
            terms = []
            for k in range(keys):
                namespace, target = key_of(k)
                for scheduler in ("publish", "recurring"):
                    lock = LockKey(scheduler, namespace, target)
                    holder = f"{target}-7f9c4d-2"
                    terms.append(
                        (scheduler, namespace, target, lock.classid, lock.objid, holder)
                        + (now,) * 3
                    )
            cur.executemany(TERMS, terms)
        params = {
            "keys": keys, "per_key": per_key, "now": now, "n": rows, "step": span_s / rows,
            "recent": RECENT_S,
        }  # fmt: skip
        for lo in range(0, rows, BATCH):
            hi = min(rows, lo + BATCH)
            conn.execute(ROWS, {**params, "lo": lo, "hi": hi})
            elapsed = time.monotonic() - started
            say(f"history: {hi:,} of {rows:,} rows loaded ({elapsed:.0f} s)")
        inserted = time.monotonic()
        conn.execute("VACUUM (ANALYZE) schedlock_publishes")
        conn.execute("VACUUM (ANALYZE) schedlock_schedules")
        conn.execute("ANALYZE schedlock_terms")
        analyzed = time.monotonic()
        size, heap = conn.execute(
            "SELECT pg_total_relation_size('schedlock_publishes'), "
            "pg_relation_size('schedlock_publishes')"
        ).fetchone() or (0, 0)
    return Loaded(
        rows=rows,
        keys=keys,
        schedules=schedules,
        span_s=span_s,
        insert_s=inserted - started,
        vacuum_analyze_s=analyzed - inserted,
        table_mb=int(size) / 2**20,
        heap_bytes_per_row=int(heap) / rows if rows else 0.0,
        loaded_at=now,
    )
