-- loses data: no (the cursor is a position, not history: without it the sync starts from now
-- minus its catch-up, and a release before 0006 sweeps from the epoch anyway)
DROP TABLE schedlock_sync_cursors;
