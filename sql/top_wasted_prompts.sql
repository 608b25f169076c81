-- Which prompts soaked up the most wasted trajectories (all iterations together)? Top 20.
WITH scoped AS (
    SELECT *
    FROM trajectories
    WHERE $run_id::VARCHAR IS NULL OR run_id = $run_id::VARCHAR
)

SELECT
    run_id,
    prompt_id,
    any_value(task) AS task,
    any_value(difficulty) AS difficulty,
    count(DISTINCT iteration) AS iterations,
    count(*) AS trajectories,
    count(*) FILTER (WHERE wasted) AS wasted,
    round(avg(reward), 4) AS mean_reward
FROM scoped
GROUP BY run_id, prompt_id
HAVING count(*) FILTER (WHERE wasted) > 0
ORDER BY wasted DESC, run_id, prompt_id
LIMIT 20;
