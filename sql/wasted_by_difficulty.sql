-- How does waste depend on prompt difficulty (the generator's difficulty level)?
WITH scoped AS (
    SELECT *
    FROM trajectories
    WHERE $run_id::VARCHAR IS NULL OR run_id = $run_id::VARCHAR
)

SELECT
    run_id,
    task,
    difficulty,
    count(*) AS trajectories,
    count(*) FILTER (WHERE wasted) AS wasted,
    round(count(*) FILTER (WHERE wasted) / count(*), 4) AS wasted_share,
    round(avg(reward), 4) AS mean_reward
FROM scoped
GROUP BY run_id, task, difficulty
ORDER BY run_id, task, difficulty;
