-- loses data: no (storage parameters back to the defaults)
ALTER TABLE schedlock_terms RESET (fillfactor);
ALTER TABLE schedlock_reserves RESET (fillfactor);
ALTER TABLE schedlock_publishes RESET (
    autovacuum_vacuum_scale_factor,
    autovacuum_vacuum_threshold,
    autovacuum_analyze_scale_factor,
    autovacuum_analyze_threshold
);
