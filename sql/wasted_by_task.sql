-- Which task family wastes the most rollouts?
WITH scoped AS (
    SELECT *
    FROM trajectories
    WHERE $run_id::VARCHAR IS NULL OR run_id = $run_id::VARCHAR
)

SELECT
    run_id,
    task,
    count(*) AS trajectories,
    count(*) FILTER (WHERE wasted) AS wasted,
    round(count(*) FILTER (WHERE wasted) / count(*), 4) AS wasted_share,
    round(avg(reward), 4) AS mean_reward,
    coalesce(sum(tokens) FILTER (WHERE wasted), 0) AS wasted_tokens
FROM scoped
GROUP BY run_id, task
ORDER BY run_id, wasted DESC, task;
