-- additive: yes (indexes and a nullable column: binaries of schema 3 run unchanged on it)
-- 0004 live indexes: no hot-path query's cost depends on the history a table accumulates.
-- Finished rows (published, failed, missed, cancelled) are most of schedlock_publishes after a
-- while; every query a leader, the operator or `schedlock status` runs often reads only live
-- rows (scheduled, firing, suspended) through a partial index, or probes one end of an index.
--   heartbeat, key_status backlog: the due scheduled rows (schedlock_publishes_claim, 0002)
--     plus the firing ones (schedlock_publishes_firing, 0001), as two index-bounded halves
--     of a UNION ALL (an IN over both states matched neither partial index: a full scan).
--   claim_due, next_due: schedlock_publishes_claim; complete: the primary key.
--   latest_slot: a backward probe of schedlock_publishes_schedule for one schedule_id; the
--     same index serves the ON DELETE CASCADE from schedlock_schedules (it had none: deleting
--     one schedule scanned the table).  Full, not partial: the latest slot may be finished,
--     and the cascade must find every row; only one-shot rows (no schedule) are left out.
--   cancel_schedule: schedlock_publishes_unfired_slots, the slots of each schedule that have
--     not fired (only what it cancels: a wider predicate would offer claims a second index
--     over every live row without the claim order).
-- key_status's last fire was max(finished_at) over the key's published rows, its whole
-- history.  It is kept on the key's schedlock_terms row instead (last_fire_at, set by
-- `complete` on the lock session in the statement that records a published outcome): one
-- more column on a row that session already writes every heartbeat, HOT-updated (nothing
-- indexes it), where an index-end probe would need an index over every published row, paid on
-- every completion and stored for the whole history.  The backfill below reads the history
-- once, here.  A binary of schema 3 running on this schema leaves it unchanged (its status
-- shows the last fire a newer binary recorded): cosmetic, the rule of additive migrations.
CREATE INDEX schedlock_publishes_schedule ON schedlock_publishes (schedule_id, due_at, id)
    WHERE schedule_id IS NOT NULL;
CREATE INDEX schedlock_publishes_unfired_slots ON schedlock_publishes (schedule_id)
    WHERE state IN ('scheduled', 'suspended') AND schedule_id IS NOT NULL;
ALTER TABLE schedlock_terms ADD COLUMN last_fire_at timestamptz;
-- One pass over the history (a hash aggregate), not one per key.
UPDATE schedlock_terms SET last_fire_at = f.last_fire_at
FROM (SELECT scheduler, namespace, target, max(finished_at) AS last_fire_at
      FROM schedlock_publishes WHERE state = 'published'
      GROUP BY scheduler, namespace, target) AS f
WHERE f.scheduler = schedlock_terms.scheduler AND f.namespace = schedlock_terms.namespace
  AND f.target = schedlock_terms.target;
