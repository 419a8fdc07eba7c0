-- 0004 live indexes, PostgreSQL only: storage parameters per table (SQLite has none).
-- A HOT update (the new row version on the same page, no new index entries) needs two things:
-- no column that any index reads (its key, INCLUDE or partial-index predicate) changes, and
-- room on the row's page.  The fillfactor reserves that room; autovacuum's thresholds decide how
-- much dead history a table carries before it is cleaned.
--
-- schedlock_terms: one row per key, updated by every heartbeat (heartbeat_at, every 3 s per
-- led key), every completion that publishes (last_fire_at), each term's start and release.
-- Only the primary key (scheduler, namespace, target) and (lock_classid, lock_objid) index it,
-- and no update changes those: each can be HOT if the page has room.  Half of each page is
-- left free for the new versions (a row is ~130 bytes; a few hundred keys still fit in a few
-- pages), so heartbeats do not touch the indexes and the page is pruned in place.  Pages already
-- filled by an older schema keep their rows until rewritten: the setting applies to new ones.
-- Default autovacuum: the table is tiny, and pruning reclaims HOT chains between vacuums.
ALTER TABLE schedlock_terms SET (fillfactor = 50);
--
-- schedlock_reserves: one row per reserve replica and key, updated at each of its checks
-- (checked_at, next_check_at, expires_at; only the primary key indexes it): HOT as terms.
ALTER TABLE schedlock_reserves SET (fillfactor = 50);
--
-- schedlock_publishes: the history.  No transition can be HOT: each one changes `state`, which
-- the predicates of the partial indexes (claim, firing, unfired_slots) read, and most also change
-- an indexed next_attempt_at or term.  Free space reserved on its pages would buy no HOT update
-- and make every page of history emptier, so the fillfactor stays 100.  The indexed updated_at
-- (schedlock_publishes_finished, the operator's sweep) blocks HOT too, but only for updates that
-- keep the state (a spec edit of a scheduled row): dropping it or making it BRIN (which blocks no
-- HOT update from PostgreSQL 16) would save nothing on the hot path and PostgreSQL 15 is
-- supported, so it stays a btree.  Each fire leaves two dead versions (claim, completion): the
-- default threshold (20 % of the table) let 1 M dead versions pile up on a 5 M row table before
-- the first vacuum.  Vacuum after 1,000 + 0.2 % of the rows changed (11,000 at 5 M rows, 1,200
-- at 100,000): a vacuum reads only the pages changed since the last one (the visibility map),
-- and skips the index pass when few pages have dead rows, so frequent ones stay cheap.  Analyze
-- after 1 % (the planner's row estimates per state; the partial indexes do not rely on them).
ALTER TABLE schedlock_publishes SET (
    autovacuum_vacuum_scale_factor = 0.002,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.01,
    autovacuum_analyze_threshold = 1000
);
--
-- schedlock_schedules: one row per schedule, updated at each of its slots (advance_schedule),
-- which changes next_slot_at, indexed by schedlock_schedules_next: not HOT, and the table is small
-- (the default thresholds vacuum it after 50 + 20 % of its rows): defaults.
-- schedlock_migrations: a handful of rows, written by migrations only: defaults.
