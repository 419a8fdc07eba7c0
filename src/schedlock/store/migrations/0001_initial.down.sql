-- loses data: yes (every publish row, schedule and key's terms)
-- 0001 initial, undone: the tables (children first: publishes reference schedules).
DROP TABLE schedlock_publishes;
DROP TABLE schedlock_schedules;
DROP TABLE schedlock_terms;
