-- additive: yes (binaries of schema 7 keep running: every role that held privileges when it ran may serve every namespace, as before; a role granted later by a schema-7 binary is mapped to no namespace and sees no row until granted by this release)
-- 0008 namespace roles: the database enforces tenancy.  A mapping of roles to the namespaces
-- they may serve, that only the schema owner changes, keys row-level security on every table
-- that holds a namespace's rows: a runtime role reads and writes only those rows.  The policies
-- and functions are PostgreSQL's (0008_namespace_roles.postgres.sql); SQLite has no roles (one
-- process owns the file) and keeps the table empty, so both dialects have the same tables.
CREATE TABLE schedlock_namespace_roles (
    role text NOT NULL,
    namespace text NOT NULL,
    granted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (role, namespace)
);
