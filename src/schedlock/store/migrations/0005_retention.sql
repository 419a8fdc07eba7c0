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
-- One index per finished state, by age (a row is in exactly one: the same size as one index
-- over them all): each prune batch and the oldest finished row's age read one range of their
-- state's index, whatever the number of live rows or of rows of other states.  One over every
-- state (or the updated_at index of 0001) is what a planner would walk from the oldest end,
-- through 7 days of failed rows kept, to reach the published ones just past their 24 hours.
-- Suspended rows by key: a key's terms row is kept while it has one.
CREATE INDEX schedlock_publishes_published_age ON schedlock_publishes (updated_at)
    WHERE state = 'published';
CREATE INDEX schedlock_publishes_cancelled_age ON schedlock_publishes (updated_at)
    WHERE state = 'cancelled';
CREATE INDEX schedlock_publishes_failed_age ON schedlock_publishes (updated_at)
    WHERE state = 'failed';
CREATE INDEX schedlock_publishes_missed_age ON schedlock_publishes (updated_at)
    WHERE state = 'missed';
CREATE INDEX schedlock_publishes_suspended ON schedlock_publishes (scheduler, namespace, target)
    WHERE state = 'suspended';
