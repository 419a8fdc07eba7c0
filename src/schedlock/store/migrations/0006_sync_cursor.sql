-- additive: yes (a new table: binaries of earlier schemas neither read nor need it)
-- 0006 sync cursor: where the operator's status sync resumes (schedlock.operator.sync).  The
-- sync replica (the holder of the sync advisory lock) stores its watermark, on the database
-- clock, after each completed sweep and starts the next run from it; the sweep re-reads
-- SWEEP_OVERLAP behind it.  Without a row (a new database, or one upgraded from a release
-- without cursor) the sync starts from now minus a bounded catch-up, never from the epoch.
-- One row per cursor name ('status-sync'); each update is HOT (nothing indexes watermark_at).
CREATE TABLE schedlock_sync_cursors (
    name text PRIMARY KEY,
    watermark_at timestamptz NOT NULL,
    holder text NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
