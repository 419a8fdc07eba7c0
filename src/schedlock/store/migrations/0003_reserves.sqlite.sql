-- 0003 reserves: see the PostgreSQL migration (SQLite always leads: the table stays empty).
CREATE TABLE schedlock_reserves (
    scheduler text NOT NULL,
    namespace text NOT NULL,
    target text NOT NULL,
    holder text NOT NULL,
    checked_at text NOT NULL,
    next_check_at text NOT NULL,
    expires_at text NOT NULL,
    PRIMARY KEY (scheduler, namespace, target, holder)
);
