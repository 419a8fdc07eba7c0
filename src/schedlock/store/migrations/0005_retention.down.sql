-- loses data: no
-- 0005 retention, down: the lease row is transient (who prunes next) and the indexes are derived;
-- nothing the product records is lost.  Rows already pruned stay pruned.
DROP INDEX schedlock_publishes_published_age;
DROP INDEX schedlock_publishes_cancelled_age;
DROP INDEX schedlock_publishes_failed_age;
DROP INDEX schedlock_publishes_missed_age;
DROP INDEX schedlock_publishes_suspended;
DROP TABLE schedlock_maintenance;
