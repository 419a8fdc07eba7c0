-- 0002 claim index: claim_due orders by (next_attempt_at, id); see the PostgreSQL migration.
CREATE INDEX schedlock_publishes_claim ON schedlock_publishes
    (scheduler, namespace, target, next_attempt_at, id) WHERE state = 'scheduled';
DROP INDEX schedlock_publishes_due;
