-- additive: yes (a new table: binaries of schema 2 never read it)
-- 0003 reserves: replicas that hold no session for a key (the leader and its standbys hold
-- one each) enlist here at each of their rare checks for a free standby place.  The roster
-- spreads their checks over turns (schedlock.sidecar.reserve) and `schedlock status` lists it.
-- A row is live until expires_at (its next check plus a grace); later ones are ignored and
-- pruned by the next enlisting reserve of the key.  (SQLite always leads: its table stays empty.)
CREATE TABLE schedlock_reserves (
    scheduler text NOT NULL,
    namespace text NOT NULL,
    target text NOT NULL,
    holder text NOT NULL,
    checked_at timestamptz NOT NULL DEFAULT now(),
    next_check_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (scheduler, namespace, target, holder)
);
