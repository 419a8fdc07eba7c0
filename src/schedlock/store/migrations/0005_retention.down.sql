-- loses data: no
-- 0005 retention, down: the lease row is transient (who prunes next) and the index is derived;
-- nothing the product records is lost.  Rows already pruned stay pruned.
DROP INDEX schedlock_publishes_at_rest;
DROP TABLE schedlock_maintenance;
