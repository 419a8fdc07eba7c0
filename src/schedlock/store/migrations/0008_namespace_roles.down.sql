-- loses data: no (the mapping is re-recorded by `schedlock migrate --grant-… --namespace` run again after the next upgrade; every row stays)
-- 0008 namespace roles, undone: PostgreSQL's part first drops its policies and functions
-- (0008_namespace_roles.down.postgres.sql); taking it down ends the tenancy the database enforced.
DROP TABLE schedlock_namespace_roles;
