-- loses data: no (the reserves' roster is transient: each row expires within a check and is
-- written again by the next check of a reserve that runs a release that has it)
DROP TABLE schedlock_reserves;
