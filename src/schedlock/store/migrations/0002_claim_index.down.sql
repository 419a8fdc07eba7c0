-- loses data: no (indexes only)
-- 0002 claim index, undone: schema 1's due index back, the claim index gone.
CREATE INDEX schedlock_publishes_due ON schedlock_publishes (scheduler, namespace, target, next_attempt_at)
    WHERE state = 'scheduled';
DROP INDEX schedlock_publishes_claim;
