-- additive: yes
-- 0005 retention: finished history is pruned after a retention by one elected process
-- (schedlock.store.retention).  Binaries of the previous release ignore both objects.
-- The lease row elects the pruner across every process of the database (sidecars, operator):
-- a contender claims it with one UPDATE on the database clock; the holder renews it while it
-- prunes.  It decides who spends the effort, not what is safe: deleting finished rows twice
-- is harmless.
CREATE TABLE schedlock_maintenance (
    task text PRIMARY KEY,
    holder text,
    lease_until timestamptz
);
INSERT INTO schedlock_maintenance (task) VALUES ('prune');
-- Rows at rest (suspended or finished) by state and age: each prune batch and the oldest
-- finished row's age read one index range per state, whatever the number of live rows or of
-- rows of other states (failed rows kept 7 days are never walked by the 24-hour prune of
-- published ones).  Scheduled and firing rows have indexes of their own (0001, 0002).
CREATE INDEX schedlock_publishes_at_rest ON schedlock_publishes (state, updated_at)
    WHERE state IN ('suspended', 'published', 'cancelled', 'failed', 'missed');
