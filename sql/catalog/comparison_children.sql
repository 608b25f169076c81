-- The child runs of a comparison (trace-rl compare): runs whose parent_run_id is the comparison id.
SELECT run_id, strategy, seed, status, started_at, finished_at
FROM runs
WHERE parent_run_id = $run_id::VARCHAR
ORDER BY strategy, seed, run_id;
