-- Every run id the home holds rows for, and every comparison id its runs name as parent
-- (what an unknown --run-id is told about).
SELECT DISTINCT run_id
FROM (
    SELECT run_id FROM runs
    UNION ALL
    SELECT parent_run_id AS run_id FROM runs
    UNION ALL
    SELECT run_id FROM iterations
    UNION ALL
    SELECT run_id FROM nodes
)
WHERE run_id IS NOT NULL
ORDER BY run_id;
